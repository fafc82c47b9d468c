"""The attention executor's chunk kernels, one per kind of chunk, chosen from one table (:data:`KERNELS`).

=============  =====================================================================  =====================
kind           chunk                                                                   module
=============  =====================================================================  =====================
dense          queries against their keys at true positions (full, causal, chunked, a  :mod:`.dense`
               window too short to batch, a generation step)
windows        BCA's blocks / a sliding window's strides: n windows of c queries        :mod:`.windows`
               against 2c keys each, at window-local positions, in one SDPA call
sinks          any chunk with sink tokens: their keys at virtual positions, one        :mod:`.sinks`
               softmax with the window's keys
position_map   full attention at remapped distances (ReRoPE, Self-Extend, DCA),        :mod:`.remapped`
               piece by piece, merged by log-sum-exp
blocks         top-k block attention (MoBA): each query's own block and the k - 1      :mod:`.blocks`
               earlier blocks its gate scores highest, gathered, one softmax
landmarks      landmark attention's grouped softmax: the own block and the earlier     :mod:`.landmarks`
               landmarks in one softmax, each landmark's share spread over its block
=============  =====================================================================  =====================

Each kernel is ``kernel(run, chunk) -> (B, H, Tq, D)``: ``run`` (:class:`~.run.ChunkRun`) the call's inputs, read
only; ``chunk`` (``planner.Chunk``) the queries and keys it covers. The primitives they share (SDPA with learned
sink logits, SDPA with the log-sum-exp, one query as two products) are in :mod:`.ops`.
"""

from typing import Callable, Dict

from torch import Tensor

from ..planner import Chunk
from ..retrieval import BlockRetrieval, LandmarkRetrieval
from .blocks import attend_blocks
from .dense import attend_dense
from .landmarks import attend_landmarks
from .remapped import attend_remapped
from .run import ChunkRun, Observer, with_positions
from .sinks import attend_with_sinks
from .windows import attend_windows

__all__ = ["BlockRetrieval", "KERNELS", "LandmarkRetrieval", "ChunkRun", "Kernel", "Observer", "kernel_kind", "with_positions"]

Kernel = Callable[[ChunkRun, Chunk], Tensor]

KERNELS: Dict[str, Kernel] = {"dense": attend_dense, "windows": attend_windows, "sinks": attend_with_sinks,
                              "position_map": attend_remapped, "blocks": attend_blocks,
                              "landmarks": attend_landmarks}


def kernel_kind(run: ChunkRun, chunk: Chunk) -> str:
    """The key of :data:`KERNELS` that runs ``chunk``: the landmarks kernel for every chunk under a landmark retrieval,
    the blocks kernel for every chunk under a block retrieval, a
    position map's kernel for every chunk under a map, the sinks' for every chunk with sink tokens, else windows for a
    windows chunk (``chunk.blocks``) and dense for the rest."""
    if isinstance(run.retrieval, LandmarkRetrieval):
        return "landmarks"
    if run.retrieval is not None:
        return "blocks"
    if run.position_map is not None:
        return "position_map"
    if run.window.sinks:
        return "sinks"
    return "windows" if chunk.blocks else "dense"

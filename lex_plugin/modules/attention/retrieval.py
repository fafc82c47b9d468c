"""Block retrieval: which earlier blocks of keys each query attends besides its most recent ones, chosen by the query;
the value a design or an evaluation hands the executor. :class:`BlockRetrieval` (MoBA, ``--bca --retrieval-blocks K``)
runs on the blocks kernel (``kernels.blocks``), :class:`LandmarkRetrieval` (landmark tokens) on the landmarks kernel
(``kernels.landmarks``)."""

from dataclasses import dataclass
from typing import Optional

__all__ = ["BlockRetrieval", "LandmarkRetrieval"]


@dataclass(frozen=True)
class BlockRetrieval:
    """Top-k block attention: each query sees its ``local`` most recent blocks (its own causally) and the
    ``topk - local`` earlier blocks of ``block`` positions with the highest gate <q, mean(K_i)>.

    ``local`` 1 is MoBA (the own block, k counting it); 2 with blocks of l/2 is BCA's window plus the chosen blocks,
    InfLLM's local window and memory blocks (Xiao et al. 2024, arXiv 2402.04617, section 3; each block represented
    here by its mean key, MoBA's gate, where InfLLM keeps its most-attended keys) applied to a model trained without it
    (``--bca --retrieval-blocks K``).

    Attributes:
        block: b, positions per block (>= 1).
        topk: k, blocks per query counting the local ones (>= local).
        local: the most recent blocks always seen, the own one first (>= 1).

    Raises:
        ValueError: a block or ``local`` below 1, k below ``local``.
    """

    block: int
    topk: int
    local: int = 1

    def __post_init__(self):
        if self.block < 1:
            raise ValueError(f"--moba-block-size {self.block}: a block holds at least one position.")
        if self.local < 1:
            raise ValueError(f"a block retrieval sees at least its own block (local >= 1), got {self.local}.")
        if self.topk < self.local:
            what = "--moba-topk" if self.local == 1 else "the blocks retrieved"
            raise ValueError(f"{what} {self.topk - self.local + 1 if self.local > 1 else self.topk}: each query attends at "
                             "least its own block (k >= 1).")

    def __str__(self) -> str:
        if self.local == 1:
            return f"moba(block={self.block},topk={self.topk})"
        if self.local == 2:  # (--bca --retrieval-blocks K: BCA's window and K chosen blocks of l/2)
            return f"bca+retrieval({self.topk - self.local})"
        return f"retrieval(block={self.block},local={self.local},topk={self.topk - self.local})"


@dataclass(frozen=True)
class LandmarkRetrieval:
    """Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300, section 3.1): the positions come in blocks of
    ``block`` tokens each followed by its landmark token (a period of ``block + 1`` positions, the landmark last), and
    each query attends under the grouped softmax: one softmax over the tokens of its own block up to itself and the
    landmarks of the earlier blocks; an earlier block's tokens get its landmark's share times their softmax within the
    block; landmarks give no value. ``topk`` keeps each query's k highest-scoring earlier landmarks (the paper's
    retrieval at inference, section 3.2), None every one (training's grouped softmax).

    Attributes:
        block: l_block, tokens per block (>= 1), its landmark not counted.
        topk: earlier blocks each query retrieves (>= 1), or None: all.

    Raises:
        ValueError: a block or a top-k below 1.
    """

    block: int
    topk: Optional[int] = None

    def __post_init__(self):
        if self.block < 1:
            raise ValueError(f"--landmark-block-size {self.block}: a block holds at least one token.")
        if self.topk is not None and self.topk < 1:
            raise ValueError(f"--landmark-topk {self.topk}: retrieve at least one block, or leave it out (every block).")

    @property
    def period(self) -> int:
        """Positions per block, its landmark included: ``block + 1``."""
        return self.block + 1

    def __str__(self) -> str:
        return f"landmark(block={self.block}" + ("" if self.topk is None else f",topk={self.topk}") + ")"

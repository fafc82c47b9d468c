"""Mixture of block attention (MoBA; Lu et al. 2025, arXiv 2502.13189, section 2.2; ``--moba-topk``,
``--moba-block-size``): the keys are split into blocks of b positions; each query attends causally to its own block and
to the k - 1 earlier blocks with the highest gate

    s_i = <q, mean(K_i)>  over the blocks wholly before the query's own (its own always chosen: "top-k" counts it),

under one softmax. The gate has no parameters (the paper's "parameter-less" router); it reads the keys as attention
does, after the position scheme. b defaults to BCA's block, l/2 ("BCA plus the blocks that matter"): at training
length l that is full attention for k >= 2, so a sparse model is trained with a smaller block (l/8 with k = 3 sees at
most 3/8 of the context). k at least the number of blocks is full causal attention.

In the global layers of a ``--layer-pattern`` only (its local layers keep their windows); evaluated with full attention
in those layers (no ``--bca``, sliding window, sinks or position map there); the kernel:
``attention.kernels.blocks``. Training and evaluation alike; generation steps choose the blocks the parallel pass
chooses, up to fp32 rounding of near-tied gates (the kernel's docstring).
"""

from dataclasses import dataclass
from typing import Optional

from ..attention.kernels import BlockRetrieval
from .registry import DesignOption, DesignSpec, LayerDesign, register_design

__all__ = ["MOBA", "MoBA"]


@dataclass(frozen=True)
class MoBA(LayerDesign):
    """MoBA in one layer: the executor runs its attention under ``blocks`` (module docstring)."""

    blocks: BlockRetrieval
    retrieves = True
    global_only = True

    def retrieval(self, attention) -> BlockRetrieval:
        return self.blocks


def _build(config) -> Optional[MoBA]:
    topk, block = (option.read(config) for option in MOBA.options)
    if topk is None:
        if block is not None:
            raise ValueError(f"--moba-block-size {block} belongs to MoBA: give --moba-topk (3 in the paper) too, or "
                             "leave the block size out.")
        return None
    if block is None:
        length = getattr(config, "tokens_per_sample", None)
        if not length or int(length) < 2:
            raise ValueError("--moba-topk without --moba-block-size takes BCA's block, l/2: give --tokens-per-sample or "
                             "--moba-block-size.")
        block = int(length) // 2
    return MoBA(BlockRetrieval(block=int(block), topk=int(topk)))


def _record(args) -> None:
    """b written into the args where only l gave it: a later l (fine-tuning at another length) keeps the blocks."""
    if (getattr(args, "moba_topk", None) is not None and getattr(args, "moba_block_size", None) is None
            and getattr(args, "tokens_per_sample", None)):
        args.moba_block_size = int(args.tokens_per_sample) // 2


MOBA = register_design(DesignSpec(
    name="moba",
    summary="each query attends its own block and the k - 1 earlier blocks whose mean key it scores highest",
    source="Lu et al. 2025, MoBA: Mixture of Block Attention for Long-Context LLMs (arXiv 2502.13189), section 2.2",
    options=(
        DesignOption("moba_topk", int, None,
                     "MoBA (Lu et al. 2025): each query attends its own block and the k - 1 earlier blocks with the "
                     "highest <q, mean of the block's keys>; k counts the own block (the paper: 3); default: off"),
        DesignOption("moba_block_size", int, None,
                     "MoBA's block, in positions; default: BCA's block, --tokens-per-sample / 2"),
    ),
    build=_build,
    record=_record,
    refuses_logn="--logn on a MoBA model: log-n scaling counts the window's keys, and a MoBA query sees its own block "
                 "and k - 1 chosen blocks. Evaluate it without --logn.",
    left_padding="MoBA (its blocks count positions from the first column)",
))

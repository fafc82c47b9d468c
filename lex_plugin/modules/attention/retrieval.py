"""Block retrieval (:class:`BlockRetrieval`): which earlier blocks of keys each query attends besides its most recent
ones, chosen by the query; the value a design (MoBA) or an evaluation (``--bca --retrieval-blocks K``) hands the
executor, whose blocks kernel (``kernels.blocks``) runs it."""

from dataclasses import dataclass

__all__ = ["BlockRetrieval"]


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

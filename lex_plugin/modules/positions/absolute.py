"""Absolute position embeddings added to the token embeddings: sinusoidal and learned.

The baselines of the LeX paper's Table 2 ("Absolute") and of ALiBi's comparisons. Positions are the
token indices 0 .. L-1 of the sequence (with a key/value cache: the cached length plus the index of the
new token), so incremental decoding sees the same positions as a parallel forward.
"""

import math

import torch
from torch import Tensor, nn

from .scheme import PositionScheme, SchemeOption, SchemeSpec, register_position_scheme

__all__ = ["LearnedPositions", "SinusoidalPositions"]


class SinusoidalPositions(PositionScheme):
    """Vaswani et al. (2017), in fairseq's layout: row n = [sin(n w_0) .. sin(n w_{h-1}), cos(n w_0) ..
    cos(n w_{h-1})] (a zero column appended for odd C), w_i = 10000^(-i / (h - 1)), h = C // 2.

    No table size: rows are computed for any position, angles in float64, stored fp32 in one growing
    table (a plain tensor, not a buffer: never in checkpoints, never cast by ``model.half()``).

    Args:
        embed_dim: C (>= 4).
    """

    kind = "absolute"

    def __init__(self, embed_dim: int):
        super().__init__()
        if embed_dim < 4:
            raise ValueError(f"sinusoidal positions need --decoder-embed-dim >= 4, got {embed_dim}.")
        self.embed_dim = embed_dim
        half = embed_dim // 2
        self._freq = torch.exp(torch.arange(half, dtype=torch.float64, device="cpu") * -(math.log(10000.0) / (half - 1)))
        self._table = torch.zeros(0, embed_dim, device="cpu")

    def _build(self, cap: int, device) -> Tensor:
        n = torch.arange(cap, dtype=torch.float64, device="cpu")[:, None]
        angles = n * self._freq[None, :]
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
        if self.embed_dim % 2:
            table = torch.cat([table, torch.zeros(cap, 1, dtype=torch.float64, device="cpu")], dim=1)
        return table.to(device=device, dtype=torch.float32)

    def embed(self, start: int, length: int, device) -> Tensor:
        """Rows for positions start .. start + length - 1: (length, C) fp32 on ``device``."""
        end = start + length
        if self._table.size(0) < end or self._table.device != torch.device(device):
            self._table = self._build(max(end, 2 * self._table.size(0), 1024), device)
        return self._table[start:end]

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}"


class LearnedPositions(PositionScheme):
    """A learned (P, C) table, one row per position 0 .. P - 1 (GPT-2 / fairseq ``learned`` positions),
    initialised N(0, C^-0.5). State-dict name ``weight``.

    Args:
        num_positions: P, the longest sequence the model can take (default: the training length).
        embed_dim: C.

    Raises (embed):
        ValueError: a position >= P. The table has nothing there; evaluate at <= P tokens or use a
            scheme that extrapolates.
    """

    kind = "absolute"

    def __init__(self, num_positions: int, embed_dim: int):
        super().__init__()
        if num_positions <= 0:
            raise ValueError(f"learned positions need a positive table size, got {num_positions} (--max-target-positions).")
        self.num_positions = num_positions
        self.max_positions = num_positions
        self.weight = nn.Parameter(torch.empty(num_positions, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=embed_dim**-0.5)

    def embed(self, start: int, length: int, device) -> Tensor:
        """Rows for positions start .. start + length - 1: (length, C), the parameter's dtype."""
        end = start + length
        if end > self.num_positions:
            raise ValueError(
                f"--pos-emb learned has a table of {self.num_positions} positions; position {end - 1} is past it. "
                f"Evaluate with --tokens-per-sample <= {self.num_positions} (and no longer --eval-lengths), "
                "or train with a scheme that extrapolates (xpos, alibi, sinusoidal, ...)."
            )
        return self.weight[start:end]

    def extra_repr(self) -> str:
        return f"num_positions={self.num_positions}, embed_dim={self.weight.size(1)}"


def _validate_sinusoidal(config) -> None:
    if config.decoder_embed_dim < 4:
        raise ValueError(f"--pos-emb sinusoidal needs --decoder-embed-dim >= 4, got {config.decoder_embed_dim}.")


def _learned_size(config) -> int:
    """P: --max-target-positions, else the longest position training draws (the training length, or
    --random-positions L_MAX)."""
    size = config.max_target_positions or max(getattr(config, "tokens_per_sample", None) or 0,
                                               getattr(config, "random_positions", 0) or 0)
    if not size:
        raise ValueError("--pos-emb learned needs a table size: --max-target-positions (or --tokens-per-sample).")
    return int(size)


def _validate_learned(config) -> None:
    size, limit = _learned_size(config), getattr(config, "random_positions", 0) or 0
    if limit and size < limit:
        raise ValueError(f"--pos-emb learned with --random-positions {limit} needs --max-target-positions >= {limit} "
                         f"(a row for every position drawn), got {size}.")


register_position_scheme(SchemeSpec(
    "sinusoidal", "absolute", "sin/cos of n w_i added to the token embeddings", "Vaswani et al. 2017, section 3.5",
    lambda config, layer: SinusoidalPositions(config.decoder_embed_dim), validate=_validate_sinusoidal,
))
register_position_scheme(SchemeSpec(
    "learned", "absolute", "a learned row per position 0 .. P-1 (P = --max-target-positions, default l); no extrapolation",
    "Radford et al. 2019 (GPT-2); fairseq's learned positions",
    lambda config, layer: LearnedPositions(_learned_size(config), config.decoder_embed_dim),
    validate=_validate_learned,
    options=(SchemeOption("max_target_positions", int, None,
                          "rows of the learned position table (default: --tokens-per-sample, or --random-positions)"),),
))

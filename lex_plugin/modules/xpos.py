"""xPos: the extrapolatable position embedding of the LeX Transformer.

Sun et al., "A Length-Extrapolatable Transformer" (ACL 2023), section 3.2, Eq. 11-12 and Algorithm 1.

For head dimension d and pair index i = 0 .. d/2 - 1:

    theta_i = theta_base ** (-2i / d)                       (RoPE angles, Eq. 8)
    zeta_i  = (2i / d + gamma) / (1 + gamma)                 (Eq. 12, gamma = 0.4)

A query at position n is rotated by n * theta_i and scaled by zeta_i ** (n / B); a key at position m is
rotated by m * theta_i and scaled by zeta_i ** (-m / B) (B = scale base, 512). The pre-softmax logit then
carries zeta_i ** ((n - m) / B): it depends only on n - m (Eq. 6) and decays with distance (Eq. 11).

Numerics (the module's contract):

* Angles are formed in float64 (n * theta_i is exact to ~1e-16 relative at any n) and stored as fp32
  tables; the rotation and scaling are applied in fp32 and the result is cast back to the input dtype,
  whatever the model dtype (fp16, bf16).
* The scale exponent is taken relative to a centre c shared by the queries and keys of one call:
  queries get zeta ** ((n - c) / B), keys zeta ** (-(m - c) / B). The logit is unchanged in exact
  arithmetic (only n - m matters), and the exponents stay within +-(key span) / (2B) instead of growing
  with the absolute position. TorchScale's ``XPOS`` centres the same way.
* Tables live in a small per-module LRU cache keyed by (centre, direction, device), each covering
  positions 0 .. cap - 1 and sliced: one table serves every layer of a forward pass (the decoder owns one
  ``XPos`` and hands it to each layer) and every step of a generation. They are plain tensors,
  not buffers: they are never saved in checkpoints and never cast by ``model.half()``.
"""

from collections import OrderedDict
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["XPos", "apply_rotary_complex", "apply_rotary_scaled", "xpos_zeta", "rope_theta"]

# The scale centre is rounded to this many positions: exact in the logits (only n - m matters), and the
# exponent bound grows by at most CENTER_STEP / (2B).
CENTER_STEP = 256


def rope_theta(head_dim: int, theta_base: float = 10000.0, dtype=torch.float64) -> Tensor:
    """RoPE angle per pair: theta_i = theta_base ** (-2i / d), shape (d/2,). (Eq. 8; Su et al. 2021)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (theta_base ** (-2.0 * i / head_dim)).to(dtype)


def xpos_zeta(head_dim: int, gamma: float = 0.4, dtype=torch.float64) -> Tensor:
    """xPos decay per pair: zeta_i = (2i/d + gamma) / (1 + gamma), shape (d/2,), values in (0, 1). (Eq. 12)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((2.0 * i / head_dim + gamma) / (1.0 + gamma)).to(dtype)


def apply_rotary_scaled(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` (Algorithm 1: rot(x) = [-x1, x0, -x3, x2, ...]).

    Args:
        x: (..., L, d) any float dtype.
        cos, sin: (L, d/2) fp32, already multiplied by the per-pair scale (zeta ** (+-n/B) for xPos).

    Returns:
        x * cos + rot(x) * sin, computed in fp32 and cast back to ``x.dtype``; shape (..., L, d).
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return out.flatten(-2).to(x.dtype)


def apply_rotary_complex(x: Tensor, rotation: Tensor) -> Tensor:
    """``apply_rotary_scaled`` as one complex multiplication: pair (x0, x1) is x0 + i x1, times
    cos + i sin. The same arithmetic (two products and a sum per output) in one kernel instead of six,
    without the stacked copy, forward and backward.

    Args:
        x: (..., L, d) any float dtype.
        rotation: (L, d/2) complex64, cos + i sin (already scaled).

    Returns:
        (..., L, d) in ``x.dtype``, computed in fp32.
    """
    xf = x.float()
    if xf.stride(-1) != 1 or xf.storage_offset() % 2 or any(st % 2 for st in xf.stride()[:-1]):
        xf = xf.contiguous()  # view_as_complex needs each pair adjacent and aligned in memory
    z = torch.view_as_complex(xf.unflatten(-1, (-1, 2)))
    return torch.view_as_real(z * rotation).flatten(-2).to(x.dtype)


class XPos(nn.Module):
    """xPos applied to queries and keys of one attention call (LeX paper Eq. 12, Algorithm 1).

    Args:
        head_dim: d, the per-head dimension; must be even (pairs are rotated).
        scale_base: B in zeta ** (n / B); TorchScale's ``xpos_scale_base``. Default 512.
        gamma: gamma in zeta_i = (2i/d + gamma) / (1 + gamma). Default 0.4.
        theta_base: RoPE base. Default 10000.
        use_scale: False gives plain RoPE (zeta = 1), the paper's baseline (Su et al. 2021).
        scalar_zeta: one zeta = gamma / (1 + gamma) for every pair (LeX Table 4 ablation).
        rotation: False sets theta = 0: decay only, no rotation (LeX Table 4 ablation).
        cache_size: number of (centre, direction, device) tables kept.

    Raises:
        ValueError: odd ``head_dim``, non-positive ``scale_base`` or ``gamma``.
    """

    def __init__(
        self,
        head_dim: int,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        theta_base: float = 10000.0,
        use_scale: bool = True,
        scalar_zeta: bool = False,
        rotation: bool = True,
        cache_size: int = 8,
    ):
        super().__init__()
        if head_dim <= 0 or head_dim % 2 != 0:
            raise ValueError(
                f"xPos rotates pairs of dimensions, so the head dimension must be even; got {head_dim}. "
                "Choose --decoder-embed-dim / --decoder-attention-heads so that it is even."
            )
        if scale_base <= 0:
            raise ValueError(f"xPos scale base B must be > 0, got {scale_base} (--xpos-scale-base).")
        if gamma <= 0:
            raise ValueError(f"xPos gamma must be > 0 (zeta_0 = gamma / (1 + gamma)), got {gamma} (--xpos-gamma).")
        self.head_dim = head_dim
        self.scale_base = float(scale_base)
        self.gamma = float(gamma)
        self.theta_base = float(theta_base)
        self.use_scale = use_scale
        self.scalar_zeta = scalar_zeta
        self.rotation = rotation
        theta = rope_theta(head_dim, theta_base)
        self._theta = theta if rotation else torch.zeros_like(theta)  # (d/2,) float64, CPU
        zeta = xpos_zeta(head_dim, gamma)
        if scalar_zeta:
            zeta = torch.full_like(zeta, gamma / (1.0 + gamma))
        self._log_zeta = torch.log(zeta)  # (d/2,) float64, CPU
        self._cache: "OrderedDict[tuple, Tuple[Tensor, Tensor]]" = OrderedDict()
        self._cache_size = cache_size

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, scale_base={self.scale_base}, gamma={self.gamma}, "
            f"theta_base={self.theta_base}, use_scale={self.use_scale}, scalar_zeta={self.scalar_zeta}, "
            f"rotation={self.rotation}"
        )

    def tables(self, start: int, length: int, center: int, downscale: bool, device) -> Tuple[Tensor, Tensor]:
        """cos and sin tables for positions start .. start + length - 1, each (length, d/2) fp32.

        Both are multiplied by zeta ** (+-(n - center) / B): ``+`` for queries, ``-`` (``downscale``)
        for keys. One table per (center, downscale, device) covers positions 0 .. cap - 1 and is sliced;
        it grows geometrically, so a generation step reuses it instead of rebuilding N positions.
        """
        cos, sin, _ = self._entry(start, length, center, downscale, device)
        return cos[start : start + length], sin[start : start + length]

    def complex_table(self, start: int, length: int, center: int, downscale: bool, device) -> Tensor:
        """The same tables as one (length, d/2) complex64 tensor, cos + i sin (``apply_rotary_complex``)."""
        return self._entry(start, length, center, downscale, device)[2][start : start + length]

    def _entry(self, start: int, length: int, center: int, downscale: bool, device) -> Tuple[Tensor, Tensor, Tensor]:
        """The cached (cos, sin, cos + i sin) tables covering positions 0 .. >= start + length - 1."""
        if start < 0:
            raise ValueError(f"xPos positions start at 0, got start={start}")
        end = start + length
        key = (center, downscale, str(device))
        hit = self._cache.get(key)
        if hit is None or hit[0].size(0) < end:
            cap = max(end, 2 * hit[0].size(0) if hit is not None else 0, 256)
            hit = self._build(cap, center, downscale, device)
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return hit

    def _build(self, cap: int, center: int, downscale: bool, device) -> Tuple[Tensor, Tensor, Tensor]:
        work = torch.device("cpu") if torch.device(device).type == "mps" else device
        n = torch.arange(cap, dtype=torch.float64, device=work)
        angle = n[:, None] * self._theta.to(work)[None, :]
        cos, sin = torch.cos(angle), torch.sin(angle)
        if self.use_scale:
            exponent = (n - center)[:, None] / self.scale_base
            if downscale:
                exponent = -exponent
            scale = torch.exp(exponent * self._log_zeta.to(work)[None, :])
            cos, sin = cos * scale, sin * scale
        cos, sin = cos.to(device=device, dtype=torch.float32), sin.to(device=device, dtype=torch.float32)
        return cos, sin, torch.complex(cos, sin)

    def rotate(self, x: Tensor, start: int = 0, center: Optional[int] = None, downscale: bool = False) -> Tensor:
        """Apply xPos to one tensor.

        Args:
            x: (..., L, d) queries (``downscale=False``) or keys (``downscale=True``).
            start: position of x[..., 0, :].
            center: the centre c of the scale exponent; defaults to start + L // 2. Queries and keys
                that are multiplied together must use the same centre.

        Returns:
            Tensor of x's shape and dtype.
        """
        length = x.size(-2)
        if center is None:
            center = start + length // 2
        return apply_rotary_complex(x, self.complex_table(start, length, center, downscale, x.device))

    def forward(self, q: Tensor, k: Tensor, q_start: int, k_start: int = 0) -> Tuple[Tensor, Tensor]:
        """xPos on the queries and keys of one attention call.

        Args:
            q: (..., Lq, d) queries at positions q_start .. q_start + Lq - 1.
            k: (..., Lk, d) keys at positions k_start .. k_start + Lk - 1.

        Returns:
            (q', k') with q' . k'_m = sum_i Re[(q e^{i n theta}) conj(k e^{i m theta})] zeta_i^((n - m)/B),
            in the input dtypes. The shared centre is the middle of the key span, rounded down to a
            multiple of CENTER_STEP so that consecutive generation steps share one cached table.
        """
        center = (k_start + k.size(-2) // 2) // CENTER_STEP * CENTER_STEP
        return self.rotate(q, q_start, center, False), self.rotate(k, k_start, center, True)

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
* Tables live in a small per-module LRU cache keyed by (centre, direction, device), each covering a
  range of positions that grows geometrically and is sliced: one table serves every layer of a forward
  pass (the decoder owns one ``XPos`` and hands it to each layer) and every step of a generation. They
  are plain tensors, not buffers: never saved in checkpoints, never cast by ``model.half()``.
* ``scaling`` (``rope_scaling.RopeScaling``, an argument of every call, from the evaluation's
  ``AttentionSpec``) replaces theta_i by the scaled angles, divides the decay exponent by s for position
  interpolation, and multiplies queries and keys by YaRN's temperature; each scaling has its tables.
* Keys cached during generation are stored rotated at a centre c (``rotate(..., keys=True)``); when
  new positions move more than ``max_centre_offset(dtype)`` past c, the cache moves its centre and
  multiplies the stored keys by ``rescale_keys(c, c')`` = zeta^((c' - c)/B), one (d,) factor.
"""

from collections import OrderedDict
from typing import Optional, Tuple

import torch
from torch import Tensor

from .rope_scaling import RopeScaling
from .scheme import PositionScheme, SchemeOption, SchemeSpec, head_dim, register_position_scheme

__all__ = ["XPos", "apply_rotary_complex", "xpos_zeta", "rope_theta"]

# Largest |exponent| of zeta^(+-(n - c)/B) allowed in a stored key or query, by dtype: e^60 stays far
# inside fp32 / bf16 (e^88); fp16 ends at 65504 = e^11, and keys themselves may be ~e^5 large.
MAX_LOG_SCALE = {torch.float16: 5.0}
DEFAULT_MAX_LOG_SCALE = 60.0

# The defaults of LeX Eq. 12 (gamma, B) and RoPE's base; the model config reads them from here.
GAMMA = 0.4
SCALE_BASE = 512.0
THETA_BASE = 10000.0

# The scale centre is rounded to this many positions: exact in the logits (only n - m matters), and the
# exponent bound grows by at most CENTER_STEP / (2B).
CENTER_STEP = 256
# Rows of a freshly built table at least (generation steps slice it for this many positions).
TABLE_ROWS = 4096


def rope_theta(head_dim: int, theta_base: float = THETA_BASE, dtype=torch.float64) -> Tensor:
    """RoPE angle per pair: theta_i = theta_base ** (-2i / d), shape (d/2,). (Eq. 8; Su et al. 2021)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")  # (CPU tables, whatever the default device)
    return (theta_base ** (-2.0 * i / head_dim)).to(dtype)


def xpos_zeta(head_dim: int, gamma: float = GAMMA, dtype=torch.float64) -> Tensor:
    """xPos decay per pair: zeta_i = (2i/d + gamma) / (1 + gamma), shape (d/2,), values in (0, 1). (Eq. 12)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")
    return ((2.0 * i / head_dim + gamma) / (1.0 + gamma)).to(dtype)


def apply_rotary_complex(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` (Algorithm 1: x * cos + rot(x) * sin, rot(x) = [-x1, x0, -x3, x2, ...])
    as one complex multiplication: pair (x0, x1) is x0 + i x1, times cos + i sin (already scaled). Two
    products and a sum per output in one kernel, forward and backward.

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


class XPos(PositionScheme):
    """xPos applied to queries and keys (LeX paper Eq. 12, Algorithm 1); RoPE with ``use_scale=False``.

    Args:
        head_dim: d, the per-head dimension; must be even (pairs are rotated).
        scale_base: B in zeta ** (n / B); TorchScale's ``xpos_scale_base``. Default 512.
        gamma: gamma in zeta_i = (2i/d + gamma) / (1 + gamma). Default 0.4.
        theta_base: RoPE base. Default 10000.
        use_scale: False gives plain RoPE (zeta = 1), the paper's baseline (Su et al. 2021).
        scalar_zeta: one zeta = gamma / (1 + gamma) for every pair (LeX Table 4 ablation).
        rotation: False sets theta = 0: decay only, no rotation (LeX Table 4 ablation).
        cache_size: number of (centre, direction, device, range) tables kept.

    Raises:
        ValueError: odd ``head_dim``, non-positive ``scale_base`` or ``gamma``.
    """

    kind = "rotary"
    center_step = CENTER_STEP

    def __init__(
        self,
        head_dim: int,
        scale_base: float = SCALE_BASE,
        gamma: float = GAMMA,
        theta_base: float = THETA_BASE,
        use_scale: bool = True,
        scalar_zeta: bool = False,
        rotation: bool = True,
        cache_size: int = 16,
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
        self._trained_theta = theta if rotation else torch.zeros_like(theta)  # (d/2,) float64, CPU
        zeta = xpos_zeta(head_dim, gamma)
        if scalar_zeta:
            zeta = torch.full_like(zeta, gamma / (1.0 + gamma))
        self._log_zeta = torch.log(zeta)  # (d/2,) float64, CPU
        self._steepest_decay = float(-self._log_zeta.min())  # -log zeta_0: what bounds the scale's range
        self._cache: "OrderedDict[tuple, Tuple[int, Tensor]]" = OrderedDict()
        self._cache_size = cache_size

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, scale_base={self.scale_base}, gamma={self.gamma}, "
            f"theta_base={self.theta_base}, use_scale={self.use_scale}, scalar_zeta={self.scalar_zeta}, "
            f"rotation={self.rotation}"
        )

    def _angles(self, scaling: Optional[RopeScaling]) -> Tuple[Tensor, float, float]:
        """(theta (d/2,) float64, decay divisor, attention scale) under ``scaling`` (None: as trained)."""
        if scaling is None:
            return self._trained_theta, 1.0, 1.0
        theta = scaling.angles(rope_theta(self.head_dim, self.theta_base), self.head_dim, self.theta_base)
        return (theta if self.rotation else torch.zeros_like(theta)), scaling.decay_divisor, scaling.attention_scale

    def complex_table(self, start: int, length: int, center: int, keys: bool, device,
                      scaling: Optional[RopeScaling] = None) -> Tensor:
        """cos + i sin for positions start .. start + length - 1, one (length, d/2) complex64 tensor
        (``apply_rotary_complex``), multiplied by zeta ** (+-(n - center) / B): ``+`` for queries, ``-`` for
        keys; under ``scaling`` (``rope_scaling.RopeScaling``, None: as trained) the angles are the scaled
        ones, the decay exponent is divided by its ``decay_divisor`` and both directions carry its
        ``attention_scale`` (YaRN's temperature).

        One table per (scaling, center, direction, device, start // TABLE_ROWS) covers a range of positions and is
        sliced; a request outside it rebuilds it from the requested start over max(2 * length, TABLE_ROWS) positions,
        so consecutive generation steps rebuild once every TABLE_ROWS steps and memory does not grow with
        the position. Ranges far apart keep a table each: a position map's step rotates its query at n and at a remapped
        n / G (Self-Extend), which under one table per direction rebuilt it twice per layer and step (sin and cos over
        TABLE_ROWS rows: 60% of a 16k Self-Extend step at l = 256). Angles and scales are formed in float64.

        Raises:
            ValueError: a negative ``start``.
        """
        if start < 0:
            raise ValueError(f"xPos positions start at 0, got start={start}")
        if not self.use_scale:
            center = 0  # RoPE: one table whatever the centre
        key = (scaling, center, keys, str(device), start // TABLE_ROWS)  # far-apart ranges keep a table each
        hit = self._cache.get(key)
        if hit is None or start < hit[0] or start + length > hit[0] + hit[1].size(0):
            # a table from here on, with room for what follows (generation steps): memory stays bounded
            hit = (start, self._build(start, max(2 * length, TABLE_ROWS), center, keys, device, scaling))
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return hit[1][start - hit[0] : start - hit[0] + length]

    def _build(self, low: int, size: int, center: int, keys: bool, device, scaling: Optional[RopeScaling]) -> Tensor:
        work = torch.device("cpu") if torch.device(device).type == "mps" else device
        return self._rotation_at(torch.arange(low, low + size, dtype=torch.float64, device=work), center, keys,
                                 device, scaling)

    def _rotation_at(self, n: Tensor, center: int, keys: bool, device, scaling: Optional[RopeScaling]) -> Tensor:
        """(..., d/2) complex64 cos + i sin (times the scales) at float64 positions ``n`` (...,)."""
        work = torch.device("cpu") if torch.device(device).type == "mps" else device
        n = n.to(work)
        if not self.use_scale:
            center = 0
        theta, decay_divisor, attention_scale = self._angles(scaling)
        angle = n[..., None] * theta.to(work)
        cos, sin = torch.cos(angle), torch.sin(angle)
        if self.use_scale:
            exponent = (n - center)[..., None] / (self.scale_base * decay_divisor)
            if keys:
                exponent = -exponent
            scale = torch.exp(exponent * self._log_zeta.to(work))
            cos, sin = cos * scale, sin * scale
        if attention_scale != 1.0:  # YaRN's temperature, on queries and keys alike
            cos, sin = cos * attention_scale, sin * attention_scale
        return torch.complex(cos.float(), sin.float()).to(device)

    def rotate(self, x: Tensor, *, start: int = 0, center: Optional[int] = None, keys: bool = False,
               scaling: Optional[RopeScaling] = None) -> Tensor:
        """Apply xPos to queries (``keys=False``: zeta^((n - center)/B)) or keys (``keys=True``:
        zeta^(-(m - center)/B)).

        Args:
            x: (..., L, d) any float dtype.
            start: position of x[..., 0, :].
            center: the centre c of the scale exponent; defaults to start + L // 2. Queries and keys
                that are multiplied together must use the same centre.
            scaling: a RoPE scaling (``complex_table``), or None: as trained.

        Returns:
            Tensor of x's shape and dtype (computed in fp32).
        """
        length = x.size(-2)
        if center is None:
            center = start + length // 2
        return apply_rotary_complex(x, self.complex_table(start, length, center, keys, x.device, scaling))

    def rescale_keys(self, old_center: int, new_center: int, device, scaling: Optional[RopeScaling] = None) -> Optional[Tensor]:
        """(d,) fp32 factor zeta^((new - old)/B) per dimension (pairs repeated), or None for RoPE."""
        if not self.use_scale or old_center == new_center:
            return None
        divisor = self._angles(scaling)[1]
        factor = torch.exp((new_center - old_center) / (self.scale_base * divisor) * self._log_zeta)  # (d/2,)
        return factor.repeat_interleave(2).float().to(device)

    def max_center_offset(self, dtype, scaling: Optional[RopeScaling] = None) -> Optional[int]:
        """Positions a stored query or key may lie from its centre with |log scale| <= MAX_LOG_SCALE[dtype]."""
        if not self.use_scale:
            return None
        bound = MAX_LOG_SCALE.get(dtype, DEFAULT_MAX_LOG_SCALE)
        divisor = self._angles(scaling)[1]
        return max(CENTER_STEP, int(bound * self.scale_base * divisor / self._steepest_decay))

    def rotate_at(self, x: Tensor, positions: Tensor, *, center: int, keys: bool,
                  scaling: Optional[RopeScaling] = None) -> Tensor:
        """xPos / RoPE of x (..., d) at ``positions`` (>= 0, broadcastable to ``x.shape[:-1]``) with the scale
        centre ``center``: int64 positions gather rows of one table; floating ones (fractional positions of a
        position map, Leaky ReRoPE's m / k) get angles and scales formed in float64 at each. Returns x's shape
        and dtype (fp32 math); ``x`` itself where the rotation is the identity (every position 0 with the
        centre 0 and no attention scale: ReRoPE's capped keys), a slice of the table for consecutive positions."""
        if positions.is_floating_point():
            return apply_rotary_complex(x, self._rotation_at(positions.double(), center, keys, x.device, scaling))
        low, high = int(positions.min()), int(positions.max())
        if high == 0 and (center == 0 or not self.use_scale) and (scaling is None or scaling.attention_scale == 1.0):
            return x  # angle 0, scale zeta^0: no work (a position map's keys all at 0)
        table = self.complex_table(low, high - low + 1, center, keys, x.device, scaling)
        if positions.dim() == 1 and positions.numel() == high - low + 1 and bool((positions.diff() == 1).all()):
            return apply_rotary_complex(x, table)  # consecutive positions: the table as it is, no gather
        return apply_rotary_complex(x, table[positions - low])


ROPE_THETA = SchemeOption("rope_theta", float, THETA_BASE, "RoPE / xPos base of theta_i = base^(-2i/d)")
XPOS_OPTIONS = (
    SchemeOption("xpos_scale_base", float, SCALE_BASE, "xPos scale base B in zeta^(n/B) (Eq. 12)"),
    SchemeOption("xpos_gamma", float, GAMMA, "xPos gamma in zeta_i = (2i/d + gamma)/(1 + gamma) (Eq. 12)"),
    ROPE_THETA,
    SchemeOption("xpos_scalar_zeta", bool, False, "ablation (LeX Table 4): one zeta = gamma/(1 + gamma) for every pair"),
    SchemeOption("xpos_no_rotation", bool, False, "ablation (LeX Table 4): theta = 0, decay only, no rotation"),
)


def _validate_rotary(config) -> None:
    d = head_dim(config)
    if d % 2:
        raise ValueError(
            f"--pos-emb {config.pos_emb} rotates pairs of dimensions, so the head dimension (--decoder-embed-dim / "
            f"--decoder-attention-heads = {d}) must be even."
        )
    if config.rope_theta <= 0:
        raise ValueError(f"--rope-theta must be > 0, got {config.rope_theta}.")


def _validate_xpos(config) -> None:
    _validate_rotary(config)
    if config.xpos_scale_base <= 0 or config.xpos_gamma <= 0:
        raise ValueError(f"--xpos-scale-base ({config.xpos_scale_base}) and --xpos-gamma ({config.xpos_gamma}) must be > 0.")


register_position_scheme(SchemeSpec(
    "xpos", "rotary", "rotation n theta_i of RoPE, queries scaled by zeta_i^(n/B), keys by zeta_i^(-m/B) (default)",
    "Sun et al. 2023 (LeX), Eq. 12, Algorithm 1",
    lambda config, layer: XPos(head_dim(config), config.xpos_scale_base, config.xpos_gamma, config.rope_theta,
                               use_scale=True, scalar_zeta=config.xpos_scalar_zeta, rotation=not config.xpos_no_rotation),
    validate=_validate_xpos, options=XPOS_OPTIONS,
))
register_position_scheme(SchemeSpec(
    "rope", "rotary", "rotation of query/key pairs by n theta_i (xPos with zeta = 1)", "Su et al. 2021 (RoFormer), Eq. 34",
    lambda config, layer: XPos(head_dim(config), theta_base=config.rope_theta, use_scale=False),
    validate=_validate_rotary, options=(ROPE_THETA,),
))

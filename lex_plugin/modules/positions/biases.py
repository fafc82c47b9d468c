"""Relative position biases added to the attention logits: ALiBi, Sandwich, smoothed Sandwich, KERPLE
(log and power), T5.

Every scheme here is a function of the distance r = n - m >= 0 between a query at n and a key at m
(causal attention never looks ahead), one value per head:

    logit_h(n, m) = q_n . k_m / sqrt(d) + f_h(n - m)

so the (H, Tq, Tk) bias of any block of queries against any block of keys is gathered from a 1-D
table f_h(0 .. r_max) over the distances that block contains. Nothing is ever sized by a maximum
length: the table covers exactly the distances asked for, at any length, in training, under BCA /
sliding windows (window-local positions give the same distances) and during incremental decoding.
Tables are computed in fp32 (float64 where the formula loses precision in fp32) whatever the model
dtype; callers cast the final bias to the attention dtype.

Schemes (``--pos-emb``):

* ``alibi``: f_h(r) = -m_h r, with the geometric slopes of Press et al. (ICLR 2022, section 3):
  m_h = 2^(-8h/H') for H' = H a power of two; otherwise the slopes of the nearest lower power of two
  followed by every other slope of twice that many heads.
* ``sandwich``: Chi et al. (receptive-field paper, Eq. 6 and Appendix E): with sinusoidal p_n of
  dimension d_bar (default 128, base 10000), p_n . p_m = sum_k cos((n - m) w_k), w_k = 10000^(-2k/d_bar);
  f_h(r) = (p_n . p_m - d_bar / 2) / rho_h with compression ratios rho_h = 8h / H, h = 1 .. H.
* ``smoothed_sandwich``: the log curve Chi et al. fit to Sandwich's bias (receptive-field paper,
  section 6.2, Figure 9, Table 3 "Smoothed"): f(r) = -0.825 log(1 + r) - 0.8, the same for every head.
* ``kerple_log``: Chi et al. (KERPLE, NeurIPS 2022), the logarithmic kernel
  f_h(r) = -r1_h log(1 + r2_h r), r1, r2 > 0 learnable per head (clamped at ``min_value``).
* ``kerple_power``: KERPLE's power kernel f_h(r) = -r1_h r^(r2_h), r1 > 0 and 0 < r2 <= 2 learnable per
  head (KERPLE's c - r1 |m - n|^r2 without the constant c, which softmax ignores).
* ``t5``: Raffel et al. (2020): a learnable scalar per head and log-spaced distance bucket
  (``num_buckets`` = 32, ``max_distance`` = 128, causal buckets), TorchScale's ``RelativePositionBias``.
"""

import math
from collections import OrderedDict
from typing import List

import torch
from torch import Tensor, nn

from .scheme import PositionScheme, SchemeOption, SchemeSpec, register_position_scheme

__all__ = ["ALiBi", "DistanceBias", "KerpleLog", "KerplePower", "Sandwich", "SmoothedSandwich", "T5Bias", "alibi_slopes"]

# Block biases up to this many entries (16 MB in fp32) are cached. Larger ones come from chunked full
# attention at long lengths: each chunk is asked for once per layer, in order, so an LRU cache of a few
# would hold hundreds of MB and never hit; gathering them again is cheap next to the attention itself.
CACHE_ELEMENTS = 2**22

# Defaults of the schemes' options (the model config reads them from here).
SANDWICH_DIM = 128
T5_NUM_BUCKETS = 32
T5_MAX_DISTANCE = 128


class DistanceBias(PositionScheme):
    """Base of the additive relative biases: subclasses define ``distance_bias`` (one value per head and
    distance); ``bias`` gathers the (H, Tq, Tk) block bias from it.

    Args:
        num_heads: H.
        cache_size: parameter-free schemes keep this many recent block biases of at most
            ``CACHE_ELEMENTS`` entries (every layer of a forward pass and every window of BCA asks for the
            same ones); learnable schemes never cache.
    """

    kind = "bias"
    learnable = False

    def __init__(self, num_heads: int, cache_size: int = 8):
        super().__init__()
        if num_heads <= 0:
            raise ValueError(f"a position bias needs at least one head, got {num_heads}.")
        self.num_heads = num_heads
        self._cache: "OrderedDict[tuple, Tensor]" = OrderedDict()
        self._cache_size = cache_size

    def distance_bias(self, distance: Tensor) -> Tensor:
        """f_h(r) for r = ``distance``: (D,) int64 >= 0 -> (H, D) fp32."""
        raise NotImplementedError

    def bias_at(self, query: Tensor, key: Tensor) -> Tensor:
        """f_h(n - m) between positions ``query`` and ``key`` (broadcasting int64 tensors; future keys get
        f_h(0), a placeholder the caller masks): (H, *shape) fp32."""
        distance = (query - key).clamp(min=0)
        low, high = int(distance.min()), int(distance.max())
        table = self.distance_bias(torch.arange(low, high + 1, device=distance.device)).float()  # (H, D)
        return table[:, distance - low]

    def bias(self, q_start: int, q_len: int, k_start: int, k_len: int, device) -> Tensor:
        """Bias of queries at q_start .. q_start + q_len - 1 against keys at k_start .. k_start + k_len - 1.

        Only distances n - m matter, so the positions may be absolute or local to a window. Entries with
        m > n (future keys, which the caller masks) hold a finite placeholder.

        Returns:
            (H, q_len, k_len) fp32 on ``device``.
        """
        key = (q_start, q_len, k_start, k_len, str(device))
        if not self.learnable:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        q = torch.arange(q_start, q_start + q_len, device=device)
        k = torch.arange(k_start, k_start + k_len, device=device)
        rel = (q[:, None] - k[None, :]).clamp_(min=0)  # (Tq, Tk)
        low = max(0, q_start - (k_start + k_len - 1))  # smallest distance present
        high = max(0, q_start + q_len - 1 - k_start)  # largest
        table = self.distance_bias(torch.arange(low, high + 1, device=device))  # (H, D)
        bias = table[:, (rel - low).clamp_(min=0)]
        if not self.learnable and bias.numel() <= CACHE_ELEMENTS:
            self._cache[key] = bias
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return bias


def alibi_slopes(num_heads: int) -> List[float]:
    """ALiBi head slopes m_1 .. m_H (Press et al. 2022, section 3 and their reference code): the geometric
    sequence starting at and multiplied by 2^(-8/H) for H a power of two; otherwise the slopes of the
    largest power of two p < H, then slopes 0, 2, 4, ... of 2p heads, H in all."""
    def power_of_two(n: int) -> List[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads <= 0:
        raise ValueError(f"ALiBi needs at least one head, got {num_heads}.")
    p = 2 ** int(math.floor(math.log2(num_heads)))
    if p == num_heads:
        return power_of_two(num_heads)
    return power_of_two(p) + power_of_two(2 * p)[0::2][: num_heads - p]


class ALiBi(DistanceBias):
    """Attention with Linear Biases: f_h(r) = -m_h r (Press et al., ICLR 2022). Shape (H,) slopes,
    float64 internally (r * m_h is exact to fp32 rounding at any r)."""

    def __init__(self, num_heads: int):
        super().__init__(num_heads)
        self._slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64, device="cpu")

    def distance_bias(self, distance: Tensor) -> Tensor:
        slopes = self._slopes.to(distance.device)
        return (-slopes[:, None] * distance.double()[None, :]).float()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class Sandwich(DistanceBias):
    """Sandwich (Chi et al., receptive-field paper, Eq. 6 and Appendix E): the inner product of d_bar-dim
    sinusoidal embeddings, p_n . p_m - d_bar/2 = sum_k (cos((n - m) w_k) - 1), divided per head by the
    compression ratio rho_h = 8h / H. Values are <= 0, 0 at distance 0.

    Args:
        num_heads: H.
        dim: d_bar (even), default 128.
        base: sinusoid base, default 10000.

    Raises:
        ValueError: d_bar odd or not positive.
    """

    def __init__(self, num_heads: int, dim: int = SANDWICH_DIM, base: float = 10000.0):
        super().__init__(num_heads)
        if dim <= 0 or dim % 2:
            raise ValueError(f"Sandwich's d_bar must be positive and even, got {dim} (--sandwich-dim).")
        self.dim = dim
        self.base = base
        k = torch.arange(dim // 2, dtype=torch.float64, device="cpu")
        self._freq = base ** (-2.0 * k / dim)  # (d_bar/2,) float64
        self._ratio = torch.arange(1, num_heads + 1, dtype=torch.float64, device="cpu") * 8.0 / num_heads  # (H,)

    def distance_bias(self, distance: Tensor) -> Tensor:
        # float64: r * w_k must be exact for cos at large r
        angles = distance.double()[:, None] * self._freq.to(distance.device)[None, :]  # (D, d_bar/2)
        dot = torch.cos(angles).sum(-1) - self.dim / 2  # (D,)
        return (dot[None, :] / self._ratio.to(distance.device)[:, None]).float()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}, base={self.base}"


class KerpleLog(DistanceBias):
    """KERPLE's logarithmic kernel (Chi et al., NeurIPS 2022): f_h(r) = -r1_h log(1 + r2_h r), with
    learnable r1, r2 > 0 per head: parameters ``r1``, ``r2`` of shape (H,), initialised uniform in
    (0, 2) and (0, 1) as in KERPLE's code, clamped at ``min_value`` when used. Computed in fp32.
    """

    learnable = True

    def __init__(self, num_heads: int, min_value: float = 1e-2):
        super().__init__(num_heads)
        self.min_value = min_value
        self.r1 = nn.Parameter(torch.rand(num_heads) * 2)
        self.r2 = nn.Parameter(torch.rand(num_heads))

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1 = self.r1.float().clamp(min=self.min_value)
        r2 = self.r2.float().clamp(min=self.min_value)
        return -r1[:, None] * torch.log1p(r2[:, None] * distance.float()[None, :])

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, min_value={self.min_value}"


class SmoothedSandwich(DistanceBias):
    """Smoothed Sandwich (Chi et al., receptive-field paper, section 6.2, Figure 9 and Table 3 "Smoothed"):
    the least-squares log fit of Sandwich's temporal bias, f(r) = -0.825 log(1 + r) - 0.8, one curve for
    every head; parameter-free. Computed in float64, returned fp32."""

    SLOPE, OFFSET = 0.825, 0.8

    def distance_bias(self, distance: Tensor) -> Tensor:
        curve = (-self.SLOPE * torch.log1p(distance.double()) - self.OFFSET).float()  # (D,)
        return curve[None, :].expand(self.num_heads, -1)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class KerplePower(KerpleLog):
    """KERPLE's power kernel (Chi et al., NeurIPS 2022, section 3.2): f_h(r) = -r1_h r^(r2_h) with learnable
    r1 > 0 and 0 < r2 <= 2 per head: parameters ``r1``, ``r2`` of shape (H,), initialised uniform in (0, 2)
    and (0, 1) as in KERPLE's code, clamped to [min_value, inf) and [min_value, 2] when used. r^(r2) is
    formed as exp(r2 log r) with r = 0 mapped to 0, so gradients stay finite at distance 0. Computed in fp32.
    Parameters and initialisation are :class:`KerpleLog`'s.
    """

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1 = self.r1.float().clamp(min=self.min_value)
        r2 = self.r2.float().clamp(min=self.min_value, max=2.0)
        r = distance.float()[None, :]
        power = torch.exp(r2[:, None] * torch.log(r.clamp(min=1.0)))  # log(1) = 0 at r = 0: finite gradients
        return torch.where(r > 0, -r1[:, None] * power, torch.zeros_like(power))


def t5_buckets(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """T5's causal bucket of each distance r = n - m >= 0 (Raffel et al. 2020, section 2.1; the arithmetic of
    TorchScale's ``RelativePositionBias._relative_position_bucket`` with ``bidirectional=False``, tested
    against it): r itself below num_buckets / 2, then log-spaced up to ``max_distance``, the last bucket beyond.

    Args:
        distance: (...) int64 distances (negative ones count as 0).

    Returns:
        (...) int64 bucket indices in [0, num_buckets).
    """
    n = distance.clamp(min=0)
    exact = num_buckets // 2
    # log(0) = -inf where n = 0: those positions take the exact branch; the float is computed in fp32
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, large)


class T5Table(nn.Module):
    """The (num_buckets, H) table of T5's bias, under TorchScale's names (``relative_attention_bias``)."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)


class T5Bias(DistanceBias):
    """T5's relative position bias (Raffel et al., 2020, section 2.1): one learnable scalar per head and
    distance bucket; exact buckets for r < num_buckets / 2, log-spaced up to ``max_distance``, the last
    bucket beyond (:func:`t5_buckets`). The (num_buckets, H) table and its state-dict name
    ``t5.relative_attention_bias.weight`` are TorchScale's ``RelativePositionBias``'s (causal).
    """

    learnable = True

    def __init__(self, num_heads: int, num_buckets: int = T5_NUM_BUCKETS, max_distance: int = T5_MAX_DISTANCE):
        super().__init__(num_heads)
        if num_buckets < 2 or max_distance < num_buckets // 2:
            raise ValueError(
                f"T5 bias needs --t5-num-buckets >= 2 and --t5-max-distance >= buckets / 2; got {num_buckets}, {max_distance}."
            )
        self.t5 = T5Table(num_heads, num_buckets, max_distance)

    def buckets(self, distance: Tensor) -> Tensor:
        """Bucket index of each distance r >= 0: (D,) int64 -> (D,) int64 in [0, num_buckets)."""
        return t5_buckets(distance, self.t5.num_buckets, self.t5.max_distance)

    def distance_bias(self, distance: Tensor) -> Tensor:
        return self.t5.relative_attention_bias(self.buckets(distance)).float().t()


def _heads(config) -> int:
    return config.decoder_attention_heads


def _validate_sandwich(config) -> None:
    if config.sandwich_dim <= 0 or config.sandwich_dim % 2:
        raise ValueError(f"--sandwich-dim must be positive and even, got {config.sandwich_dim}.")


def _validate_t5(config) -> None:
    if config.t5_num_buckets < 2 or config.t5_max_distance < config.t5_num_buckets // 2:
        raise ValueError(
            f"--t5-num-buckets must be >= 2 and --t5-max-distance >= buckets / 2; got {config.t5_num_buckets}, "
            f"{config.t5_max_distance}."
        )


for _spec in (
    SchemeSpec("alibi", "bias", "-m_h (n - m), geometric head slopes m_h", "Press et al. 2022 (ALiBi), section 3",
               lambda config, layer: ALiBi(_heads(config))),
    SchemeSpec("sandwich", "bias", "(p_n . p_m - d_bar/2) / rho_h from d_bar-dim sinusoids (--sandwich-dim)",
               "Chi et al. 2023 (receptive field), Eq. 6, Appendix E",
               lambda config, layer: Sandwich(_heads(config), config.sandwich_dim), validate=_validate_sandwich,
               options=(SchemeOption("sandwich_dim", int, SANDWICH_DIM,
                                     "Sandwich's d_bar: dimension of its sinusoids (Chi et al., Eq. 6)"),)),
    SchemeSpec("smoothed_sandwich", "bias", "-0.825 log(1 + |n - m|) - 0.8, every head",
               "Chi et al. 2023 (receptive field), section 6.2, Table 3 'Smoothed'",
               lambda config, layer: SmoothedSandwich(_heads(config))),
    SchemeSpec("kerple_log", "bias", "-r1_h log(1 + r2_h (n - m)), learnable r1, r2 > 0 per layer and head",
               "Chi et al. 2022 (KERPLE), section 3.2, logarithmic variant",
               lambda config, layer: KerpleLog(_heads(config)), per_layer=True),
    SchemeSpec("kerple_power", "bias", "-r1_h (n - m)^r2_h, learnable r1 > 0, 0 < r2 <= 2 per layer and head",
               "Chi et al. 2022 (KERPLE), section 3.2, power variant",
               lambda config, layer: KerplePower(_heads(config)), per_layer=True),
    SchemeSpec("t5", "bias", "learned scalar per head and log-spaced distance bucket (--t5-num-buckets, --t5-max-distance)",
               "Raffel et al. 2020 (T5), section 2.1",
               lambda config, layer: T5Bias(_heads(config), config.t5_num_buckets, config.t5_max_distance),
               validate=_validate_t5,
               options=(SchemeOption("t5_num_buckets", int, T5_NUM_BUCKETS, "T5 bias: number of distance buckets"),
                        SchemeOption("t5_max_distance", int, T5_MAX_DISTANCE,
                                     "T5 bias: distances from here on share the last bucket"))),
):
    register_position_scheme(_spec)

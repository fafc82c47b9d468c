"""RoPE scaling at evaluation: stretch a rotary model's positions or frequencies past its training length.

A registry of the published variants (``ROPE_SCALINGS``), each a function of the RoPE angles
theta_i = base^(-2i/d) (float64, (d/2,)), the factor s, d, the base and the training length l, returning
the new angles; :class:`RopeScaling` bundles one choice with what else it changes:

* ``linear``: position interpolation (Chen et al. 2023, "Extending Context Window of Large Language
  Models via Positional Interpolation", Eq. 4): position n becomes n / s, i.e. theta_i' = theta_i / s.
* ``ntk``: NTK-aware base scaling (bloc97, 2023; YaRN paper section 3.2, Eq. 12-13): the base becomes
  base * s^(d / (d - 2)), i.e. theta_i' = theta_i * s^(-2i / (d - 2)): the highest frequency is kept, the
  lowest is interpolated by s.
* ``yarn``: YaRN (Peng et al. 2023, section 3.2 "NTK-by-parts" Eq. 16-18 and 3.4 Eq. 21-22): with the
  wavelength lambda_i = 2 pi / theta_i and r_i = l / lambda_i, ramp(r) = 0 below alpha, 1 above beta,
  linear between (alpha = 1, beta = 32); theta_i' = (1 - ramp(r_i)) theta_i / s + ramp(r_i) theta_i; and
  the attention temperature sqrt(1/t) = 0.1 ln s + 1 multiplies queries and keys (logits by its square).

xPos's decay zeta^((n - m)/B) under scaling (a choice this module makes and documents): ``linear``
interpolates positions, so the decay sees the interpolated positions too (exponent (n - m) / (s B)): the
model meets the same (rotation, decay) pairs as in training. ``ntk`` and ``yarn`` change frequencies, not
positions, so the decay is left as trained (exponent (n - m) / B).

A factor of 1 is the identity in every variant. ``factor="auto"`` is resolved by the caller as
max(1, evaluation length / l) (:func:`resolve_factor`).
"""

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Union

import torch
from torch import Tensor

__all__ = ["ROPE_SCALINGS", "RopeScaling", "resolve_factor", "rope_scaling_from_options", "YARN_ALPHA", "YARN_BETA"]

YARN_ALPHA = 1.0  # YaRN's ramp bounds (section 3.2, the values the paper uses for LLaMA)
YARN_BETA = 32.0


def _linear(theta: Tensor, s: float, d: int, base: float, l: Optional[int]) -> Tensor:
    return theta / s


def _ntk(theta: Tensor, s: float, d: int, base: float, l: Optional[int]) -> Tensor:
    i = torch.arange(theta.numel(), dtype=torch.float64)
    return theta * s ** (-2.0 * i / (d - 2))


def _yarn(theta: Tensor, s: float, d: int, base: float, l: Optional[int]) -> Tensor:
    r = l * theta / (2 * math.pi)  # l / wavelength
    ramp = ((r - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
    return (1 - ramp) * theta / s + ramp * theta


ROPE_SCALINGS: Dict[str, Callable[[Tensor, float, int, float, Optional[int]], Tensor]] = {
    "linear": _linear,
    "ntk": _ntk,
    "yarn": _yarn,
}


@dataclass(frozen=True)
class RopeScaling:
    """One RoPE scaling: ``kind`` in :data:`ROPE_SCALINGS`, factor s > 0, and the training length l
    (YaRN's ramp needs it).

    Raises:
        ValueError: an unknown kind, s <= 0, or ``yarn`` without l.
    """

    kind: str
    factor: float
    training_length: Optional[int] = None

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)}, got {self.kind!r}.")
        if not self.factor > 0:
            raise ValueError(f"--rope-scaling-factor must be > 0 (or auto), got {self.factor}.")
        if self.kind == "yarn" and not self.training_length:
            raise ValueError("--rope-scaling yarn needs the training length l (the checkpoint's, or --training-length).")

    def angles(self, theta: Tensor, head_dim: int, theta_base: float) -> Tensor:
        """The scaled angles theta' ((d/2,) float64) from RoPE's ``theta``."""
        return ROPE_SCALINGS[self.kind](theta.double(), float(self.factor), head_dim, theta_base, self.training_length)

    @property
    def decay_divisor(self) -> float:
        """What xPos's decay exponent (n - m) / B is further divided by: s for ``linear``, else 1."""
        return float(self.factor) if self.kind == "linear" else 1.0

    @property
    def attention_scale(self) -> float:
        """The factor on queries and keys: YaRN's 0.1 ln s + 1 (s > 1), else 1."""
        if self.kind == "yarn" and self.factor > 1:
            return 0.1 * math.log(self.factor) + 1.0
        return 1.0

    def __str__(self) -> str:
        return f"{self.kind}(s={self.factor:g})"


def resolve_factor(factor: Union[str, float], evaluation_length: Optional[int], training_length: Optional[int]) -> float:
    """s from ``--rope-scaling-factor``: a positive number, or ``auto`` = max(1, evaluation length / l).

    Raises:
        ValueError: ``auto`` without an evaluation length or l; a factor that is neither.
    """
    if str(factor).strip() == "auto":
        if not evaluation_length or not training_length:
            raise ValueError(
                "--rope-scaling-factor auto means evaluation length / l; here the length is not known in advance "
                "(generation, analysis), or the checkpoint records no l: give a number."
            )
        return max(1.0, evaluation_length / training_length)
    try:
        value = float(factor)
    except (TypeError, ValueError):
        raise ValueError(f"--rope-scaling-factor takes a number > 0 or 'auto', got {factor!r}.") from None
    if not value > 0:
        raise ValueError(f"--rope-scaling-factor must be > 0, got {value}.")
    return value


def rope_scaling_from_options(
    kind: Optional[str],
    factor: Union[str, float, None],
    training_length: Optional[int],
    evaluation_length: Optional[int] = None,
) -> Optional[RopeScaling]:
    """The one translation from ``--rope-scaling KIND --rope-scaling-factor S|auto`` to a
    :class:`RopeScaling` (None without ``kind``).

    Raises:
        ValueError: a factor without a kind, a kind without a factor, or the errors of
            :func:`resolve_factor` and :class:`RopeScaling`.
    """
    if not kind:
        if factor is not None:
            raise ValueError("--rope-scaling-factor needs --rope-scaling linear|ntk|yarn.")
        return None
    if factor is None:
        raise ValueError(f"--rope-scaling {kind} needs --rope-scaling-factor (a number > 0, or auto).")
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)}, got {kind!r}.")
    return RopeScaling(kind, resolve_factor(factor, evaluation_length, training_length), training_length)

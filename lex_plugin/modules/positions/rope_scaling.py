"""RoPE scaling at evaluation: stretch a rotary model's positions or frequencies past its training length.

A registry of the published variants (``ROPE_SCALINGS``), each a function of the RoPE angles
theta_i = base^(-2i/d) (float64, (d/2,)), the scaling (factor s, training length l, evaluation length, factor
lists), d and the base, returning the new angles; :class:`RopeScaling` bundles one choice with what else it changes:

* ``linear``: position interpolation (Chen et al. 2023, "Extending Context Window of Large Language
  Models via Positional Interpolation", Eq. 4): position n becomes n / s, i.e. theta_i' = theta_i / s.
* ``ntk``: NTK-aware base scaling (bloc97, 2023; YaRN paper section 3.2, Eq. 12-13): the base becomes
  base * s^(d / (d - 2)), i.e. theta_i' = theta_i * s^(-2i / (d - 2)): the highest frequency is kept, the
  lowest is interpolated by s.
* ``yarn``: YaRN (Peng et al. 2023, section 3.2 "NTK-by-parts" Eq. 16-18 and 3.4 Eq. 21-22): with the
  wavelength lambda_i = 2 pi / theta_i and r_i = l / lambda_i, ramp(r) = 0 below alpha, 1 above beta,
  linear between (alpha = 1, beta = 32); theta_i' = (1 - ramp(r_i)) theta_i / s + ramp(r_i) theta_i; and
  the attention temperature sqrt(1/t) = 0.1 ln s + 1 multiplies queries and keys (logits by its square).
* ``dynamic``: dynamic NTK (Hugging Face transformers ``_compute_dynamic_ntk_parameters``): the base becomes
  base ((s L / l) - (s - 1))^(d / (d - 2)), L = max(evaluation length, l). The base is fixed per evaluation
  (the length known in advance, ``length``), so the keys a cache holds and the queries after them always share
  it: transformers issue 25104's inconsistency (keys cached under a shorter length's base) cannot arise, and
  dynamic scaling without a known length (generation) is refused.
* ``llama3``: Llama 3.1's per-frequency scaling (transformers ``_compute_llama3_parameters``): wavelengths above
  l / 1 divided by s, below l / 4 kept, a smooth blend between (low / high frequency factors 1 and 4, the
  original's).
* ``longrope``: LongRoPE / Phi-3 (transformers ``_compute_longrope_parameters``): theta_i divided by a factor
  per frequency, the ``long_factor`` list when the evaluation length exceeds l, else ``short_factor`` (both
  from a JSON file, ``--rope-scaling-file``, d/2 values each); queries and keys times
  sqrt(1 + ln s / ln l) (s > 1).
* ``resonance``: Resonance RoPE (Wang et al. 2024, ``sheryc/resonance_rope``): every wavelength rounded to the
  nearest integer, theta_i' = 2 pi / round(2 pi / theta_i); no factor.

``linear``, ``dynamic``, ``llama3`` and ``longrope`` give Hugging Face's inverse frequencies and attention
factor (tested to 1e-6 against transformers' own functions). ``yarn`` follows the YaRN paper's ramp, linear in
r = l / wavelength; transformers (and the YaRN authors' code) ramp linearly in the pair index between the
floor and ceiling of the indices where r = 32 and r = 1: the two differ for the pairs inside that range
(tested as such; ``ntk``, the NTK-aware base, has no transformers counterpart).

xPos's decay zeta^((n - m)/B) under scaling (a choice this module makes and documents): ``linear``
interpolates positions, so the decay sees the interpolated positions too (exponent (n - m) / (s B)): the
model meets the same (rotation, decay) pairs as in training. The others change frequencies, not
positions, so the decay is left as trained (exponent (n - m) / B).

A factor of 1 is the identity in every variant but ``resonance`` (which takes none) and ``longrope`` (whose
short factors apply at any length). ``factor="auto"`` is resolved by the caller as
max(1, evaluation length / l) (:func:`resolve_factor`).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = ["LLAMA3_HIGH_FREQ_FACTOR", "LLAMA3_LOW_FREQ_FACTOR", "ROPE_SCALINGS", "RopeScaling", "resolve_factor", "rope_scaling_from_options", "YARN_ALPHA", "YARN_BETA"]

YARN_ALPHA = 1.0  # YaRN's ramp bounds (section 3.2, the values the paper uses for LLaMA)
YARN_BETA = 32.0


def _linear(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    return theta / scaling.factor


def _ntk(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    i = torch.arange(theta.numel(), dtype=torch.float64, device="cpu")
    return theta * scaling.factor ** (-2.0 * i / (d - 2))


def _yarn(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    r = scaling.training_length * theta / (2 * math.pi)  # l / wavelength
    ramp = ((r - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
    return (1 - ramp) * theta / scaling.factor + ramp * theta


def _dynamic(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    l, s = scaling.training_length, scaling.factor
    length = max(scaling.length, l)
    new_base = base * ((s * length / l) - (s - 1)) ** (d / (d - 2))
    return new_base ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)


def _llama3(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    l, s = scaling.training_length, scaling.factor
    low, high = LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR
    wavelength = 2 * math.pi / theta
    scaled = torch.where(wavelength > l / low, theta / s, theta)
    smooth = (l / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / s + smooth * scaled
    medium = ~(wavelength < l / high) & ~(wavelength > l / low)
    return torch.where(medium, blended, scaled)


def _longrope(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    factors = scaling.long_factor if scaling.length and scaling.length > scaling.training_length else scaling.short_factor
    if len(factors) != theta.numel():
        raise ValueError(f"--rope-scaling longrope needs {theta.numel()} factors per list (d/2 for head dimension {d}), "
                         f"got {len(factors)}: check --rope-scaling-file.")
    return theta / torch.tensor(factors, dtype=torch.float64, device="cpu")


def _resonance(theta: Tensor, scaling: "RopeScaling", d: int, base: float) -> Tensor:
    return 2 * math.pi / torch.round(2 * math.pi / theta)


ROPE_SCALINGS: Dict[str, Callable[[Tensor, "RopeScaling", int, float], Tensor]] = {
    "linear": _linear,
    "ntk": _ntk,
    "yarn": _yarn,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "longrope": _longrope,
    "resonance": _resonance,
}
NEEDS_LENGTH = ("dynamic", "longrope")  # the evaluation length picks the base / the factor list
LLAMA3_LOW_FREQ_FACTOR = 1.0  # Llama 3.1's rope_scaling values
LLAMA3_HIGH_FREQ_FACTOR = 4.0


@dataclass(frozen=True)
class RopeScaling:
    """One RoPE scaling: ``kind`` in :data:`ROPE_SCALINGS`, factor s > 0, the training length l, the evaluation
    length (``dynamic``'s base, ``longrope``'s choice of list) and ``longrope``'s factor lists.

    Raises:
        ValueError: an unknown kind, s <= 0, a kind that needs l without it, ``dynamic`` / ``longrope``
            without the evaluation length, ``longrope`` without both lists, ``resonance`` with a factor.
    """

    kind: str
    factor: float
    training_length: Optional[int] = None
    length: Optional[int] = None
    short_factor: Tuple[float, ...] = ()
    long_factor: Tuple[float, ...] = ()

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)}, got {self.kind!r}.")
        if not self.factor > 0:
            raise ValueError(f"--rope-scaling-factor must be > 0 (or auto), got {self.factor}.")
        if self.kind in ("yarn", "dynamic", "llama3", "longrope") and not self.training_length:
            raise ValueError(f"--rope-scaling {self.kind} needs the training length l (the checkpoint's, or --training-length).")
        if self.kind in NEEDS_LENGTH and not self.length:
            raise ValueError(f"--rope-scaling {self.kind} depends on the evaluation length, which is not known here "
                             "(generation, analysis): use another scaling, or evaluate at given lengths.")
        if self.kind == "longrope" and not (self.short_factor and self.long_factor):
            raise ValueError("--rope-scaling longrope needs its short_factor and long_factor lists: give --rope-scaling-file "
                             "with a JSON object {\"short_factor\": [...], \"long_factor\": [...]}.")
        if self.kind == "resonance" and self.factor != 1.0:
            raise ValueError("--rope-scaling resonance rounds the trained wavelengths and takes no --rope-scaling-factor.")

    def angles(self, theta: Tensor, head_dim: int, theta_base: float) -> Tensor:
        """The scaled angles theta' ((d/2,) float64) from RoPE's ``theta``.

        Raises:
            ValueError: ``longrope`` lists of another length than d/2.
        """
        return ROPE_SCALINGS[self.kind](theta.double(), self, head_dim, theta_base)

    @property
    def decay_divisor(self) -> float:
        """What xPos's decay exponent (n - m) / B is further divided by: s for ``linear``, else 1."""
        return float(self.factor) if self.kind == "linear" else 1.0

    @property
    def attention_scale(self) -> float:
        """The factor on queries and keys: YaRN's 0.1 ln s + 1, LongRoPE's sqrt(1 + ln s / ln l) (s > 1), else 1."""
        if self.kind == "yarn" and self.factor > 1:
            return 0.1 * math.log(self.factor) + 1.0
        if self.kind == "longrope" and self.factor > 1:
            return math.sqrt(1 + math.log(self.factor) / math.log(self.training_length))
        return 1.0

    def __str__(self) -> str:
        if self.kind == "resonance":
            return "resonance"
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
    factors_file: Optional[str] = None,
) -> Optional[RopeScaling]:
    """The one translation from ``--rope-scaling KIND --rope-scaling-factor S|auto [--rope-scaling-file JSON]``
    to a :class:`RopeScaling` (None without ``kind``).

    Raises:
        ValueError: a factor or file without a kind, a kind without a factor (but ``resonance``, which takes
            none), a file for a kind other than ``longrope`` or one that is not a JSON object with both lists,
            or the errors of :func:`resolve_factor` and :class:`RopeScaling`.
    """
    if not kind:
        if factor is not None or factors_file:
            flag = "--rope-scaling-factor" if factor is not None else "--rope-scaling-file"
            raise ValueError(f"{flag} needs --rope-scaling {'|'.join(ROPE_SCALINGS)}.")
        return None
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)}, got {kind!r}.")
    if factors_file and kind != "longrope":
        raise ValueError(f"--rope-scaling-file holds LongRoPE's factor lists; --rope-scaling {kind} does not use it.")
    if kind == "resonance":
        if factor is not None:
            raise ValueError("--rope-scaling resonance rounds the trained wavelengths and takes no --rope-scaling-factor.")
        return RopeScaling(kind, 1.0, training_length)
    if factor is None:
        raise ValueError(f"--rope-scaling {kind} needs --rope-scaling-factor (a number > 0, or auto).")
    lists = {}
    if kind == "longrope":
        if not factors_file:
            raise ValueError("--rope-scaling longrope needs --rope-scaling-file: a JSON object with \"short_factor\" and "
                             "\"long_factor\", d/2 numbers each.")
        try:
            data = json.loads(Path(factors_file).read_text())
            lists = {name: tuple(float(x) for x in data[name]) for name in ("short_factor", "long_factor")}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"--rope-scaling-file {factors_file}: not a JSON object with short_factor and long_factor "
                             f"lists of numbers ({err}).") from None
    return RopeScaling(kind, resolve_factor(factor, evaluation_length, training_length), training_length,
                       evaluation_length if kind in NEEDS_LENGTH else None, **lists)

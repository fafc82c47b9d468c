"""Position schemes (``--pos-emb``): one protocol (:class:`PositionScheme`), one registry
(``POSITION_SCHEMES``); each module below registers its schemes when imported."""

from .scheme import (
    KINDS, POSITION_SCHEMES, SCHEME_OPTIONS, NoPositions, PositionScheme, SchemeOption, SchemeSpec, build_positions,
    get_scheme, register_position_scheme, scheme_table, unregister_position_scheme, validate_position_config,
)
from .xpos import XPos, apply_rotary_complex, rope_theta, xpos_zeta
from .biases import ALiBi, DistanceBias, KerpleLog, KerplePower, Sandwich, SmoothedSandwich, T5Bias, alibi_slopes
from .absolute import LearnedPositions, SinusoidalPositions

register_position_scheme(SchemeSpec(
    "none", "none", "no position information (NoPE): causal masking alone orders tokens",
    "Kazemnejad et al. 2023 (NoPE)", lambda config, layer: NoPositions(),
))

__all__ = [
    "ALiBi", "DistanceBias", "KINDS", "KerpleLog", "KerplePower", "LearnedPositions", "NoPositions",
    "POSITION_SCHEMES", "PositionScheme", "SCHEME_OPTIONS", "Sandwich", "SchemeOption", "SchemeSpec", "SinusoidalPositions", "SmoothedSandwich",
    "T5Bias", "XPos", "alibi_slopes", "apply_rotary_complex", "build_positions",
    "get_scheme", "register_position_scheme", "rope_theta", "scheme_table", "unregister_position_scheme", "validate_position_config",
    "xpos_zeta",
]

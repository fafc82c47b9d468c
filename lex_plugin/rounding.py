"""How a published figure is rounded and written: half up from its shortest decimal form, the way a reader rounds
the number they see, never the binary value's way (``round(1.005, 2)`` is 1.0). Every table that judges a figure
against a bar (the definitions of ``experiments.definitions``, the reproduction's claims, RULER-lite's effective
length) rounds it here, so no cell reads otherwise than its verdict.
"""

import math
import re
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["half_up", "product_half_up", "written"]


def _decimal(value: float) -> Decimal:
    """``value``'s shortest decimal form (``repr``), the number a reader sees.

    Raises:
        ValueError: ``value`` is not finite (a figure that was not measured is None, not NaN).
    """
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a measured figure: it cannot be rounded.")
    return Decimal(repr(float(value)))


def _quantize(value: Decimal, decimals: int) -> float:
    return float(value.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def half_up(value: float, decimals: int) -> float:
    """``value`` rounded half up to ``decimals`` decimals from its shortest decimal form (1.005 -> 1.01, 0.995 -> 1.00,
    where ``round`` and ``str.format``, reading the binary value, give 1.0 and 0.99).

    Raises:
        ValueError: ``value`` is not finite (a figure that was not measured is None, not NaN).
    """
    return _quantize(_decimal(value), decimals)


def product_half_up(factor: float, value: float, decimals: int) -> float:
    """``factor`` x ``value`` worked out as a reader would, on their shortest decimal forms, then rounded half up to
    ``decimals`` (0.9 x 0.815 = 0.7335 -> 0.734 at 3, where the binary product 0.73349... gives 0.733).

    Raises:
        ValueError: either is not finite.
    """
    return _quantize(_decimal(factor) * _decimal(value), decimals)


def written(value: float, fmt: str) -> str:
    """``value`` as ``fmt`` (``{:.Nf}`` and a unit: ``{:.2f}x``) writes it, rounded half up from its shortest decimal
    form as the definitions read a figure (:func:`half_up`): 0.995 -> "1.00", where ``str.format`` writes "0.99" and a
    cell would read as meeting "< 1.00" while the definition says it does not.

    Raises:
        ValueError: ``fmt`` holds no ``{:.Nf}``; ``value`` is not finite.
    """
    found = re.search(r"\{:\.(\d+)f\}", fmt)
    if found is None:
        raise ValueError(f"format {fmt!r}: give a fixed-point field such as '{{:.2f}}'.")
    return fmt.format(half_up(value, int(found.group(1))))

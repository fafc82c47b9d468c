"""Comma-separated option values, parsed one way for the task, every ``lex`` command and the scripts."""

from typing import List, Optional

__all__ = ["parse_float_list", "parse_int_list", "parse_name_list"]


def parse_name_list(text: Optional[str], flag: str) -> List[str]:
    """``'full, bca'`` -> ``['full', 'bca']`` (empty items dropped; None or '' -> [])."""
    if not text:
        return []
    return [part.strip() for part in str(text).split(",") if part.strip()]


def parse_int_list(text: Optional[str], flag: str) -> List[int]:
    """``'256,512'`` -> ``[256, 512]`` (None or '' -> []).

    Raises:
        ValueError: an item that is not a positive integer, naming ``flag``.
    """
    values = []
    for part in parse_name_list(text, flag):
        if not part.isdigit() or int(part) <= 0:
            raise ValueError(f"{flag} takes positive integers separated by commas; got {part!r} in {text!r}.")
        values.append(int(part))
    return values


def parse_float_list(text: Optional[str], flag: str, low: float = float("-inf"), high: float = float("inf")) -> List[float]:
    """``'0.1,0.5'`` -> ``[0.1, 0.5]`` (None or '' -> []), each within [low, high].

    Raises:
        ValueError: an item that is not a number in range, naming ``flag``.
    """
    values = []
    for part in parse_name_list(text, flag):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{flag} takes numbers separated by commas; got {part!r} in {text!r}.") from None
        if not low <= value <= high:
            raise ValueError(f"{flag} takes numbers in [{low:g}, {high:g}]; got {value:g} in {text!r}.")
        values.append(value)
    return values

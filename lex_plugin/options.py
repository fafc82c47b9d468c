"""Comma-separated option values, parsed one way for the task, every ``lex`` command and the scripts; and which of
a click command's options its command line gave (to refuse those that would change nothing)."""

from typing import List, Optional

__all__ = ["given_flags", "parse_float_list", "parse_int_list", "parse_name_list"]


def given_flags(*names: str) -> List[str]:
    """The flags (``--methods``: each parameter's first option string) of those of ``names`` (click parameter names,
    ``method_names``) that the running click command's command line gave, in the order of ``names``; a value left at
    its default is not given.

    Raises:
        RuntimeError: no click command is running. KeyError: a name that is not one of its parameters.
    """
    import click

    ctx = click.get_current_context()
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return [flags[n] for n in names if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT]


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

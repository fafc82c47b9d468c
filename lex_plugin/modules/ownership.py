"""The one ownership rule: an option that belongs to some choices (position schemes, attention modes, position
maps) is refused under any other choice, whatever its value, since it would do nothing there."""

from typing import Any, Callable, Mapping, Sequence

__all__ = ["refuse_foreign"]


def refuse_foreign(given: Mapping[str, Any], chosen: str, owners: Callable[[str], Sequence[str]],
                   describe: Callable[[Sequence[str]], str], subject: str) -> None:
    """The one ownership rule, for scheme options and attention options alike: an option that belongs to some
    choices (schemes, modes) is refused under any other, whatever its value, since it would do nothing.

    Args:
        given: option name -> value; None means not given (and is never refused).
        chosen: the choice made (``alibi``, ``bca``).
        owners: option name -> the choices that take it.
        describe: choices -> the words that select them (``('xpos', 'rope')`` -> ``--pos-emb xpos / rope``).
        subject: what was chosen, in words (``this model is --pos-emb alibi``).

    Raises:
        ValueError: the first foreign option given, naming it, its value, its owners and how to proceed.
    """
    for name, value in given.items():
        if value is None or value is False:
            continue
        taken_by = tuple(owners(name))
        if chosen not in taken_by:
            flag = "--" + name.replace("_", "-")
            shown = "" if value is True else f" {value}"
            raise ValueError(f"{flag}{shown} is an option of {describe(taken_by)}; {subject}, which does not use it: "
                             f"drop {flag}, or choose {describe(taken_by[:1])}.")

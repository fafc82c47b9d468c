"""One option of ``--arch lex_lm`` that a registry entry declares (a position scheme's, ``positions.SchemeOption``; a
trained design's, ``designs.DesignOption``): its name, type, default and help, from which the fairseq flag, the
dataclass field and the Hugging Face config field are derived."""

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelOption"]


@dataclass(frozen=True)
class ModelOption:
    """One model option.

    Attributes:
        name: the config attribute (``xpos_gamma``; the flag is ``--xpos-gamma``).
        type: ``float``, ``int``, ``bool`` or ``str``.
        default: the value when not given (None: the owner computes one, e.g. from the training length).
        help: one line for ``--help``.
    """

    name: str
    type: type
    default: Any
    help: str

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the name with dashes."""
        return "--" + self.name.replace("_", "-")

    def read(self, config) -> Any:
        """This option's value in ``config`` (any object; missing or None: the default), as its type.

        Raises:
            ValueError: a text given to a ``bool`` option (``bool("False")`` would be True).
        """
        value = getattr(config, self.name, None)
        if value is None:
            return self.default
        if self.type is bool and isinstance(value, str):
            raise ValueError(f"{self.flag} is a switch: give True or False, not the text {value!r}.")
        return self.type(value)

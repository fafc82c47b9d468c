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
        type: ``float``, ``int`` or ``bool``.
        default: the value when not given (None: the owner computes one, e.g. from the training length).
        help: one line for ``--help``.
    """

    name: str
    type: type
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def read(self, config) -> Any:
        """This option's value in ``config`` (any object; missing or None: the default), as its type."""
        value = getattr(config, self.name, None)
        return self.default if value is None else self.type(value)

"""The ``lex`` command line (click): corpus preparation and helpers around fairseq's own commands, one module per
command family (:mod:`.data`, :mod:`.evaluate`, :mod:`.probes`, :mod:`.export`, :mod:`.train`), thin over the
library; the options they share are :mod:`.common`."""

from . import data, evaluate, export, probes, train  # noqa: F401  (each registers its commands on the group)
from .group import main

__all__ = ["main"]

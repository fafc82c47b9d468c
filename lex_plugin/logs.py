"""Readable console output under fairseq's commands: undo two known sources of noise, nothing else.

1. ``fairseq/models/wav2vec/wav2vec2_classification.py`` (fairseq 0.12) calls
   ``logging.basicConfig(level=logging.DEBUG)`` when ``import fairseq`` loads it. ``fairseq-train``
   configures logging before importing fairseq and is unaffected; ``fairseq-eval-lm`` (and the other
   commands) import fairseq first, so their own ``basicConfig`` becomes a no-op: every line loses
   fairseq's ``date | LEVEL | name | message`` format and hydra's DEBUG lines appear.
   :func:`repair_fairseq_logging` restores what those commands meant (their format, ``LOGLEVEL`` or
   INFO, stdout), only when the root logger is in exactly that state.
2. Deprecation warnings that fairseq 0.12 triggers in its dependencies on every run (hydra's
   experimental compose API, automatic schema matching, ``torch.cuda.amp.autocast``; torch's
   ``pin_memory`` without an accelerator). :func:`silence_known_warnings` ignores those messages,
   matched exactly; every other warning still shows.

fairseq's own INFO log is kept as is.
"""

import logging
import os
import sys
import warnings

__all__ = ["FAIRSEQ_FORMAT", "KNOWN_WARNINGS", "repair_fairseq_logging", "silence_known_warnings"]

FAIRSEQ_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's own format
FAIRSEQ_DATEFMT = "%Y-%m-%d %H:%M:%S"

# (category, regex matched against the start of the message): what fairseq 0.12 triggers on every run
KNOWN_WARNINGS = [
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental"),
    (UserWarning, r"\s*The version_base parameter is not specified"),
    (UserWarning, r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'"),
    (UserWarning, r"\s*'[^']*' is validated against ConfigStore schema with the same name"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
    (FutureWarning, r"`torch\.cuda\.amp\.(autocast|custom_fwd|custom_bwd)\(args\.\.\.\)` is deprecated"),
]


def silence_known_warnings() -> None:
    """Ignore exactly the warnings in :data:`KNOWN_WARNINGS` (``warnings.filterwarnings``)."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def repair_fairseq_logging() -> bool:
    """If the root logger is as fairseq's wav2vec import leaves it (level DEBUG, one handler with the
    default format), reconfigure it as fairseq's commands intended. Returns True if it did."""
    root = logging.getLogger()
    if root.level != logging.DEBUG or len(root.handlers) != 1:
        return False
    formatter = root.handlers[0].formatter
    if formatter is not None and getattr(formatter, "_fmt", None) != logging.BASIC_FORMAT:
        return False
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    logging.basicConfig(format=FAIRSEQ_FORMAT, datefmt=FAIRSEQ_DATEFMT, level=level, stream=sys.stdout, force=True)
    return True

"""Clear errors for checkpoints that cannot be read.

fairseq reads every checkpoint (``fairseq-train`` resuming from ``checkpoint_last.pt``, ``--restore-file``,
``fairseq-eval-lm --path``, the hub interface) through ``fairseq.checkpoint_utils.load_checkpoint_to_cpu``.
A truncated or corrupt file (a full disk, a copy cut short, a job killed by a non-atomic copy) makes
``torch.load`` fail deep inside its zip reader ("failed finding central directory", "unexpected EOF").
Importing the plugin wraps that one function so the error names the file, its size and what to do.
Nothing else changes: a readable checkpoint loads exactly as before.
"""

import functools
import os
import pickle
import zipfile

from fairseq import checkpoint_utils

__all__ = ["CorruptCheckpointError", "install"]

UNREADABLE = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile)


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be deserialised."""


def install() -> None:
    """Wrap ``checkpoint_utils.load_checkpoint_to_cpu`` once (idempotent)."""
    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_lex_guarded", False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return original(path, *args, **kwargs)
        except UNREADABLE as err:
            if isinstance(err, CorruptCheckpointError) or not os.path.isfile(path):
                raise
            raise CorruptCheckpointError(
                f"checkpoint {path} ({os.path.getsize(path):,} bytes) cannot be read: it is truncated or corrupt "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). Resume from an earlier one "
                "(--restore-file checkpoint_N.pt or checkpoint_best.pt in the same --save-dir), or move it away to "
                "start over."
            ) from err

    load_checkpoint_to_cpu._lex_guarded = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu

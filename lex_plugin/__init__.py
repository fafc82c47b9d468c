"""lex_plugin: the LeX Transformer (xPos + blockwise causal attention) as a fairseq user-dir plugin.

Use with ``fairseq-train --user-dir lex_plugin --arch lex_lm_tiny ...``. Importing this package
registers the ``lex_lm`` model and its ``lex_lm_*`` architectures.
"""

__version__ = "0.1.0"

from . import checkpoints, models, optim, tasks  # noqa: F401  (registers lex_lm, its architectures, torch_adamw, lex_language_modeling)
from .data import lex_moses  # noqa: F401  (registers the lex_moses tokenizer)
from .models import LexLanguageModel

checkpoints.install()  # clear errors for truncated / corrupt checkpoints

__all__ = ["LexLanguageModel"]

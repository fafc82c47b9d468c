"""lex_plugin: the LeX Transformer (xPos + blockwise causal attention) as a fairseq user-dir plugin.

Use with ``fairseq-train --user-dir lex_plugin --arch lex_lm_tiny ...``. Importing this package
registers the ``lex_lm`` model and its ``lex_lm_*`` architectures; ``lex_plugin.from_pretrained(model_dir,
checkpoint_file, data_bin, window=...)`` loads a checkpoint for generation and scoring (``hub_interface``).

The attention core (``lex_plugin.modules``: positions, windows, planner, executor, cache, layers) needs
torch (and TorchScale's components) only: where fairseq is not installed, ``import lex_plugin.modules``
works and the fairseq registrations are skipped.
"""

__version__ = "0.2.0"

from . import logs

logs.silence_known_warnings()  # before fairseq is imported (its imports trigger some of them)

try:
    import fairseq  # noqa: F401
except ModuleNotFoundError as err:  # the fairseq-free core; any other import error is real and raised
    if err.name != "fairseq":
        raise
    __all__ = []
else:
    from . import checkpoints, criterions, models, optim, tasks  # noqa: E402,F401  (registers lex_lm, its architectures, answer_cross_entropy, torch_adamw, lex_language_modeling)
    from .data import lex_moses  # noqa: F401  (registers the lex_moses tokenizer)
    from .hub_interface import from_pretrained
    from .models import LexLanguageModel

    checkpoints.install()  # clear errors for truncated / corrupt checkpoints
    logs.repair_fairseq_logging()  # fairseq-eval-lm & co.: undo the DEBUG root logger fairseq's wav2vec import sets

    __all__ = ["LexLanguageModel", "from_pretrained"]

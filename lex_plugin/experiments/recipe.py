"""The project's one fairseq-train recipe: the demo (``scripts/demo.sh`` through ``lex train``), the
reproduction's runs and fine-tuning, and the training benchmark all build their command here.

The recipe (LeX section 4.1 in shape, at CPU scale): ``--task lex_language_modeling`` (fairseq's
``language_modeling`` plus this plugin's options, e.g. ``--bf16-autocast``; ``language_modeling`` for a stock
architecture), a tied
output embedding, Adam (0.9, 0.98) with weight decay 0.01, gradient clipping at 1.0, a polynomial decay
of the learning rate after a linear warm-up, no data-loader workers, a fixed seed. What differs between
uses is an argument: model (``--arch`` and its options), data layout (``--tokens-per-sample``,
``--sample-break-mode``), batch, learning rate, updates, warm-up, checkpoints, validation, logging.
"""

import tempfile
from pathlib import Path
from typing import List, Optional, Sequence, Union

__all__ = ["PLUGIN_DIR", "fairseq_train_command"]

PLUGIN_DIR = Path(__file__).resolve().parent.parent  # lex_plugin/: the --user-dir of every fairseq command

Arg = Union[str, int, float, Path]


def fairseq_train_command(
    data: Arg,
    save_dir: Optional[Arg],
    *,
    arch: str = "lex_lm_tiny",
    model_args: Sequence[Arg] = (),
    tokens_per_sample: int = 256,
    batch_size: int = 16,
    lr: Arg = "1.5e-3",
    updates: int = 600,
    warmup: Optional[int] = None,
    break_mode: str = "none",
    save_interval_updates: Optional[int] = None,
    validate_interval_updates: Optional[int] = None,
    max_valid_steps: int = 10,
    log_format: str = "simple",
    log_interval: int = 25,
    seed: int = 1,
    user_dir: Optional[Arg] = PLUGIN_DIR,
    extra: Sequence[Arg] = (),
    total_updates: Optional[int] = None,
) -> List[str]:
    """The fairseq-train command line of the recipe (module docstring), as strings.

    Args:
        data: the data-bin.
        save_dir: where checkpoints go (``--no-epoch-checkpoints``; only the last one, and with
            ``save_interval_updates`` every that many updates, one kept); None: ``--no-save``.
        arch: ``--arch`` (a ``lex_lm_*`` preset, or another fairseq architecture with ``user_dir=None``).
        model_args: further model options (``--pos-emb rope``, ``--random-positions 4096``, sizes).
        tokens_per_sample, batch_size, lr: l, sequences per update, peak learning rate.
        updates: ``--max-update``, also the polynomial decay's ``--total-num-update`` unless ``total_updates``.
        warmup: warm-up updates (default total updates / 8).
        break_mode: ``--sample-break-mode`` (``none``: a stream cut into l-token samples; ``eos``: one
            sample per line).
        validate_interval_updates: validate every that many updates on at most ``max_valid_steps``
            batches; None: ``--disable-validation``.
        log_format, log_interval: fairseq's progress log.
        user_dir: ``--user-dir`` (this plugin by default); None for a stock fairseq architecture.
        extra: appended as given (``--finetune-from-model CKPT``, ``--memory-efficient-fp16``...).
        total_updates: the learning-rate schedule's length when training stops before its end (a snapshot of a
            longer run: ``--max-update updates`` of ``--total-num-update total_updates``); default ``updates``.

    Raises:
        ValueError: non-positive updates, batch or l; total updates fewer than updates; a warm-up longer than the
            schedule (the peak learning rate would never be reached).
    """
    if updates <= 0 or batch_size <= 0 or tokens_per_sample <= 0:
        raise ValueError(f"updates ({updates}), batch size ({batch_size}) and tokens per sample ({tokens_per_sample}) "
                         "must be positive.")
    total = updates if total_updates is None else total_updates
    if total < updates:
        raise ValueError(f"total_updates ({total}) must be at least updates ({updates}): the schedule would end "
                         "before training does.")
    warmup = max(1, total // 8) if warmup is None else warmup
    if not 0 <= warmup <= total:
        raise ValueError(f"warmup ({warmup} updates) must lie in 0..{total}: the schedule has {total} updates and would "
                         "end before reaching its peak learning rate; give fewer warm-up updates.")
    cmd: List[Arg] = ["fairseq-train", data, *(["--user-dir", user_dir] if user_dir is not None else []),
                      "--task", "lex_language_modeling" if user_dir is not None else "language_modeling", "--arch", arch, *model_args, "--share-decoder-input-output-embed",
                      "--tokens-per-sample", tokens_per_sample, "--sample-break-mode", break_mode, "--batch-size", batch_size,
                      "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01", "--clip-norm", "1.0",
                      "--lr", lr, "--lr-scheduler", "polynomial_decay", "--warmup-updates", warmup,
                      "--total-num-update", total, "--max-update", updates]
    if save_dir is None:
        cmd += ["--no-save", "--save-dir", tempfile.gettempdir()]  # fairseq checks a directory even when it saves nothing
    else:
        cmd += ["--save-dir", save_dir, "--no-epoch-checkpoints"]
        if save_interval_updates:
            cmd += ["--save-interval-updates", save_interval_updates, "--keep-interval-updates", 1]
    if validate_interval_updates:
        cmd += ["--validate-interval-updates", validate_interval_updates, "--max-valid-steps", max_valid_steps]
    else:
        cmd += ["--disable-validation"]
    cmd += ["--log-format", log_format, "--log-interval", log_interval, "--num-workers", 0, "--seed", seed, *extra]
    return [str(c) for c in cmd]

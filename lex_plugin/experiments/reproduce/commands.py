"""The command of each step of the reproduction: lex prepare, the training recipe, fairseq-eval-lm with
the lex task, the methods, the passkey probe and its fine-tuning data, lex resolution."""

import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ...modules.attention.position_map import POSITION_MAPS
from ..definitions import FAR_CONTEXT_BASELINE
from ..recipe import PLUGIN_DIR, fairseq_train_command
from .options import ReproduceOptions
from .catalogue import (BABILONG_FINETUNE, BABILONG_PROBE, LONGPPL_PROBE, METHODS, PASSKEY_FINETUNE, PROBE_WINDOWS, RULER_FINETUNE,
                        RULER_PROBE)

__all__ = ["answer_finetune_command", "babilong_command", "babilong_data_command", "eval_command", "finetune_command",
           "longppl_command", "longppl_windows", "method_command", "passkey_command", "passkey_data_command", "probe_windows",
           "scaled_passkey_flags", "prepare_command", "resolution_command", "ruler_command", "ruler_data_command",
           "train_command"]

# a fine-tuning keeps a checkpoint every this many updates, so that a killed one resumes there (its stamp is train.done)
FINETUNE_SAVE_INTERVAL = 100


def probe_windows(rotary: bool, position_maps: bool = True, only: Sequence[str] = (), logn: bool = False) -> tuple:
    """The attention modes every probe compares: :data:`PROBE_WINDOWS`, and Leaky ReRoPE on a ``rotary``
    checkpoint (its fractional distances mean nothing to ALiBi's bias); without the position maps when the
    checkpoint has no positions they could remap (``position_maps`` False: a layer pattern whose global layers
    are NoPE); of those, the ones named in ``only`` when it is given (``--probe-windows``); with ``logn``, without
    BCA and the sliding window (no query of theirs sees more than l keys, so log-n is the identity there).

    Raises:
        ValueError: ``only`` names a mode that is no probe window, or leaves none for this checkpoint.
    """
    unknown = [w for w in only if w not in (*PROBE_WINDOWS, "leaky_rerope")]
    if unknown:
        raise ValueError(f"--probe-windows {','.join(unknown)}: not a probe window; choose from "
                         f"{', '.join((*PROBE_WINDOWS, 'leaky_rerope'))}.")
    windows = PROBE_WINDOWS + (("leaky_rerope",) if rotary else ())
    windows = windows if position_maps else tuple(w for w in windows if w not in POSITION_MAPS)
    windows = tuple(w for w in windows if not logn or w not in ("bca", "sliding"))
    kept = tuple(w for w in windows if not only or w in only)
    if not kept:
        raise ValueError(f"--probe-windows {','.join(only)}: none applies to this run{' with log-n' if logn else ''} "
                         f"(it takes {', '.join(windows)}).")
    return kept


def prepare_command(corpus: Path, data: Path) -> List:
    """``lex prepare`` of CORPUS/{train,valid,test}/*.txt into the data-bin ``data``, on every core."""
    return [sys.executable, "-m", "lex_plugin.cli", "prepare", corpus, data, "--workers", os.cpu_count() or 1]


def train_command(data: Path, save_dir: Path, run_args: List[str], o: ReproduceOptions, updates: Optional[int] = None) -> List:
    """fairseq-train of one run (``run_args``: its ``RUNS`` arguments) at l = ``o.training_length`` into
    ``save_dir``: the project's recipe (``lex_plugin.experiments.recipe``), the same budget and optimizer for every run, no
    validation; under bf16 autocast when ``o.bf16_autocast`` (fp32 weights and optimizer state).

    Args:
        updates: stop after this many updates of the ``o.max_update``-update schedule (a snapshot budget:
            resuming with a larger ``updates`` continues the same run); default ``o.max_update``.
    """
    total = o.max_update
    return fairseq_train_command(data, save_dir, arch=o.arch, model_args=run_args, tokens_per_sample=o.training_length,
                                 batch_size=o.batch_size, lr=o.lr, updates=updates or total,
                                 warmup=max(1, total // 8), break_mode="none", save_interval_updates=max(1, min(100, total)),
                                 log_interval=25, seed=o.seed, total_updates=total,
                                 extra=["--bf16-autocast"] if o.bf16_autocast else [])


def eval_command(data: Path, ckpt: Path, lengths: List[int], windows: List[str], report: Path, o: ReproduceOptions,
                 extra: Sequence = (), split: str = "test") -> List:
    """fairseq-eval-lm of ``ckpt`` over the first ``o.eval_tokens`` tokens of ``split`` (the test split; ``valid`` where
    an evaluation chooses a setting) at each of ``lengths`` under each of ``windows`` (``full``, ``sliding``, ``bca``,
    ``lm_infinite``), writing the length report JSON ``report``; ``extra``: further ``--task lex_language_modeling``
    arguments (sinks, RoPE scaling, an attention temperature)."""
    return [
        "fairseq-eval-lm", data, "--user-dir", PLUGIN_DIR, "--task", "lex_language_modeling",
        "--path", ckpt, "--gen-subset", split, "--tokens-per-sample", o.training_length,
        "--sample-break-mode", "none", "--batch-size", 8, "--num-workers", 0,
        "--eval-lengths", ",".join(map(str, lengths)), "--eval-windows", ",".join(windows),
        "--eval-tokens", o.eval_tokens, "--report-json", report,
        # fairseq's own pass over the whole split at l would cost minutes per model and duplicates the
        # length table's l row: let it see one shard of 1000 (it says how many tokens it evaluated).
        "--num-shards", 1000, "--shard-id", 0, *extra,
    ]


def method_command(data: Path, ckpt: Path, method: str, report: Path, o: ReproduceOptions) -> List:
    """fairseq-eval-lm of ``ckpt`` under one of :data:`METHODS` at every length of ``o.lengths`` (the
    same tokens as :func:`eval_command`), writing the length report JSON ``report``.

    Raises:
        KeyError: ``method`` is not in :data:`METHODS`."""
    window, extra, _, _ = METHODS[method]
    return eval_command(data, ckpt, o.lengths, [window], report, o, extra)


def passkey_data_command(data: Path, ckpt: Path, dest: Path, o: ReproduceOptions) -> List:
    """``lex passkey-data``: :data:`PASSKEY_FINETUNE` ``samples`` prompts with their key, at most l / 2 - 8
    tokens each, filler from the training split of ``data`` (encoded as ``ckpt``'s hub encodes), into ``dest``."""
    return [sys.executable, "-m", "lex_plugin.cli", "passkey-data", data, dest, "--path", ckpt,
            "--samples", PASSKEY_FINETUNE["samples"], "--max-length", o.training_length // 2 - 8]


def finetune_command(passkey_data: Path, ckpt: Path, save_dir: Path, run_args: List[str], o: ReproduceOptions,
                     seed: Optional[int] = None) -> List:
    """fairseq-train fine-tuning ``ckpt`` (trained with ``run_args``) on the passkey data-bin, one prompt per
    row at l (:data:`PASSKEY_FINETUNE`: updates, batch, peak lr; polynomial decay, no validation), under ``seed``
    (default ``o.seed``: the order of the prompts and the dropout)."""
    f = PASSKEY_FINETUNE
    return fairseq_train_command(passkey_data, save_dir, arch=o.arch, model_args=run_args,
                                 tokens_per_sample=o.training_length, batch_size=f["batch_size"], lr=f["lr"],
                                 updates=f["updates"], warmup=max(1, f["updates"] // 20), break_mode="eos",
                                 save_interval_updates=FINETUNE_SAVE_INTERVAL, log_interval=50,
                                 seed=o.seed if seed is None else seed, extra=["--finetune-from-model", ckpt])


def passkey_command(data: Path, ckpt: Path, out: Path, o: ReproduceOptions, rotary: bool = True, extra: Sequence = (),
                    lengths: Optional[Sequence[int]] = None, windows: Optional[Sequence[str]] = None, *,
                    position_maps: bool = True) -> List:
    """``lex passkey`` of ``ckpt`` at ``lengths`` (default l, 2l, 4l and 8l), depths 0.1..0.9, under each of
    ``windows`` (default :func:`probe_windows`: full attention, BCA, the sliding window, Λ-shaped attention,
    ReRoPE, Self-Extend, DCA; and Leaky ReRoPE for a ``rotary`` checkpoint), ``o.passkey_trials`` prompts per
    cell (9 distractor keys), with the further ``lex passkey`` flags ``extra`` (``--logn``, a RoPE scaling),
    writing the JSON ``out`` and the heat map beside it (same name, .png). With ``--logn`` the default windows
    leave out BCA and the sliding window: no query of theirs sees more than l keys, so log-n is the identity.

    Raises:
        ValueError: ``o.probe_windows`` leaves no default window (:func:`probe_windows`).
    """
    l = o.training_length
    if not windows:
        windows = probe_windows(rotary, position_maps, o.probe_windows, logn="--logn" in extra)
    lengths = lengths or [l * k for k in (1, 2, 4, 8)]
    return [sys.executable, "-m", "lex_plugin.cli", "passkey", data, "--path", ckpt,
            "--lengths", ",".join(map(str, lengths)), "--depths", "0.1,0.3,0.5,0.7,0.9",
            "--windows", ",".join(windows), "--trials", o.passkey_trials,
            "--json", out, "--plot", out.with_suffix(".png"), *extra]


def scaled_passkey_flags(method: str) -> List:
    """The ``lex passkey`` flags of the RoPE scaling ``method`` (a name of :data:`METHODS`: a scaling of
    :data:`SCALINGS`, with or without ``_logn``) at 8l: ``auto`` becomes 8, its value at 8l."""
    return ["8" if f == "auto" else f for f in METHODS[method][1]]


def ruler_data_command(data: Path, ckpt: Path, dest: Path, o: ReproduceOptions) -> List:
    """``lex ruler-data``: :data:`RULER_FINETUNE` ``samples`` prompts of every RULER-lite task with an answer, at
    most l - 1 tokens each, haystacks from the training split of ``data``, into ``dest``."""
    return [sys.executable, "-m", "lex_plugin.cli", "ruler-data", "--path", ckpt, data, dest,
            "--samples", RULER_FINETUNE["samples"], "--max-length", o.training_length - 1]


def answer_finetune_command(answers_bin: Path, ckpt: Path, save_dir: Path, run_args: List[str], o: ReproduceOptions,
                            recipe: dict, seed: Optional[int] = None) -> List:
    """fairseq-train fine-tuning ``ckpt`` (trained with ``run_args``) on a probe's data-bin of prompts with recorded
    answers (``lex ruler-data``, ``lex babilong-data``), one prompt per row at l, as :func:`finetune_command` does for
    the passkey data: ``recipe`` (:data:`RULER_FINETUNE`, :data:`BABILONG_FINETUNE`) gives the updates, batch and peak
    lr, and whether the loss is on the answers alone (``--answer-only-loss``); ``seed`` the fine-tuning's (default
    ``o.seed``)."""
    return fairseq_train_command(answers_bin, save_dir, arch=o.arch, model_args=run_args,
                                 tokens_per_sample=o.training_length, batch_size=recipe["batch_size"], lr=recipe["lr"],
                                 updates=recipe["updates"], warmup=max(1, recipe["updates"] // 20), break_mode="eos",
                                 save_interval_updates=FINETUNE_SAVE_INTERVAL, log_interval=50,
                                 seed=o.seed if seed is None else seed, extra=["--finetune-from-model", ckpt,
                                                        *(["--answer-only-loss"] if recipe["answer_only_loss"] else [])])


def ruler_command(data: Path, ckpt: Path, out: Path, o: ReproduceOptions, rotary: bool = True, *,
                  position_maps: bool = True, extra: Sequence = ()) -> List:
    """``lex ruler`` of ``ckpt``: every task at l, 2l, 4l and 8l, :data:`RULER_PROBE`'s depths and trials, under
    :func:`probe_windows`, writing the JSON ``out`` and a heat map
    per task beside it (``out``'s name + ``_TASK.png``)."""
    l = o.training_length
    return [sys.executable, "-m", "lex_plugin.cli", "ruler", data, "--path", ckpt,
            "--lengths", ",".join(str(l * k) for k in (1, 2, 4, 8)), "--depths", RULER_PROBE["depths"],
            "--windows", ",".join(probe_windows(rotary, position_maps, o.probe_windows)), "--trials", RULER_PROBE["trials"], "--json", out,
            "--plot", out.with_suffix(".png"), *extra]


def longppl_command(data: Path, ckpt: Path, out: Path, o: ReproduceOptions, rotary: bool = True, *,
                    position_maps: bool = True, windows: Optional[Sequence[str]] = None, extra: Sequence = (),
                    key_tokens: Optional[Path] = None) -> List:
    """fairseq-eval-lm of ``ckpt`` with LongPPL (:data:`LONGPPL_PROBE`: l, 4l and 16l, the thresholds alpha and beta
    in nats) under ``windows`` (default :func:`longppl_windows`), over the tokens of :func:`eval_command`, the key tokens found by ``ckpt``
    itself under full attention, or with ``key_tokens`` those of that report (``--key-tokens``: one common evaluator's,
    its own rule); the length table only (``--length-report-only``), written to ``out``."""
    p, l = LONGPPL_PROBE, o.training_length
    found = (["--key-tokens", key_tokens] if key_tokens is not None
             else ["--longppl-alpha", p["alpha"], "--longppl-beta", p["beta"]])
    windows = longppl_windows(rotary, position_maps, o) if windows is None else windows
    return eval_command(data, ckpt, [l * k for k in p["multiples"]], list(windows), out, o,
                        ["--longppl", *found, "--length-report-only", *extra])


def longppl_windows(rotary: bool, position_maps: bool, o: ReproduceOptions, baseline: bool = True) -> Tuple[str, ...]:
    """The attention modes LongPPL is measured under: :func:`probe_windows` (limited by ``o.probe_windows``), and with
    ``baseline`` the sliding window of l that "reads the far context" divides by (``definitions.FAR_CONTEXT_BASELINE``)
    where they lack it, listed once.

    Raises:
        ValueError: ``o.probe_windows`` leaves no window for this run (:func:`probe_windows`).
    """
    windows = tuple(probe_windows(rotary, position_maps, o.probe_windows))
    return windows if not baseline or FAR_CONTEXT_BASELINE in windows else (*windows, FAR_CONTEXT_BASELINE)


def babilong_data_command(data: Path, ckpt: Path, dest: Path, o: ReproduceOptions) -> List:
    """``lex babilong-data``: :data:`BABILONG_FINETUNE` ``samples`` stories of its tasks with their answers, at most
    l - 1 tokens each, book text from the training split of ``data``, into ``dest``."""
    f = BABILONG_FINETUNE
    return [sys.executable, "-m", "lex_plugin.cli", "babilong-data", "--path", ckpt, data, dest, "--tasks", f["tasks"],
            "--samples", f["samples"], "--max-length", o.training_length - 1, "--seed", o.seed]


def babilong_command(data: Path, ckpt: Path, out: Path, o: ReproduceOptions, rotary: bool = True, *,
                     position_maps: bool = True, extra: Sequence = ()) -> List:
    """``lex babilong`` of ``ckpt``: :data:`BABILONG_FINETUNE`'s tasks at :data:`BABILONG_PROBE`'s multiples of l,
    its trials per cell, under :func:`probe_windows`, on the test split, writing the JSON ``out`` and its heat map
    beside it (same name, .png)."""
    l = o.training_length
    return [sys.executable, "-m", "lex_plugin.cli", "babilong", data, "--path", ckpt, "--tasks", BABILONG_FINETUNE["tasks"],
            "--lengths", ",".join(str(l * k) for k in BABILONG_PROBE["multiples"]),
            "--windows", ",".join(probe_windows(rotary, position_maps, o.probe_windows)), "--trials", BABILONG_PROBE["trials"], "--json", out,
            "--plot", out.with_suffix(".png"), *extra]


def resolution_command(data: Path, ckpt: Path, lengths: List[int], window: str, out: Path, o: ReproduceOptions) -> List:
    """``lex resolution`` of ``ckpt`` at ``lengths`` over ``o.resolution_texts`` texts, with BCA when
    ``window`` is ``bca`` (else full attention), writing the JSON ``out``."""
    cmd = [sys.executable, "-m", "lex_plugin.cli", "resolution", data, "--path", ckpt,
           "--lengths", ",".join(map(str, lengths)), "--texts", o.resolution_texts, "--json", out]
    return cmd + (["--bca"] if window == "bca" else [])

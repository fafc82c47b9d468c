"""The LeX paper's extrapolation tables at CPU scale: run definitions, the commands of each step, the
resumable step runner, and the tables, claim verdicts and plot built from the finished reports.

Protocol (``scripts/reproduce.py`` is its command line): for each run (a ``--pos-emb`` scheme, an xPos
ablation, or a scheme trained with randomized positions) with the same model size, data, optimizer and token
budget, fairseq-train at training length l (:func:`train_command`), then one fairseq-eval-lm over the first
``eval_tokens`` tokens of the test split at each evaluation length and window (:func:`eval_command`, the
stream protocol of ``--task lex_language_modeling``), then ``lex resolution`` at l and 2l with full attention
and BCA (:func:`resolution_command`). On the xPos, RoPE and ALiBi checkpoints it then runs each of
:data:`METHODS` (attention sinks, LM-Infinite's Λ-shaped attention, RoPE scaling; the same lengths and tokens)
and ``lex passkey`` at l..8l (:func:`passkey_command`). :func:`write_results` turns the reports into LeX
Tables 2-5 in shape, a table per method, the passkey accuracies, the claims check, plots and a JSON of
everything.

The package: :mod:`.catalogue` (the runs, methods, probes and profiles), :mod:`.options`, :mod:`.commands` (each step's
command line), :mod:`.runner` (the resumable step runner), :mod:`.steps` (the steps of a run and :func:`reproduce`),
:mod:`.results` (reports -> tables, plots, results.json), :mod:`.tables`, :mod:`.plots` and :mod:`.verdict`.
Every function takes the options as one frozen value, ``o``: :class:`~.options.ReproduceOptions` (the model,
l, the budget and optimizer, the evaluation lengths and tokens, the methods and probes, the snapshot budgets, bf16
autocast). :data:`PROFILES` names whole settings (``--profile``).
"""

from ..recipe import PLUGIN_DIR
from .catalogue import (BABILONG_FINETUNE, DEFAULT_RUNS, DROPE_TEMPERATURES, LABELS, METHOD_RUNS, METHODS, PASSKEY_FINETUNE,
                        PROBE_WINDOWS, PROBES, PROFILES, ROTARY_RUNS, RULER_DATA_DONE, RULER_FINETUNE, RUNS, SINK_TOKENS,
                        WINDOW_LABEL, methods_of, profile_flags)
from .commands import (answer_finetune_command, babilong_command, babilong_data_command, eval_command, finetune_command,
                       longppl_command, method_command, passkey_command, passkey_data_command, prepare_command, probe_windows,
                       resolution_command, ruler_command, ruler_data_command, scaled_passkey_flags, train_command)
from .options import ReproduceOptions
from .plots import plot_ppl
from .results import write_results
from .runner import ReproduceError, Runner, check_options, fmt_time
from .steps import recalibration_choice, reproduce
from .tables import (check_claims, check_magnitudes, markdown_claims, markdown_magnitudes, markdown_methods, markdown_passkey,
                     markdown_ppl, markdown_resolution, ppl_table)

__all__ = [
    "BABILONG_FINETUNE", "DEFAULT_RUNS", "DROPE_TEMPERATURES", "LABELS", "METHODS", "METHOD_RUNS", "PASSKEY_FINETUNE",
    "PLUGIN_DIR", "PROBES", "PROBE_WINDOWS", "PROFILES", "ROTARY_RUNS", "RULER_DATA_DONE", "RULER_FINETUNE", "RUNS",
    "SINK_TOKENS", "WINDOW_LABEL", "ReproduceError", "ReproduceOptions", "Runner", "answer_finetune_command",
    "babilong_command", "babilong_data_command", "check_claims", "check_magnitudes", "check_options", "eval_command",
    "finetune_command", "fmt_time", "longppl_command", "markdown_claims", "markdown_magnitudes", "markdown_methods",
    "markdown_passkey", "markdown_ppl", "markdown_resolution", "method_command", "methods_of", "passkey_command",
    "passkey_data_command", "plot_ppl", "ppl_table", "prepare_command", "probe_windows", "profile_flags",
    "recalibration_choice", "reproduce", "resolution_command", "ruler_command", "ruler_data_command",
    "scaled_passkey_flags", "train_command", "write_results",
]

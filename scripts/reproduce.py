#!/usr/bin/env python
"""Reproduce the LeX paper's extrapolation tables at CPU scale on the book corpus (one resumable command).

For each run (a ``--pos-emb`` scheme, an xPos ablation, or a scheme trained with randomized positions)
with the same model size, data, optimizer and token budget: fairseq-train at training length l, then one
fairseq-eval-lm over the first ``--eval-tokens`` tokens of the test split at each evaluation length and
window (the stream protocol of ``--task lex_language_modeling``), then ``lex resolution`` at l and 2l with
full attention and BCA; on the xPos, RoPE and ALiBi checkpoints, each of ``--methods`` (attention sinks,
Λ-shaped attention, RoPE scaling, the passkey probe). Finally it writes the tables (LeX Tables 2-5 in
shape, one per method, passkey accuracy), the claims check, plots and a JSON of everything to WORK.

    python scripts/reproduce.py                                # ~3 h 15 min on 2 CPU cores (est.), see RESULTS.md
    python scripts/reproduce.py --work work/repro --max-update 500   # more tokens, ~4 h 15 min (est.)
    nohup python scripts/reproduce.py > repro.log 2>&1 &      # background; tail -f WORK/runs/*/train.log

Every step leaves a stamp (a finished checkpoint, a JSON report); re-running skips what is done and
fairseq-train resumes from ``checkpoint_last.pt``, so a killed run continues where it stopped. Each
command is printed before it runs and logged to WORK/runs/NAME/*.log. Results: examples/lex_lm/RESULTS.md.
The steps, tables and claims are ``lex_plugin.experiments.reproduce``; this is its command line.
"""

from pathlib import Path

import click

from lex_plugin.experiments.reproduce import (DEFAULT_RUNS, METHOD_RUNS, METHODS, PROBE_WINDOWS, PROBES, PROFILES, ROTARY_RUNS, RUNS, methods_of, probe_windows, ReproduceError, ReproduceOptions, profile_flags,
                                             reproduce)
from lex_plugin.options import given_flags, parse_int_list, parse_name_list

REPO = Path(__file__).resolve().parents[1]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--corpus", type=click.Path(path_type=Path), default=REPO.parent / "shared" / "data" / "pg", show_default=True,
              help="SRC/{train,valid,test}/*.txt, prepared with `lex prepare` unless --data-bin exists")
@click.option("--work", type=click.Path(path_type=Path), default=Path("work/reproduce"), show_default=True)
@click.option("--data-bin", type=click.Path(path_type=Path), default=None,
              help="an already prepared data-bin (default: WORK/data-bin, prepared from --corpus)")
@click.option("--runs", "run_names", default=",".join(DEFAULT_RUNS), show_default=True,
              help="comma-separated, in order; also the trained designs: rope_qknorm, rope_ssmax, none_tt, rope_drope")
@click.option("--arch", default="lex_lm_tiny", show_default=True)
@click.option("--training-length", type=click.IntRange(min=2), default=256, show_default=True, help="l (tokens per sample)")
@click.option("--max-update", type=click.IntRange(min=1), default=300, show_default=True, help="updates per model (equal token budget)")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--lr", default="1.5e-3", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--lengths", default=None, help="evaluation lengths (default: l, 2l, 4l, ... up to --longest x l)")
@click.option("--longest", type=click.IntRange(min=1), default=16, show_default=True,
              help="without --lengths: evaluate at l, 2l, 4l, ... up to this multiple of l")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=49152, show_default=True,
              help="score the first N test tokens at every length")
@click.option("--resolution-texts", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--methods", "method_names", default=",".join(m for m in [*METHODS, *PROBES] if m != "longppl_common"),
              show_default=True,
              help="evaluation-time methods and the probes (passkey as trained and after fine-tuning on its format; "
                   "RULER-lite and BABILong-lite after fine-tuning; LongPPL) on the xpos, rope and alibi checkpoints; "
                   "'' for none; also longppl_common (LongPPL on the committed common evaluator's key tokens, l = 256)")
@click.option("--passkey-trials", type=click.IntRange(min=1), default=10, show_default=True, help="prompts per passkey cell")
@click.option("--budgets", default="", show_default=True,
              help="comma-separated updates below --max-update at which each run is also evaluated (snapshots of the "
                   "one run, same schedule): the ratio-against-training-tokens table and ratio_vs_tokens.png")
@click.option("--bf16-autocast/--no-bf16-autocast", default=False, show_default=True,
              help="train each run under bf16 autocast (fp32 weights and optimizer state; every evaluation, and the "
                   "probes' fine-tuning, stay fp32); needs native bf16 (CUDA 8.0+, or a CPU with AVX-512 BF16 / AMX)")
@click.option("--probe-windows", default="", show_default=True,
              help="comma-separated attention modes the probes (passkey, RULER-lite, BABILong-lite, LongPPL) compare, "
                   f"each run taking those that apply to it; '' for all: {','.join((*PROBE_WINDOWS, 'leaky_rerope'))}. "
                   "'full' is the trained designs' battery (their verdict reads full attention)")
@click.option("--profile", type=click.Choice(sorted(PROFILES)), default=None,
              help="a named setting: its values replace the defaults of the options not given on the command line. "
                   + "; ".join(f"{name}: {profile_flags(name)}" for name in sorted(PROFILES)))
@click.option("--finetune-seeds", default="", help="comma-separated seeds of the probes' fine-tuning (passkey_finetuned, ruler, babilong), "
                   "each fine-tuned and probed apart")
@click.option("--in-process", is_flag=True, default=False,
              help="run each fairseq-train, fairseq-eval-lm and lex step in this process instead of a new one (saves "
                   "~5 s of imports a step: small runs; one process's threads, no isolation between steps)")
def main(**params):
    """Train every scheme on the same budget, evaluate at l..16l under full/sliding/BCA, measure attention
    resolution, and write WORK/tables.md, WORK/results.json, WORK/ppl_vs_length.png."""
    given = {k for k in params if given_flags(k)}
    if params["profile"]:  # the profile's values for every option left at its default
        params.update({k: v for k, v in PROFILES[params["profile"]].items() if k not in given})
    p = params
    runs = parse_name_list(p["run_names"], "--runs")
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise click.BadParameter(f"unknown runs {unknown}; choose from {', '.join(RUNS)}", param_hint="--runs")
    methods = parse_name_list(p["method_names"], "--methods")
    unknown = [m for m in methods if m not in METHODS and m not in PROBES]
    if unknown:
        raise click.BadParameter(f"unknown methods {unknown}; choose from {', '.join([*METHODS, *PROBES])}",
                                 param_hint="--methods")
    if "method_names" in given:  # named methods must run somewhere (the default, all of them, is "those that apply")
        idle = [m for m in methods if not any(methods_of(r, [m]) for r in runs)]
        if idle:
            raise click.BadParameter(
                f"{', '.join(idle)} runs on none of --runs {','.join(runs)}: the methods run on the {', '.join(METHOD_RUNS)} "
                f"checkpoints (RoPE scalings and Leaky ReRoPE on {', '.join(ROTARY_RUNS)} alone), the trained designs take "
                "the probes as trained. Add a run that takes them, or drop them.", param_hint="--methods")
    if "lengths" in given and "longest" in given:
        raise click.BadParameter("--lengths names every length; --longest only sets the default ones. Give one.",
                                 param_hint="--longest")
    probed = [m for m in methods if m in PROBES and any(methods_of(r, [m]) for r in runs)]
    for option, takers in (("probe_windows", probed), ("passkey_trials", [m for m in probed if m.startswith("passkey")]),
                           ("finetune_seeds", [m for m in probed if m in ("passkey_finetuned", "ruler", "babilong")])):
        if option in given and not takers:
            what = {"passkey_trials": "passkey probe",
                    "finetune_seeds": "passkey_finetuned, ruler or babilong probe"}.get(option, "probe")
            raise click.BadParameter(f"no {what} in --methods runs "
                                     "on these runs, so it would change nothing; drop it or add the probe",
                                     param_hint=f"--{option.replace('_', '-')}")
    named = parse_name_list(p["probe_windows"], "--probe-windows")
    try:  # every probe window a run can take, in one order: the same setting reads the same in options.json
        windows = list(probe_windows(rotary=True, position_maps=True, only=named)) if named else []
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--probe-windows") from None
    l, max_update = p["training_length"], p["max_update"]
    try:
        lengths = (sorted(set(parse_int_list(p["lengths"], "--lengths"))) if p["lengths"]
                   else [l * 2 ** i for i in range(p["longest"].bit_length()) if 2 ** i <= p["longest"]])
        budgets = sorted(set(parse_int_list(str(p["budgets"]), "--budgets")))
        seeds = parse_int_list(str(p["finetune_seeds"]), "--finetune-seeds") if p["finetune_seeds"] else []
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if p["bf16_autocast"]:
        import torch

        from lex_plugin.modules.autocast import check_autocast

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where fairseq-train will run
        try:
            check_autocast(device, torch.bfloat16, torch.float32)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--bf16-autocast") from None
    try:  # the options check themselves (ReproduceOptions: l, lengths, eval tokens, budgets ...)
        o = ReproduceOptions(arch=p["arch"], training_length=l, max_update=max_update, batch_size=p["batch_size"], lr=p["lr"],
                             seed=p["seed"], lengths=lengths, eval_tokens=p["eval_tokens"],
                             resolution_texts=p["resolution_texts"], methods=methods, passkey_trials=p["passkey_trials"],
                             budgets=budgets, bf16_autocast=p["bf16_autocast"], probe_windows=windows,
                             finetune_seeds=seeds)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        reproduce(Path(p["work"]), o, runs, p["corpus"], p["data_bin"], in_process=p["in_process"])
    except ReproduceError as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    main()

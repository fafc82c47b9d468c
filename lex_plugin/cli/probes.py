"""``lex`` probes that compare attention modes on long prompts: ``passkey``, ``ruler``, ``babilong``."""

import click

from ..options import parse_float_list, parse_int_list, parse_name_list
from .common import CKPT, DATA, JSON_OUT, PLOT_OUT, RESUME, WINDOWS, open_hub, probe_journal, probe_options, probe_outputs, probe_specs
from .group import main


@main.command("passkey")
@CKPT
@DATA
@click.option("--lengths", default="256,512,1024,2048", show_default=True, help="comma-separated prompt lengths (tokens)")
@click.option("--depths", default="0.1,0.3,0.5,0.7,0.9", show_default=True, help="relative needle depths in [0, 1]")
@WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=10, show_default=True, help="prompts per (length, depth)")
@click.option("--distractors", type=click.IntRange(min=1), default=9, show_default=True,
              help="random other keys scored against the true one")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the filler text comes from")
@probe_options
@JSON_OUT
@PLOT_OUT
def passkey_cmd(checkpoint, data, lengths, depths, windows, trials, distractors, seed, split, json_out, plot_out, **flags):
    """Passkey retrieval (Mohtashami & Jaggi 2023): a 5-digit key hidden at each depth of a filler context
    of each length (filler from the data-bin's own text); the true key is scored against random
    distractors by the model's log-probability. Accuracy per (window, length, depth): table, JSON, heat map."""
    from ..analysis.report import split_stream
    from ..evaluation.passkey import format_passkey, passkey_accuracy, plot_passkey

    try:
        sizes = parse_int_list(lengths, "--lengths")
        fractions = parse_float_list(depths, "--depths", 0.0, 1.0)
        modes = parse_name_list(windows, "--windows")
        if not sizes or not fractions or not modes:
            raise ValueError("--lengths, --depths and --windows each need at least one value.")
        hub = open_hub(checkpoint, data, flags)
        specs = probe_specs(hub, flags, modes, max(sizes))
        filler = split_stream(data, split, hub.src_dict)
        results = passkey_accuracy(hub.models[0], hub.encode_fragment, filler, sizes, fractions, specs, hub.src_dict.eos(),
                                   hub.src_dict.pad(), trials, distractors, seed)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    l = flags["training_length"] or hub.training_length
    click.echo(format_passkey(results, l))
    report = {"checkpoint": str(checkpoint), "data": str(data), "split": split, "training_length": l,
              "rope_scaling": None if specs[0].rope_scaling is None else str(specs[0].rope_scaling),
              "results": [r.to_dict() for r in results]}
    probe_outputs(report, json_out, plot_out, lambda out: plot_passkey(results, out, l))


@main.command("ruler")
@CKPT
@DATA
@click.option("--tasks", default="niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,"
              "niah_multivalue,niah_multiquery,vt,fwe,cwe", show_default=True,
              help="comma-separated RULER task names (a task too long for a length is skipped there, '-' in the tables)")
@click.option("--lengths", default=None, help="comma-separated prompt lengths in tokens (default l, 2l, 4l, 8l)")
@click.option("--depths", default="0.1,0.5,0.9", show_default=True, help="relative needle depths in [0, 1] (fwe, cwe have none)")
@WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=4, show_default=True, help="prompts per cell")
@click.option("--distractors", type=click.IntRange(min=1), default=9, show_default=True,
              help="same-typed wrong candidates per answer (chance 1 / (K + 1))")
@click.option("--hops", type=click.IntRange(min=1), default=2, show_default=True, help="vt: assignments after the first")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the book haystacks come from")
@click.option("--threshold", type=click.FloatRange(0, 1), default=0.856, show_default=True,
              help="effective length: the task average, at 3 decimals, must exceed this at every length up to it (RULER's "
                   "0.856; at most 3 decimals)")
@click.option("--relative-threshold", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="effective length also at this fraction of the window's own average at the shortest length")
@probe_options
@JSON_OUT
@PLOT_OUT
@RESUME
def ruler_cmd(checkpoint, data, tasks, lengths, depths, windows, trials, distractors, hops, seed, split, threshold,
              relative_threshold, json_out, plot_out, resume, **flags):
    """RULER-lite (RULER's synthetic tasks for small models): needles in noise or book text (numbers, UUIDs),
    several keys, values and queries, variable tracking, frequent- and common-word extraction. Each query is
    scored by greedy exact match (RULER's string_match_all on what greedy decoding writes) and by ranking each
    answer against K same-typed distractors. Per (task, window, length, depth): tables, each window's effective
    length and weighted averages, JSON, one heat map per task (--plot OUT.png writes OUT_TASK.png)."""
    from ..data.stream import split_stream
    from ..evaluation.ruler import check_threshold, effective_length, format_ruler, plot_ruler, ruler_accuracy

    try:
        check_threshold(threshold)  # before the probe runs, not after it
        hub = open_hub(checkpoint, data, flags)
        l = flags["training_length"] or hub.training_length
        if lengths is None and l is None:
            raise ValueError("the checkpoint records no training length; give --lengths.")
        sizes = parse_int_list(lengths, "--lengths") if lengths else [l * k for k in (1, 2, 4, 8)]
        fractions = parse_float_list(depths, "--depths", 0.0, 1.0)
        modes, names = parse_name_list(windows, "--windows"), parse_name_list(tasks, "--tasks")
        if not sizes or not fractions or not modes or not names:
            raise ValueError("--tasks, --lengths, --depths and --windows each need at least one value.")
        specs = probe_specs(hub, flags, modes, max(sizes))
        filler = split_stream(data, split, hub.src_dict)
        journal = probe_journal(json_out, checkpoint, resume)
        results = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, names, sizes, fractions, specs, hub.src_dict.eos(),
                                 hub.src_dict.pad(), trials, distractors, hops, seed, unk=hub.src_dict.unk(), journal=journal)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(format_ruler(results, l, threshold, relative_threshold))
    summary = [{"window": w, "measure": m, "relative": rel, **effective_length(results, w, m, threshold, rel)}
               for w in dict.fromkeys(r.window for r in results) for m in ("greedy", "ranking")
               for rel in (None, relative_threshold)]
    report = {"checkpoint": str(checkpoint), "data": str(data), "split": split, "training_length": l, "trials": trials,
              "distractors": distractors, "hops": hops, "seed": seed, "threshold": threshold,
              "relative_threshold": relative_threshold, "summary": summary, "results": [r.to_dict() for r in results]}
    probe_outputs(report, json_out, plot_out, lambda out: plot_ruler(results, out, l),
                   plot_out and plot_out.with_name(f"{plot_out.stem}_TASK{plot_out.suffix}"))
    if journal is not None:
        journal.remove()


@main.command("babilong")
@CKPT
@DATA
@click.option("--tasks", default="qa1,qa2,qa3,qa4,qa5", show_default=True, help="comma-separated bAbI tasks")
@click.option("--lengths", default=None, help="comma-separated prompt lengths in tokens (default l, 2l, 4l, 8l, 16l)")
@WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=20, show_default=True, help="stories per cell")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the book text comes from")
@probe_options
@JSON_OUT
@PLOT_OUT
@RESUME
def babilong_cmd(checkpoint, data, tasks, lengths, windows, trials, seed, split, json_out, plot_out, resume, **flags):
    """BABILong-lite: bAbI stories (qa1-qa5: one, two, three supporting facts; two- and three-argument relations)
    scattered through book text at each length, then the question; scored by greedy exact match of the answer
    word and by ranking it against the task's other answers. Table, JSON, heat map. Fine-tune first on
    lex babilong-data rows (a model trained on books has never seen a question)."""
    from ..data.stream import split_stream
    from ..evaluation.babilong import babilong_accuracy, format_babilong, plot_babilong

    try:
        hub = open_hub(checkpoint, data, flags)
        l = flags["training_length"] or hub.training_length
        if lengths is None and l is None:
            raise ValueError("the checkpoint records no training length; give --lengths.")
        sizes = parse_int_list(lengths, "--lengths") if lengths else [l * k for k in (1, 2, 4, 8, 16)]
        modes, names = parse_name_list(windows, "--windows"), parse_name_list(tasks, "--tasks")
        if not sizes or not modes or not names:
            raise ValueError("--tasks, --lengths and --windows each need at least one value.")
        specs = probe_specs(hub, flags, modes, max(sizes))
        journal = probe_journal(json_out, checkpoint, resume)
        results = babilong_accuracy(hub.models[0], hub.encode_fragment, split_stream(data, split, hub.src_dict), names,
                                    sizes, specs, hub.src_dict.eos(), hub.src_dict.pad(), trials, seed,
                                    unk=hub.src_dict.unk(), journal=journal)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(format_babilong(results, l))
    report = {"checkpoint": str(checkpoint), "data": str(data), "split": split, "training_length": l, "trials": trials,
              "seed": seed, "results": [r.to_dict() for r in results]}
    probe_outputs(report, json_out, plot_out, lambda out: plot_babilong(results, out, l))
    if journal is not None:
        journal.remove()

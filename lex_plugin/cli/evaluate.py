"""``lex`` commands that evaluate or analyse a model: ``score``, ``generate``, ``resolution``, ``decay-curve``,
``receptive-field``, and the report tools ``plot`` and ``compare-curves``."""

import json
import math
import sys
from pathlib import Path

import click

from ..modules.positions.xpos import GAMMA, SCALE_BASE
from ..options import given_flags, parse_int_list
from .common import (CKPT, DATA, DEPRECATED_DATA, JSON_OUT, PLOT_OUT, SPLIT, analysis_model, analysis_outputs,
                     command_provenance, data_and_rest, key_token_options, load_hub, window_options)
from .group import main


@main.command("plot")
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="PNG to write")
@click.option("--label", "labels", multiple=True, help="one per report (default: file names)")
@click.option("--protocol", type=click.Choice(["stream", "fixed_target"]), default="stream", show_default=True)
@click.option("--title", default=None)
@click.option("--metric", type=click.Choice(["ppl", "longppl"]), default="ppl", show_default=True,
              help="longppl: the LongPPL column of reports written with --longppl")
@click.option("--windows", "--window", "modes", default=None,
              help="draw only these attention modes' rows, comma-separated (full, bca, sliding, rerope, ...)")
def plot_cmd(reports, out, labels, protocol, title, metric, modes):
    """Plot perplexity (or LongPPL) against length (log x) for one or more --report-json files of
    fairseq-eval-lm --task lex_language_modeling."""
    from ..evaluation.plot import plot_reports
    from ..options import parse_name_list

    try:
        n = plot_reports(reports, out, labels or None, protocol, title, metric,
                         parse_name_list(modes, "--window") if modes else None)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        raise click.ClickException(f"cannot plot: {err}") from None
    click.echo(f"{n} lines -> {out}")


@main.command("compare-curves")
@click.argument("log_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("log_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--labels", default="a,b", show_default=True, help="the two runs' names, comma-separated")
@click.option("--after", type=click.IntRange(min=0), default=0, show_default=True,
              help="the summary covers updates past this one (leave the warm-up out)")
@click.option("--key", default="loss", show_default=True, help="the train_inner statistic compared (loss: bits per token)")
@click.option("--tolerance", type=click.FloatRange(min=0, min_open=True), default=None,
              help="exit with status 1 when |b / a - 1| exceeds this past --after (0.01 = 1%)")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="PNG of both curves and the gap")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def compare_curves_cmd(log_a, log_b, labels, after, key, tolerance, plot_path, json_path):
    """Compare the training curves of two fairseq-train logs (stdout or --log-file; --log-format simple or
    json) at every update both logged: a table of each run's value and the relative gap b / a - 1, then the
    largest gap past --after and the gap at the last update (bf16 autocast against fp32, one seed against
    another)."""
    from ..experiments.train_log import compare_curves, markdown_curves, plot_curves, read_train_log

    names = [x.strip() for x in labels.split(",")]
    if len(names) != 2 or not all(names):
        raise click.BadParameter(f"{labels!r}: give two names, comma-separated", param_hint="--labels")
    try:
        result = compare_curves(read_train_log(log_a), read_train_log(log_b), after, key)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(markdown_curves(result, names, key))
    click.echo(f"\nlargest |{names[1]} / {names[0]} - 1| past update {after}: {100 * result['max_relative']:.2f}% "
               f"(update {result['at']:,}); at the last update: {100 * result['final_relative']:+.2f}%")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"labels": names, "key": key, **result}, indent=1))
    if plot_path:
        plot_curves(result, names, plot_path, f"{names[1]} against {names[0]}", key)
        click.echo(f"plot: {plot_path}")
    if tolerance is not None and result["max_relative"] > tolerance:
        click.echo(f"beyond the tolerance {100 * tolerance:g}%", err=True)
        sys.exit(1)


@main.command("generate")
@click.argument("data", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--path", "checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="checkpoint file (e.g. checkpoints/checkpoint_last.pt)")
@DEPRECATED_DATA
@click.option("--prompt", "prompts", multiple=True, required=True, help="text to continue (repeat for several)")
@click.option("--max-len", type=click.IntRange(min=1), default=50, show_default=True, help="tokens to generate")
@window_options
@click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True, help="0: greedy")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--beam", type=click.IntRange(min=1), default=1, show_default=True,
              help="> 1: fairseq's beam search (the prompt is then fed one token per step)")
@click.option("--seed", type=int, default=None)
def generate_cmd(data, checkpoint, data_option, prompts, max_len, temperature, top_k, top_p, beam, seed, **window):
    """Continue one or more prompts with a LeX checkpoint (sampling with temperature / top-k / top-p, or
    beam search). DATA: the data-bin made by lex prepare (dictionary, BPE model)."""
    data, extra = data_and_rest(data_option, data, "")
    if extra:
        raise click.UsageError(f"lex generate takes one DATA; give the texts with --prompt (got {', '.join(map(str, extra))}).")
    given = given_flags("temperature", "top_k", "top_p", "seed")
    if beam > 1 and given:
        raise click.UsageError(f"{', '.join(given)}: options of sampling; --beam {beam} searches deterministically and "
                               "would ignore them. Drop them, or drop --beam.")
    unused = [g for g in given if g != "--temperature"]
    if temperature == 0 and unused:
        raise click.UsageError(f"--temperature 0 decodes greedily, which {', '.join(unused)} would not change; "
                               "drop them, or give a temperature above 0.")
    try:
        hub = load_hub(checkpoint, data, window)
        for prompt in prompts:
            if beam > 1:  # fairseq's length limits count the prompt too
                prompt_len = len(hub.encode(prompt))
                text = hub.sample(prompt, beam=beam, max_len_b=prompt_len + max_len, min_len=prompt_len + 1)
                click.echo(text)
            else:
                text = hub.continue_text(prompt, max_len=max_len, temperature=temperature, top_k=top_k,
                                         top_p=top_p, seed=seed)
                click.echo(f"{prompt} {text}")
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None


@main.command("score")
@CKPT
@DEPRECATED_DATA
@click.argument("paths", nargs=-1, required=True, metavar="DATA FILE...", type=click.Path(exists=True, path_type=Path))
@window_options
@click.option("--longppl", is_flag=True, help="also LongPPL (Fang et al. 2025): perplexity over the key tokens, those the "
              "evaluator predicts better by > alpha nats with the whole document than truncated, at loss < beta")
@click.option("--key-token-model", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="--longppl evaluator checkpoint (same data-bin), under full attention [default: --path]")
@key_token_options
@JSON_OUT
def score_cmd(checkpoint, data_option, paths, json_out, longppl, key_token_model, **flags):
    """Perplexity of raw text FILEs (one document each, UTF-8) under the data-bin DATA the model was trained on (its
    spm.model, dict.txt and lex_prepare.json encode the text), with the loss per position bucket
    ([0, l), [l, 2l), [2l, 4l) ...), under any window, and with --longppl the LongPPL of each document. No
    binarising: the text is encoded as lex prepare encodes a corpus; long documents run through the key/value
    cache, never truncated."""
    data, files = data_and_rest(data_option, paths, "the FILEs")
    if not files or any(f.is_dir() for f in files):
        raise click.UsageError("lex score DATA FILE ...: give at least one text file after the data-bin.")
    from ..analysis.report import write_json
    from ..evaluation.documents import format_scores, score_document
    from ..evaluation.longppl import key_token_rule

    try:
        rule = key_token_rule(longppl, key_token_model, **{k: flags.pop(k) for k in list(flags) if k.startswith("longppl_")})
        hub = load_hub(checkpoint, data, flags)
        evaluator = load_hub(key_token_model, data, {"cpu": flags.get("cpu")}) if key_token_model else None
        scores = []
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path} is not UTF-8; convert it (e.g. iconv -f latin1 -t utf-8).") from None
            scores.append(score_document(hub, text, name=path.name, key_token_rule=rule, evaluator=evaluator))
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    tokens = sum(s.tokens for s in scores)
    nll = sum(s.nll for s in scores)
    click.echo(format_scores(scores, hub.training_length))
    overall = 2 ** (nll / tokens / math.log(2))
    click.echo(f"\n{len(scores)} documents, {tokens:,} tokens, window {hub.spec}: ppl {overall:.2f}")
    report = {"checkpoint": str(checkpoint), "data": str(data), "window": str(hub.window),
              "attention": hub.spec.fields(),
              "rope_scaling": None if hub.spec.rope_scaling is None else str(hub.spec.rope_scaling),
              "training_length": hub.training_length, "tokens": tokens, "ppl": overall,
              "documents": [s.to_dict() for s in scores]}
    if rule is not None:
        report["longppl"] = {"evaluator": str(key_token_model or checkpoint), "window": "full",
                             **rule.resolve((evaluator or hub).training_length or hub.training_length).to_dict()}
    write_json(report, json_out, provenance=command_provenance() if json_out else None)
    if json_out:
        click.echo(f"JSON -> {json_out}")


@main.command("resolution")
@CKPT
@DATA
@click.option("--lengths", default="1024,2048", show_default=True, help="comma-separated text lengths")
@click.option("--texts", type=click.IntRange(min=1), default=8, show_default=True, help="texts per length")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True)
@SPLIT
@window_options
@JSON_OUT
@PLOT_OUT
def resolution_cmd(checkpoint, data, lengths, texts, batch_size, split, json_out, plot_out, **window):
    """Attention resolution (LeX paper Eq. 4, Table 3): s[n] from the pre-softmax logits of each layer,
    averaged over texts and heads; R(s) per layer and averaged over layers."""
    from ..analysis.report import format_resolution, plot_resolution, resolution_report, split_stream

    def report():
        sizes = parse_int_list(lengths, "--lengths")
        if not sizes or min(sizes) < 2:
            raise ValueError(f"--lengths takes integers >= 2 separated by commas, got {lengths!r}.")
        model, dictionary, spec = analysis_model(checkpoint, data, window)
        return resolution_report(model, split_stream(data, split, dictionary), sizes, spec, texts, batch_size)

    analysis_outputs(report, format_resolution, json_out, plot_out, plot_resolution)


@main.command("first-token")
@CKPT
@DATA
@click.option("--length", type=click.IntRange(min=2), default=256, show_default=True, help="tokens per text")
@click.option("--texts", type=click.IntRange(min=1), default=16, show_default=True, help="texts averaged")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True)
@SPLIT
@JSON_OUT
def first_token_cmd(checkpoint, data, length, texts, batch_size, split, json_out):
    """The share of attention on the first token (the attention sink) per layer, under full attention: the measure
    of Qiu et al. 2025 (Gated Attention, section 4.3), on texts of the split."""
    from ..analysis.report import first_token_report, format_first_token, split_stream

    def report():
        model, dictionary, _ = analysis_model(checkpoint, data, {})
        return first_token_report(model, split_stream(data, split, dictionary), length, texts, batch_size)

    analysis_outputs(report, format_first_token, json_out)


@main.command("decay-curve")
@click.option("--head-dim", type=int, default=64, show_default=True)
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True), default=GAMMA, show_default=True)
@click.option("--scale-base", type=click.FloatRange(min=0, min_open=True), default=SCALE_BASE, show_default=True)
@click.option("--max-distance", type=click.IntRange(min=1), default=8192, show_default=True)
@JSON_OUT
@PLOT_OUT
def decay_curve_cmd(head_dim, gamma, scale_base, max_distance, json_out, plot_out):
    """The expectation g[n] of the logit by distance (LeX Eq. 10, Figure 2) for RoPE and xPos, with R(g)."""
    from ..analysis.report import decay_curve_report, format_decay_curve, plot_decay_curve

    analysis_outputs(lambda: decay_curve_report(head_dim, gamma, scale_base, max_distance), format_decay_curve, json_out,
                     plot_out, plot_decay_curve)


@main.command("receptive-field")
@CKPT
@DATA
@click.option("--length", type=click.IntRange(min=2), default=2048, show_default=True, help="inputs per text")
@click.option("--segments", type=click.IntRange(min=1), default=8, show_default=True, help="texts averaged")
@SPLIT
@window_options
@JSON_OUT
@PLOT_OUT
def receptive_field_cmd(checkpoint, data, length, segments, split, json_out, plot_out, **window):
    """Receptive field (Chi et al., section 5.1): cumulative normalized gradient of the last token's loss
    with respect to the input embeddings, ERF = min{m : c_m > 0.99}, and the window's theoretical bound."""
    from ..analysis.report import format_receptive_field, plot_receptive_field, receptive_field_report, split_stream

    def report():
        model, dictionary, spec = analysis_model(checkpoint, data, window, evaluation_length=length)
        return receptive_field_report(model, split_stream(data, split, dictionary), length, spec, segments)

    analysis_outputs(report, format_receptive_field, json_out, plot_out, plot_receptive_field)

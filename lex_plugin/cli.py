"""The ``lex`` command line (click): corpus preparation and helpers around fairseq's own commands."""

import json
import logging
import math
import os
import shlex
import sys
from pathlib import Path

import click

from .data.prepare import PrepareConfig, PrepareError, prepare
from .modules.attention.flags import ATTENTION_FLAGS, ATTENTION_MODES, MODE_SELECTORS
from .modules.attention.spec import AttentionOptions
from .modules.positions.rope_scaling import ROPE_SCALINGS
from .modules.positions.xpos import GAMMA, SCALE_BASE
from .options import parse_float_list, parse_int_list, parse_name_list


def _attention_options(names):
    """A decorator adding the attention flags ``names`` (their one declaration, ``flags.ATTENTION_FLAGS``) as
    click options: switches off unless given, values None unless given (``AttentionOptions.from_flags``)."""
    def decorate(fn):
        for name in reversed(names):
            flag = ATTENTION_FLAGS[name]
            if flag.type is bool:
                fn = click.option(flag.flag, is_flag=True, help=flag.help)(fn)
                continue
            kind = (click.Choice(list(flag.choices)) if flag.choices
                    else click.IntRange(min=flag.minimum) if flag.type is int
                    else click.FloatRange(min=flag.minimum) if flag.type is float else str)
            fn = click.option(flag.flag, type=kind, default=None, metavar=flag.metavar, help=flag.help)(fn)
        return fn
    return decorate


def _window_options(fn):
    """Every attention flag (the task's) and --bf16-autocast."""
    return _precision_options(_attention_options(list(ATTENTION_FLAGS))(fn))


def _precision_options(fn):
    """--bf16-autocast, as in the task."""
    return click.option("--bf16-autocast", is_flag=True,
                        help="run the model under torch.autocast in bf16, fp32 weights (needs native bf16: "
                             "a CPU with AVX-512 BF16 / AMX, CUDA 8.0+)")(fn)


_WINDOWS = click.option("--windows", default="full,bca", show_default=True,
                        help=f"comma-separated attention modes among {', '.join(ATTENTION_MODES)}")


def _key_token_options(fn):
    """LongPPL's rule flags (``--longppl-alpha`` ..., declared once in ``evaluation.longppl.KEY_TOKEN_FLAGS``)."""
    from .evaluation.longppl import KEY_TOKEN_FLAGS

    for name, kind, text in reversed(KEY_TOKEN_FLAGS):
        fn = click.option(f"--longppl-{name.replace('_', '-')}", f"longppl_{name}", default=None,
                          type=click.IntRange(min=1) if kind is int else kind, help=text)(fn)
    return fn


def _probe_options(fn):
    """The flags of a probe that compares modes (--windows): every attention flag but the switches that select a
    mode (--sliding-window stays: W of the sliding mode), and --bf16-autocast."""
    names = [name for name in ATTENTION_FLAGS if name not in MODE_SELECTORS or name == "sliding_window"]
    return _precision_options(_attention_options(names)(fn))


def _probe_specs(hub, flags: dict, modes, longest: int):
    """One attention spec per mode of a probe's --windows, the other flags shared (``AttentionOptions.for_mode``;
    ValueError for an option no mode takes)."""
    options = AttentionOptions.from_flags(flags)  # the modes come from --windows
    options.check_modes(modes)
    return [hub.spec_for(options.for_mode(m), longest) for m in modes]


def _hub(checkpoint: Path, data: Path, flags: dict, evaluation_length=None):
    """The hub of ``checkpoint`` under the attention spec of the flags of :func:`_window_options`
    (``AttentionOptions.from_flags``; ValueError as ``AttentionOptions.spec``)."""
    from .hub_interface import from_pretrained

    hub = from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=bool(flags.get("bf16_autocast")))
    return hub.under(hub.spec_for(AttentionOptions.from_flags(flags), evaluation_length))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """lex_plugin: LeX Transformer tools for fairseq (train and evaluate with fairseq-train /
    fairseq-eval-lm --user-dir "$(lex user-dir)")."""
    # force: importing fairseq may already have configured the root logger (see lex_plugin.logs); results go to
    # stdout, the log to stderr
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, force=True)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG


@main.command("prepare")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--splits", default="train,valid,test", show_default=True, help="comma-separated sub-directories of SRC")
@click.option("--bpe", type=click.Choice(["sentencepiece", "none"]), default="sentencepiece", show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=16), default=8192, show_default=True,
              help="BPE vocabulary (with --bpe none: the number of words kept)")
@click.option("--lang", default="en", show_default=True, help="Moses language code")
@click.option("--workers", type=click.IntRange(min=1), default=PrepareConfig.workers, show_default=True)
@click.option("--documents", type=click.Choice(["file", "wikitext"]), default="file", show_default=True,
              help="file: one document per .txt; wikitext: split files at top-level ' = Title = ' lines")
@click.option("--max-docs", type=click.IntRange(min=1), default=None, help="first N documents of each split")
@click.option("--max-chars-per-doc", type=click.IntRange(min=1), default=None,
              help="truncate each document to N characters (quick slices)")
@click.option("--like", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              metavar="DATA_BIN", help="reuse DATA_BIN's Moses settings, spm.model and dict.txt (to evaluate a model "
                                       "trained on DATA_BIN on new text; any splits, e.g. --splits test)")
@click.option("--force", is_flag=True, help="replace DEST if it exists")
@click.pass_context
def prepare_cmd(ctx, src, dest, splits, bpe, vocab_size, lang, workers, documents, max_docs, max_chars_per_doc, like,
                force):
    """Turn SRC/{train,valid,test}/*.txt (one document per file, or WikiText articles with --documents
    wikitext) into a fairseq data-bin at DEST.

    Moses normalisation and tokenisation (sacremoses, no XML escaping), SentencePiece BPE learned on the
    train split, then fairseq-preprocess --only-source. Documents are separated by an empty line, so
    --sample-break-mode complete_doc works. With --like DATA_BIN nothing is learned: DATA_BIN's
    tokenizer settings, BPE model and dictionary encode the text.
    """
    if like is not None:
        given = [f"--{name.replace('_', '-')}" for name in ("bpe", "vocab_size", "lang")
                 if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)} cannot be combined with --like: they come from {like}.")
    cfg = PrepareConfig(
        splits=tuple(s.strip() for s in splits.split(",") if s.strip()),
        lang=lang,
        bpe=bpe,
        vocab_size=vocab_size,
        workers=workers,
        documents=documents,
        max_docs=max_docs,
        max_chars_per_doc=max_chars_per_doc,
        like=like,
    )
    try:
        meta = prepare(src, dest, cfg, force=force)
    except PrepareError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"data-bin written to {dest}")
    click.echo(f"{'split':<6} {'documents':>9} {'lines':>8} {'tokens':>11}")
    for split, s in meta["splits"].items():
        click.echo(f"{split:<6} {s['documents']:>9} {s['lines']:>8} {s['tokens']:>11,}")


@main.command("plot")
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="PNG to write")
@click.option("--label", "labels", multiple=True, help="one per report (default: file names)")
@click.option("--protocol", type=click.Choice(["stream", "fixed_target"]), default="stream", show_default=True)
@click.option("--title", default=None)
@click.option("--metric", type=click.Choice(["ppl", "longppl"]), default="ppl", show_default=True,
              help="longppl: the LongPPL column of reports written with --longppl")
def plot_cmd(reports, out, labels, protocol, title, metric):
    """Plot perplexity (or LongPPL) against length (log x) for one or more --report-json files of
    fairseq-eval-lm --task lex_language_modeling."""
    from .evaluation.plot import plot_reports

    try:
        n = plot_reports(reports, out, labels or None, protocol, title, metric)
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
    from .evaluation.train_log import compare_curves, markdown_curves, plot_curves, read_train_log

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
@click.option("--path", "checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="checkpoint file (e.g. checkpoints/checkpoint_last.pt)")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="the data-bin made by lex prepare (dictionary, BPE model)")
@click.option("--prompt", "prompts", multiple=True, required=True, help="text to continue (repeat for several)")
@click.option("--max-len", type=click.IntRange(min=1), default=50, show_default=True, help="tokens to generate")
@_window_options
@click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True, help="0: greedy")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--beam", type=click.IntRange(min=1), default=1, show_default=True,
              help="> 1: fairseq's beam search (the prompt is then fed one token per step)")
@click.option("--seed", type=int, default=None)
def generate_cmd(checkpoint, data, prompts, max_len, temperature, top_k, top_p, beam, seed, **window):
    """Continue one or more prompts with a LeX checkpoint (sampling with temperature / top-k / top-p, or
    beam search)."""
    try:
        hub = _hub(checkpoint, data, window)
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


@main.command("export-hf")
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="the data-bin the checkpoint was trained on (dict.txt, spm.model, lex_prepare.json)")
@_attention_options(list(ATTENTION_FLAGS))
@click.option("--max-position-embeddings", type=click.IntRange(min=1), default=None,
              help="config.max_position_embeddings: the length tools such as lm-eval feed at once (default 16 l; a "
                   "learned table's size); not a limit of the model")
@click.option("--length-report", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="an --eval-lengths JSON (fairseq-eval-lm --report-json) whose perplexity table the model card shows")
@click.option("--force", is_flag=True, help="replace the files of an existing OUT")
def export_hf_cmd(checkpoint, out, data, force, max_position_embeddings, length_report, **window):
    """Write CHECKPOINT as a self-contained Hugging Face model directory OUT: config.json (model, position
    scheme, training length, the attention spec of the flags as its default), model.safetensors, the tokenizer
    (as lex prepare encodes), a model card and the remote code, generated from this package's sources, that
    AutoModelForCausalLM / AutoModel / AutoTokenizer load with trust_remote_code=True where only torch,
    transformers, safetensors, sentencepiece and sacremoses are installed."""
    try:
        from .export.hf import export_hf
    except ImportError as err:
        raise click.ClickException(f"lex export-hf needs transformers and safetensors (the hf extra: "
                                   f"pip install -e '.[hf]'): {err}") from None
    try:
        model = export_hf(checkpoint, data, out, AttentionOptions.from_flags(window), force,
                          max_position_embeddings=max_position_embeddings, length_report=length_report)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        raise click.ClickException(str(err)) from None
    c = model.config
    click.echo(f"exported {checkpoint} -> {out}: {c.pos_emb}, {c.num_hidden_layers} layers, C = {c.hidden_size}, "
               f"V = {c.vocab_size}, l = {c.training_length}, attention {model.spec}")
    click.echo(f"load: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")


def _analysis_model(checkpoint, data, window: dict, evaluation_length=None):
    from .analysis.report import load_model

    return load_model(checkpoint, data, AttentionOptions.from_flags(window), evaluation_length,
                      bf16_autocast=bool(window.get("bf16_autocast")))


def _outputs(report, table, json_out, plot_out, plotter):
    from .analysis.report import write_json

    click.echo(table)
    write_json(report, json_out)
    if plot_out:
        plotter(report, plot_out)
    for label, path in (("JSON", json_out), ("plot", plot_out)):
        if path:
            click.echo(f"{label} -> {path}")


def _probe_outputs(report: dict, json_out, plot_out, draw, plots_shown=None):
    """A probe's files: the plot first (``draw(plot_out)``; the JSON is what a resumed run, scripts/reproduce.py,
    takes as done), then the JSON; each path echoed (``plots_shown``: how to name several PNGs)."""
    from .analysis.report import write_json

    if plot_out:
        draw(plot_out)
    write_json(report, json_out)
    for label, path in (("JSON", json_out), ("plot", plots_shown or plot_out)):
        if path:
            click.echo(f"{label} -> {path}")


_CKPT = click.option("--path", "checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
                     help="checkpoint file")
_DATA = click.argument("data", type=click.Path(exists=True, file_okay=False, path_type=Path))
_SPLIT = click.option("--split", default="test", show_default=True, help="split of the data-bin to read texts from")
_JSON = click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write the results as JSON")
_PLOT = click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write a PNG")


@main.command("resolution")
@_CKPT
@_DATA
@click.option("--lengths", default="1024,2048", show_default=True, help="comma-separated text lengths")
@click.option("--texts", type=click.IntRange(min=1), default=8, show_default=True, help="texts per length")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True)
@_SPLIT
@_window_options
@_JSON
@_PLOT
def resolution_cmd(checkpoint, data, lengths, texts, batch_size, split, json_out, plot_out, **window):
    """Attention resolution (LeX paper Eq. 4, Table 3): s[n] from the pre-softmax logits of each layer,
    averaged over texts and heads; R(s) per layer and averaged over layers."""
    from .analysis.report import format_resolution, plot_resolution, resolution_report, split_stream

    try:
        sizes = parse_int_list(lengths, "--lengths")
        if not sizes or min(sizes) < 2:
            raise ValueError(f"--lengths takes integers >= 2 separated by commas, got {lengths!r}.")
        model, dictionary, spec = _analysis_model(checkpoint, data, window)
        report = resolution_report(model, split_stream(data, split, dictionary), sizes, spec, texts, batch_size)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    _outputs(report, format_resolution(report), json_out, plot_out, plot_resolution)


@main.command("decay-curve")
@click.option("--head-dim", type=int, default=64, show_default=True)
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True), default=GAMMA, show_default=True)
@click.option("--scale-base", type=click.FloatRange(min=0, min_open=True), default=SCALE_BASE, show_default=True)
@click.option("--max-distance", type=click.IntRange(min=1), default=8192, show_default=True)
@_JSON
@_PLOT
def decay_curve_cmd(head_dim, gamma, scale_base, max_distance, json_out, plot_out):
    """The expectation g[n] of the logit by distance (LeX Eq. 10, Figure 2) for RoPE and xPos, with R(g)."""
    from .analysis.report import decay_curve_report, format_decay_curve, plot_decay_curve

    try:
        report = decay_curve_report(head_dim, gamma, scale_base, max_distance)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    _outputs(report, format_decay_curve(report), json_out, plot_out, plot_decay_curve)


@main.command("receptive-field")
@_CKPT
@_DATA
@click.option("--length", type=click.IntRange(min=2), default=2048, show_default=True, help="inputs per text")
@click.option("--segments", type=click.IntRange(min=1), default=8, show_default=True, help="texts averaged")
@_SPLIT
@_window_options
@_JSON
@_PLOT
def receptive_field_cmd(checkpoint, data, length, segments, split, json_out, plot_out, **window):
    """Receptive field (Chi et al., section 5.1): cumulative normalized gradient of the last token's loss
    with respect to the input embeddings, ERF = min{m : c_m > 0.99}, and the window's theoretical bound."""
    from .analysis.report import format_receptive_field, plot_receptive_field, receptive_field_report, split_stream

    try:
        model, dictionary, spec = _analysis_model(checkpoint, data, window, evaluation_length=length)
        report = receptive_field_report(model, split_stream(data, split, dictionary), length, spec, segments)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    _outputs(report, format_receptive_field(report), json_out, plot_out, plot_receptive_field)


@main.command("score")
@_CKPT
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="the data-bin the model was trained on (its spm.model, dict.txt and lex_prepare.json encode the text)")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_window_options
@click.option("--longppl", is_flag=True, help="also LongPPL (Fang et al. 2025): perplexity over the key tokens, those the "
              "evaluator predicts better by > alpha nats with the whole document than truncated, at loss < beta")
@click.option("--key-token-model", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="--longppl evaluator checkpoint (same data-bin), under full attention [default: --path]")
@_key_token_options
@_JSON
def score_cmd(checkpoint, data, files, json_out, longppl, key_token_model, **flags):
    """Perplexity of raw text FILES (one document each, UTF-8), with the loss per position bucket
    ([0, l), [l, 2l), [2l, 4l) ...), under any window, and with --longppl the LongPPL of each document. No
    binarising: the text is encoded as lex prepare encodes a corpus; long documents run through the key/value
    cache, never truncated."""
    from .analysis.report import write_json
    from .evaluation.documents import format_scores
    from .evaluation.longppl import key_token_rule

    try:
        rule = key_token_rule(longppl, key_token_model, **{k: flags.pop(k) for k in list(flags) if k.startswith("longppl_")})
        hub = _hub(checkpoint, data, flags)
        evaluator = _hub(key_token_model, data, {}) if key_token_model else None
        scores = []
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path} is not UTF-8; convert it (e.g. iconv -f latin1 -t utf-8).") from None
            scores.append(hub.score_document(text, name=path.name, key_token_rule=rule, evaluator=evaluator))
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
    write_json(report, json_out)
    if json_out:
        click.echo(f"JSON -> {json_out}")


@main.command("passkey")
@_CKPT
@_DATA
@click.option("--lengths", default="256,512,1024,2048", show_default=True, help="comma-separated prompt lengths (tokens)")
@click.option("--depths", default="0.1,0.3,0.5,0.7,0.9", show_default=True, help="relative needle depths in [0, 1]")
@_WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=10, show_default=True, help="prompts per (length, depth)")
@click.option("--distractors", type=click.IntRange(min=1), default=9, show_default=True,
              help="random other keys scored against the true one")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the filler text comes from")
@_probe_options
@_JSON
@_PLOT
def passkey_cmd(checkpoint, data, lengths, depths, windows, trials, distractors, seed, split, json_out, plot_out, **flags):
    """Passkey retrieval (Mohtashami & Jaggi 2023): a 5-digit key hidden at each depth of a filler context
    of each length (filler from the data-bin's own text); the true key is scored against random
    distractors by the model's log-probability. Accuracy per (window, length, depth): table, JSON, heat map."""
    from .analysis.report import split_stream
    from .evaluation.passkey import format_passkey, passkey_accuracy, plot_passkey
    from .hub_interface import from_pretrained

    try:
        sizes = parse_int_list(lengths, "--lengths")
        fractions = parse_float_list(depths, "--depths", 0.0, 1.0)
        modes = parse_name_list(windows, "--windows")
        if not sizes or not fractions or not modes:
            raise ValueError("--lengths, --depths and --windows each need at least one value.")
        hub = from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=flags["bf16_autocast"])
        specs = _probe_specs(hub, flags, modes, max(sizes))
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
    _probe_outputs(report, json_out, plot_out, lambda out: plot_passkey(results, out, l))


def _write_finetune_bin(checkpoint: Path, data: Path, dest: Path, max_length, split: str, make_rows, what: str, source: str):
    """A fine-tuning data-bin DEST for a probe (passkey-data, ruler-data): ``make_rows(hub, filler, max_length)``'s
    rows (max_length default l - 1) as DEST/train.{bin,idx} with their answer lengths (train.answers.npy, for
    --answer-only-loss), plus DATA's dictionary and encoder files."""
    import shutil

    from .data.finetune import write_rows
    from .data.stream import split_stream
    from .hub_interface import from_pretrained

    if dest.exists() and any(dest.iterdir()):
        raise click.ClickException(f"{dest} exists and is not empty; give a new directory.")
    try:
        hub = from_pretrained(checkpoint.parent, checkpoint.name, data, "full")
        l = hub.training_length
        if l is None and max_length is None:
            raise ValueError("the checkpoint records no training length; give --max-length (l - 1 for training length l).")
        rows = make_rows(hub, split_stream(data, split, hub.src_dict), max_length or l - 1)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    partial = dest.with_name(dest.name + ".partial")  # written whole, then renamed: a killed run leaves no half DEST
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in data.iterdir():  # dictionary, encoder and preparation record; not the splits
        if path.is_file() and path.suffix not in (".bin", ".idx"):
            shutil.copy2(path, partial / path.name)
    write_rows(rows, partial / "train", hub.src_dict.eos(), len(hub.src_dict))
    partial.rename(dest)  # over an empty DEST too (checked above; POSIX rename replaces an empty directory)
    lengths = [r.tokens.numel() for r in rows]
    click.echo(f"{len(rows):,} {what}, {sum(lengths):,} tokens ({min(lengths)}-{max(lengths)} per sample, "
               f"{source} from {split}) -> {dest}/train.{{bin,idx,answers.npy}}; fine-tune with --tokens-per-sample >= "
               f"{max(lengths) + 1} (--answer-only-loss: the loss on the answers alone)")


@main.command("passkey-data")
@_CKPT
@_DATA
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--samples", type=click.IntRange(min=1), default=4000, show_default=True, help="prompts followed by their key")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="longest sample (prompt and key) in tokens (default l - 1: one row of --sample-break-mode eos "
                   "--tokens-per-sample l; fine-tune with --tokens-per-sample above it)")
@click.option("--split", default="train", show_default=True, help="split the filler text comes from (keep the probe's test text unseen)")
@click.option("--seed", type=int, default=1, show_default=True)
def passkey_data_cmd(checkpoint, data, dest, samples, max_length, split, seed):
    """A fine-tuning data-bin DEST in the passkey probe's format (a prompt, then its key; at most l - 1 tokens
    together): DEST/train.{bin,idx} plus DATA's dictionary and encoder files, no valid split. Fine-tune on
    it with fairseq-train --sample-break-mode eos --disable-validation --finetune-from-model CKPT, then run
    lex passkey on DATA as usual."""
    from .evaluation.passkey import finetune_samples

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, samples, max_length, seed)

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "passkey samples", "filler")


@main.command("ruler")
@_CKPT
@_DATA
@click.option("--tasks", default="niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,"
              "niah_multivalue,niah_multiquery,vt,fwe,cwe", show_default=True,
              help="comma-separated RULER task names (a task too long for a length is skipped there, '-' in the tables)")
@click.option("--lengths", default=None, help="comma-separated prompt lengths in tokens (default l, 2l, 4l, 8l)")
@click.option("--depths", default="0.1,0.5,0.9", show_default=True, help="relative needle depths in [0, 1] (fwe, cwe have none)")
@_WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=4, show_default=True, help="prompts per cell")
@click.option("--distractors", type=click.IntRange(min=1), default=9, show_default=True,
              help="same-typed wrong candidates per answer (chance 1 / (K + 1))")
@click.option("--hops", type=click.IntRange(min=1), default=2, show_default=True, help="vt: assignments after the first")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the book haystacks come from")
@click.option("--threshold", type=click.FloatRange(0, 1), default=0.856, show_default=True,
              help="effective length: the task average must exceed this at every length up to it (RULER's 85.6%)")
@click.option("--relative-threshold", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="effective length also at this fraction of the window's own average at the shortest length")
@_probe_options
@_JSON
@_PLOT
def ruler_cmd(checkpoint, data, tasks, lengths, depths, windows, trials, distractors, hops, seed, split, threshold,
              relative_threshold, json_out, plot_out, **flags):
    """RULER-lite (RULER's synthetic tasks for small models): needles in noise or book text (numbers, UUIDs),
    several keys, values and queries, variable tracking, frequent- and common-word extraction. Each query is
    scored by greedy exact match (RULER's string_match_all on what greedy decoding writes) and by ranking each
    answer against K same-typed distractors. Per (task, window, length, depth): tables, each window's effective
    length and weighted averages, JSON, one heat map per task (--plot OUT.png writes OUT_TASK.png)."""
    from .data.stream import split_stream
    from .evaluation.ruler import effective_length, format_ruler, plot_ruler, ruler_accuracy
    from .hub_interface import from_pretrained

    try:
        hub = from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=flags["bf16_autocast"])
        l = flags["training_length"] or hub.training_length
        if lengths is None and l is None:
            raise ValueError("the checkpoint records no training length; give --lengths.")
        sizes = parse_int_list(lengths, "--lengths") if lengths else [l * k for k in (1, 2, 4, 8)]
        fractions = parse_float_list(depths, "--depths", 0.0, 1.0)
        modes, names = parse_name_list(windows, "--windows"), parse_name_list(tasks, "--tasks")
        if not sizes or not fractions or not modes or not names:
            raise ValueError("--tasks, --lengths, --depths and --windows each need at least one value.")
        specs = _probe_specs(hub, flags, modes, max(sizes))
        filler = split_stream(data, split, hub.src_dict)
        results = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, names, sizes, fractions, specs, hub.src_dict.eos(),
                                 hub.src_dict.pad(), trials, distractors, hops, seed, unk=hub.src_dict.unk())
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(format_ruler(results, l, threshold, relative_threshold))
    summary = [{"window": w, "measure": m, "relative": rel, **effective_length(results, w, m, threshold, rel)}
               for w in dict.fromkeys(r.window for r in results) for m in ("greedy", "ranking")
               for rel in (None, relative_threshold)]
    report = {"checkpoint": str(checkpoint), "data": str(data), "split": split, "training_length": l, "trials": trials,
              "distractors": distractors, "hops": hops, "seed": seed, "threshold": threshold,
              "relative_threshold": relative_threshold, "summary": summary, "results": [r.to_dict() for r in results]}
    _probe_outputs(report, json_out, plot_out, lambda out: plot_ruler(results, out, l),
                   plot_out and plot_out.with_name(f"{plot_out.stem}_TASK{plot_out.suffix}"))


@main.command("ruler-data")
@_CKPT
@_DATA
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--tasks", default="niah_single_1,niah_single_2,niah_multikey_1,niah_multikey_2,niah_multivalue,niah_multiquery,vt,fwe",
              show_default=True, help="the tasks mixed, in turn")
@click.option("--samples", type=click.IntRange(min=1), default=8000, show_default=True, help="prompts followed by an answer")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="longest sample (prompt and answer) in tokens (default l - 1: one row of --sample-break-mode eos)")
@click.option("--hops", type=click.IntRange(min=1), default=2, show_default=True, help="vt: assignments after the first")
@click.option("--split", default="train", show_default=True, help="split the book haystacks come from (keep the probe's test text unseen)")
@click.option("--seed", type=int, default=1, show_default=True)
def ruler_data_cmd(checkpoint, data, dest, tasks, samples, max_length, hops, split, seed):
    """A fine-tuning data-bin DEST in the RULER-lite format (the tasks mixed, each prompt followed by the answer
    text of one of its questions; at most l - 1 tokens): DEST/train.{bin,idx} plus DATA's dictionary and encoder
    files. Fine-tune with fairseq-train --sample-break-mode eos --disable-validation --finetune-from-model CKPT,
    then run lex ruler on DATA."""
    from .evaluation.ruler import finetune_samples

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, parse_name_list(tasks, "--tasks"), samples, max_length, seed,
                                hops=hops, unk=hub.src_dict.unk())

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "RULER-lite samples", "haystacks")


@main.command("babilong")
@_CKPT
@_DATA
@click.option("--tasks", default="qa1,qa2,qa3,qa4,qa5", show_default=True, help="comma-separated bAbI tasks")
@click.option("--lengths", default=None, help="comma-separated prompt lengths in tokens (default l, 2l, 4l, 8l, 16l)")
@_WINDOWS
@click.option("--trials", type=click.IntRange(min=1), default=20, show_default=True, help="stories per cell")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default="test", show_default=True, help="split of the data-bin the book text comes from")
@_probe_options
@_JSON
@_PLOT
def babilong_cmd(checkpoint, data, tasks, lengths, windows, trials, seed, split, json_out, plot_out, **flags):
    """BABILong-lite: bAbI stories (qa1-qa5: one, two, three supporting facts; two- and three-argument relations)
    scattered through book text at each length, then the question; scored by greedy exact match of the answer
    word and by ranking it against the task's other answers. Table, JSON, heat map. Fine-tune first on
    lex babilong-data rows (a model trained on books has never seen a question)."""
    from .data.stream import split_stream
    from .evaluation.babilong import babilong_accuracy, format_babilong, plot_babilong
    from .hub_interface import from_pretrained

    try:
        hub = from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=flags["bf16_autocast"])
        l = flags["training_length"] or hub.training_length
        if lengths is None and l is None:
            raise ValueError("the checkpoint records no training length; give --lengths.")
        sizes = parse_int_list(lengths, "--lengths") if lengths else [l * k for k in (1, 2, 4, 8, 16)]
        modes, names = parse_name_list(windows, "--windows"), parse_name_list(tasks, "--tasks")
        if not sizes or not modes or not names:
            raise ValueError("--tasks, --lengths and --windows each need at least one value.")
        specs = _probe_specs(hub, flags, modes, max(sizes))
        results = babilong_accuracy(hub.models[0], hub.encode_fragment, split_stream(data, split, hub.src_dict), names,
                                    sizes, specs, hub.src_dict.eos(), hub.src_dict.pad(), trials, seed,
                                    unk=hub.src_dict.unk())
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    click.echo(format_babilong(results, l))
    report = {"checkpoint": str(checkpoint), "data": str(data), "split": split, "training_length": l, "trials": trials,
              "seed": seed, "results": [r.to_dict() for r in results]}
    _probe_outputs(report, json_out, plot_out, lambda out: plot_babilong(results, out, l))


@main.command("babilong-data")
@_CKPT
@_DATA
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--tasks", default="qa1,qa2,qa3,qa4,qa5", show_default=True, help="the tasks mixed, in turn")
@click.option("--samples", type=click.IntRange(min=1), default=8000, show_default=True, help="stories followed by an answer")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="longest sample (prompt and answer) in tokens (default l - 1: one row of --sample-break-mode eos)")
@click.option("--split", default="train", show_default=True, help="split the book text comes from (keep the probe's test text unseen)")
@click.option("--seed", type=int, default=1, show_default=True)
def babilong_data_cmd(checkpoint, data, dest, tasks, samples, max_length, split, seed):
    """A fine-tuning data-bin DEST in the BABILong-lite format (the tasks mixed, each story in book text followed by
    its question and answer; at most l - 1 tokens): DEST/train.{bin,idx,answers.npy} plus DATA's dictionary and
    encoder files. Fine-tune with fairseq-train --sample-break-mode eos --answer-only-loss --finetune-from-model
    CKPT, then run lex babilong on DATA."""
    from .evaluation.babilong import finetune_samples

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, parse_name_list(tasks, "--tasks"), samples, max_length, seed,
                                unk=hub.src_dict.unk())

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "BABILong-lite samples", "book text")


@main.command("train", context_settings={"ignore_unknown_options": True})
@click.argument("data", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("save_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", default="lex_lm_tiny", show_default=True)
@click.option("--tokens-per-sample", type=click.IntRange(min=1), default=256, show_default=True, help="the training length l")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--lr", default="1.5e-3", show_default=True, help="peak learning rate")
@click.option("--max-update", type=click.IntRange(min=1), default=600, show_default=True)
@click.option("--warmup-updates", type=click.IntRange(min=1), default=None, help="default: max-update / 8")
@click.option("--save-interval-updates", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--validate-interval-updates", type=click.IntRange(min=0), default=0, show_default=True,
              help="validate every N updates on 10 batches (0: no validation)")
@click.option("--seed", type=int, default=1, show_default=True)
@click.argument("fairseq_args", nargs=-1, type=click.UNPROCESSED)
def train_cmd(data, save_dir, arch, tokens_per_sample, batch_size, lr, max_update, warmup_updates, save_interval_updates,
              validate_interval_updates, seed, fairseq_args):
    """fairseq-train DATA into SAVE_DIR with the project's recipe (lex_plugin.recipe: Adam (0.9, 0.98), weight
    decay 0.01, clip 1.0, polynomial decay after a warm-up, tied embeddings), the one the demo, the reproduction
    and the benchmarks use. Further fairseq-train options go after the others (--pos-emb rope, --fp16 ...). The
    command is printed, then runs in place of this one: resuming from SAVE_DIR/checkpoint_last.pt as fairseq does."""
    from .recipe import fairseq_train_command

    cmd = fairseq_train_command(data, save_dir, arch=arch, tokens_per_sample=tokens_per_sample, batch_size=batch_size,
                                lr=lr, updates=max_update, warmup=warmup_updates, save_interval_updates=save_interval_updates,
                                validate_interval_updates=validate_interval_updates or None, seed=seed,
                                extra=fairseq_args)  # last: they override the recipe's (--log-format json ...)
    beside = Path(sys.executable).parent / cmd[0]  # this environment's fairseq-train, whatever PATH says
    cmd[0] = str(beside) if beside.is_file() else cmd[0]
    click.echo("+ " + " ".join(shlex.quote(c) for c in cmd), err=True)
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


@main.command("user-dir")
def user_dir_cmd():
    """Print the path to give fairseq's --user-dir (the installed lex_plugin package)."""
    click.echo(os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    main()

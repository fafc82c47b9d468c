"""The options and helpers every ``lex`` command family shares: the attention flags (generated from their one
declaration, ``flags.ATTENTION_FLAGS``), the checkpoint / data-bin / output options, and loading a model under them."""

from pathlib import Path

import click

from ..modules.attention.flags import ATTENTION_FLAGS, ATTENTION_MODES, MODE_SELECTORS
from ..modules.attention.spec import AttentionOptions


def attention_options(names):
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


def window_options(fn):
    """Every attention flag (the task's), --bf16-autocast and --cpu."""
    return precision_options(attention_options(list(ATTENTION_FLAGS))(fn))


def precision_options(fn):
    """--bf16-autocast, as in the task, and --cpu, as in fairseq (the model runs on CUDA where it is available)."""
    fn = click.option("--cpu", is_flag=True,
                      help="run on the CPU even where CUDA is available (default: CUDA when present, as fairseq)")(fn)
    return click.option("--bf16-autocast", is_flag=True,
                        help="run the model under torch.autocast in bf16, fp32 weights (needs native bf16: "
                             "a CPU with AVX-512 BF16 / AMX, CUDA 8.0+)")(fn)


def command_device(flags: dict):
    """The device a command's model runs on: CUDA where it is available, unless ``--cpu`` (fairseq's convention)."""
    import torch

    return torch.device("cpu" if flags.get("cpu") or not torch.cuda.is_available() else "cuda")


def open_hub(checkpoint: Path, data: Path, flags: dict):
    """The hub of ``checkpoint`` (full attention) under ``--bf16-autocast``, on :func:`command_device`: how every
    command that runs a model loads it (FileNotFoundError, ValueError as ``hub_interface.from_pretrained``)."""
    from ..hub_interface import from_pretrained

    return from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=bool(flags.get("bf16_autocast")),
                           device=command_device(flags))


WINDOWS = click.option("--windows", default="full,bca", show_default=True,
                        help=f"comma-separated attention modes among {', '.join(ATTENTION_MODES)}")


def key_token_options(fn):
    """LongPPL's rule flags (``--longppl-alpha`` ..., declared once in ``evaluation.longppl.KEY_TOKEN_FLAGS``)."""
    from ..evaluation.longppl import KEY_TOKEN_FLAGS

    for name, kind, text in reversed(KEY_TOKEN_FLAGS):
        fn = click.option(f"--longppl-{name.replace('_', '-')}", f"longppl_{name}", default=None,
                          type=click.IntRange(min=1) if kind is int else kind, help=text)(fn)
    return fn


def probe_options(fn):
    """The flags of a probe that compares modes (--windows): every attention flag but the switches that select a
    mode (--sliding-window stays: W of the sliding mode), and --bf16-autocast."""
    names = [name for name in ATTENTION_FLAGS if name not in MODE_SELECTORS or name == "sliding_window"]
    return precision_options(attention_options(names)(fn))


def probe_specs(hub, flags: dict, modes, longest: int):
    """One attention spec per mode of a probe's --windows, the other flags shared (``AttentionOptions.for_mode``;
    ValueError for an option no mode takes)."""
    options = AttentionOptions.from_flags(flags)  # the modes come from --windows
    options.check_modes(modes)
    return [hub.spec_for(options.for_mode(m), longest) for m in modes]


def load_hub(checkpoint: Path, data: Path, flags: dict, evaluation_length=None):
    """The hub of ``checkpoint`` under the attention spec of the flags of :func:`window_options`
    (``AttentionOptions.from_flags``; ValueError as ``AttentionOptions.spec``)."""
    hub = open_hub(checkpoint, data, flags)
    return hub.under(hub.spec_for(AttentionOptions.from_flags(flags), evaluation_length))


def analysis_model(checkpoint, data, window: dict, evaluation_length=None):
    """The fairseq model of ``checkpoint`` (eval mode) for an analysis command, under the attention of the flags
    ``window`` (:func:`window_options`; ``evaluation_length``: the L that ``auto`` scalings resolve against), with
    ``--bf16-autocast`` applied (``analysis.report.load_model``; ValueError as ``AttentionOptions.spec``)."""
    from ..analysis.report import load_model

    return load_model(checkpoint, data, AttentionOptions.from_flags(window), evaluation_length,
                      bf16_autocast=bool(window.get("bf16_autocast")), device=command_device(window))


def command_provenance() -> dict:
    """The provenance of the running ``lex`` command's report (``lex_plugin.provenance``): its command line, the
    code's commit, the device its model ran on (:func:`command_device` of its ``--cpu``), versions, its ``--seed``
    where it has one, and the wall time since the command began."""
    import time

    from ..provenance import provenance
    from .group import STARTED

    ctx = click.get_current_context()
    started = ctx.meta.get(STARTED)
    return provenance(seed=ctx.params.get("seed"), wall_s=None if started is None else time.monotonic() - started,
                      cuda=command_device(ctx.params).type == "cuda")


def analysis_outputs(make_report, table, json_out, plot_out=None, plotter=None) -> None:
    """An analysis command's run: ``make_report()`` (a ValueError or FileNotFoundError becomes the command's error
    message, what to change), then :func:`write_outputs` of the report and its markdown ``table(report)``."""
    try:
        report = make_report()
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from None
    write_outputs(report, table(report), json_out, plot_out, plotter)


def write_outputs(report, table, json_out, plot_out, plotter):
    """An analysis command's results: ``table`` (markdown) echoed, ``report`` written as JSON to ``json_out`` (with its
    :func:`command_provenance`) and
    drawn by ``plotter(report, plot_out)`` where those paths are given (None: skipped), each path echoed."""
    from ..analysis.report import write_json

    click.echo(table)
    write_json(report, json_out, provenance=command_provenance() if json_out else None)
    if plot_out:
        plotter(report, plot_out)
    for label, path in (("JSON", json_out), ("plot", plot_out)):
        if path:
            click.echo(f"{label} -> {path}")


def probe_outputs(report: dict, json_out, plot_out, draw, plots_shown=None):
    """A probe's files: the plot first (``draw(plot_out)``; the JSON is what a resumed run, scripts/reproduce.py,
    takes as done), then the JSON with its :func:`command_provenance`; each path echoed (``plots_shown``: how to name several PNGs)."""
    from ..analysis.report import write_json

    if plot_out:
        draw(plot_out)
    write_json(report, json_out, provenance=command_provenance() if json_out else None)
    for label, path in (("JSON", json_out), ("plot", plots_shown or plot_out)):
        if path:
            click.echo(f"{label} -> {path}")


CKPT = click.option("--path", "checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
                     help="checkpoint file")


DATA = click.argument("data", type=click.Path(exists=True, file_okay=False, path_type=Path))

# the data-bin of score and generate before the one convention (DATA first, as fairseq-eval-lm and every other lex
# command take it): still accepted for one release, with a deprecation message
DEPRECATED_DATA = click.option("--data", "data_option", type=click.Path(exists=True, file_okay=False, path_type=Path),
                               default=None, help="deprecated: give the data-bin as the first argument DATA")


def data_and_rest(data_option, arguments, rest: str):
    """(data-bin, the other positional arguments) of a command whose data-bin comes first (``lex score DATA FILE...``)
    or, deprecated, as ``--data`` (a message on stderr says so).

    Raises:
        click.UsageError: no data-bin; a data-bin that is not a directory; the data-bin given both ways.
    """
    arguments = [Path(a) for a in arguments]
    if data_option is not None:
        click.echo("lex: --data is deprecated and goes in the next release: give the data-bin as the first argument "
                   "(lex score DATA FILE ..., lex generate DATA --prompt ...), as fairseq-eval-lm and the other lex "
                   "commands take it.", err=True)
        if arguments and arguments[0].is_dir():
            raise click.UsageError(f"the data-bin is given twice ({arguments[0]} and --data {data_option}): keep DATA.")
        return Path(data_option), arguments
    if not arguments:
        raise click.UsageError(f"missing DATA, the data-bin (first argument){', then ' + rest if rest else ''}.")
    if not arguments[0].is_dir():
        raise click.UsageError(f"DATA, the first argument, must be the data-bin directory; got {arguments[0]}.")
    return arguments[0], arguments[1:]


SPLIT = click.option("--split", default="test", show_default=True, help="split of the data-bin to read texts from")


JSON_OUT = click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write the results as JSON")


PLOT_OUT = click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write a PNG")


RESUME = click.option("--resume/--no-resume", default=True, show_default=True,
                      help="with --json OUT: record each finished cell in OUT.cells.jsonl, and read the cells of an earlier, "
                           "killed run of the same command (same checkpoint file, same options, same lex_plugin source) back instead of computing them")


def probe_journal(json_out, checkpoint, resume: bool):
    """The cell journal of a ``--resume`` probe writing ``json_out`` (``OUT.cells.jsonl``), signed with the command,
    the checkpoint file, every option given and the digest of lex_plugin's source (:class:`~lex_plugin.evaluation.journal.CellJournal`); None without
    ``--json`` or with ``--no-resume`` (which also drops a journal left by an earlier run)."""
    from ..evaluation.journal import JOURNAL_SUFFIX, CellJournal, checkpoint_identity, code_identity

    if json_out is None:
        return None
    path = json_out.with_name(json_out.name + JOURNAL_SUFFIX)
    if not resume:
        path.unlink(missing_ok=True)
        return None
    ctx = click.get_current_context()
    options = {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in sorted(ctx.params.items())
               if k not in ("json_out", "plot_out", "resume")}
    return CellJournal(path, {"command": ctx.command.name, "checkpoint": checkpoint_identity(checkpoint), "options": options,
                              "code": code_identity()})

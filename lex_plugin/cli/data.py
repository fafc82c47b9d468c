"""``lex`` commands that write data-bins: ``prepare`` (a corpus) and the probes' fine-tuning bins (``passkey-data``,
``ruler-data``, ``babilong-data``)."""

from pathlib import Path

import click

from ..data.prepare import PrepareConfig, PrepareError, prepare
from ..options import given_flags, parse_name_list
from .common import CKPT, DATA
from .group import main


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
        given = given_flags("bpe", "vocab_size", "lang")
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


def _write_finetune_bin(checkpoint: Path, data: Path, dest: Path, max_length, split: str, make_rows, what: str, source: str):
    """A fine-tuning data-bin DEST for a probe (passkey-data, ruler-data): ``make_rows(hub, filler, max_length)``'s
    rows (max_length default l - 1) as DEST/train.{bin,idx} with their answer lengths (train.answers.npy, for
    --answer-only-loss), plus DATA's dictionary and encoder files."""
    import shutil

    from ..data.finetune import write_rows
    from ..data.stream import split_stream
    from ..hub_interface import from_pretrained

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
@CKPT
@DATA
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
    from ..evaluation.passkey import finetune_samples

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, samples, max_length, seed)

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "passkey samples", "filler")


@main.command("ruler-data")
@CKPT
@DATA
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
    from ..evaluation.ruler import finetune_samples

    names = _task_names(tasks)

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, names, samples, max_length, seed, hops=hops, unk=hub.src_dict.unk())

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "RULER-lite samples", "haystacks")


def _task_names(tasks: str) -> list:
    """The names of ``--tasks`` (comma-separated), at least one; which names exist is the probe's to check."""
    names = parse_name_list(tasks, "--tasks")
    if not names:
        raise click.BadParameter("give at least one task: the samples take the tasks in turn", param_hint="--tasks")
    return names


@main.command("babilong-data")
@CKPT
@DATA
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
    from ..evaluation.babilong import finetune_samples

    names = _task_names(tasks)

    def rows(hub, filler, max_length):
        return finetune_samples(hub.encode_fragment, filler, names, samples, max_length, seed, unk=hub.src_dict.unk())

    _write_finetune_bin(checkpoint, data, dest, max_length, split, rows, "BABILong-lite samples", "book text")

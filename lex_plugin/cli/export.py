"""``lex export-hf``: a checkpoint as a self-contained Hugging Face model directory."""

from pathlib import Path

import click

from ..modules.attention.flags import ATTENTION_FLAGS
from ..modules.attention.spec import AttentionOptions
from .common import attention_options
from .group import main


@main.command("export-hf")
@click.argument("data", type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--path", "checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="checkpoint file  [required]")
@click.option("--data", "data_option", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="deprecated: the form before the one convention, lex export-hf CHECKPOINT OUT --data DATA")
@attention_options(list(ATTENTION_FLAGS))
@click.option("--max-position-embeddings", type=click.IntRange(min=1), default=None,
              help="config.max_position_embeddings: the length tools such as lm-eval feed at once (default 16 l; a "
                   "learned table's size); not a limit of the model")
@click.option("--length-report", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="an --eval-lengths JSON (fairseq-eval-lm --report-json) whose perplexity table the model card shows")
@click.option("--probe-report", "probe_reports", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a far-context probe's JSON whose figures the model card shows, with its provenance and in the "
                   "Hub's model-index: lex passkey, ruler or babilong --json, or fairseq-eval-lm --longppl "
                   "--report-json (its LongPPL); repeat for each report")
@click.option("--force", is_flag=True, help="replace the files of an existing OUT")
def export_hf_cmd(data, out, checkpoint, data_option, force, max_position_embeddings, length_report, probe_reports,
                  **window):
    """Write the checkpoint --path as a self-contained Hugging Face model directory OUT, DATA the data-bin it was
    trained on (dict.txt, spm.model, lex_prepare.json), as every lex command takes them: config.json (model, position
    scheme, training length, the attention spec of the flags as its default), model.safetensors, the tokenizer
    (as lex prepare encodes), a model card (the figures of --length-report and each --probe-report, each with its
    provenance, in the Hub's model-index too) and the remote code, generated from this package's sources, that
    AutoModelForCausalLM / AutoModel / AutoTokenizer load with trust_remote_code=True where only torch,
    transformers, safetensors, sentencepiece and sacremoses are installed."""
    if checkpoint is not None and data_option is not None:
        raise click.UsageError("give the data-bin once: lex export-hf DATA OUT --path CHECKPOINT.")
    if checkpoint is None and data_option is None:
        raise click.UsageError("give the checkpoint: lex export-hf DATA OUT --path CHECKPOINT.")
    if data_option is not None:  # the deprecated form: CHECKPOINT OUT --data DATA
        if not data.is_file():
            raise click.UsageError(f"with --data, the first argument is the checkpoint file; {data} is not a file. "
                                   "Use lex export-hf DATA OUT --path CHECKPOINT.")
        click.echo("lex export-hf CHECKPOINT OUT --data DATA is deprecated: use lex export-hf DATA OUT --path CHECKPOINT "
                   "(as the other lex commands).", err=True)
        checkpoint, data = data, data_option
    elif not data.is_dir():
        raise click.UsageError(f"DATA {data} is not a directory: give the data-bin first (lex export-hf DATA OUT --path "
                               "CHECKPOINT).")
    try:
        from ..export.hf import export_hf
    except ImportError as err:
        raise click.ClickException(f"lex export-hf needs transformers and safetensors (the hf extra: "
                                   f"pip install -e '.[hf]'): {err}") from None
    try:
        model = export_hf(checkpoint, data, out, AttentionOptions.from_flags(window), force,
                          max_position_embeddings=max_position_embeddings, length_report=length_report,
                          probe_reports=probe_reports)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        raise click.ClickException(str(err)) from None
    c = model.config
    click.echo(f"exported {checkpoint} -> {out}: {c.pos_emb}, {c.num_hidden_layers} layers, C = {c.hidden_size}, "
               f"V = {c.vocab_size}, l = {c.training_length}, attention {model.spec}")
    click.echo(f"load: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")

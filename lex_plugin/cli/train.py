"""``lex train`` (the project's fairseq-train recipe) and ``lex user-dir``."""

import os
import shlex
import sys
from pathlib import Path

import click

from .group import main


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
    """fairseq-train DATA into SAVE_DIR with the project's recipe (lex_plugin.experiments.recipe: Adam (0.9, 0.98), weight
    decay 0.01, clip 1.0, polynomial decay after a warm-up, tied embeddings), the one the demo, the reproduction
    and the benchmarks use. Further fairseq-train options go after the others (--pos-emb rope, --fp16 ...). The
    command is printed, then runs in place of this one: resuming from SAVE_DIR/checkpoint_last.pt as fairseq does."""
    from ..experiments.recipe import fairseq_train_command

    try:
        cmd = fairseq_train_command(data, save_dir, arch=arch, tokens_per_sample=tokens_per_sample, batch_size=batch_size,
                                    lr=lr, updates=max_update, warmup=warmup_updates, save_interval_updates=save_interval_updates,
                                    validate_interval_updates=validate_interval_updates or None, seed=seed,
                                    extra=fairseq_args)  # last: they override the recipe's (--log-format json ...)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    beside = Path(sys.executable).parent / cmd[0]  # this environment's fairseq-train, whatever PATH says
    cmd[0] = str(beside) if beside.is_file() else cmd[0]
    click.echo("+ " + " ".join(shlex.quote(c) for c in cmd), err=True)
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


@main.command("user-dir")
def user_dir_cmd():
    """Print the path to give fairseq's --user-dir (the installed lex_plugin package)."""
    click.echo(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lex_plugin/

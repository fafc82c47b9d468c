"""The ``lex`` command group (click); each command family registers its commands on it."""

import logging
import time

import click

STARTED = "lex_plugin.started"  # the click context's meta key: when the command began (time.monotonic())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """lex_plugin: LeX Transformer tools for fairseq (train and evaluate with fairseq-train /
    fairseq-eval-lm --user-dir "$(lex user-dir)")."""
    # force: importing fairseq may already have configured the root logger (see lex_plugin.logs); results go to
    # stdout, the log to stderr
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, force=True)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    click.get_current_context().meta[STARTED] = time.monotonic()  # a report's wall time counts from here

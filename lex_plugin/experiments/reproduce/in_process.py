"""Running a reproduction step's command in this process (``scripts/reproduce.py --in-process``): fairseq-train,
fairseq-eval-lm and the ``lex`` commands (but ``prepare``, which starts a pool of workers) run through their entry
points with the command line they would have had, their output appended to the step's log, instead of a new
interpreter that imports torch and fairseq again (about 5 s a step on 2 cores, most of a small run's time). What a
step computes is the same; what it shares with the steps before it is the process: its random generators are set by
each command's ``--seed``, its thread count is this process's (not every core).
"""

import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Callable, List, Optional, Sequence, TextIO

from ...logs import FAIRSEQ_FORMAT

__all__ = ["entry_point", "run_in_process"]


def _fairseq(module: str) -> Callable[[List[str]], None]:
    def call(argv: List[str]) -> None:
        import importlib

        cli = importlib.import_module(f"fairseq_cli.{module}")
        saved = sys.argv
        sys.argv = [f"fairseq-{module.replace('_', '-')}", *argv]  # fairseq's parsers read sys.argv
        try:
            cli.cli_main()
        finally:
            sys.argv = saved
            _at_exit()
    return call


def _at_exit() -> None:
    """What fairseq leaves to the end of its process: its TensorBoard writers flushed and closed (fairseq closes them
    at exit), so a next command in this process starts new ones."""
    from fairseq.logging import progress_bar

    writers = getattr(progress_bar, "_tensorboard_writers", {})
    for writer in writers.values():
        writer.close()
    writers.clear()


def _lex(argv: List[str]) -> None:
    import click

    from ...cli import main

    try:
        main.main(args=argv, prog_name="lex", standalone_mode=False)
    except click.ClickException as e:  # as the process would: the message, then its exit code (2 for a usage error)
        e.show()
        raise SystemExit(e.exit_code) from None


def entry_point(cmd: Sequence[str]) -> Optional[Callable[[List[str]], None]]:
    """The function that runs ``cmd`` (a step's command, strings) in this process, called with its arguments; None
    for a command that must start its own process (``lex prepare``, anything else)."""
    head = [str(c) for c in cmd[:4]]
    if head[:1] == ["fairseq-train"]:
        return _fairseq("train")
    if head[:1] == ["fairseq-eval-lm"]:
        return _fairseq("eval_lm")
    if head[:3] == [sys.executable, "-m", "lex_plugin.cli"] and len(head) > 3 and head[3] != "prepare":
        return _lex
    return None


def run_in_process(cmd: Sequence, out: TextIO, cwd: Path) -> Optional[int]:
    """Run ``cmd`` in this process, from ``cwd``, with its output (stdout, stderr and every log record, in fairseq's
    format) written to ``out`` (a step's log, open for appending); the working directory, the root logger, sys.argv and
    the standard streams are put back after it.

    Returns:
        0 on success, 1 on failure (the traceback written to ``out``), or None where ``cmd`` has no entry point here
        (:func:`entry_point`: the caller starts a process).
    """
    call = entry_point(cmd)
    if call is None:
        return None
    argv = [str(c) for c in cmd[3 if str(cmd[0]) == sys.executable else 1:]]  # "python -m lex_plugin.cli CMD ..." -> "CMD ..."
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter(FAIRSEQ_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        try:
            call(argv)
            return 0
        except SystemExit as e:  # argparse and click exit with a code
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001 - the step failed: its traceback goes to its log, as a process's would
            traceback.print_exc(file=out)
            return 1
        finally:
            out.flush()
            root.handlers[:] = handlers
            root.setLevel(level)

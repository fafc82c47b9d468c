"""The resumable step runner of the reproduction: one command per step, logged, skipped once its output
exists, wall times kept in WORK/progress.json; and the record of the options a work directory was run with."""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..recipe import PLUGIN_DIR
from .in_process import run_in_process
from .options import ReproduceOptions

__all__ = ["REPO", "ReproduceError", "Runner", "check_options", "fmt_time", "tool_env"]

REPO = PLUGIN_DIR.parent  # working directory of every step


class ReproduceError(RuntimeError):
    """A step failed, or the work directory holds a run with other options."""


def fmt_time(seconds: float) -> str:
    """``seconds`` as ``1h05m`` (an hour or more) or ``4m07s``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def tool_env() -> dict:
    """The environment a step's command runs in: this one, with this interpreter's scripts (``fairseq-train``,
    ``fairseq-eval-lm``, ``lex``) first on PATH, whether or not its environment is activated."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


class Runner:
    """Runs one command per step, logging to a file, and keeps wall times in WORK/progress.json.

    Args:
        work: the work directory (progress.json lives there).
        steps: the number of steps, for the ``[i/steps]`` prefix of what it prints.
        in_process: run the commands that have an entry point here in this process (:mod:`.in_process`), not in
            a new one.
    """

    def __init__(self, work: Path, steps: int, in_process: bool = False):
        self.work, self.steps, self.step, self.in_process = work, steps, 0, in_process
        self.start = time.time()
        self.progress_path = work / "progress.json"
        self.progress = json.loads(self.progress_path.read_text()) if self.progress_path.exists() else {}

    def __call__(self, key: str, cmd: Sequence, log: Path, done: Path, stamp: bool = False,
                 then: Optional[Callable[[], None]] = None):
        """Run ``cmd`` unless ``done`` exists; ``stamp``: write ``done`` after a successful run (for
        commands whose outputs exist before they finish, like fairseq-train's checkpoint_last.pt); ``then``:
        called after a successful run, before the stamp (keeping a snapshot of what the command left).

        The command runs in the repository root with this interpreter's scripts first on PATH and
        OMP_NUM_THREADS defaulting to every core; its output is appended to ``log``. Its wall time is added
        to WORK/progress.json under ``key``.

        Raises:
            ReproduceError: the command failed (with the last lines of its log), or did not write ``done``.
        """
        self.step += 1
        prefix = f"[{self.step}/{self.steps}] {key}"
        if done.exists():
            print(f"{prefix}: done already ({done})", flush=True)
            return
        print(f"\n{prefix}: {' '.join(shlex.quote(str(c)) for c in cmd)}\n  log: {log}", flush=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        env = tool_env()
        env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        with open(log, "a") as f:
            rc = run_in_process(cmd, f, REPO) if self.in_process else None
            if rc is None:
                rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
        if rc != 0:
            tail = "".join(log.read_text().splitlines(True)[-30:])
            raise ReproduceError(f"{key} failed (exit {rc}); last lines of {log}:\n{tail}\nFix it and re-run: finished steps are skipped.")
        if then is not None:
            then()
        if stamp:
            done.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
        if not done.exists():
            raise ReproduceError(f"{key} finished but did not write {done}; see {log}.")
        seconds = time.time() - t0
        self.progress[key] = self.progress.get(key, 0.0) + seconds
        self.progress_path.write_text(json.dumps(self.progress, indent=1))
        print(f"{prefix}: done in {fmt_time(seconds)} (this session {fmt_time(time.time() - self.start)})", flush=True)


# options the reproduction gained after work directories were made, with the value those directories ran with
OPTIONS_ADDED_LATER = {"bf16_autocast": False, "probe_windows": [], "finetune_seeds": []}


# options a work directory may be re-run with other values of: each method's report stands alone, a budget is
# a snapshot of the same run (one the run has trained past is refused when it is taken), and each fine-tuning seed
# writes its own reports
MAY_DIFFER = ("methods", "budgets", "finetune_seeds")


def check_options(work: Path, o: ReproduceOptions) -> None:
    """Record ``o`` in WORK/options.json (creating WORK), after checking that a run already there used the
    same options (``methods`` and ``budgets`` may differ: :data:`MAY_DIFFER`).

    Raises:
        ReproduceError: WORK/options.json holds other options (mixing budgets would make the tables unequal).
    """
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "options.json"
    if saved.exists():
        before = json.loads(saved.read_text())
        # which methods run does not change the numbers of the others; an option a run directory predates is recorded
        # an option added since a directory was run had its default there
        before = {**OPTIONS_ADDED_LATER, **before}
        changed = {k: (before[k], v) for k, v in o.as_json().items() if k not in MAY_DIFFER and k in before and before[k] != v}
        if changed:
            raise ReproduceError(f"{work} holds a run with other options {changed}: use another --work "
                                 "or remove it; mixing budgets would make the tables unequal.")
    saved.write_text(json.dumps(o.as_json(), indent=1))

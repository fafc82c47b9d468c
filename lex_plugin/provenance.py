"""Where a report came from: the command, the code, the machine, the versions, the date and the wall time.

A published figure is only as good as the record of how it was made. :func:`provenance` returns that record as a
flat dict that a report stores under its ``"provenance"`` key: the command line, the code commit and whether the
tree had uncommitted changes, the device (GPU name, or the CPU model and its cores), the intra-op threads torch
used (a CPU run is deterministic only at a fixed thread count: float sums are ordered by it), torch and Python
versions, the seed, the date and the wall time. A field that cannot be known (no git, no ``/proc/cpuinfo``) reads
``"unknown"``, never a guess.
"""

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["UNKNOWN", "code_commit", "device_name", "provenance"]

UNKNOWN = "unknown"
_REPO = Path(__file__).resolve().parents[1]


def code_commit(repo: Path = _REPO) -> dict:
    """{"commit": the checked-out commit (40 hex digits), "dirty": whether tracked files differ from it} of ``repo``;
    both ``"unknown"`` outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    if commit.returncode != 0 or status.returncode != 0:
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def device_name(cuda: Optional[bool] = None) -> str:
    """The device a run used, in words: ``"NVIDIA H100 80GB HBM3"`` (``cuda`` True, or None with CUDA present), else
    the CPU's model name and the cores this process may use (``"AMD EPYC 7B13, 2 cores"``)."""
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        return torch.cuda.get_device_name(0)
    model = UNKNOWN
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if model == UNKNOWN:
        model = platform.processor() or UNKNOWN
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def provenance(argv: Optional[Sequence[str]] = None, seed: Optional[int] = None, wall_s: Optional[float] = None,
               cuda: Optional[bool] = None) -> dict:
    """The provenance block of a report.

    Args:
        argv: the command line (default ``sys.argv``), recorded as one shell-quoted string.
        seed: the run's seed, if it has one.
        wall_s: the run's wall time in seconds, once known.
        cuda: whether the run used CUDA (default: whether CUDA is available).

    Returns:
        {"command", "commit", "dirty", "device", "threads" (``torch.get_num_threads()``), "torch", "python", "seed",
        "date" (UTC, ISO 8601), "wall_s"}.
    """
    import torch

    argv = list(sys.argv if argv is None else argv)
    return {"command": shlex.join(str(a) for a in argv), **code_commit(), "device": device_name(cuda),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "seed": seed, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": None if wall_s is None else round(wall_s, 1)}

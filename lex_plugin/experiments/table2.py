"""LeX Table 2 (PG22, l = 1,024) in one bounded call: plan the budget, train each scheme, evaluate, write the table.

The paper trains each position scheme at l = 1,024 and reports perplexity at 256 .. 8,192 tokens (Table 2, the
absolute Transformer, ALiBi, RoPE and LeX = xPos + BCA). :func:`run_table2` does the same in one call of a lent GPU
(or, at a tiny setting, on the CPU as a rehearsal of the same code path):

1. **Plan** (:func:`plan_budget`): every scheme gets the same number of updates, the most that fits before the
   deadline at the measured training throughput (:data:`MEASURED_TRAIN_TPS`, fairseq-train's ``wps`` in
   ``examples/lex_lm/gpu_checks_h200.json``), after reserving each scheme's start-up and evaluation time and
   keeping a share (1 - ``safety``) of the training time as slack.
2. **Train** each scheme in turn with the project's recipe (:func:`~lex_plugin.experiments.recipe.fairseq_train_command`),
   fp16 on CUDA, with fairseq's ``--stop-time-hours`` set to its slot: a run slower than planned stops cleanly at
   its slot (checkpoint saved) and the table says how many updates it reached.
3. **Evaluate** it right away with ``fairseq-eval-lm --task lex_language_modeling`` at l/4 .. 8l, the paper's
   columns, and 16l beyond them, under full attention, BCA and the sliding window (the stream protocol: the same
   test tokens cut into each length), within the time left before the next scheme's reservation.

After every step the table and its JSON are written again (``table2.md``, ``table2.json`` in ``out``), so a call
stopped at any point keeps what it measured; re-running with the same work directory keeps its plan
(``work/plan.json``: every scheme the same updates and schedule) and skips finished steps. A step that fails is
recorded and the next scheme runs; the call raises at its end.

Notation: l the training length; a *scheme* is a ``--pos-emb`` name; a *window* an ``--eval-windows`` mode.
"""

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..provenance import provenance
from .recipe import PLUGIN_DIR, fairseq_train_command
from .reproduce.commands import eval_command as reproduce_eval_command
from .reproduce.options import ReproduceOptions
from .reproduce.tables import ppl_table
from .table2_report import PAPER_TABLE2, write_table2
from .train_log import read_train_log

__all__ = ["MEASURED_TRAIN_TPS", "SCHEMES", "Table2Options", "Table2Plan", "measured_throughput", "plan_budget",
           "run_table2"]

SCHEMES = ("xpos", "rope", "alibi", "sinusoidal")  # the paper's four rows, LeX first: the row a short call must reach

# fairseq-train's median wps (tokens/s) after its first log interval, lex_lm_small, l = 1,024, 32 sequences per
# update, fp16, one NVIDIA H200 (GPU run 1, examples/lex_lm/gpu_checks_h200.json, section "train"). The absolute
# scheme was not measured: it is NoPE's attention plus one embedding add, so NoPE's figure stands for it.
MEASURED_TRAIN_TPS = {
    ("H200", "lex_lm_small", 1024, "fp16"): {"xpos": 757802, "rope": 767959, "alibi": 249139, "none": 841489,
                                             "sinusoidal": 841489},
}
# the H100 was not measured at this size: it gets the H200's figures (same SM count and clocks, less memory
# bandwidth), which the plan's safety share and each run's stop time absorb
SAME_AS = {"H100": "H200"}
# seconds a fairseq process spends before its first update (interpreter, imports, CUDA context, data, model) and
# after its last (checkpoint): run 1's wall time less its tokens / wps, 13.8-17.7 s over six runs
PROCESS_OVERHEAD_S = 20.0
EVAL_OVERHEAD_S = 20.0  # one fairseq-eval-lm's start-up and model load
EVAL_TPS = {"cuda": 150_000, "cpu": 4_000}
MIN_STEP_S = 5.0  # a step is not started with less time left than this  # scored tokens per second per window and length, conservative (GPU.md run 1)


class Table2Error(RuntimeError):
    """A step of the Table 2 call failed (its log's last lines say why), or the options cannot fit the deadline."""


@dataclass(frozen=True)
class Table2Options:
    """What one Table 2 call trains and evaluates.

    Attributes:
        data: the data-bin (``lex prepare`` output).
        work: checkpoints, logs and reports of each scheme (``work/SCHEME/``).
        out: where ``table2.md`` and ``table2.json`` are written after every step.
        deadline_s: seconds from the call's start by which every step has ended.
        schemes: ``--pos-emb`` names, trained in this order.
        windows: ``--eval-windows`` modes of every evaluation.
        arch, training_length, batch_size, lr, seed: the recipe's model and optimiser settings.
        precision: ``fp16`` (CUDA only) or ``fp32``.
        eval_tokens: test tokens scored at every length and window.
        max_update: at most this many updates (the plan may give fewer).
        tokens_per_s: training throughput for the plan, {scheme: tokens/s}; None: :data:`MEASURED_TRAIN_TPS` for
            this device.
        safety: the share of the training time left after reservations that the plan fills (0 < safety <= 1).
        cuda: run on CUDA (default: when available).
    """

    data: Path
    work: Path
    out: Path
    deadline_s: float = 390.0
    schemes: Sequence[str] = SCHEMES
    windows: Sequence[str] = ("full", "bca", "sliding")
    arch: str = "lex_lm_small"
    training_length: int = 1024
    batch_size: int = 32
    lr: str = "1e-3"
    seed: int = 1
    precision: str = "fp16"
    eval_tokens: int = 131072
    max_update: Optional[int] = None
    tokens_per_s: Optional[Dict[str, float]] = None
    safety: float = 0.7
    cuda: bool = field(default=None)

    def __post_init__(self):
        import torch

        if self.cuda is None:
            object.__setattr__(self, "cuda", torch.cuda.is_available())
        if self.precision not in ("fp16", "fp32"):
            raise ValueError(f"precision must be fp16 or fp32; got {self.precision!r}.")
        if self.precision == "fp16" and not self.cuda:
            raise ValueError("fp16 training needs CUDA (fairseq's --fp16); on the CPU give precision fp32.")
        if not 0 < self.safety <= 1:
            raise ValueError(f"safety must lie in (0, 1]; got {self.safety}.")
        if self.training_length % 4:
            raise ValueError(f"the training length ({self.training_length}) must be a multiple of 4: the table starts at l/4.")
        unknown = [s for s in self.schemes if s not in PAPER_TABLE2]
        if unknown or not self.schemes:
            raise ValueError(f"schemes {unknown or '(none)'}: choose among {', '.join(PAPER_TABLE2)}.")
        if self.eval_tokens < 16 * self.training_length:
            raise ValueError(f"eval_tokens ({self.eval_tokens}) must hold one window of 16l = {16 * self.training_length}.")

    @property
    def lengths(self) -> List[int]:
        """l/4, l/2, l, 2l, 4l, 8l (the paper's columns in multiples of l) and 16l."""
        l = self.training_length
        return [l // 4, l // 2, l, 2 * l, 4 * l, 8 * l, 16 * l]


@dataclass(frozen=True)
class Table2Plan:
    """The budget of one call (:func:`plan_budget`).

    Attributes:
        updates: updates per scheme (all equal); tokens_per_update: batch x l.
        train_s: {scheme: planned seconds of training at the planned throughput}.
        slot_s: {scheme: the most seconds of training it may take (its ``--stop-time-hours``)}.
        reserved_s: start-up and evaluation seconds reserved for every scheme together.
        tokens_per_s: the throughputs planned with, and source: where they came from.
    """

    updates: int
    tokens_per_update: int
    train_s: Dict[str, float]
    slot_s: Dict[str, float]
    reserved_s: float
    tokens_per_s: Dict[str, float]
    source: str

    @property
    def training_tokens(self) -> int:
        """Tokens each scheme trains on: updates x batch x l."""
        return self.updates * self.tokens_per_update


def measured_throughput(device: str, arch: str, l: int, precision: str) -> Optional[Dict[str, float]]:
    """:data:`MEASURED_TRAIN_TPS` for a device whose name contains a measured kind (``"NVIDIA H100 80GB HBM3"`` ->
    the H200's figures through :data:`SAME_AS`), or None when nothing was measured for it."""
    for kind in ("H200", "H100"):
        if kind in device:
            return MEASURED_TRAIN_TPS.get((SAME_AS.get(kind, kind), arch, l, precision))
    return None


def eval_seconds(o: Table2Options, lengths: Sequence[int]) -> float:
    """Seconds reserved for one fairseq-eval-lm of one scheme over ``lengths`` and every window of ``o``."""
    return EVAL_OVERHEAD_S + o.eval_tokens * len(o.windows) * len(lengths) / EVAL_TPS["cuda" if o.cuda else "cpu"]


def plan_budget(o: Table2Options, tokens_per_s: Dict[str, float], source: str,
                overhead_s: float = PROCESS_OVERHEAD_S) -> Table2Plan:
    """The same number of updates for every scheme: the most that fit in the deadline.

    From ``o.deadline_s`` take, for every scheme, one training process's start-up (``overhead_s``) and its evaluation
    (:func:`eval_seconds` at l/4 .. 16l); of what is left, fill ``o.safety`` with training at ``tokens_per_s``:
    updates = floor(safety x left / sum over schemes of (batch x l / tokens_per_s[scheme])), at most ``o.max_update``.
    Each scheme's slot is its planned time divided by the safety share (a run may take that much longer before its
    stop time ends it).

    Raises:
        Table2Error: a scheme has no throughput, or not one update fits (the message gives the seconds missing).
    """
    missing = [s for s in o.schemes if s not in tokens_per_s]
    if missing:
        raise Table2Error(f"no training throughput for {', '.join(missing)}: give --tokens-per-s SCHEME=N,... "
                          f"(fairseq-train's wps at this arch, l and precision).")
    tpu = o.batch_size * o.training_length
    reserved = len(o.schemes) * (overhead_s + eval_seconds(o, o.lengths))
    per_update = sum(tpu / tokens_per_s[s] for s in o.schemes)
    left = o.deadline_s - reserved
    updates = math.floor(o.safety * left / per_update) if left > 0 else 0
    if o.max_update is not None:
        updates = min(updates, o.max_update)
    if updates < 1:
        raise Table2Error(f"a deadline of {o.deadline_s:.0f} s fits no update: start-up and evaluation take "
                          f"{reserved:.0f} s and one update of every scheme {per_update / o.safety:.1f} s more; raise "
                          "--deadline-s, or give fewer schemes, windows or evaluation tokens.")
    train_s = {s: updates * tpu / tokens_per_s[s] for s in o.schemes}
    return Table2Plan(updates=updates, tokens_per_update=tpu, train_s=train_s,
                      slot_s={s: t / o.safety for s, t in train_s.items()}, reserved_s=reserved,
                      tokens_per_s=dict(tokens_per_s), source=source)


# --- the steps ----------------------------------------------------------------------------------------------

def _run(cmd: Sequence, log: Path, timeout: float) -> str:
    """Run ``cmd`` with its output into ``log`` (the repository root as working directory, this interpreter's scripts
    first on PATH): ``"ok"`` when it exits 0, ``"timeout"`` when ``timeout`` seconds end it (a line in the log says
    so), ``"failed"`` otherwise."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(" ".join(map(str, cmd)) + "\n")
        f.flush()
        try:
            proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                                  cwd=PLUGIN_DIR.parent, timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            f.write(f"\n[table2] killed after {timeout:.0f} s: the deadline\n")
            return "timeout"
    return "ok" if proc.returncode == 0 else "failed"


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def train_command(o: Table2Options, plan: Table2Plan, scheme: str, save_dir: Path, slot_s: float) -> List[str]:
    """fairseq-train of ``scheme`` with the recipe at ``plan.updates`` updates, stopping after ``slot_s`` seconds of
    training (``--stop-time-hours``), a checkpoint every quarter of the updates (a run killed later keeps one); fp16
    on CUDA, ``--cpu`` without it."""
    extra = ["--fp16"] if o.precision == "fp16" else []
    extra += [] if o.cuda else ["--cpu"]
    extra += ["--stop-time-hours", f"{slot_s / 3600:.6f}", "--log-file", str(save_dir / "train_log.txt")]
    return fairseq_train_command(o.data, save_dir, arch=o.arch, model_args=["--pos-emb", scheme],
                                 tokens_per_sample=o.training_length, batch_size=o.batch_size, lr=o.lr,
                                 updates=plan.updates, save_interval_updates=max(1, plan.updates // 4), log_format="json",
                                 log_interval=max(1, min(50, plan.updates // 10)), seed=o.seed, extra=extra)


def eval_command(o: Table2Options, ckpt: Path, lengths: Sequence[int], report: Path) -> List[str]:
    """fairseq-eval-lm of ``ckpt`` over the first ``o.eval_tokens`` test tokens at ``lengths`` under ``o.windows``: the
    reproduction's length evaluation (``reproduce.commands.eval_command``), in fp16 on CUDA, ``--cpu`` without it."""
    device = ["--fp16"] if o.precision == "fp16" else [] if o.cuda else ["--cpu"]
    setting = ReproduceOptions(arch=o.arch, training_length=o.training_length, eval_tokens=o.eval_tokens)
    return [str(c) for c in reproduce_eval_command(o.data, ckpt, list(lengths), list(o.windows), report, setting,
                                                   extra=device)]


_SAVED = re.compile(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates")  # the last one is also checkpoint_last.pt


def _trained(save_dir: Path) -> dict:
    """What a training reached, from its logs: ``updates`` (the last checkpoint's), ``stopped_by_time`` (fairseq's
    ``--stop-time-hours`` ended its last run), ``wps`` (median tokens/s after the first log interval) and ``loss``
    (the last interval's, bits per token)."""
    text = (save_dir / "train.log").read_text(errors="replace") if (save_dir / "train.log").exists() else ""
    text = text[text.rfind("\nfairseq-train ") + 1:]  # the last run's part (_run writes each command first)
    saved = _SAVED.findall(text)
    out = {"updates": int(saved[-1]) if saved else None, "stopped_by_time": "due to cumulative_training_time" in text,
           "wps": None, "loss": None}
    try:
        stats = read_train_log(save_dir / "train_log.txt")
    except (ValueError, OSError):
        return out
    ups = sorted(stats)
    wps = sorted(stats[u]["wps"] for u in ups[1:] if "wps" in stats[u]) or [stats[ups[-1]].get("wps")]
    return {**out, "wps": wps[len(wps) // 2], "loss": stats[ups[-1]].get("loss")}


def run_table2(o: Table2Options, argv: Optional[Sequence[str]] = None, log: Callable[[str], None] = print) -> dict:
    """Plan, train, evaluate and write the table (module docstring); returns the result written to ``table2.json``.

    Args:
        o: the call's options; argv: its command line, for the provenance; log: where progress lines go.

    Raises:
        Table2Error: the plan fits no update; the work directory holds another setting's plan; or, at the end,
            after the table is written, a step failed for another reason than the deadline.
    """
    start = time.monotonic()
    left = lambda: o.deadline_s - (time.monotonic() - start)  # noqa: E731
    prov = provenance(argv, seed=o.seed, cuda=o.cuda)
    tps, source = (o.tokens_per_s, "given") if o.tokens_per_s else (
        measured_throughput(prov["device"], o.arch, o.training_length, o.precision), "measured on an H200 (GPU run 1)")
    if tps is None:
        raise Table2Error(f"no measured training throughput for {o.arch} at l = {o.training_length} in {o.precision} "
                          f"on {prov['device']}: give --tokens-per-s (fairseq-train's wps for this setting, one number "
                          "or SCHEME=N,...).")
    plan = _kept_plan(o, plan_budget(o, tps, source))
    result = {"options": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()},
                          "lengths": o.lengths},
              "plan": {**asdict(plan), "training_tokens": plan.training_tokens}, "train": {}, "ppl": {}, "events": [],
              "provenance": prov}

    def save():
        result["provenance"]["wall_s"] = round(time.monotonic() - start, 1)
        write_table2(result, o.out)

    log(f"[table2] {plan.updates} updates x {plan.tokens_per_update} tokens per scheme "
        f"({', '.join(f'{s} {t:.0f} s' for s, t in plan.train_s.items())} of training planned; {source}); "
        f"deadline {o.deadline_s:.0f} s")
    save()
    failures: List[str] = []

    def skip(message: str, failure: Optional[str] = None) -> None:
        """A scheme left without its row: the event said, written, and the failure kept for the end."""
        result["events"].append(message)
        if failure is not None:
            failures.append(failure)
        log(f"[table2] {message}")
        save()

    remaining = list(o.schemes)
    for scheme in o.schemes:
        remaining.remove(scheme)
        sdir = o.work / scheme
        ckpt, report = sdir / "checkpoint_last.pt", sdir / "length_report.json"
        reserve_after = sum(PROCESS_OVERHEAD_S + eval_seconds(o, o.lengths) + plan.train_s[s] for s in remaining)
        if not (sdir / "train.done").exists():
            slot = min(plan.slot_s[scheme], left() - reserve_after - PROCESS_OVERHEAD_S - eval_seconds(o, o.lengths))
            if slot < MIN_STEP_S / 10:
                skip(f"{scheme}: not trained, {left():.0f} s left at its turn")
                continue
            log(f"[table2] train {scheme}: up to {slot:.0f} s of training ({left():.0f} s left)")
            report.unlink(missing_ok=True)  # a report of an earlier checkpoint is stale now
            status = _run(train_command(o, plan, scheme, sdir, slot), sdir / "train.log",
                          timeout=min(left(), slot + PROCESS_OVERHEAD_S + 30))
            if status == "failed":
                skip(f"{scheme}: training failed (train.log); no row",
                     f"fairseq-train of {scheme} failed:\n{_tail(sdir / 'train.log')}")
                continue
            if status == "timeout" and not ckpt.exists():
                skip(f"{scheme}: training killed before its first checkpoint; no row")
                continue
            if status == "ok":
                (sdir / "train.done").write_text("")
            else:
                result["events"].append(f"{scheme}: training killed after its slot and start-up; its last checkpoint "
                                        "is evaluated")
        result["train"][scheme] = _trained(sdir)
        if result["train"][scheme]["updates"] not in (None, plan.updates):
            result["events"].append(f"{scheme}: stopped at update {result['train'][scheme]['updates']} of {plan.updates} "
                                    "(its slot ended before the plan's updates: slower than planned; the learning rate "
                                    "had not decayed to zero)")
        save()
        if not report.exists():
            if left() < MIN_STEP_S:
                skip(f"{scheme}: not evaluated, {left():.0f} s left")
                continue
            budget = left() - reserve_after
            log(f"[table2] evaluate {scheme} at {','.join(map(str, o.lengths))} ({left():.0f} s left)")
            status = _run(eval_command(o, ckpt, o.lengths, report), sdir / "eval.log",
                          timeout=min(left(), max(budget, eval_seconds(o, o.lengths))))
            if status != "ok":
                skip(f"{scheme}: evaluation {'failed (eval.log)' if status == 'failed' else 'stopped at its time'}; no row",
                     f"fairseq-eval-lm of {scheme} failed:\n{_tail(sdir / 'eval.log')}" if status == "failed" else None)
                continue
        _merge(result, scheme, report)
        save()
    save()
    log(f"[table2] wrote {o.out / 'table2.md'} after {result['provenance']['wall_s']} s")
    if failures:
        raise Table2Error("\n\n".join(failures))
    return result


def _kept_plan(o: Table2Options, plan: Table2Plan) -> Table2Plan:
    """The plan of ``o.work`` (``plan.json``) when a call began there before, else ``plan``, saved there: every scheme
    of one work directory trains the same updates on the same schedule, however much time a later call has.

    Raises:
        Table2Error: the work directory's plan was made for another model, l, batch or precision.
    """
    path = o.work / "plan.json"
    setting = {"arch": o.arch, "training_length": o.training_length, "batch_size": o.batch_size, "lr": o.lr,
               "precision": o.precision, "seed": o.seed}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["setting"] != setting:
            raise Table2Error(f"{o.work} holds a call of another setting ({saved['setting']}); give another --work.")
        kept = Table2Plan(**saved["plan"])
        missing = [s for s in o.schemes if s not in kept.train_s]
        for s in missing:  # a scheme added later: its time at the kept updates
            kept.train_s[s] = kept.updates * kept.tokens_per_update / plan.tokens_per_s[s]
            kept.slot_s[s] = kept.train_s[s] / o.safety
        return kept
    o.work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setting": setting, "plan": asdict(plan)}, indent=1) + "\n")
    return plan


def _merge(result: dict, scheme: str, report: Path) -> None:
    """Add an eval-lm report's perplexities to ``result["ppl"][scheme]`` ({window: {length: ppl}})."""
    rows = ppl_table({scheme: json.loads(report.read_text())}).get(scheme, {})
    for window, row in rows.items():
        result["ppl"].setdefault(scheme, {}).setdefault(window, {}).update(row)

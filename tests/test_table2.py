"""scripts/paper_table2.py: the budget plan, the deadline, the table beside the paper's, and the CPU rehearsal of
the GPU call (the same code path at a tiny setting)."""

import json
import math
import sys
from pathlib import Path

import pytest

from lex_plugin.experiments import table2
from lex_plugin.experiments.table2 import Table2Error, Table2Options, measured_throughput, plan_budget, run_table2
from lex_plugin.experiments.table2_report import PAPER_TABLE2, markdown_table2

from conftest import REPO, run_cli

H200 = table2.MEASURED_TRAIN_TPS[("H200", "lex_lm_small", 1024, "fp16")]


def gpu_options(tmp_path, **kw) -> Table2Options:
    return Table2Options(data=tmp_path, work=tmp_path, out=tmp_path, cuda=True, **kw)


def test_the_plan_gives_every_scheme_the_most_equal_updates_that_fit(tmp_path):
    o = gpu_options(tmp_path)
    plan = plan_budget(o, H200, "measured")
    tokens = 32 * 1024
    # written out from the rule: each scheme's start-up and evaluation reserved, the safety share of the rest filled
    eval_s = table2.EVAL_OVERHEAD_S + 131072 * 3 * 7 / table2.EVAL_TPS["cuda"]
    reserved = 4 * (table2.PROCESS_OVERHEAD_S + eval_s)
    seconds_per_update = sum(tokens / H200[s] for s in ("xpos", "rope", "alibi", "sinusoidal"))
    assert plan.reserved_s == pytest.approx(reserved)
    assert plan.updates == math.floor(0.7 * (390 - reserved) / seconds_per_update)
    assert sum(plan.train_s.values()) <= 0.7 * (390 - reserved) < sum(plan.train_s.values()) + seconds_per_update
    # ALiBi trains at a third of xPos's speed: the same updates take it three times as long, and its slot too
    assert plan.train_s["alibi"] / plan.train_s["xpos"] == pytest.approx(H200["xpos"] / H200["alibi"])
    assert plan.slot_s["alibi"] == pytest.approx(plan.train_s["alibi"] / 0.7)
    assert plan.training_tokens == plan.updates * tokens
    assert plan_budget(gpu_options(tmp_path, max_update=10), H200, "measured").updates == 10


def test_the_measured_throughputs_are_found_by_device_name():
    assert measured_throughput("NVIDIA H200", "lex_lm_small", 1024, "fp16") == H200
    assert measured_throughput("NVIDIA H100 80GB HBM3", "lex_lm_small", 1024, "fp16") == H200  # the H200's stand in
    assert measured_throughput("NVIDIA A100-SXM4-80GB", "lex_lm_small", 1024, "fp16") is None
    assert measured_throughput("NVIDIA H200", "lex_lm_medium", 1024, "fp16") is None


def test_a_deadline_that_fits_no_update_and_a_scheme_without_throughput_are_refused(tmp_path):
    with pytest.raises(Table2Error, match="fits no update"):
        plan_budget(gpu_options(tmp_path, deadline_s=100), H200, "measured")
    with pytest.raises(Table2Error, match="no training throughput for sinusoidal"):
        plan_budget(gpu_options(tmp_path), {k: v for k, v in H200.items() if k != "sinusoidal"}, "measured")


@pytest.mark.parametrize("bad, match", [
    (dict(cuda=False), "fp16 training needs CUDA"),
    (dict(cuda=True, schemes=("xpos", "nope")), "choose among"),
    (dict(cuda=True, eval_tokens=1000), "16l"),
    (dict(cuda=True, safety=0), "safety"),
])
def test_options_that_cannot_run_are_refused(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        Table2Options(data=tmp_path, work=tmp_path, out=tmp_path, **bad)


def test_each_paper_row_stands_under_its_window_at_the_same_multiples_of_l():
    result = {"options": {"training_length": 64, "lengths": [16, 32, 64, 128, 256, 512, 1024],
                          "schemes": ["xpos", "rope"], "windows": ["full", "bca"]},
              "ppl": {"xpos": {"full": {"64": 10.0, "512": 40.0}, "bca": {"64": 10.0, "512": 9.0}}}}
    lines = markdown_table2(result).splitlines()
    assert lines[0].split("|")[3:10] == [" 16 (0.25l) ", " 32 (0.5l) ", " 64 (1l) ", " 128 (2l) ", " 256 (4l) ",
                                         " 512 (8l) ", " 1024 (16l) "]
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]] for line in lines[2:]}
    assert rows[("LeX (xPos)", "bca")][-1] == "0.900" and rows[("LeX (xPos)", "full")][-1] == "4.000"
    paper_lex = rows[("*paper: LeX (xPos)*", "bca")]  # LeX is xPos under BCA; its 1,024 is our l
    assert paper_lex[:6] == [f"{PAPER_TABLE2['xpos'][L]:.2f}" for L in (256, 512, 1024, 2048, 4096, 8192)]
    assert paper_lex[-1] == f"{24.89 / 26.59:.3f}"
    assert rows[("*paper: RoPE (Roformer)*", "full")][3] == "68.86"
    assert ("RoPE (Roformer)", "full") not in rows  # a scheme not reached has its paper row alone


def _fake_steps(monkeypatch, seconds: dict):
    """Replace the fairseq processes by the files a finished step leaves, and the clock by one that each step moves on
    by ``seconds[(command, scheme)]`` (default ``seconds[command]``), or by its timeout when that is shorter (then the
    step is killed before it wrote anything)."""
    clock = {"now": 0.0}
    monkeypatch.setattr(table2.time, "monotonic", lambda: clock["now"])
    calls = []

    def run(cmd, log, timeout):
        sdir = log.parent
        calls.append((cmd[0], sdir.name))
        took = seconds.get((cmd[0], sdir.name), seconds[cmd[0]])
        clock["now"] += min(took, timeout)
        if timeout < took:
            return "timeout"
        sdir.mkdir(parents=True, exist_ok=True)
        if cmd[0] == "fairseq-train":
            updates = int(cmd[cmd.index("--max-update") + 1])
            (sdir / "checkpoint_last.pt").write_bytes(b"")
            log.write_text(f"Saved checkpoint {sdir}/checkpoint_last.pt (epoch 1 @ {updates} updates, score None)\n")
        else:
            lengths = map(int, cmd[cmd.index("--eval-lengths") + 1].split(","))
            report = {"results": [{"window": w, "attention": {"mode": w}, "length": L, "ppl": 20.0 + L / 1000}
                                  for L in lengths for w in ("full", "bca")]}
            Path(cmd[cmd.index("--report-json") + 1]).write_text(json.dumps(report))
        return "ok"

    monkeypatch.setattr(table2, "_run", run)
    real = table2.provenance
    monkeypatch.setattr(table2, "provenance", lambda argv, seed, cuda: {**real(argv, seed, cuda=False),
                                                                        "device": "NVIDIA H200"})
    return calls


def test_a_call_out_of_time_keeps_the_rows_it_finished_and_says_what_it_skipped(tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch, {"fairseq-train": 45, "fairseq-eval-lm": 30, ("fairseq-train", "alibi"): 100})
    options = dict(windows=("full", "bca"), max_update=50)
    result = run_table2(gpu_options(tmp_path, deadline_s=300, **options), argv=["paper_table2.py"], log=lambda line: None)
    # ALiBi's training outlasts its slot (9.4 s) and start-up: killed after 59.4 s with no checkpoint; the absolute
    # model after it still fits, and the call ends before its deadline
    assert calls == [("fairseq-train", "xpos"), ("fairseq-eval-lm", "xpos"), ("fairseq-train", "rope"),
                     ("fairseq-eval-lm", "rope"), ("fairseq-train", "alibi"), ("fairseq-train", "sinusoidal"),
                     ("fairseq-eval-lm", "sinusoidal")]
    assert set(result["ppl"]) == {"xpos", "rope", "sinusoidal"}
    assert {s: t["updates"] for s, t in result["train"].items()} == {"xpos": 50, "rope": 50, "sinusoidal": 50}
    assert len(result["events"]) == 1 and result["events"][0].startswith("alibi: training killed before its first")
    saved = json.loads((tmp_path / "table2.json").read_text())
    assert saved["ppl"]["xpos"]["bca"]["16384"] == pytest.approx(36.384)
    assert saved["provenance"]["wall_s"] == pytest.approx(284.4) and saved["provenance"]["command"] == "paper_table2.py"
    assert "alibi: training killed" in (tmp_path / "table2.md").read_text()
    # a scheme whose turn finds less than its own start-up and evaluation plus the later schemes' reservations waits
    calls.clear()
    result = run_table2(gpu_options(tmp_path / "short", deadline_s=250, **options), log=lambda line: None)
    assert [c for c, s in calls if s == "alibi"] == [] and result["events"][0].startswith("alibi: not trained")
    # run again with time enough: the finished steps are skipped, the others run
    calls.clear()
    _fake_steps(monkeypatch, {"fairseq-train": 45, "fairseq-eval-lm": 30})
    result = run_table2(gpu_options(tmp_path, deadline_s=300, **options), log=lambda line: None)
    assert set(result["ppl"]) == set(table2.SCHEMES) and not result["events"]


def test_a_work_directory_keeps_its_plan_and_a_failed_step_ends_the_call_after_the_others(tmp_path, monkeypatch):
    """A second call in the same work directory trains its remaining schemes on the first call's plan (the same
    updates and schedule), whatever its own deadline; a directory of another setting is refused; a step that fails
    is recorded, the next scheme runs, and the call raises once the table is written."""
    calls = _fake_steps(monkeypatch, {"fairseq-train": 45, "fairseq-eval-lm": 30})
    first = run_table2(gpu_options(tmp_path, deadline_s=300, schemes=("xpos",), windows=("full",)), log=lambda line: None)
    later = run_table2(gpu_options(tmp_path, deadline_s=3000, windows=("full",)), log=lambda line: None)
    assert later["plan"]["updates"] == first["plan"]["updates"] < plan_budget(
        gpu_options(tmp_path, deadline_s=3000, windows=("full",)), H200, "measured").updates
    assert {t["updates"] for t in later["train"].values()} == {first["plan"]["updates"]}
    assert calls.count(("fairseq-train", "xpos")) == 1  # done in the first call
    with pytest.raises(Table2Error, match="holds a call of another setting"):
        run_table2(gpu_options(tmp_path, batch_size=16, windows=("full",)), log=lambda line: None)

    failing = {"fairseq-train": 45, "fairseq-eval-lm": 30}
    _fake_steps(monkeypatch, failing)
    real_run = table2._run
    monkeypatch.setattr(table2, "_run", lambda cmd, log, timeout: "failed" if log.parent.name == "rope" and
                        cmd[0] == "fairseq-eval-lm" else real_run(cmd, log, timeout))
    with pytest.raises(Table2Error, match="fairseq-eval-lm of rope failed"):
        run_table2(gpu_options(tmp_path / "fails", deadline_s=3000, windows=("full",)), log=lambda line: None)
    saved = json.loads((tmp_path / "fails" / "table2.json").read_text())
    assert set(saved["ppl"]) == {"xpos", "alibi", "sinusoidal"} and saved["events"] == [
        "rope: evaluation failed (eval.log); no row"]


def test_the_cpu_rehearsal_runs_the_gpu_call_end_to_end(data_bin, tmp_path):
    """The GPU call's code path at a tiny setting, for LeX and the absolute model (one relative scheme and the one
    that adds positions to the embeddings; the four-scheme order and the deadline are checked above without
    processes)."""
    work = tmp_path / "work"
    args = [sys.executable, str(REPO / "scripts" / "paper_table2.py"), "--data-bin", data_bin, "--arch", "lex_lm_tiny",
            "--training-length", "32", "--batch-size", "4", "--tokens-per-s", "100", "--max-update", "3",
            "--eval-tokens", "1024", "--deadline-s", "900", "--schemes", "xpos,sinusoidal", "--work", work,
            "--out", tmp_path / "out"]
    run_cli(args)
    result = json.loads((tmp_path / "out" / "table2.json").read_text())
    assert result["plan"]["updates"] == 3 and not result["events"]
    assert {s: t["updates"] for s, t in result["train"].items()} == {"xpos": 3, "sinusoidal": 3}
    for scheme in ("xpos", "sinusoidal"):
        for window in ("full", "bca", "sliding"):
            row = result["ppl"][scheme][window]
            assert sorted(map(int, row)) == [8, 16, 32, 64, 128, 256, 512]
            assert all(math.isfinite(v) and 1 < v < 1e5 for v in row.values())
        # within l every window is full attention: one number
        assert result["ppl"][scheme]["bca"]["32"] == pytest.approx(result["ppl"][scheme]["full"]["32"], rel=1e-6)
    assert result["provenance"]["device"] and result["provenance"]["torch"]
    text = (tmp_path / "out" / "table2.md").read_text()
    assert "*paper: LeX (xPos)* | bca | 33.18 |" in text and "3 updates x 4 x 32" in text
    mtime = (work / "xpos" / "train.log").stat().st_mtime
    run_cli(args)  # resumed: nothing left to do
    assert (work / "xpos" / "train.log").stat().st_mtime == mtime

"""lex_plugin.evaluation.reproduce and scripts/reproduce.py: the tables and claim verdicts from known
reports, the step commands, and one tiny resumable run on real text through fairseq-train,
fairseq-eval-lm and lex resolution."""

import json
import sys

import pytest

from conftest import REPO, run_cli
from lex_plugin.evaluation import reproduce

L = 32


def report(rows):
    """An eval-lm --report-json holding {(window label, length): ppl}."""
    return {"results": [{"window": w, "length": n, "protocol": "stream", "ppl": p} for (w, n), p in rows.items()]}


def resolution(r_full, r_bca):
    return {"full": {"lengths": {str(2 * L): {"R": r_full}}}, "bca": {"lengths": {str(2 * L): {"R": r_bca}}}}


LENGTHS = [L, 2 * L, 4 * L, 8 * L]


def paper_like():
    """Reports shaped like the paper's claims: LeX+BCA flat, RoPE exploding, ALiBi slightly worse."""
    return {
        "xpos": report({("bca(16)", n): 30.0 - i for i, n in enumerate(LENGTHS)} | {("full", n): 30.0 * (i + 1) for i, n in enumerate(LENGTHS)}),
        "rope": report({("full", n): 30.0 * 10 ** i for i, n in enumerate(LENGTHS)}),
        "alibi": report({("full", n): 31.0 for n in LENGTHS}),
    }


def test_ppl_table_strips_window_sizes():
    ppl = reproduce.ppl_table(paper_like())
    assert set(ppl["xpos"]) == {"bca", "full"}
    assert ppl["xpos"]["bca"][2 * L] == 29.0


def test_claims_hold_on_paper_like_numbers():
    ppl = reproduce.ppl_table(paper_like())
    claims = reproduce.check_claims(ppl, {"xpos": resolution(0.10, 0.20)}, L, LENGTHS)
    assert len(claims) == 4
    assert all(c["holds"] for c in claims), claims


def test_claims_fail_when_the_numbers_say_so():
    reports = paper_like()
    reports["xpos"]["results"].append({"window": "bca(16)", "length": 16 * L, "protocol": "stream", "ppl": 45.0})
    reports["rope"] = report({("full", n): 30.0 + i for i, n in enumerate(LENGTHS + [16 * L])})  # RoPE extrapolates
    reports["alibi"] = report({("full", n): 20.0 for n in LENGTHS + [16 * L]})  # ALiBi better at 4l+
    ppl = reproduce.ppl_table(reports)
    claims = reproduce.check_claims(ppl, {"xpos": resolution(0.20, 0.10)}, L, LENGTHS + [16 * L])
    assert len(claims) == 4
    assert not any(c["holds"] for c in claims), claims
    assert "16: 45.00" not in claims[0]["numbers"]  # formatted with the length first
    assert f"{16 * L}: 45.00" in claims[0]["numbers"]


def test_missing_numbers_give_no_verdict():
    assert reproduce.check_claims({}, {}, L, LENGTHS) == []


def test_commands_load_this_repository_plugin(tmp_path):
    o = dict(arch="lex_lm_tiny", train_length=L, max_update=3, batch_size=4, lr="1e-3", seed=1, lengths=LENGTHS,
             eval_tokens=512, resolution_texts=2)
    train = reproduce.train_command(tmp_path, tmp_path / "ckpt", ["--pos-emb", "xpos"], o)
    evaluate = reproduce.eval_command(tmp_path, tmp_path / "c.pt", LENGTHS, ["full", "bca"], tmp_path / "r.json", o)
    for cmd in (train, evaluate):
        assert cmd[cmd.index("--user-dir") + 1] == REPO / "lex_plugin"
    assert train[train.index("--max-update") + 1] == 3 and "--pos-emb" in train
    assert evaluate[evaluate.index("--eval-windows") + 1] == "full,bca"
    assert reproduce.resolution_command(tmp_path, tmp_path / "c.pt", [L], "bca", tmp_path / "o.json", o)[-1] == "--bca"
    assert "--bca" not in reproduce.resolution_command(tmp_path, tmp_path / "c.pt", [L], "full", tmp_path / "o.json", o)


def test_tiny_run_end_to_end_and_resume(data_bin, tmp_path):
    work = tmp_path / "repro"
    args = [sys.executable, str(REPO / "scripts" / "reproduce.py"), "--work", str(work), "--data-bin", str(data_bin),
            "--runs", "xpos,xpos_scalar_zeta", "--max-update", "3", "--batch-size", "4", "--train-length", str(L),
            "--lengths", f"{L},{2 * L},{8 * L}", "--eval-tokens", "512", "--resolution-texts", "2"]
    proc = run_cli(args, timeout=600)
    tables = (work / "tables.md").read_text()
    for needle in ("LeX (xPos) | full attention", "LeX (xPos) | BCA", "LeX (xPos) | sliding window",
                   "xPos with one scalar zeta | BCA", "R at 32, full", "| **total** |"):
        assert needle in tables, (needle, tables)
    results = json.loads((work / "results.json").read_text())
    assert set(results["ppl"]) == {"xpos", "xpos_scalar_zeta"}
    assert set(results["ppl"]["xpos"]) == {"full", "sliding", "bca"}
    assert set(results["ppl"]["xpos_scalar_zeta"]["bca"]) == {str(L), str(8 * L)}  # ablations: l and 8l only
    assert 0 < results["resolution"]["xpos"]["bca"][str(2 * L)] < 1
    assert (work / "ppl_vs_length.png").stat().st_size > 10_000
    # at l every window sees the same context: one number
    assert results["ppl"]["xpos"]["full"][str(L)] == pytest.approx(results["ppl"]["xpos"]["bca"][str(L)], rel=1e-5)

    again = run_cli(args, timeout=300)
    assert again.stdout.count("done already") == 8, again.stdout
    assert "fairseq-train" not in again.stdout

    with pytest.raises(AssertionError, match="other options"):
        run_cli([*args[:-2], "--resolution-texts", "3"])
    with pytest.raises(AssertionError, match="unknown runs"):
        run_cli([*args[:6], "--runs", "xpos,rotary"])

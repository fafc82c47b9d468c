"""lex_plugin.experiments.train_log and `lex compare-curves`: fairseq-train's train_inner lines read in both
log formats, and two runs' curves compared (the gap, its summary past the warm-up, the tolerance's exit)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO
from lex_plugin.experiments.train_log import compare_curves, read_train_log

# fairseq 0.12's own lines (a real run of the recipe), in its simple and json formats
SIMPLE = ("2026-11-24 10:54:32 | INFO | train_inner | epoch 001:     25 / 1922 loss=14.813, ppl=28781, wps=2030.5, "
          "ups=0.5, wpb=4096, bsz=16, num_updates={u}, lr=0.0003, gnorm=3.545, clip=100, train_wall=53, wall=53")
JSON = ('2026-11-24 10:54:32 | INFO | train_inner | {{"epoch": 1, "update": 0.013, "loss": "14.813", "ppl": "28781", '
        '"wps": "2030.5", "ups": "0.5", "wpb": "4096", "bsz": "16", "num_updates": "{u}", "lr": "0.0003", '
        '"gnorm": "3.545", "clip": "100", "train_wall": "53", "wall": "53"}}')
NOISE = ["2026-11-24 10:54:00 | INFO | fairseq_cli.train | Start iterating over samples",
         "2026-11-24 10:58:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.1 | ppl 137 | num_updates 300",
         "  return torch.cuda.amp.custom_fwd(orig_func)  # type: ignore"]


def log(lines):
    return "\n".join([NOISE[0], *lines, *NOISE[1:]])


def with_loss(line: str, loss: float) -> str:
    return line.replace("14.813", f"{loss}")


def bare(line: str) -> str:
    """The line as --log-file holds it: fairseq's file handler has no formatter (message only)."""
    return line.split(" | train_inner | ", 1)[1]


# the end-of-epoch summaries as --log-file holds them (simple and json): not interval lines
SUMMARIES = ["epoch 001 | loss 7.1 | ppl 137.2 | wps 3000 | num_updates 300 | lr 0.0003",
             '{"epoch": 1, "train_loss": "7.1", "train_ppl": "137.2", "train_num_updates": "300"}',
             '{"epoch": 1, "valid_loss": "7.2", "valid_ppl": "147", "valid_num_updates": "300"}']


def test_both_formats_read_alike_and_a_resumed_update_keeps_the_later_line():
    simple, js = read_train_log(log([SIMPLE.format(u=25)])), read_train_log(log([JSON.format(u=25)]))
    for form in (SIMPLE, JSON):  # stdout, and the --log-file copy with its summaries
        assert read_train_log(log([bare(form.format(u=25)), *SUMMARIES])) == read_train_log(log([form.format(u=25)]))
    assert simple == {25: {"loss": 14.813, "ppl": 28781.0, "wps": 2030.5, "ups": 0.5, "wpb": 4096.0, "bsz": 16.0,
                           "lr": 0.0003, "gnorm": 3.545, "clip": 100.0, "train_wall": 53.0, "wall": 53.0}}
    assert js == {25: {**simple[25], "epoch": 1.0, "update": 0.013}}  # json also names the epoch's fraction
    resumed = read_train_log(log([with_loss(SIMPLE.format(u=25), 9.0), with_loss(SIMPLE.format(u=50), 8.0),
                                  with_loss(SIMPLE.format(u=50), 7.5)]))
    assert {u: s["loss"] for u, s in resumed.items()} == {25: 9.0, 50: 7.5}
    with pytest.raises(ValueError, match="no train_inner line"):
        read_train_log("\n".join([*NOISE, *SUMMARIES]))


def test_the_gap_and_its_summary_past_the_warm_up():
    a = {u: {"loss": v} for u, v in [(25, 10.0), (50, 8.0), (75, 7.0), (100, 6.0)]}
    b = {u: {"loss": v} for u, v in [(25, 12.0), (50, 8.08), (75, 6.93), (100, 6.03), (125, 5.0)]}
    result = compare_curves(a, b, after=25)
    assert [r["update"] for r in result["rows"]] == [25, 50, 75, 100]  # only the updates both logged
    assert result["rows"][0]["relative"] == pytest.approx(0.2)
    assert result["max_relative"] == pytest.approx(0.01) and result["at"] in (50, 75)  # 25 is the warm-up
    assert result["final_relative"] == pytest.approx(0.005)
    assert compare_curves(a, b)["max_relative"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="share no update past 100"):
        compare_curves(a, b, after=100)
    with pytest.raises(ValueError, match="diverged"):
        compare_curves(a, {**b, 50: {"loss": float("nan")}})


@pytest.mark.e2e  # starts a process
def test_cli_table_json_plot_and_tolerance(tmp_path):
    fp32, bf16 = tmp_path / "fp32.log", tmp_path / "bf16.log"
    fp32.write_text(log([with_loss(SIMPLE.format(u=u), v) for u, v in [(25, 10.0), (50, 8.0), (75, 7.0)]]))
    bf16.write_text(log([bare(with_loss(JSON.format(u=u), v)) for u, v in [(25, 11.0), (50, 8.04), (75, 7.07)]]))
    cmd = [sys.executable, "-m", "lex_plugin.cli", "compare-curves", fp32, bf16, "--labels", "fp32,bf16", "--after", "25"]
    ok = subprocess.run([*cmd, "--tolerance", "0.02", "--json", tmp_path / "gap.json", "--plot", tmp_path / "gap.png"],
                        capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert "| 50 | 8.0000 | 8.0400 | +0.50% |" in ok.stdout and "1.00% (update 75)" in ok.stdout
    saved = json.loads((tmp_path / "gap.json").read_text())
    assert saved["labels"] == ["fp32", "bf16"] and saved["max_relative"] == pytest.approx(0.01)
    assert (tmp_path / "gap.png").stat().st_size > 10_000
    beyond = subprocess.run([*cmd, "--tolerance", "0.005"], capture_output=True, text=True, cwd=REPO)
    assert beyond.returncode == 1 and "beyond the tolerance 0.5%" in beyond.stderr


def test_the_validation_lines_read_alike_in_both_formats_and_other_subsets_are_left_out():
    """fairseq's line after validating: on stdout (after "| valid |"), bare in --log-file, and in the json format; a
    line of another --valid-subset is not the one asked for."""
    from lex_plugin.experiments.train_log import read_valid_log

    stdout = read_valid_log(log([SIMPLE.format(u=25)]))
    assert stdout == {300: {"loss": 7.1, "ppl": 137.0}}
    assert read_valid_log(NOISE[1].split(" | valid | ", 1)[1]) == stdout
    assert read_valid_log(SUMMARIES[2]) == {300: {"loss": 7.2, "ppl": 147.0}}
    other = NOISE[1].replace("'valid' subset", "'valid1' subset")
    assert read_valid_log(other, subset="valid1") == stdout
    with pytest.raises(ValueError, match="no validation line of subset 'valid'"):
        read_valid_log("\n".join([other, SIMPLE.format(u=25), SUMMARIES[0]]))

"""lex_plugin.experiments.benchmark (the bench scripts' harness), lex_plugin.models.builder and
lex_plugin.data.stream; the bench scripts end to end on tiny sizes, with this checkout as its own baseline."""

import json
import sys

import pytest
import torch

from conftest import REPO, make_dictionary, run_cli
from lex_plugin.data.stream import split_stream
from lex_plugin.experiments import benchmark
from lex_plugin.models.builder import build_random_lm

COLUMNS = [("bca tok/s", "tokens_per_s", "{:,.0f}"), ("bca peak MB", "peak_mb_above_start", "{:,.0f}")]


def test_result_cells_without_and_with_baseline():
    new, old = {"tokens_per_s": 3000.0, "peak_mb_above_start": 50.0}, {"tokens_per_s": 2000.0, "peak_mb_above_start": 100.0}
    assert benchmark.result_header(COLUMNS, False) == ["bca tok/s", "bca peak MB"]
    assert benchmark.result_cells(new, None, COLUMNS, False) == ["3,000", "50"]
    assert benchmark.result_header(COLUMNS, True) == ["bca tok/s old", "bca tok/s new", "bca tok/s new/old",
                                                       "bca peak MB old", "bca peak MB new", "bca peak MB new/old"]
    assert benchmark.result_cells(new, old, COLUMNS, True) == ["2,000", "3,000", "1.50", "100", "50", "0.50"]
    # a skipped result: "-" but its last cell, which says why; no ratio
    assert benchmark.result_cells({"skipped": "too big"}, None, COLUMNS, False) == ["-", "too big"]
    assert benchmark.result_cells(new, {"skipped": "failed: x"}, COLUMNS, True) == ["-", "3,000", "-", "failed: x", "50", "-"]
    assert benchmark.ratio(1.0, 0.0) == "-" and benchmark.ratio(-0.2, 0.1) == "-"
    # ratios of the numbers as shown: 0.3 MB and 0.1 MB both show as 0
    tiny = benchmark.result_cells({"tokens_per_s": 10.0, "peak_mb_above_start": 0.3}, {"tokens_per_s": 5.0, "peak_mb_above_start": 0.1}, COLUMNS, True)
    assert tiny == ["5", "10", "2.00", "0", "0", "-"]


def test_markdown_table():
    assert benchmark.markdown_table(["L", "a"], [["1", "x"], ["2", "y"]]) == "| L | a |\n|---|---|\n| 1 | x |\n| 2 | y |"


def test_timing():
    assert len(benchmark.time_calls(lambda n: n, range(3))) == 3
    assert 0 <= benchmark.best_time(lambda: None, 2) <= benchmark.median_time(lambda _: sum(range(10_000)), range(3)) + 1
    assert benchmark.rss_mb() > 0 and benchmark.peak_rss_mb() >= benchmark.rss_mb() * 0.5


@pytest.mark.e2e  # starts a process
def test_run_isolated_reads_the_last_json_line_and_runs_the_baseline_copy(tmp_path):
    body = "import json, sys\nprint('log line')\nprint(json.dumps({'who': __file__, 'args': sys.argv[1:]}))\n"
    new_script = tmp_path / "new" / "scripts" / "bench_x.py"
    old_script = tmp_path / "old" / "scripts" / "bench_x.py"
    for path in (new_script, old_script):
        path.parent.mkdir(parents=True)
        path.write_text(body)
    new, old = benchmark.measure(new_script, ["bca", 64], tmp_path / "old")
    assert new == {"who": str(new_script), "args": ["--one", "bca", "64"]}
    assert old["who"] == str(old_script) and old["args"] == new["args"]
    assert benchmark.checkout_env(tmp_path / "old")["PYTHONPATH"].split(":")[0] == str((tmp_path / "old").resolve())
    new_script.write_text("import sys\nsys.exit('boom')\n")
    assert benchmark.run_isolated(new_script, []) == {"skipped": "failed: boom"}
    with pytest.raises(FileNotFoundError, match="bench_y.py"):
        benchmark.run_isolated(tmp_path / "bench_y.py", [], checkout=tmp_path / "old")


def test_build_random_lm():
    model, d = build_random_lm(tokens_per_sample=16, decoder_layers=1)
    assert not model.training
    assert len(d) == d.nspecial + 100 and d[d.nspecial] == "w0" and d[len(d) - 1] == "w99"
    again, _ = build_random_lm(dictionary=d, tokens_per_sample=16, decoder_layers=1)
    other, _ = build_random_lm(dictionary=d, tokens_per_sample=16, decoder_layers=1, seed=1)
    w = "decoder.embed_tokens.weight"
    assert torch.equal(model.state_dict()[w], again.state_dict()[w])
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])
    assert len(model.decoder.layers) == 1


def test_split_stream_missing_split_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'nosuch'.*" + str(tmp_path)):
        split_stream(tmp_path, "nosuch", make_dictionary())


def test_split_stream_is_the_split_in_order(data_bin):
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(data_bin / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / "test"), d)
    stream = split_stream(data_bin, "test", d)
    assert stream.dtype == torch.int64 and stream.numel() == int(ds.sizes.sum())
    assert torch.equal(stream[: len(ds[0])], ds[0].long()) and stream[len(ds[0]) - 1] == d.eos()


@pytest.mark.e2e  # starts a process
def test_bench_generation_against_itself_as_baseline(tmp_path):
    out = tmp_path / "gen.json"
    proc = run_cli([sys.executable, str(REPO / "scripts" / "bench_generation.py"), "--contexts", "48", "--modes", "bca",
                    "--training-length", "16", "--steps", "2", "--baseline", str(REPO), "--json-out", str(out)],
                   env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert "| context | bca ms/token old | bca ms/token new | bca ms/token new/old |" in proc.stdout, proc.stdout
    report = json.loads(out.read_text())
    row = report["rows"][0]
    assert report["provenance"]["command"] and report["provenance"]["wall_s"] > 0
    # BCA keeps at most l = 16 keys per layer, in both checkouts
    assert 0 < row["cached_positions_per_layer"] <= 16 and row["baseline"]["cached_positions_per_layer"] == row["cached_positions_per_layer"]


@pytest.mark.e2e  # starts a process
def test_bench_attention_one_point_per_mode(tmp_path):
    out = tmp_path / "att.json"
    proc = run_cli([sys.executable, str(REPO / "scripts" / "bench_attention.py"), "--lengths", "64",
                    "--modes", "bca_blockwise,reference", "--training-length", "16", "--repeats", "1", "--json-out", str(out)],
                   env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert "| L | bca_blockwise tok/s | bca_blockwise peak MB | reference tok/s | reference peak MB |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["bca_blockwise", "reference"]
    assert all("skipped" not in r and r["tokens_per_s"] > 0 for r in rows), rows


def test_precision_suffix_of_bench_modes():
    assert benchmark.precision_of("bca") == ("bca", None)
    assert benchmark.precision_of("bca_blockwise+bf16") == ("bca_blockwise", torch.bfloat16)
    with pytest.raises(ValueError, match=r"\+bf16"):
        benchmark.precision_of("full+fp16")


@pytest.mark.e2e  # starts a process
def test_bench_hf_generate_times_every_engine(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    proc = run_cli([sys.executable, str(REPO / "scripts" / "bench_hf_generate.py"), "--contexts", "48", "--engines", "lex,hf",
                    "--training-length", "16", "--steps", "3", "--repeats", "1", "--rounds", "2",
                    "--json-out", str(out)],
                   env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert "| context | lex ms/token | hf ms/token |" in proc.stdout and "hf speed / lex" in proc.stdout, proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["lex", "hf"] * 2 and all(r["ms_per_token"] > 0 for r in rows), rows  # engines take turns


def test_bench_train_speed_finetune_times_the_answer_only_loss_on_its_rows(tmp_path, monkeypatch):
    """--finetune BIN trains lex_lm_tiny with --answer-only-loss on BIN's rows (one per sample); without it a missing
    --data is refused with what to do; options the comparison would ignore, two comparisons at once and a warm-up
    that leaves nothing to measure are refused, naming the option (fairseq-train is replaced by a recorder here)."""
    from click.testing import CliRunner

    from conftest import _script

    script = _script("bench_train_speed.py")
    calls = []
    monkeypatch.setattr(script, "train_wps", lambda data, arch, *rest: calls.append((data, arch, rest[-1])) or [1.0])
    rows = tmp_path / "rows"
    rows.mkdir()
    result = CliRunner().invoke(script.main, ["--finetune", str(rows), "--rounds", "1"])
    assert result.exit_code == 0, result.output
    assert calls == [(rows, ("lex_lm_tiny", ["--answer-only-loss"], True), "eos")]  # break mode: one row a sample
    result = CliRunner().invoke(script.main, ["--data", str(tmp_path / "none"), "--rounds", "1"])
    assert result.exit_code != 0 and "is not a data-bin directory" in result.output
    for args, named in [(["--finetune", str(rows), "--data", str(rows)], "--data"), (["--arch", "lex_lm_small"], "--arch"),
                        (["--schemes", "rope", "--autocast"], "--schemes and --autocast"),
                        (["--designs", "rope", "--finetune", str(rows)], "--designs and --finetune"),
                        (["--updates", "20", "--warmup", "20"], "--warmup")]:
        result = CliRunner().invoke(script.main, [*args, "--rounds", "1"])
        assert result.exit_code == 2 and named in result.output, (args, result.output)
    assert len(calls) == 1  # none of them trained

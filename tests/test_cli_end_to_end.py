"""The commands users run, end to end on a real slice of the books:
lex prepare -> fairseq-train --user-dir lex_plugin --arch lex_lm_tiny -> fairseq-eval-lm."""

import json
import re
import sys

import pytest
from fairseq.data import Dictionary, data_utils

from conftest import REPO, TRAIN_LEN, run_cli


def test_training_loss_falls_on_real_text(trained):
    _, losses = trained
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, losses  # bits per token


def split_tokens(data_bin, split="test") -> int:
    d = Dictionary.load(str(data_bin / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(data_bin / split), d)  # keep it alive: its mmap backs .sizes
    return int(dataset.sizes.sum())


def eval_lm(data_bin, ckpt, tokens_per_sample):
    proc = run_cli(
        [
            "fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
            "--path", str(ckpt), "--gen-subset", "test", "--tokens-per-sample", str(tokens_per_sample),
            "--sample-break-mode", "none", "--batch-size", "4", "--num-workers", "0",
        ]
    )
    text = proc.stdout + proc.stderr
    count = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
    ppl = float(re.search(r"Perplexity: ([\d.]+)", text).group(1))
    return count, ppl


@pytest.mark.parametrize("length", [TRAIN_LEN, 4 * TRAIN_LEN])
def test_eval_lm_scores_every_token_at_and_beyond_training_length(data_bin, trained, length):
    ckpt, _ = trained
    count, ppl = eval_lm(data_bin, ckpt, length)
    assert count == split_tokens(data_bin)  # nothing silently skipped, also past the training length
    assert 1.0 < ppl < 1000.0  # vocabulary is ~1000: a trained model beats uniform


def lex_eval(data_bin, ckpt, *extra, check=True):
    args = [
        "fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
        "--path", str(ckpt), "--gen-subset", "test", "--batch-size", "4", "--num-workers", "0", *map(str, extra),
    ]
    if check:
        return run_cli(args)
    import os
    import subprocess

    env = dict(os.environ, PATH=f"{sys.executable.rsplit('/', 1)[0]}:{os.environ['PATH']}")
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)


def test_length_stratified_report_bca_sliding_and_plot(data_bin, trained, tmp_path):
    ckpt, _ = trained
    report_path = tmp_path / "report.json"
    proc = lex_eval(
        data_bin, ckpt, "--tokens-per-sample", 4 * TRAIN_LEN, "--bca",
        "--eval-lengths", f"{TRAIN_LEN},{2 * TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-windows", "full,bca,sliding",
        "--fixed-target-tokens", TRAIN_LEN // 2, "--fixed-target-samples", 8, "--report-json", report_path,
    )
    prefix = lex_eval(data_bin, ckpt, "--tokens-per-sample", TRAIN_LEN, "--eval-lengths", TRAIN_LEN, "--eval-tokens", 1000)
    assert "| stream | full | 64 | 1 | 1,000 |" in prefix.stdout
    out = proc.stdout + proc.stderr
    assert "| stream | bca(32) | 256 |" in out and "| fixed_target |" in out
    report = json.loads(report_path.read_text())
    assert report["training_length"] == TRAIN_LEN
    # how the report was made: eval-lm's command line, this checkout's commit, the CPU, fairseq's seed, its wall time
    made = report["provenance"]
    assert "fairseq-eval-lm" in made["command"] and f"--report-json {report_path}" in made["command"]
    assert len(made["commit"]) == 40 and "cores" in made["device"] and made["seed"] == 1 and made["wall_s"] > 0
    stream = [r for r in report["results"] if r["protocol"] == "stream"]
    assert {(r["window"], r["length"]) for r in stream} == {
        (w, L) for w in ("full", "bca(32)", "sliding(64)") for L in (64, 128, 256)
    }
    tokens = split_tokens(data_bin)
    assert all(r["tokens"] == tokens == sum(b["tokens"] for b in r["buckets"]) for r in stream)
    by = {(r["window"], r["length"]): r for r in stream}
    # at L = l every window mode is full causal attention
    assert by[("bca(32)", 64)]["loss"] == pytest.approx(by[("full", 64)]["loss"], abs=1e-6)
    # fairseq's own pass (--bca at --tokens-per-sample 256) agrees with the report's row
    fairseq_loss = float(re.search(r"Loss \(base 2\): ([\d.]+)", out).group(1))
    assert fairseq_loss == pytest.approx(by[("bca(32)", 256)]["loss"], abs=1e-3)
    fixed = [r for r in report["results"] if r["protocol"] == "fixed_target"]
    assert len(fixed) == 9 and all(r["tokens"] == 8 * TRAIN_LEN // 2 for r in fixed)

    png = tmp_path / "ppl.png"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "plot", str(report_path), "-o", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--bca", "--training-length", "33"], "even"),
        (["--sliding-window", "0"], "positive integer"),
        (["--eval-lengths", "64,abc"], "positive integers"),
        (["--bca", "--sliding-window", "64"], "choose one"),
    ],
)
def test_bad_evaluation_flags_are_explained(data_bin, trained, flags, message):
    ckpt, _ = trained
    proc = lex_eval(data_bin, ckpt, "--tokens-per-sample", TRAIN_LEN, *flags, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]


def test_bca_without_training_length_is_explained(data_bin, trained, tmp_path):
    import torch

    ckpt, _ = trained
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    del state["cfg"]["model"]["tokens_per_sample"]
    stripped = tmp_path / "no_length.pt"
    torch.save(state, stripped)
    proc = lex_eval(data_bin, stripped, "--tokens-per-sample", TRAIN_LEN, "--bca", check=False)
    assert proc.returncode != 0 and "records no tokens_per_sample" in proc.stderr, proc.stderr[-2000:]
    ok = lex_eval(data_bin, stripped, "--tokens-per-sample", 2 * TRAIN_LEN, "--bca", "--training-length", TRAIN_LEN)
    assert "Perplexity" in ok.stdout + ok.stderr


def test_samples_fairseq_would_skip_are_refused(data_bin):
    """fairseq's eval-lm drops samples longer than max_positions() and still prints a perplexity; the
    task stops instead, saying what to change (a model capped at 64 positions, samples of 128)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_eval_lm_parser()
    args = options.parse_args_and_arch(parser, [
        str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
        "--tokens-per-sample", str(2 * TRAIN_LEN), "--path", "unused.pt",
    ])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("test")
    dataset = task.dataset("test")
    with pytest.raises(ValueError, match="would skip them silently"):
        task.eval_lm_dataloader(dataset, max_positions=TRAIN_LEN)
    batches = list(task.eval_lm_dataloader(dataset, max_positions=2 * TRAIN_LEN, batch_size=4))
    assert sum(int(b["ntokens"]) for b in batches) == split_tokens(data_bin)


def test_add_bos_token_is_refused_where_no_leading_bos_is_fed(data_bin, trained, tmp_path):
    """fairseq's --add-bos-token puts <s> first in every training sample; the length report and the hub feed none,
    so they refuse such a model instead of scoring it without the token it always saw first."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import torch

    from lex_plugin.hub_interface import from_pretrained

    parser = options.get_eval_lm_parser()
    args = options.parse_args_and_arch(parser, [
        str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling", "--add-bos-token",
        "--tokens-per-sample", str(TRAIN_LEN), "--path", "unused.pt", "--eval-lengths", f"{TRAIN_LEN},{2 * TRAIN_LEN}",
    ])
    with pytest.raises(ValueError, match="--add-bos-token"):
        tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    ckpt, _ = trained
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state["cfg"]["task"]["add_bos_token"] = True  # the same checkpoint, as if trained with --add-bos-token
    torch.save(state, tmp_path / "bos.pt")
    with pytest.raises(ValueError, match="trained with --add-bos-token"):
        from_pretrained(tmp_path, "bos.pt", data_bin)


def train_scheme(data_bin, save_dir, scheme, updates):
    run_cli([
        "fairseq-train", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
        "--arch", "lex_lm_tiny", "--decoder-layers", "2", "--pos-emb", scheme, "--share-decoder-input-output-embed",
        "--tokens-per-sample", str(TRAIN_LEN), "--sample-break-mode", "none", "--batch-size", "8",
        "--optimizer", "adam", "--lr", "2e-3", "--max-update", str(updates), "--save-dir", str(save_dir),
        "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--seed", "1",
    ])
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("scheme", ["alibi", "sandwich"])
def test_baseline_schemes_train_and_evaluate_under_every_window(data_bin, tmp_path, scheme):
    """fairseq-train --pos-emb <baseline>, then the lex task's report under full, BCA and sliding windows."""
    ckpt = train_scheme(data_bin, tmp_path / "ckpt", scheme, 10)
    report_path = tmp_path / "report.json"
    lex_eval(data_bin, ckpt, "--tokens-per-sample", 4 * TRAIN_LEN, "--bca", "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}",
             "--eval-windows", "full,bca,sliding", "--report-json", report_path)
    report = json.loads(report_path.read_text())
    tokens = split_tokens(data_bin)
    assert len(report["results"]) == 6 and all(r["tokens"] == tokens for r in report["results"])
    by = {(r["window"], r["length"]): r["loss"] for r in report["results"]}
    assert by[("bca(32)", TRAIN_LEN)] == pytest.approx(by[("full", TRAIN_LEN)], abs=1e-6)
    assert all(0 < loss < 10.5 for loss in by.values())  # finite, below uniform over ~1000 BPE types (9.97 bits) + slack


def test_learned_positions_past_their_table_are_refused(data_bin, tmp_path):
    """A --pos-emb learned model has no positions past its table: eval-lm says so instead of skipping."""
    ckpt = train_scheme(data_bin, tmp_path / "ckpt", "learned", 2)
    ok = lex_eval(data_bin, ckpt, "--tokens-per-sample", TRAIN_LEN, "--bca")
    assert "Perplexity" in ok.stdout + ok.stderr
    long = lex_eval(data_bin, ckpt, "--tokens-per-sample", 2 * TRAIN_LEN, check=False)
    assert long.returncode != 0 and "longer than the model's max_positions() = 64" in long.stderr, long.stderr[-2000:]
    report = lex_eval(data_bin, ckpt, "--tokens-per-sample", TRAIN_LEN, "--eval-lengths", f"{TRAIN_LEN},{2 * TRAIN_LEN}", check=False)
    assert report.returncode != 0 and "exceed the model's max_positions() = 64" in report.stderr, report.stderr[-2000:]

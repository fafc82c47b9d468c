"""The commands users run, end to end on a real slice of the books:
lex prepare -> fairseq-train --user-dir lex_plugin --arch lex_lm_tiny -> fairseq-eval-lm."""

import json
import re
import sys

import pytest
from fairseq.data import Dictionary, data_utils

from conftest import REPO, run_cli

TRAIN_LEN = 64


@pytest.fixture(scope="module")
def data_bin(pg_slice, tmp_path_factory):
    dest = tmp_path_factory.mktemp("e2e") / "data-bin"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "prepare", str(pg_slice), str(dest), "--vocab-size", "1000", "--workers", "2"])
    return dest


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    proc = run_cli(
        [
            "fairseq-train", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
            "--arch", "lex_lm_tiny", "--share-decoder-input-output-embed",
            "--tokens-per-sample", str(TRAIN_LEN), "--sample-break-mode", "none", "--batch-size", "8",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "5", "--clip-norm", "1.0", "--max-update", "30", "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", "--disable-validation", "--log-format", "json", "--log-interval", "1",
            "--num-workers", "0", "--seed", "1",
        ]
    )
    losses = [float(json.loads(m)["loss"]) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    return save_dir / "checkpoint_last.pt", losses


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

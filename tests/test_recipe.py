"""The one fairseq-train recipe: what its command says, and ``lex train`` running it."""

import json
import re
import sys

import pytest
import torch

from conftest import REPO, run_cli
from lex_plugin.experiments.recipe import fairseq_train_command


def test_the_recipe_command():
    cmd = fairseq_train_command("data", "ckpt", arch="lex_lm_small", model_args=["--pos-emb", "alibi"], tokens_per_sample=512,
                                batch_size=8, lr="3e-4", updates=800,
                                save_interval_updates=100, validate_interval_updates=200)
    value = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert cmd[:2] == ["fairseq-train", "data"] and value("--user-dir") == str(REPO / "lex_plugin")
    assert value("--arch") == "lex_lm_small" and value("--pos-emb") == "alibi" and "--share-decoder-input-output-embed" in cmd
    assert (value("--tokens-per-sample"), value("--batch-size"), value("--lr")) == ("512", "8", "3e-4")
    assert value("--max-update") == value("--total-num-update") == "800" and value("--warmup-updates") == "100"
    assert (value("--optimizer"), value("--adam-betas"), value("--weight-decay"), value("--clip-norm")) == (
        "adam", "(0.9, 0.98)", "0.01", "1.0")
    assert value("--save-interval-updates") == "100" and value("--validate-interval-updates") == "200"
    assert "--disable-validation" not in cmd
    stock = fairseq_train_command("data", None, arch="transformer_lm", user_dir=None)
    assert "--user-dir" not in stock and "--no-save" in stock and "--disable-validation" in stock
    with pytest.raises(ValueError, match="must be positive"):
        fairseq_train_command("data", "ckpt", updates=0)
    # a stage of a longer run: stops at 800 of a 1,000-update schedule (warm-up from the whole schedule)
    stage = fairseq_train_command("data", "ckpt", updates=800, total_updates=1000)
    assert stage[stage.index("--max-update") + 1] == "800" and stage[stage.index("--total-num-update") + 1] == "1000"
    assert stage[stage.index("--warmup-updates") + 1] == "125"
    with pytest.raises(ValueError, match="schedule would end before training does"):
        fairseq_train_command("data", "ckpt", updates=800, total_updates=700)
    assert fairseq_train_command("data", "ckpt", updates=10, warmup=10)[-1] is not None  # all warm-up: allowed
    with pytest.raises(ValueError, match="give fewer warm-up updates"):
        fairseq_train_command("data", "ckpt", updates=10, warmup=11)


def test_lex_train_refuses_a_warm_up_longer_than_the_run(data_bin, tmp_path):
    from click.testing import CliRunner

    from lex_plugin.cli import main

    result = CliRunner().invoke(main, ["train", str(data_bin), str(tmp_path / "ckpt"), "--max-update", "10", "--warmup-updates", "50"])
    assert result.exit_code == 2 and "warmup (50 updates) must lie in 0..10" in result.output and not (tmp_path / "ckpt").exists()


def test_lex_train_runs_the_recipe(data_bin, tmp_path):
    proc = run_cli([sys.executable, "-m", "lex_plugin.cli", "train", str(data_bin), str(tmp_path / "ckpt"),
                    "--tokens-per-sample", "32", "--batch-size", "4", "--max-update", "3", "--save-interval-updates", "3",
                    "--decoder-layers", "1", "--log-format", "json", "--log-interval", "1", "--log-file", str(tmp_path / "train.log"),
                    "--validate-interval-updates", "2"])
    assert re.search(r"^\+ \S*fairseq-train .*--lr-scheduler polynomial_decay", proc.stderr, re.M)  # printed first
    losses = [json.loads(m)["loss"] for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    assert len(losses) == 3
    # lex compare-curves' reader: the --log-file copy (messages only, end-of-epoch summary too) reads as stdout does
    from lex_plugin.experiments.train_log import read_train_log

    logged = read_train_log(proc.stdout + proc.stderr)
    assert read_train_log(tmp_path / "train.log") == logged and sorted(logged) == [1, 2, 3]
    assert [logged[u]["loss"] for u in (1, 2, 3)] == [float(x) for x in losses]
    # the demo report's reader: each validation's loss and ppl, as fairseq printed them (every 2 updates, and at the end)
    from lex_plugin.experiments.train_log import read_valid_log

    printed = {int(d["valid_num_updates"]): (float(d["valid_loss"]), float(d["valid_ppl"])) for d in
               map(json.loads, re.findall(r"\| valid \| (\{.*\})", proc.stdout + proc.stderr))}
    valid = read_valid_log(tmp_path / "train.log")
    assert printed and {u: (v["loss"], v["ppl"]) for u, v in valid.items()} == printed
    state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["decoder_layers"] == 1 and state["cfg"]["task"]["tokens_per_sample"] == 32

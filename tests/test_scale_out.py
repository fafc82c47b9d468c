"""Scale-out and fault tolerance, as users run them: torchrun data parallelism, mixed precision, exact
resume after a kill, and clear errors for broken inputs. Real text (a slice of the books), fairseq's CLI."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, build_lex_model, random_tokens, run_cli
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow

SCHEMES = ["xpos", "rope", "alibi", "sandwich", "kerple_log", "t5", "sinusoidal", "learned", "none"]


def train_args(data_bin, save_dir, *extra):
    return [
        str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
        "--arch", "lex_lm_tiny", "--decoder-layers", "2", "--share-decoder-input-output-embed",
        "--tokens-per-sample", "64", "--sample-break-mode", "none",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "4", "--clip-norm", "1.0", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--disable-validation", "--log-format", "json", "--log-interval", "1", "--num-workers", "0", "--seed", "3",
        *map(str, extra),
    ]


def losses(proc) -> dict:
    """{update: loss} from fairseq's json train_inner log."""
    logs = [json.loads(m) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    return {int(r["num_updates"]): float(r["loss"]) for r in logs}


def model_params(ckpt: Path) -> dict:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    return state["model"]


def env_with_venv():
    """run_cli's environment (venv scripts first, 2 threads: bitwise comparisons need the same thread count)."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")


# ---- data parallel ------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16_autocast"])
def test_two_processes_equal_one_process_with_the_same_global_batch(data_bin, tmp_path, precision):
    """torchrun --nproc_per_node 2 scripts/train_distributed.sh (gloo, legacy_ddp) with --batch-size 4 per rank
    reaches the parameters of one process with --batch-size 4 --update-freq 2 (the same batches, summed
    the same way), with torch_adamw; no dropout (each rank draws its own masks). fairseq itself checks every
    update that the ranks' gradient norms agree. The same under --bf16-autocast (emulated where the CPU has no
    bf16: the same numbers)."""
    common = ["--batch-size", "4", "--max-update", "8", "--dropout", "0", "--optimizer", "torch_adamw"]
    env = {}
    if precision == "bf16_autocast":
        common += ["--task", "lex_language_modeling", "--bf16-autocast"]  # (the later --task wins)
        env = {"LEX_EMULATED_BF16": "1", "OMP_NUM_THREADS": "1"}  # one thread as each rank: bf16 rounds each sum once
    one = run_cli(["fairseq-train", *train_args(data_bin, tmp_path / "one", *common, "--update-freq", "2")], env=env)
    two = run_cli(["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python",
                   str(REPO / "scripts" / "train_distributed.sh"), *train_args(data_bin, tmp_path / "two", *common)],
                  env={**env, "OMP_NUM_THREADS": "1"})
    if precision == "bf16_autocast":
        assert "bf16 autocast" in one.stdout + one.stderr
    text = two.stdout + two.stderr
    assert "distributed init (rank 0)" in text and "distributed init (rank 1)" in text, text[-3000:]
    a, b = model_params(tmp_path / "one" / "checkpoint_last.pt"), model_params(tmp_path / "two" / "checkpoint_last.pt")
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < 1e-5, worst
    la, lb = losses(one), losses(two)
    assert sorted(la) == sorted(lb) == list(range(1, 9))
    assert all(abs(la[u] - lb[u]) < 1e-4 for u in la), (la, lb)
    assert la[8] < la[1] - 0.5  # it trained: the parameters moved


# ---- resume ---------------------------------------------------------------------------------------------

def test_training_killed_and_resumed_matches_an_uninterrupted_run(data_bin, tmp_path):
    """kill -9 after the checkpoint at update 4, restart the same command: updates 5-8 and the final
    parameters are bitwise those of the uninterrupted run (fairseq re-seeds every update and restores the
    data iterator, optimizer and schedule)."""
    common = ["--batch-size", "8", "--max-update", "8", "--save-interval-updates", "2", "--dropout", "0.1"]
    threads = {"OMP_NUM_THREADS": "2"}  # the same thread count in all three runs (bitwise comparison)
    whole = run_cli(["fairseq-train", *train_args(data_bin, tmp_path / "whole", *common)], env=threads)

    cmd = ["fairseq-train", *train_args(data_bin, tmp_path / "killed", *common)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_with_venv(), cwd=REPO)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if re.search(r"Saved checkpoint .*\(epoch 1 @ 4 updates", line):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-30:])
    resumed = run_cli(cmd, env=threads)
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr
    lw, lr = losses(whole), losses(resumed)
    assert min(lr) > 4 and max(lr) == 8  # the second run started after update 4
    assert all(lr[u] == lw[u] for u in lr), (lw, lr, "".join(seen[-40:]))
    a, b = model_params(tmp_path / "whole" / "checkpoint_last.pt"), model_params(tmp_path / "killed" / "checkpoint_last.pt")
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


# ---- mixed precision ------------------------------------------------------------------------------------

def test_memory_efficient_fp16_training_runs_on_cpu(data_bin, tmp_path):
    """fairseq-train --memory-efficient-fp16 (model.half(), fp16 forward/backward, dynamic loss scale):
    finite, falling losses; the checkpoint carries no position table."""
    proc = run_cli(["fairseq-train", *train_args(data_bin, tmp_path / "ckpt", "--batch-size", "8", "--max-update", "12",
                                                 "--memory-efficient-fp16", "--fp16-init-scale", "16", "--lr", "2e-3")])
    logs = [json.loads(m) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    assert len(logs) == 12 and all("loss_scale" in r for r in logs)  # fairseq's fp16 path, dynamic loss scale
    seen = [float(r["loss"]) for r in logs]
    assert all(torch.isfinite(torch.tensor(seen))) and seen[-1] < seen[0] - 1.0, seen
    state = model_params(tmp_path / "ckpt" / "checkpoint_last.pt")
    assert not any("xpos" in k or "alibi" in k for k in state)  # no position table was saved (or halved)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_half_precision_forward_is_close_to_fp32_for_every_scheme(scheme):
    """model.half() (what --fp16 does): position math stays fp32, logits finite and close to fp32 at l."""
    model = build_lex_model(tokens_per_sample=64, pos_emb=scheme, decoder_layers=2)
    tokens = random_tokens(model.decoder.dictionary, 2, 64, seed=4)
    with torch.no_grad():
        ref, _ = model(tokens)
        low, _ = model.half()(tokens)
    assert low.dtype == torch.float16 and torch.isfinite(low).all()
    assert ((low.float() - ref).abs().max() / ref.abs().max()).item() < 0.02


@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
def test_half_precision_model_with_bca_is_finite_at_64k(scheme):
    model = build_lex_model(tokens_per_sample=512, pos_emb=scheme, decoder_layers=1).half()
    model = model.under(AttentionSpec(AttentionWindow.bca(512)))
    tokens = random_tokens(model.decoder.dictionary, 1, 65536, seed=2)
    with torch.no_grad():
        features, _ = model.decoder(tokens, features_only=True)
    assert features.dtype == torch.float16 and torch.isfinite(features).all()


# ---- faults ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_ckpt(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("fault_ckpt")
    run_cli(["fairseq-train", *train_args(data_bin, save, "--batch-size", "8", "--max-update", "2")])
    return save / "checkpoint_last.pt"


def eval_lm_command(data_bin, ckpt) -> list:
    return ["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
            "--path", str(ckpt), "--gen-subset", "test", "--tokens-per-sample", "64", "--batch-size", "4", "--num-workers", "0"]


def eval_lm(data_bin, ckpt):
    """fairseq-eval-lm in its own process (what a user sees: the exit code and stderr)."""
    return subprocess.run(eval_lm_command(data_bin, ckpt), capture_output=True, text=True, env=env_with_venv(), cwd=REPO)


def test_truncated_checkpoint_is_a_clear_error(data_bin, small_ckpt, tmp_path):
    cut = tmp_path / "checkpoint_last.pt"
    cut.write_bytes(small_ckpt.read_bytes()[: small_ckpt.stat().st_size // 2])
    proc = eval_lm(data_bin, cut)
    assert proc.returncode != 0 and "cannot be read: it is truncated or corrupt" in proc.stderr, proc.stderr[-2000:]
    assert "--restore-file" in proc.stderr
    # fairseq-train resuming from it says the same
    (tmp_path / "resume").mkdir()
    shutil.copy(cut, tmp_path / "resume" / "checkpoint_last.pt")
    with pytest.raises(AssertionError, match="truncated or corrupt"):  # (in this process: run_cli)
        run_cli(["fairseq-train", *train_args(data_bin, tmp_path / "resume", "--batch-size", "8", "--max-update", "4")])
    run_cli(eval_lm_command(data_bin, small_ckpt))  # the intact file still loads


def test_checkpoint_with_another_dictionary_is_refused(data_bin, small_ckpt, tmp_path):
    """Same vocabulary size, two symbols swapped: shapes match, so without the digest every id would
    silently mean another word."""
    other = tmp_path / "data-bin"
    shutil.copytree(data_bin, other)
    lines = (other / "dict.txt").read_text(encoding="utf-8").splitlines()
    lines[10], lines[11] = lines[11], lines[10]
    (other / "dict.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = eval_lm(other, small_ckpt)
    assert proc.returncode != 0 and "trained with another dictionary" in proc.stderr, proc.stderr[-2000:]


def test_nan_loss_stops_training_with_fairseqs_message(data_bin, tmp_path):
    """An lr that blows the weights up: fairseq detects the non-finite gradients and stops, never saving
    garbage as a later checkpoint."""
    proc = subprocess.run(["fairseq-train", *train_args(data_bin, tmp_path / "nan", "--batch-size", "8", "--max-update", "6",
                                                        "--lr", "1e30", "--warmup-updates", "1", "--clip-norm", "0")],
                          capture_output=True, text=True, env=env_with_venv(), cwd=REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FloatingPointError: gradients are Nan/Inf" in out, out[-3000:]
    assert "NaN detected in output of" in out  # fairseq's NanDetector names the first module
    assert not (tmp_path / "nan" / "checkpoint_last.pt").exists()  # only fairseq's debugging crash.pt

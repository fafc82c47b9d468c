"""Everyday workflow: a new corpus prepared like the training data-bin, raw-text scoring with `lex score`."""

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary, data_utils

from conftest import REPO, TRAIN_LEN, build_lex_model, run_cli, shared_data
from lex_plugin.evaluation.documents import encode_document, score_tokens
from lex_plugin.modules.attention import AttentionSpec

HELD_OUT_CHARS = 12_000


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """Two test books the slice model never saw (the slice uses the first test book), first 12k characters."""
    src = tmp_path_factory.mktemp("held_out")
    (src / "test").mkdir()
    for path in sorted((shared_data() / "pg" / "test").glob("*.txt"))[1:3]:
        (src / "test" / path.name).write_text(path.read_text(encoding="utf-8")[:HELD_OUT_CHARS], encoding="utf-8")
    return src


@pytest.fixture(scope="module")
def like_bin(held_out, data_bin, tmp_path_factory):
    dest = tmp_path_factory.mktemp("like") / "held-out-bin"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "prepare", str(held_out), str(dest), "--like", str(data_bin),
             "--splits", "test", "--workers", "1"])
    return dest


def _stream(data_bin, split="test"):
    d = Dictionary.load(str(data_bin / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / split), d)
    return [ds[i].long() for i in range(len(ds))], d


def test_prepare_like_reuses_the_bpe_and_dictionary(like_bin, data_bin):
    assert (like_bin / "dict.txt").read_bytes() == (data_bin / "dict.txt").read_bytes()
    assert (like_bin / "spm.model").read_bytes() == (data_bin / "spm.model").read_bytes()
    assert not (like_bin / "train.bin").exists() and (like_bin / "test.bin").is_file()
    meta, original = (json.loads((d / "lex_prepare.json").read_text()) for d in (like_bin, data_bin))
    assert meta["like"] == str(data_bin.resolve()) and meta["splits"]["test"]["documents"] == 2
    assert (meta["lang"], meta["bpe"], meta["vocab_size"]) == (original["lang"], original["bpe"], original["vocab_size"])


def test_model_trained_on_the_slice_scores_held_out_books_prepared_like_it(like_bin, trained, tmp_path):
    """fairseq-eval-lm loads the checkpoint against the new data-bin (the dictionary digest check passes)
    and scores every held-out token."""
    ckpt, _ = trained
    out = run_cli(["fairseq-eval-lm", str(like_bin), "--user-dir", str(REPO / "lex_plugin"), "--path", str(ckpt),
                   "--task", "lex_language_modeling", "--gen-subset", "test", "--tokens-per-sample", str(2 * TRAIN_LEN),
                   "--bca", "--batch-size", "4", "--num-workers", "0", "--cpu"])
    log = out.stdout + out.stderr
    rows, _ = _stream(like_bin)
    total = sum(r.numel() for r in rows)
    assert f"Evaluated {total:,} tokens" in log or f"Evaluated {total} tokens" in log, log[-2000:]
    ppl = float(log.split("Perplexity: ")[1].split()[0])
    assert 1 < ppl < 1000  # the 1000-symbol vocabulary: a model that learned something, on unseen text


def test_prepare_like_refuses_what_it_cannot_reuse(held_out, data_bin, tmp_path):
    from click.testing import CliRunner

    from lex_plugin.cli import main as lex_cli

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "dict.txt").write_text("a 1\n")
    result = CliRunner().invoke(lex_cli, ["prepare", str(held_out), str(tmp_path / "o1"), "--like", str(bare), "--splits", "test"])
    assert result.exit_code != 0 and "lex_prepare.json" in result.output and not (tmp_path / "o1").exists()
    (bare / "lex_prepare.json").write_text(json.dumps({"bpe": "sentencepiece", "lang": "en"}))
    result = CliRunner().invoke(lex_cli, ["prepare", str(held_out), str(tmp_path / "o2"), "--like", str(bare), "--splits", "test"])
    assert result.exit_code != 0 and "spm.model" in result.output
    result = CliRunner().invoke(lex_cli, ["prepare", str(held_out), str(tmp_path / "o3"), "--like", str(data_bin),
                                          "--splits", "test", "--vocab-size", "500"])
    assert result.exit_code != 0 and "--vocab-size cannot be combined with --like" in result.output
    result = CliRunner().invoke(lex_cli, ["prepare", str(held_out), str(tmp_path / "o4"), "--splits", "test"])
    assert result.exit_code != 0 and "--like" in result.output  # no train split, nothing to learn from


def test_raw_text_is_encoded_exactly_as_prepare_binarised_it(hub, held_out, like_bin):
    """lex score's encoding of a raw book == the tokens lex prepare --like wrote for it (document by
    document: the data-bin separates documents by one empty line, i.e. one extra </s>)."""
    rows, d = _stream(like_bin)
    stream = torch.cat(rows)
    eos = d.eos()
    docs = [encode_document(hub, p.read_text(encoding="utf-8")[:HELD_OUT_CHARS]) for p in sorted((held_out / "test").glob("*.txt"))]
    expected = torch.cat([docs[0], torch.tensor([eos]), docs[1]])
    assert torch.equal(stream, expected)


@pytest.mark.parametrize("mode", ["full", "bca", "sliding"])
def test_document_score_equals_one_parallel_forward(hub, held_out, mode):
    """A document of many training lengths, scored block by block through the cache, has the same loss
    per token as one parallel forward of the whole document under the same window (float64 sums)."""
    text = sorted((held_out / "test").glob("*.txt"))[0].read_text(encoding="utf-8")[:HELD_OUT_CHARS]
    window = hub.spec_for(mode=mode)
    tokens = encode_document(hub, text)
    assert tokens.numel() > 8 * TRAIN_LEN
    model = hub.models[0]
    eos = hub.src_dict.eos()
    score = score_tokens(model, tokens, window, eos, "book", TRAIN_LEN)
    with torch.no_grad():
        source = torch.cat([tokens.new_tensor([eos]), tokens[:-1]])[None]
        logits, _ = model(source, spec=window)
    nll = F.cross_entropy(logits[0].double(), tokens, reduction="none")
    assert score.tokens == tokens.numel()
    assert score.nll == pytest.approx(float(nll.sum()), rel=1e-5)
    assert [(b.start, b.end) for b in score.buckets][:3] == [(0, TRAIN_LEN), (TRAIN_LEN, 2 * TRAIN_LEN), (2 * TRAIN_LEN, 4 * TRAIN_LEN)]
    assert sum(b.tokens for b in score.buckets) == tokens.numel()
    for b in score.buckets:
        assert b.nll == pytest.approx(float(nll[b.start : b.end].sum()), rel=1e-5)


def test_lex_score_command_prints_the_table_and_json(trained, data_bin, held_out, tmp_path):
    ckpt, _ = trained
    books = sorted((held_out / "test").glob("*.txt"))
    out = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), *map(str, books), "--path", str(ckpt),
                   "--bca", "--json", str(tmp_path / "score.json")])
    report = json.loads((tmp_path / "score.json").read_text())
    assert report["window"] == f"bca({TRAIN_LEN // 2})" and len(report["documents"]) == 2
    for doc, book in zip(report["documents"], books):
        assert doc["name"] == book.name and f"| {book.name} | bca({TRAIN_LEN // 2}) | {doc['tokens']:,} |" in out.stdout
        assert doc["tokens"] == sum(b["tokens"] for b in doc["buckets"])
    nll = sum(d["loss"] * d["tokens"] for d in report["documents"]) / report["tokens"]
    assert report["ppl"] == pytest.approx(2**nll, rel=1e-9)


def test_documents_past_learned_positions_are_refused_not_truncated():
    model = build_lex_model(pos_emb="learned", tokens_per_sample=32, max_target_positions=64)
    tokens = torch.arange(4, 100) % 50 + 4
    with pytest.raises(ValueError, match="max_positions"):
        score_tokens(model, tokens, AttentionSpec(), eos=2)
    assert score_tokens(model, tokens[:64], AttentionSpec(), eos=2).tokens == 64


# ---- fairseq integration: readable output, TensorBoard, hydra, FSDP -----------------------------------

FAIRSEQ_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|WARNING) \| \S+ \| ")
PROGRESS_LINE = re.compile(r"^[\w()=,.+]+ L=\d+: +\d+%\|")  # lex_plugin.evaluation.length_eval.progress_bar
FAIRSCALE_IMPORT = "fairscale/experimental/nn/offload.py"  # warns when fairseq imports it, before the plugin loads


def test_eval_lm_output_is_fairseqs_log_and_the_tables_only(data_bin, trained):
    """fairseq-eval-lm with the length table: every line is fairseq's formatted log (INFO), a table row, the
    table's title or blank; no DEBUG lines, no default-format logging, none of the known library warnings."""
    ckpt, _ = trained
    proc = run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--path", str(ckpt),
                    "--task", "lex_language_modeling", "--gen-subset", "valid", "--tokens-per-sample", str(TRAIN_LEN),
                    "--batch-size", "8", "--num-workers", "0", "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}",
                    "--eval-windows", "full,bca", "--eval-tokens", "2000"])
    lines = (proc.stdout + proc.stderr).splitlines()
    skip_next, unexpected, bars = False, [], set()
    for line in lines:
        if skip_next:  # the source line Python prints under a warning
            skip_next = False
            continue
        if FAIRSCALE_IMPORT in line:
            skip_next = True
            continue
        if not line.strip() or line.startswith("|") or line.startswith("Length-stratified evaluation"):
            continue
        if PROGRESS_LINE.match(line):  # the length report's progress bars (a line per 30 s in a log file)
            bars.add(line.split(":")[0])
            continue
        if not FAIRSEQ_LINE.match(line):
            unexpected.append(line)
    assert not unexpected, "\n".join(unexpected[:20])
    assert bars == {f"{w} L={L}" for w in ("full", "bca(32)") for L in (TRAIN_LEN, 4 * TRAIN_LEN)}
    assert any("| fairseq_cli.eval_lm | Loss (base 2)" in line for line in lines)
    assert any(line.startswith("| stream | bca(") for line in lines)


def _read_scalars(logdir: Path, tag: str) -> dict:
    """{step: value} of scalar ``tag`` in the TensorBoard event files under ``logdir`` (TFRecord framing:
    8-byte length, 4-byte CRC, the Event proto, 4-byte CRC)."""
    from tensorboardX.proto import event_pb2

    values = {}
    for path in logdir.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = value.simple_value
    return values


def _train(data_bin, save_dir, *extra):
    return run_cli(["fairseq-train", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
                    "--arch", "lex_lm_tiny", "--share-decoder-input-output-embed", "--tokens-per-sample", str(TRAIN_LEN),
                    "--sample-break-mode", "none", "--batch-size", "16", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
                    "--weight-decay", "0.01", "--lr", "0.0015", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "70",
                    "--total-num-update", "600",
                    "--clip-norm", "1.0", "--max-update", "4", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
                    "--disable-validation", "--log-format", "json", "--log-interval", "1", "--num-workers", "0", "--seed", "1",
                    *map(str, extra)])


def _losses(proc) -> dict:
    """{update: loss} of fairseq's json log lines (fairseq-train's format, or hydra's ``[train_inner][INFO] -``)."""
    logs = [json.loads(m) for m in re.findall(r"train_inner(?: \||\]\[INFO\] -) (\{.*\})", proc.stdout + proc.stderr)]
    return {int(r["num_updates"]): float(r["loss"]) for r in logs}


@pytest.fixture(scope="module")
def cli_run(data_bin, tmp_path_factory):
    """4 updates of fairseq-train with --tensorboard-logdir (the same settings as the hydra config)."""
    work = tmp_path_factory.mktemp("cli_run")
    proc = _train(data_bin, work / "ckpt", "--tensorboard-logdir", work / "tb")
    return work, _losses(proc)


def test_tensorboard_logdir_records_the_training_losses(cli_run):
    work, losses = cli_run
    assert sorted(losses) == [1, 2, 3, 4]
    logged = _read_scalars(work / "tb" / "train_inner", "loss")
    assert sorted(logged) == [1, 2, 3, 4]
    for step, loss in losses.items():  # fairseq's json log rounds to 3 decimals
        assert logged[step] == pytest.approx(loss, abs=6e-4)


def test_hydra_config_trains_exactly_like_fairseq_train(cli_run, data_bin, tmp_path):
    """examples/lex_lm/config/lex_lm_tiny.yaml under fairseq-hydra-train == the same options given to
    fairseq-train: the same model (preset from the model/ group), data, optimizer and seed, hence the same
    losses update by update."""
    _, expected = cli_run
    proc = run_cli(["fairseq-hydra-train", "--config-dir", str(REPO / "examples/lex_lm/config"), "--config-name", "lex_lm_tiny",
                    f"task.data={data_bin}", f"checkpoint.save_dir={tmp_path / 'ckpt'}", f"task.tokens_per_sample={TRAIN_LEN}",
                    "optimization.max_update=4", "dataset.disable_validation=true", "common.log_format=json",
                    "common.log_interval=1"])
    assert _losses(proc) == expected
    assert (tmp_path / "ckpt" / ".hydra" / "config.yaml").is_file() and not (REPO / ".hydra").exists()  # record beside the checkpoints
    state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["model"]["decoder.embed_tokens.weight"].shape[1] == 256 and state["cfg"]["model"]["decoder_layers"] == 4


def test_hydra_refuses_a_preset_name_it_would_not_apply(data_bin, tmp_path):
    proc = subprocess.run(["fairseq-hydra-train", "--config-dir", str(REPO / "examples/lex_lm/config"), "--config-name",
                           "lex_lm_tiny", f"task.data={data_bin}", f"checkpoint.save_dir={tmp_path}", "model._name=lex_lm_tiny",
                           "optimization.max_update=1"],
                          capture_output=True, text=True, cwd=REPO, env=_env())
    assert proc.returncode != 0 and "does not apply the lex_lm_tiny preset under fairseq-hydra-train" in proc.stderr + proc.stdout


def test_hydra_model_group_mirrors_the_presets():
    from lex_plugin.models.lex_lm import PRESETS

    for name, sizes in PRESETS.items():
        text = (REPO / "examples/lex_lm/config/model" / f"{name}.yaml").read_text()
        fields = dict(line.split(": ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        assert fields == {"_name": "lex_lm", **{k: str(v) for k, v in sizes.items()}}


def _env():
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU fully_sharded trains: examples/lex_lm/GPU.md")
def test_fully_sharded_reaches_fairscale_and_states_that_it_needs_cuda(data_bin, tmp_path):
    """fairscale is installed (make install) and fairseq's --ddp-backend fully_sharded wraps the model in
    its FSDP; on a CPU build of torch that stops with the error docs/scaling.md quotes."""
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python", str(REPO / "scripts" / "train_distributed.sh"),
         str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling", "--arch", "lex_lm_tiny",
         "--decoder-layers", "2", "--tokens-per-sample", "64", "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3",
         "--max-update", "2", "--save-dir", str(tmp_path), "--num-workers", "0", "--disable-validation"],
        capture_output=True, text=True, cwd=REPO, env=dict(_env(), DDP_BACKEND="fully_sharded"), timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "fairscale/nn/data_parallel/fully_sharded_data_parallel.py" in log, log[-3000:]
    assert FSDP_CPU_ERROR in log, log[-3000:]
    assert FSDP_CPU_ERROR in (REPO / "docs" / "scaling.md").read_text()


FSDP_CPU_ERROR = "AssertionError: Torch not compiled with CUDA enabled"


@pytest.mark.e2e  # starts a process
def test_importing_the_package_registers_all_it_provides():
    """``import lex_plugin`` (the hub, scripts, tests) registers the model, its presets, the task, the
    optimizer and the tokenizer, not only what fairseq's --user-dir loader imports by directory."""
    code = ("import lex_plugin\n"
            "from fairseq.models import ARCH_MODEL_REGISTRY\nfrom fairseq.tasks import TASK_REGISTRY\n"
            "from fairseq.optim import OPTIMIZER_REGISTRY\nfrom fairseq.data.encoders import TOKENIZER_REGISTRY\n"
            "assert 'lex_lm_tiny' in ARCH_MODEL_REGISTRY and 'lex_language_modeling' in TASK_REGISTRY\n"
            "assert 'torch_adamw' in OPTIMIZER_REGISTRY and 'lex_moses' in TOKENIZER_REGISTRY\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


def test_lex_score_takes_the_data_bin_first_and_the_old_flag_with_a_message(trained, data_bin, tmp_path):
    """One argument convention (DATA first, as fairseq-eval-lm): lex score DATA FILE; the form before it (--data)
    still gives the same numbers for one release, with a deprecation message; DATA given both ways is refused."""
    ckpt, _ = trained
    text = tmp_path / "doc.txt"
    text.write_text("\n".join((REPO / "README.md").read_text().splitlines()[:12]) + "\n")
    new = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), str(text), "--path", str(ckpt)])
    old = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", "--path", str(ckpt), "--data", str(data_bin), str(text)])
    assert "ppl" in new.stdout and new.stdout == old.stdout
    assert "--data is deprecated" in old.stderr and "deprecated" not in new.stderr
    for args in ([str(data_bin), str(text), "--data", str(data_bin)], [str(text)]):
        with pytest.raises(AssertionError, match="given twice|must be the data-bin"):
            run_cli([sys.executable, "-m", "lex_plugin.cli", "score", *args, "--path", str(ckpt)])

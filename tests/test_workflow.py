"""Everyday workflow: a new corpus prepared like the training data-bin, raw-text scoring with `lex score`."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary, data_utils

from conftest import REPO, TRAIN_LEN, build_lex_model, run_cli, shared_data
from lex_plugin import LexLanguageModel
from lex_plugin.evaluation.documents import encode_document, score_tokens
from lex_plugin.modules.attention.window import AttentionWindow

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


@pytest.fixture(scope="module")
def hub(trained, data_bin):
    ckpt, _ = trained
    return LexLanguageModel.from_pretrained(ckpt.parent, ckpt.name, data_bin)


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
    window = hub.window_for(mode)
    tokens = encode_document(hub, text)
    assert tokens.numel() > 8 * TRAIN_LEN
    model = hub.models[0]
    eos = hub.src_dict.eos()
    score = score_tokens(model, tokens, window, eos, "book", TRAIN_LEN)
    with torch.no_grad():
        source = torch.cat([tokens.new_tensor([eos]), tokens[:-1]])[None]
        logits, _ = model(source, window=window)
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
    out = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", "--path", str(ckpt), "--data", str(data_bin),
                   *map(str, books), "--bca", "--json", str(tmp_path / "score.json")])
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
        score_tokens(model, tokens, AttentionWindow.full(), eos=2)
    assert score_tokens(model, tokens[:64], AttentionWindow.full(), eos=2).tokens == 64

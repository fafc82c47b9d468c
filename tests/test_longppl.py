"""LongPPL (Fang et al., ICLR 2025): key tokens and the perplexity over them, against float64 losses written
out one context at a time, and through fairseq-eval-lm --longppl on the real-text model."""

import json
import math
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, TRAIN_LEN, build_lex_model, make_dictionary, random_tokens, run_cli
from lex_plugin.evaluation.length_eval import evaluate_lengths
from lex_plugin.evaluation.longppl import KeyTokenRule, find_key_tokens
from lex_plugin.modules.attention.spec import FULL_SPEC, AttentionSpec
from lex_plugin.modules.attention.window import AttentionWindow

L_TRAIN = 32
ALPHA, BETA = 0.01, 10.0  # the suite's 30-update model gains at most ~0.03 nats from far context


@pytest.fixture(scope="module")
def model64():
    return build_lex_model(tokens_per_sample=L_TRAIN).double()


@pytest.fixture(scope="module")
def stream():
    return random_tokens(make_dictionary(), 1, 150, seed=3)[0]


def _last_loss(model, context, token) -> float:
    """Loss (nats, float64) of ``token`` after ``context``: the last position of one forward of the context alone."""
    logits = model(context[None])[0][0, -1].double()
    return float(-F.log_softmax(logits, dim=-1)[token])


def _reference(model, stream, length, eos, k, s):
    """Per stream token: loss with its sample's whole context, and with the truncated context of the module
    notation (NaN where j < K), each from its own forward."""
    long, short = [], []
    for start in range(0, stream.numel(), length):
        first = torch.tensor([eos]) if start == 0 else stream[start - 1 : start]
        seq = torch.cat([first, stream[start : start + length]])
        for j in range(1, seq.numel()):
            long.append(_last_loss(model, seq[:j], seq[j]))
            c = s * ((j - k) // s)
            short.append(_last_loss(model, seq[c:j], seq[j]) if j >= k else math.nan)
    return torch.tensor(long, dtype=torch.float64), torch.tensor(short, dtype=torch.float64)


def _midway(values) -> float:
    """A threshold halfway between the two middle values: far from every value, so fp32 logits cannot flip a token."""
    v = values.sort().values
    return float(v[v.numel() // 2 - 1] + v[v.numel() // 2]) / 2


@torch.no_grad()
@pytest.mark.parametrize("length", [150, 70])  # one sample; three, the last shorter
def test_key_tokens_follow_the_rule_on_losses_written_out(model64, stream, length):
    d = make_dictionary()
    k, s = 11, 5  # short contexts of 11 .. 15 tokens
    long, short = _reference(model64, stream, length, d.eos(), k, s)
    lsd = short - long
    alpha = _midway(lsd[~lsd.isnan()])  # a rule that picks about half of the candidates
    beta = _midway(long)  # and about half of those
    rule = KeyTokenRule(alpha=alpha, beta=beta, trunc_len=k, sliding_window=s)
    expected = (lsd > alpha) & (long < beta)
    assert 5 < int(expected.sum()) < int((~lsd.isnan()).sum()) - 5
    key = find_key_tokens(model64, stream, length, FULL_SPEC, d.eos(), d.pad(), rule.resolve(L_TRAIN), max_tokens=40)
    assert torch.equal(key, expected)
    # the first K - 1 targets of every sample have no short context: never key tokens
    for start in range(0, stream.numel(), length):
        assert not key[start : start + k - 1].any()


@torch.no_grad()
def test_longppl_is_the_perplexity_over_the_key_tokens(model64, stream):
    """Key tokens chosen by hand; LongPPL at each length = exp(mean float64 loss over them) with that length's
    contexts; identical key tokens under every window."""
    d = make_dictionary()
    key = torch.zeros(stream.numel(), dtype=torch.bool)
    key[[3, 40, 41, 77, 100, 101, 102, 149]] = True
    for length in (150, 50):
        long, _ = _reference(model64, stream, length, d.eos(), 1, 1)
        full, = evaluate_lengths(model64, stream, [length], FULL_SPEC, d.eos(), d.pad(), key_tokens=key, progress=False)
        assert full.key_tokens == 8
        assert full.longppl == pytest.approx(math.exp(float(long[key].mean())), rel=1e-6)  # logits scored in fp32
        assert full.ppl == pytest.approx(math.exp(float(long.mean())), rel=1e-6)
        bca, = evaluate_lengths(model64, stream, [length], AttentionSpec(AttentionWindow.bca(L_TRAIN)), d.eos(), d.pad(),
                                key_tokens=key, progress=False)
        assert bca.key_tokens == full.key_tokens and bca.to_dict()["longppl"] == bca.longppl
    plain, = evaluate_lengths(model64, stream, [50], FULL_SPEC, d.eos(), d.pad(), progress=False)
    assert "longppl" not in plain.to_dict() and plain.longppl is None
    with pytest.raises(ValueError, match="mark the stream"):
        evaluate_lengths(model64, stream, [50], FULL_SPEC, d.eos(), d.pad(), key_tokens=key[:-1], progress=False)


def test_rule_defaults_and_refusals():
    assert KeyTokenRule().resolve(256) == KeyTokenRule(2.0, 2.0, 192, 64)  # K + S = l
    assert KeyTokenRule(trunc_len=100).resolve(256).sliding_window == 64  # S = l/4 whatever K
    with pytest.raises(ValueError, match="training length"):
        KeyTokenRule().resolve(None)
    with pytest.raises(ValueError, match="beta"):
        KeyTokenRule(beta=-2).resolve(256)
    with pytest.raises(ValueError, match=">= 1"):
        KeyTokenRule(sliding_window=0).resolve(256)


def _eval_lm(data_bin, ckpt, *extra, check=True):
    args = [sys.executable, "-m", "fairseq_cli.eval_lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"),
            "--task", "lex_language_modeling", "--path", str(ckpt), "--tokens-per-sample", str(TRAIN_LEN),
            "--batch-size", "8", "--num-workers", "0", *map(str, extra)]
    if check:
        return run_cli(args)
    import subprocess

    return subprocess.run(args, capture_output=True, text=True, cwd=REPO)


def test_eval_lm_longppl_column(data_bin, trained, tmp_path):
    """One evaluator pass on samples of the longest length, the key tokens the library finds on the same stream;
    the same key tokens for every window and length, and through --key-token-model the same values."""
    from lex_plugin.analysis.report import split_stream
    from lex_plugin.hub_interface import from_pretrained

    ckpt, _ = trained
    out = tmp_path / "report.json"
    rule = ["--longppl", "--longppl-alpha", ALPHA, "--longppl-beta", BETA]  # the suite's 30-update model: low bars
    proc = _eval_lm(data_bin, ckpt, "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-windows", "full,bca",
                    "--eval-tokens", 2048, *rule, "--report-json", out, "--length-report-only")
    report = json.loads(out.read_text())
    info = report["longppl"]
    assert info["length"] == 4 * TRAIN_LEN and info["trunc_len"] == 3 * TRAIN_LEN // 4 and info["sliding_window"] == TRAIN_LEN // 4
    assert info["evaluator"] == "the evaluated checkpoint" and info["alpha"] == ALPHA and info["beta"] == BETA

    hub = from_pretrained(ckpt.parent, ckpt.name, data_bin)
    stream = split_stream(data_bin, "test", hub.src_dict)[:2048]
    d = hub.src_dict
    key = find_key_tokens(hub.models[0], stream, 4 * TRAIN_LEN, FULL_SPEC, d.eos(), d.pad(),
                          KeyTokenRule(ALPHA, BETA).resolve(TRAIN_LEN))
    assert 0 < info["key_tokens"] == int(key.sum()) < 2048 // 2
    rows = report["results"]
    assert len(rows) == 4 and {r["key_tokens"] for r in rows} == {info["key_tokens"]}
    full_long, = evaluate_lengths(hub.models[0], stream, [4 * TRAIN_LEN], FULL_SPEC, d.eos(), d.pad(), key_tokens=key,
                                  progress=False)
    assert rows[1]["attention"]["mode"] == "full" and rows[1]["longppl"] == pytest.approx(full_long.longppl, rel=1e-5)
    assert "key tokens | LongPPL" in proc.stdout
    assert "Loss (base 2)" not in proc.stdout + proc.stderr  # --length-report-only: fairseq's pass skipped
    for window in ("full", "bca(32)"):  # a progress bar per window and length, its last line in a log file too
        assert re.search(rf"{re.escape(window)} L={4 * TRAIN_LEN}: 100%", proc.stderr), proc.stderr[-2000:]

    # the same checkpoint as --key-token-model: the same key tokens, the same LongPPL
    again = tmp_path / "again.json"
    _eval_lm(data_bin, ckpt, "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-windows", "bca", "--eval-tokens",
             2048, *rule, "--key-token-model", ckpt, "--report-json", again, "--length-report-only")
    other = json.loads(again.read_text())
    assert other["longppl"]["key_tokens"] == info["key_tokens"] and other["longppl"]["evaluator"] == str(ckpt)
    bca = [r for r in rows if r["attention"]["mode"] == "bca"]
    assert [r["longppl"] for r in other["results"]] == pytest.approx([r["longppl"] for r in bca], rel=1e-6)

    # the report's positions are the mask; --key-tokens scores on them with no evaluator, and refuses another stream
    assert info["positions"] == key.nonzero().flatten().tolist()
    common = tmp_path / "common.json"
    _eval_lm(data_bin, ckpt, "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-windows", "bca", "--eval-tokens",
             2048, "--longppl", "--key-tokens", out, "--report-json", common, "--length-report-only")
    read = json.loads(common.read_text())
    assert read["longppl"]["from"] == str(out) and read["longppl"]["positions"] == info["positions"]
    assert [r["longppl"] for r in read["results"]] == pytest.approx([r["longppl"] for r in bca], rel=1e-6)
    proc = _eval_lm(data_bin, ckpt, "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-tokens", 1024,
                    "--longppl", "--key-tokens", out, "--length-report-only", check=False)
    assert proc.returncode != 0 and "found on another stream" in proc.stderr


@pytest.mark.parametrize("flags, message", [
    ({"longppl_alpha": 1.0}, "add --longppl"),
    ({"key_token_model": "x.pt"}, "add --longppl"),
    ({"longppl": True, "eval_lengths": None}, "give --eval-lengths"),
    ({"key_tokens": "r.json"}, "add --longppl"),
    ({"longppl": True, "key_tokens": "r.json", "key_token_model": "x.pt"}, "drop --key-token-model"),
    ({"longppl": True, "key_tokens": "r.json", "longppl_alpha": 1.0}, "drop --key-token-model"),
])
def test_longppl_flags_refused_without_their_owner(flags, message):
    from argparse import Namespace

    from lex_plugin.tasks.lex_language_modeling import _key_token_rule

    args = Namespace(**{"longppl": False, "key_token_model": None, "key_tokens": None, "eval_lengths": "64", **{f"longppl_{n}": None for n in
                        ("alpha", "beta", "trunc_len", "sliding_window")}, **flags})
    with pytest.raises(ValueError, match=message):
        _key_token_rule(args, bool(args.eval_lengths))


def test_length_report_only_needs_eval_lengths(data_bin, trained):
    proc = _eval_lm(data_bin, trained[0], "--length-report-only", check=False)
    assert proc.returncode != 0 and "give --eval-lengths" in proc.stderr


def test_lex_score_longppl_on_a_document(data_bin, trained, pg_slice, tmp_path):
    """``lex score --longppl``: the key tokens of the whole document by the library's rule, LongPPL the score's
    loss over them; the same key tokens under BCA, a LongPPL of its own."""
    from lex_plugin.evaluation.documents import encode_document
    from lex_plugin.evaluation.length_eval import document_nll
    from lex_plugin.evaluation.longppl import document_key_tokens
    from lex_plugin.hub_interface import from_pretrained

    ckpt, _ = trained
    book = sorted((pg_slice / "test").glob("*.txt"))[0]
    doc = tmp_path / "doc.txt"
    doc.write_text(book.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    rule = ["--longppl", "--longppl-alpha", ALPHA, "--longppl-beta", BETA]
    reports = {}
    for name, window in (("full", []), ("bca", ["--bca"])):
        out = tmp_path / f"{name}.json"
        proc = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), str(doc), "--path", str(ckpt), *map(str, rule), *window, "--json", str(out)])
        assert "key tokens | LongPPL" in proc.stdout
        reports[name] = json.loads(out.read_text())
    hub = from_pretrained(ckpt.parent, ckpt.name, data_bin)
    tokens = encode_document(hub, doc.read_text(encoding="utf-8"))
    d = hub.src_dict
    key = document_key_tokens(hub.models[0], tokens, d.eos(), d.pad(), KeyTokenRule(ALPHA, BETA).resolve(TRAIN_LEN))
    nll = document_nll(hub.models[0], tokens, FULL_SPEC, d.eos())
    full, bca = reports["full"]["documents"][0], reports["bca"]["documents"][0]
    assert full["tokens"] == tokens.numel() > 4 * TRAIN_LEN
    assert 0 < full["key_tokens"] == bca["key_tokens"] == int(key.sum())
    assert full["longppl"] == pytest.approx(math.exp(float(nll[key].mean())), rel=1e-6)
    assert bca["longppl"] != pytest.approx(full["longppl"], rel=1e-6)
    assert reports["bca"]["longppl"]["trunc_len"] == 3 * TRAIN_LEN // 4


def test_crosscheck_with_the_authors_package(data_bin, trained, pg_slice, tmp_path):
    """scripts/crosscheck_longppl.py: the longppl package on the Hugging Face export finds the same key tokens and
    the same LongPPL (1e-4) as lex score on one document."""
    pytest.importorskip("longppl")
    book = sorted((pg_slice / "test").glob("*.txt"))[0]
    doc = tmp_path / "doc.txt"
    doc.write_text(book.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    proc = run_cli([sys.executable, str(REPO / "scripts" / "crosscheck_longppl.py"), "--path", str(trained[0]), "--data",
                    str(data_bin), str(doc), "--alpha", str(ALPHA), "--beta", str(BETA)])
    assert "same key tokens: True; LongPPL within 1e-4: True" in proc.stdout
    counts = re.findall(r"\| (?:lex score --longppl|longppl package \(compute_longppl\)) \| ([\d,]+) \|", proc.stdout)
    assert len(counts) == 2 and counts[0] == counts[1] and int(counts[0].replace(",", "")) > 0


def test_read_key_tokens_refuses_another_stream_or_length(tmp_path):
    """A key-token report is read back as the mask it was written from, and only for its stream and sample length."""
    from lex_plugin.evaluation.longppl import key_token_entry, read_key_tokens

    stream = torch.arange(100) % 37
    key = torch.zeros(100, dtype=torch.bool)
    key[[3, 50, 99]] = True
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"longppl": key_token_entry(key, stream, "ev", 64, KeyTokenRule(0.5, 8.0).resolve(32))}))
    mask, entry = read_key_tokens(path, stream, 64)
    assert torch.equal(mask, key) and entry["key_tokens"] == 3 and entry["trunc_len"] == 24 and entry["from"] == str(path)
    with pytest.raises(ValueError, match="another stream"):
        read_key_tokens(path, stream.flip(0), 64)
    with pytest.raises(ValueError, match="samples of 64 tokens"):
        read_key_tokens(path, stream, 128)
    path.write_text(json.dumps({"longppl": {"key_tokens": 3}}))
    with pytest.raises(ValueError, match="no LongPPL key-token positions"):
        read_key_tokens(path, stream, 64)

"""Attention sinks (StreamingLLM) and Λ-shaped attention (LM-Infinite) against naive float64 attention
with the method's own mask and virtual distances; token by token == parallel with an exact cache size."""

import math

import pytest
import torch

from conftest import build_lex_model, random_tokens, run_attention, window_mask
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow
from lex_plugin.modules.attention.window import window_from_options
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.biases import ALiBi, alibi_slopes

L_TRAIN = 32


def distances(window: AttentionWindow, length: int):
    """(L, L) int64 distance each query sees each visible key at, written from the papers: keys inside the
    window at p - m; sink j outside it at p - j - max(0, f(p) - k) (StreamingLLM: the sinks sit right before
    the window's first key f(p)) or min(p - j, L_local) (LM-Infinite); and the (L, L) visibility."""
    dist = torch.zeros(length, length, dtype=torch.long)
    visible = torch.zeros(length, length, dtype=torch.bool)
    for p in range(length):
        f = window.first_key(p)
        for m in range(length):
            if f <= m <= p:
                dist[p, m], visible[p, m] = p - m, True
            elif m < window.sinks and m < f:
                dist[p, m] = min(p - m, window.stride) if window.mode == "lm_infinite" else p - m - max(0, f - window.sinks)
                visible[p, m] = True
    return dist, visible


def naive(q, k, v, dist, visible, scheme):
    """float64 attention, logits written out per (query, key) from their distance."""
    q, k, v = q.double(), k.double(), v.double()
    d = q.size(-1)
    if isinstance(scheme, XPos):
        i = torch.arange(d // 2, dtype=torch.float64)
        theta = 10000.0 ** (-2 * i / d)
        zeta = (2 * i / d + 0.4) / 1.4
        qz = torch.complex(q[..., 0::2], q[..., 1::2])
        kz = torch.complex(k[..., 0::2], k[..., 1::2])
        phase = torch.exp(1j * dist[..., None].double() * theta) * zeta ** (dist[..., None].double() / 512)  # (L, L, d/2)
        logits = (qz[..., :, None, :] * kz[..., None, :, :].conj() * phase).real.sum(-1)
    else:
        logits = q @ k.transpose(-1, -2)
    logits = logits / math.sqrt(d)
    if isinstance(scheme, ALiBi):
        logits = logits - torch.tensor(alibi_slopes(q.size(1)), dtype=torch.float64)[:, None, None] * dist.double()
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v


WINDOWS = [AttentionWindow.bca(L_TRAIN).with_sinks(4), AttentionWindow.sliding(L_TRAIN // 2).with_sinks(3),
           AttentionWindow.lm_infinite(3, L_TRAIN // 2)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
@pytest.mark.parametrize("group_tokens", [8192, L_TRAIN], ids=["one-group", "small-groups"])
def test_sinks_match_naive_attention_with_virtual_distances(window, scheme, group_tokens):
    torch.manual_seed(0)
    B, H, D, L = 2, 4, 16, 5 * L_TRAIN + 3
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    pos = XPos(D) if scheme == "xpos" else ALiBi(H)
    got = run_attention(q, k, v, window, pos, group_tokens=group_tokens)
    dist, visible = distances(window, L)
    assert torch.equal(visible, window_mask(window, L))
    assert (got.double() - naive(q, k, v, dist, visible, pos)).abs().max() < 2e-5
    if window.mode == "lm_infinite":
        assert int(dist[visible].max()) == window.stride  # no distance past L_local
    else:
        assert int(dist[visible].max()) <= window.span - 1  # nothing farther than the window + sinks


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("pos_emb", ["xpos", "rope", "alibi", "none"])
def test_token_by_token_equals_parallel_with_an_exact_cache_size(window, pos_emb):
    model = build_lex_model(pos_emb=pos_emb, tokens_per_sample=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 1, 4 * L_TRAIN + 7)
    with torch.no_grad():
        parallel, _ = model(tokens, spec=AttentionSpec(window))
        state, steps = {}, []
        layer = model.decoder.layers[0].self_attn
        for t in range(tokens.size(1)):
            steps.append(model(tokens[:, : t + 1], incremental_state=state, spec=AttentionSpec(window))[0])
            first = window.first_key(t + 1)  # what the next query needs: its window from first_key, and the
            assert layer.cached_keys(state) == (t + 1 - first) + min(window.sinks, t + 1)  # k sinks kept un-rotated
    assert torch.allclose(torch.cat(steps, dim=1), parallel, atol=2e-4)


def test_blockwise_prefill_equals_parallel():
    from lex_plugin.evaluation.length_eval import blockwise_forward

    window = AttentionWindow.bca(L_TRAIN).with_sinks(4)
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 2, 6 * L_TRAIN)
    with torch.no_grad():
        parallel, _ = model(tokens, spec=AttentionSpec(window))
        chunks = torch.cat([out for _, _, out in blockwise_forward(model, tokens, L_TRAIN // 2, spec=AttentionSpec(window))], dim=1)
    assert torch.allclose(chunks, parallel, atol=2e-4)


def test_sink_and_lm_infinite_options_are_explained():
    with pytest.raises(ValueError, match="attach to a bounded window"):
        window_from_options("full", sink_tokens=4, model_training_length=64)
    with pytest.raises(ValueError, match="exceed the BCA block"):
        window_from_options("bca", sink_tokens=40, model_training_length=64)
    with pytest.raises(ValueError, match="exceed the sliding width"):
        window_from_options("sliding", "16", sink_tokens=17, model_training_length=64)
    with pytest.raises(ValueError, match="--n-global must be >= 1"):
        window_from_options("lm_infinite", n_global=0, model_training_length=64)
    with pytest.raises(ValueError, match="exceed LM-Infinite's --l-local"):
        window_from_options("lm_infinite", n_global=100, l_local=64)
    with pytest.raises(ValueError, match="choose one"):
        window_from_options("lm_infinite", sink_tokens=2, model_training_length=64)
    assert str(window_from_options("lm_infinite", model_training_length=64)) == "lm_infinite(10,64)"
    assert str(window_from_options("bca", sink_tokens=4, model_training_length=64)) == "bca(32)+sinks(4)"


def test_eval_lm_length_table_with_sinks_and_lm_infinite(data_bin, trained, tmp_path):
    """fairseq-eval-lm --eval-windows full,bca,lm_infinite --sink-tokens 4: rows for bca(32)+sinks(4) and
    lm_infinite(10,64); at L = l every window covers the sample, so all three rows are the same attention."""
    import json

    from conftest import REPO, TRAIN_LEN, run_cli

    ckpt, _ = trained
    run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--path", str(ckpt),
             "--task", "lex_language_modeling", "--gen-subset", "valid", "--tokens-per-sample", str(TRAIN_LEN),
             "--batch-size", "8", "--num-workers", "0", "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}",
             "--eval-windows", "full,bca,lm_infinite", "--sink-tokens", "4", "--eval-tokens", "3000",
             "--report-json", str(tmp_path / "r.json")])
    rows = {(r["window"], r["length"]): r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    sinks, lam = f"bca({TRAIN_LEN // 2})+sinks(4)", f"lm_infinite(10,{TRAIN_LEN})"
    assert set(rows) == {(w, L) for w in ("full", sinks, lam) for L in (TRAIN_LEN, 4 * TRAIN_LEN)}
    assert rows[(sinks, TRAIN_LEN)]["loss"] == pytest.approx(rows[("full", TRAIN_LEN)]["loss"], abs=1e-5)
    assert rows[(lam, TRAIN_LEN)]["loss"] == pytest.approx(rows[("full", TRAIN_LEN)]["loss"], abs=1e-5)
    assert all(r["tokens"] == 3000 and math.isfinite(r["loss"]) for r in rows.values())


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
@pytest.mark.parametrize("padded", [2, L_TRAIN + 8], ids=["sinks-padded", "past-the-first-window"])
def test_sinks_with_padded_keys_match_naive_attention(window, scheme, padded):
    """Left-padded rows: padded keys are hidden from the window's keys and from the sinks alike (a padded
    query still sees itself), under the virtual distances of each method; with the padding reaching past the
    first window (batched windows then hold padded keys), and the real rows unchanged when the padded keys and
    values are replaced."""
    torch.manual_seed(1)
    B, H, D, L = 2, 4, 16, 3 * L_TRAIN + 5
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, :padded] = True
    pos = XPos(D) if scheme == "xpos" else ALiBi(H)
    got = run_attention(q, k, v, window, pos, key_padding_mask=pad)
    dist, visible = distances(window, L)
    allowed = (visible[None, None] & ~pad[:, None, None, :]) | torch.eye(L, dtype=torch.bool)
    expected = naive(q, k, v, dist, allowed, pos)
    real = ~pad
    assert (got.double() - expected).abs().permute(0, 2, 1, 3)[real].max() < 2e-5
    k2, v2 = k.clone(), v.clone()
    k2[1, :, :padded] = 100 * torch.randn(H, padded, D)
    v2[1, :, :padded] = 100 * torch.randn(H, padded, D)
    again = run_attention(q, k2, v2, window, pos, key_padding_mask=pad)
    assert (again - got).abs().permute(0, 2, 1, 3)[real].max() < 1e-5


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sinks_and_lambda_keep_the_input_dtype(window, dtype):
    torch.manual_seed(2)
    B, H, D, L = 1, 4, 16, 3 * L_TRAIN
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    ref = run_attention(q, k, v, window, XPos(D))
    low = run_attention(q.to(dtype), k.to(dtype), v.to(dtype), window, XPos(D))
    assert low.dtype == dtype and torch.isfinite(low).all()
    assert (low.float() - ref).abs().max() < (0.02 if dtype == torch.float16 else 0.06)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_left_padded_rows_with_sinks_are_refused_in_parallel_and_through_the_cache(window):
    """A left-padded row under sinks would take its pads as the sink positions: its real tokens would be scored unlike
    the same row alone, so the batch is refused, by the parallel forward and by the first cached call alike (the
    same row padded on the right, or alone, is scored)."""
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    d = model.decoder.dictionary
    tokens = random_tokens(d, 2, 3 * L_TRAIN, seed=6)
    tokens[1, :3] = d.pad()
    spec = AttentionSpec(window)
    with torch.no_grad():
        with pytest.raises(ValueError, match="left padding shifts each row's positions"):
            model(tokens, spec=spec)
        with pytest.raises(ValueError, match="left padding shifts each row's positions"):
            model(tokens[:, :10], incremental_state={}, spec=spec)
        assert torch.isfinite(model(tokens[1:, 3:], spec=spec)[0]).all()

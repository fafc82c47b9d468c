"""Attention resolution, the expectation curve and the receptive field: hand-computed values, recovery of a
known bias, and the window bounds on real text."""

import json
import math
import sys

import pytest
import torch

from conftest import REPO, build_lex_model, random_tokens, run_cli
from lex_plugin.analysis import (attention_resolution, cumulative_gradient, effective_receptive_field,
                                 expectation_curve, score_by_distance, theoretical_receptive_field)
from lex_plugin.analysis.report import load_model, split_stream
from lex_plugin.modules.positions import POSITION_SCHEMES, alibi_slopes
from lex_plugin.modules.attention import AttentionOptions, AttentionSpec, AttentionWindow

SCHEMES = list(POSITION_SCHEMES)


# ---- R(s), Eq. 4 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "exp_s,expected",
    [
        ([4.0, 2.0, 1.0], (4 * 2 + 2 * 1) / 7**2),  # monotone: sum e_i (e_i - e_i+1) / (sum e)^2
        ([3.0] * 6, 0.0),  # flat: no resolution
        ([1.0, 3.0, 1.0, 3.0], (1 * -2 + 3 * 2 + 1 * -2) / 8**2),  # oscillating
        ([1.0, 1e-30], 1.0),  # everything on distance 0
    ],
    ids=["monotone", "flat", "oscillating", "spike"],
)
def test_resolution_equals_hand_computed_values(exp_s, expected):
    s = [math.log(v) for v in exp_s]
    assert attention_resolution(s) == pytest.approx(expected, abs=1e-12)
    assert attention_resolution([v + 17.0 for v in s]) == pytest.approx(expected, abs=1e-12)  # shift-invariant


def test_resolution_rejects_what_it_cannot_measure():
    with pytest.raises(ValueError, match=">= 2 distances"):
        attention_resolution([1.0])
    with pytest.raises(ValueError, match="finite"):
        attention_resolution([0.0, float("nan")])


def test_expectation_curve_is_eq10_and_xpos_resolves_better_than_rope():
    g = expectation_curve(64, 4096, rope=False)
    r = expectation_curve(64, 4096, rope=True)
    i = torch.arange(32, dtype=torch.float64)
    n = 1000.0
    by_hand = sum(math.cos(n * 10000 ** (-2 * k / 64)) * ((2 * k / 64 + 0.4) / 1.4) ** (n / 512) for k in i.tolist())
    assert g[1000].item() == pytest.approx(by_hand, rel=1e-12)
    assert g[0] == r[0] == 32
    assert attention_resolution(g) > attention_resolution(r)  # LeX section 3.1: xPos raises R


# ---- the estimator of s[n] ------------------------------------------------------------------------------

def zero_queries(model):
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.q_proj.bias.zero_()
    return model


@pytest.mark.parametrize("window", [AttentionWindow.full(), AttentionWindow.bca(32), AttentionWindow.sliding(24)], ids=str)
def test_estimator_recovers_a_known_bias(window):
    """With q = 0 the logits are the ALiBi bias alone: the estimate must be -mean_h(m_h) n exactly, at every
    visible distance (BCA: < l; sliding: < W), in every layer."""
    model = zero_queries(build_lex_model(tokens_per_sample=32, pos_emb="alibi"))
    tokens = random_tokens(model.decoder.dictionary, 3, 150)
    sums, counts = score_by_distance(model, tokens, AttentionSpec(window))
    reach = {"full": 150, "bca": 32, "sliding": 24}[window.mode]
    assert (counts[:reach] > 0).all() and (counts[reach:] == 0).all()
    s = sums[:, :, :reach] / counts[:reach]  # (layers, H, D)
    slopes = torch.tensor(alibi_slopes(4), dtype=torch.float64)
    expected = -slopes[:, None] * torch.arange(reach, dtype=torch.float64)
    assert torch.allclose(s, expected.expand_as(s), atol=1e-4)
    # counts: 3 texts x the number of visible query positions at each distance
    mask = torch.ones(150, 150, dtype=torch.bool).tril() & (torch.arange(150)[None, :] >= window.first_key(torch.arange(150))[:, None])
    by_distance = torch.bincount((torch.arange(150)[:, None] - torch.arange(150)[None, :])[mask], minlength=150)
    assert torch.equal(counts, 3 * by_distance)


def test_estimator_recovers_a_known_bias_with_content_noise():
    """Random content logits average out: KERPLE's -r1 log(1 + r2 n) is recovered up to a constant."""
    model = build_lex_model(tokens_per_sample=32, pos_emb="kerple_log", decoder_layers=1)
    with torch.no_grad():
        bias = model.decoder.positions[0]
        bias.r1.fill_(2.0)
        bias.r2.fill_(0.5)
        attn = model.decoder.layers[0].self_attn
        attn.q_proj.weight.mul_(0.05)  # small content term
    tokens = random_tokens(model.decoder.dictionary, 8, 200, seed=3)
    sums, counts = score_by_distance(model, tokens, AttentionSpec())
    s = (sums[0].mean(0) / counts)[:64]
    expected = -2.0 * torch.log1p(0.5 * torch.arange(64, dtype=torch.float64))
    assert torch.allclose(s - s[0], expected - expected[0], atol=0.05)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_analysis_runs_for_every_scheme(scheme):
    model = build_lex_model(tokens_per_sample=32, pos_emb=scheme, decoder_layers=2)
    spec = AttentionSpec(AttentionWindow.bca(32))
    tokens = random_tokens(model.decoder.dictionary, 2, 32 if scheme == "learned" else 80)
    sums, counts = score_by_distance(model, tokens, spec)
    assert torch.isfinite(sums).all() and counts.sum() > 0
    curve = cumulative_gradient(model, tokens[0], spec)
    assert curve["c"][-1].item() == pytest.approx(1.0) and (curve["s"] >= 0).all()


# ---- receptive field on real text -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_model(trained, data_bin):
    ckpt, _ = trained
    model, dictionary, _ = load_model(ckpt, data_bin, AttentionOptions())
    return model, split_stream(data_bin, "test", dictionary)


@pytest.mark.parametrize("window", [AttentionWindow.sliding(16), AttentionWindow.bca(64)], ids=str)
def test_erf_is_within_the_window_bound_on_real_text(real_model, window):
    """Chi et al.: a model of R layers whose queries reach W - 1 back (BCA: l - 1) has a receptive field of at
    most R (W - 1): the gradient is exactly zero farther away, so c reaches 1 there and ERF <= the bound."""
    model, stream = real_model
    bound = theoretical_receptive_field(window, model.decoder.num_layers, 400)
    assert bound == (4 * 15 if window.mode == "sliding" else 4 * 63)
    for i in range(2):
        curve = cumulative_gradient(model, stream[i * 401:(i + 1) * 401], AttentionSpec(window))
        assert (curve["s"][bound + 1:] == 0).all() and (curve["s"][: bound + 1] > 0).any()
        erf = effective_receptive_field(curve["c"])
        assert erf <= bound <= window.stride * model.decoder.num_layers * (2 if window.mode == "bca" else 1)
    # full attention reaches past that bound on the same text
    full = cumulative_gradient(model, stream[:401], AttentionSpec())
    assert (full["s"][300:] > 0).any()


def test_analysis_commands_end_to_end(trained, data_bin, tmp_path):
    ckpt, _ = trained
    lex = [sys.executable, "-m", "lex_plugin.cli"]
    res = run_cli([*lex, "resolution", "--path", str(ckpt), str(data_bin), "--lengths", "64,128", "--texts", "4", "--bca",
                   "--json", str(tmp_path / "res.json"), "--plot", str(tmp_path / "res.png")])
    assert "| 128 | bca(32) | 4 |" in res.stdout
    report = json.loads((tmp_path / "res.json").read_text())
    assert set(report["lengths"]) == {"64", "128"} and len(report["lengths"]["128"]["R_layers"]) == 4
    assert len(report["lengths"]["128"]["s"][0]) == 64  # BCA: distances 0 .. l - 1 only
    rf = run_cli([*lex, "receptive-field", "--path", str(ckpt), str(data_bin), "--length", "256", "--segments", "2",
                  "--sliding-window", "16", "--json", str(tmp_path / "rf.json"), "--plot", str(tmp_path / "rf.png")])
    assert "| sliding(16) | 256 | 2 |" in rf.stdout
    assert json.loads((tmp_path / "rf.json").read_text())["erf"] <= 60
    dc = run_cli([*lex, "decay-curve", "--head-dim", "32", "--max-distance", "2048", "--plot", str(tmp_path / "dc.png")])
    assert "| xpos |" in dc.stdout and "| rope |" in dc.stdout
    for png in ("res.png", "rf.png", "dc.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import subprocess

    bad = subprocess.run([*lex, "resolution", "--path", str(ckpt), str(data_bin), "--lengths", "64,x"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "--lengths takes positive integers" in bad.stderr


# ---- the attention on the first token ---------------------------------------------------------------------

def test_first_token_mass_of_uniform_attention_is_the_harmonic_mean():
    """With q = 0 every logit is 0 (RoPE: no bias): query n attends its n + 1 keys alike, so the mass on key 0 is
    1 / (n + 1), and its mean over n = 1 .. L - 1 the same in every layer and head."""
    from lex_plugin.analysis.first_token import first_token_mass

    model = zero_queries(build_lex_model(pos_emb="rope", seed=3).eval())
    L = 200
    mass = first_token_mass(model, random_tokens(model.decoder.dictionary, 3, L, seed=1))
    expected = sum(1.0 / (n + 1) for n in range(1, L)) / (L - 1)
    assert mass.shape == (len(model.decoder.layers), model.decoder.layers[0].self_attn.num_heads)
    assert (mass - expected).abs().max() < 1e-6


def _first_token_mass_and_float64(model, layer: int, length: int):
    """``first_token_mass`` of ``model`` on 2 random texts of ``length`` tokens, and layer ``layer``'s mass in float64
    from its own input (captured by a hook) for a NoPE layer under full attention: queries and keys in float64, causal
    softmax, the probability on key 0 averaged over queries 1 .. L - 1 and texts, per head."""
    from conftest import heads64
    from lex_plugin.analysis.first_token import first_token_mass

    attn = model.decoder.layers[layer].self_attn
    seen = []
    handle = attn.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    mass = first_token_mass(model, random_tokens(model.decoder.dictionary, 2, length, seed=2))
    handle.remove()
    x = torch.cat(seen, dim=1)
    q, k = heads64(x, attn.q_proj, attn.num_heads), heads64(x, attn.k_proj, attn.num_heads)
    T = x.size(1)
    logits = ((q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(),
                                                                           float("-inf"))
    return mass, torch.softmax(logits, -1)[:, :, 1:, 0].mean(dim=(0, 2))


def test_first_token_mass_equals_float64_attention_of_the_first_layer():
    mass, expected = _first_token_mass_and_float64(build_lex_model(pos_emb="none", seed=4).eval(), 0, 150)
    assert (mass[0] - expected).abs().max() < 1e-6


def test_first_token_mass_of_a_patterns_global_layer_equals_float64_and_its_local_layers_are_left_out():
    """RNoPE-SWA's layout: the sliding layers are NaN (not measured); the global NoPE layer's mass equals its float64
    attention."""
    model = build_lex_model(pos_emb="rope", layer_pattern="rope/sliding:8*3,none/full", seed=5).eval()
    mass, expected = _first_token_mass_and_float64(model, 3, 120)
    assert mass[:3].isnan().all() and not mass[3].isnan().any()
    assert (mass[3] - expected).abs().max() < 1e-6
    from lex_plugin.analysis.report import first_token_report, format_first_token

    stream = random_tokens(model.decoder.dictionary, 1, 480, seed=3)[0]
    report = first_token_report(model, stream, 120, texts=4, progress=False)
    assert [r["mean"] is None for r in report["layers"]] == [True, True, True, False]
    assert report["mean"] == report["layers"][3]["mean"]  # the mean over the layers measured: the global one
    assert "| 0 | - | - | - |" in format_first_token(report)


@pytest.mark.parametrize("overrides, match", [({"learned_sinks": True}, "learned sink"), ({"sink_token": True}, "sink-token"),
                                              ({"pos_emb": "rope", "layer_pattern": "rope/sliding:8*4"}, "no global layer"),
                                              ])
def test_first_token_mass_refuses_what_it_would_misread(overrides, match):
    from lex_plugin.analysis.first_token import first_token_mass

    model = build_lex_model(**overrides).eval()
    with pytest.raises(ValueError, match=match):
        first_token_mass(model, random_tokens(model.decoder.dictionary, 1, 16, seed=0))


def test_resolution_refuses_differential_attention():
    """Two maps per head would be averaged into one curve the layer never uses."""
    from lex_plugin.analysis.resolution import score_by_distance

    model = build_lex_model(differential_attention=True).eval()
    with pytest.raises(ValueError, match="several maps over the same keys"):
        score_by_distance(model, random_tokens(model.decoder.dictionary, 1, 16, seed=0), AttentionSpec())


@pytest.mark.parametrize("topk", [None, 2])
def test_first_token_mass_of_landmark_layers_is_the_papers_attweight_in_float64(topk, monkeypatch):
    """Landmark tokens (blocks of 4, RoPE): each layer's mass on token 0 equals AttWeight_i0 of section 3.1 (the
    grouped softmax written out query by query in float64, test_landmark.paper_weights) from the layer's own input,
    averaged over the tokens' queries 1 .. L - 1 (the landmarks' queries left out) and texts."""
    from test_landmark import paper_weights
    from test_xpos import rotated_qkv64
    from lex_plugin.analysis.first_token import first_token_mass
    from lex_plugin.modules.positions import XPos

    model = build_lex_model(pos_emb="rope", landmark_block_size=4, landmark_topk=topk, seed=6).eval()
    seen = {i: [] for i in range(len(model.decoder.layers))}
    handles = [layer.self_attn.register_forward_pre_hook(lambda module, args, i=i: seen[i].append(args[0].detach()))
               for i, layer in enumerate(model.decoder.layers)]
    length = 57  # 14 blocks and one token: landmarks at 4, 9, ... 69
    mass = first_token_mass(model, random_tokens(model.decoder.dictionary, 2, length, seed=2))
    for h in handles:
        h.remove()
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn
        x = torch.cat(seen[i], dim=1)
        T = x.size(1)
        assert T == length + length // 4
        q, k, _ = rotated_qkv64(attn, x, XPos(attn.head_dim, use_scale=False))
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)
        on_first = paper_weights(logits, 4, topk)[..., 0]  # (B, H, T)
        s = torch.arange(T)
        token = (s % 5 != 4) & (s > 0)
        expected = on_first[..., token].mean(dim=(0, 2))
        assert (mass[i] - expected).abs().max() < 1e-6, i
    # in blocks of 3 tokens: the first call's keys hold no landmark yet (every query in block 0)
    from lex_plugin.analysis import first_token as module

    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 2 * 4 * length * 3)
    chunked = first_token_mass(model, random_tokens(model.decoder.dictionary, 2, length, seed=2))
    assert (chunked - mass).abs().max() < 1e-6


def test_first_token_share_of_differential_attention_is_the_net_weight_over_one_minus_lambda_in_float64(monkeypatch):
    """Differential attention (RoPE): each layer's share on token 0 equals (p1 - lambda p2)[0] / (1 - lambda) from the
    layer's own input in float64, the maps' queries and keys being the even and the odd pairs of each head (d' = d / 2),
    averaged over queries 1 .. L - 1 and texts; a chunked forward gives the same."""
    from test_xpos import rotated_qkv64
    from lex_plugin.analysis import first_token
    from lex_plugin.modules.designs.differential_attention import diff_lambda
    from lex_plugin.modules.positions import XPos

    model = build_lex_model(pos_emb="rope", differential_attention=True, attention_dropout=0.0, seed=7).eval()
    seen = {i: [] for i in range(len(model.decoder.layers))}
    handles = [layer.self_attn.register_forward_pre_hook(lambda module, args, i=i: seen[i].append(args[0].detach()))
               for i, layer in enumerate(model.decoder.layers)]
    tokens = random_tokens(model.decoder.dictionary, 2, 90, seed=2)
    mass = first_token.first_token_mass(model, tokens)
    for h in handles:
        h.remove()
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn
        x = torch.cat(seen[i], dim=1)
        q, k, _ = rotated_qkv64(attn, x, XPos(attn.head_dim, use_scale=False))
        T, d = x.size(1), attn.head_dim
        first = (torch.arange(d) // 2) % 2 == 0
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        p1, p2 = (torch.softmax((q[..., m] @ k[..., m].transpose(-1, -2) / math.sqrt(d // 2)).masked_fill(~causal, float("-inf")), -1)
                  for m in (first, ~first))
        lam = float(diff_lambda(attn))
        expected = ((p1[..., 1:, 0] - lam * p2[..., 1:, 0]) / (1 - lam)).mean(dim=(0, 2))
        assert (mass[i] - expected).abs().max() < 1e-6, i
    monkeypatch.setattr(first_token, "CHUNK_ELEMENTS", 2 * 4 * 90 * 7)  # 7 queries a block: several calls of each map
    assert (first_token.first_token_mass(model, tokens) - mass).abs().max() < 1e-6

"""The baselines of --pos-emb: each against its formula written here independently, under every attention
window, through the key/value cache, on real text."""

import math

import numpy as np
import pytest
import torch
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
from torchscale.component.relative_position_bias import RelativePositionBias

from conftest import build_lex_model, random_tokens, run_attention, window_mask
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.positions import (
    POSITION_SCHEMES, ALiBi, KerpleLog, KerplePower, LearnedPositions, Sandwich, SinusoidalPositions, SmoothedSandwich,
    T5Bias, XPos, alibi_slopes, scheme_table,
)
from lex_plugin.modules.positions.biases import CACHE_ELEMENTS

SCHEMES = list(POSITION_SCHEMES)  # every registered --pos-emb
BIAS_SCHEMES = [name for name, spec in POSITION_SCHEMES.items() if spec.kind == "bias"]
L_TRAIN = 32


# ---- formulas -------------------------------------------------------------------------------------------

def test_alibi_slopes_are_press_et_al():
    """Press et al. (2022) section 3: 8 heads 1/2 .. 1/256; 16 heads start at 2^-0.5; 12 heads (not a power
    of two): the 8-head slopes, then the odd-exponent slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 of 16 heads."""
    assert alibi_slopes(8) == pytest.approx([2.0**-e for e in range(1, 9)], rel=1e-12)
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-e / 2) for e in range(1, 17)], rel=1e-12)
    assert alibi_slopes(12) == pytest.approx([2.0**-e for e in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5], rel=1e-12)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBi(8).bias(100, 5, 90, 20, "cpu")  # queries 100..104 against keys 90..109
    n = torch.arange(100, 105)[:, None]
    m = torch.arange(90, 110)[None, :]
    slopes = torch.tensor([2.0**-e for e in range(1, 9)])[:, None, None]
    expected = -slopes * (n - m)
    causal = (m <= n).expand(8, -1, -1)
    assert torch.allclose(bias[causal], expected[causal].float(), rtol=0, atol=1e-6)
    # built from the positions asked for, never from a maximum length: exact far past any training length
    far = ALiBi(8).bias(10**6, 1, 10**6 - 3, 4, "cpu")
    assert torch.equal(far[:, 0], -slopes[:, 0] * torch.tensor([3.0, 2, 1, 0]))


def sandwich_numpy_reference(heads: int, seq_len: int, bar_d: int = 128, base: float = 1e4) -> np.ndarray:
    """Chi et al., Appendix E: sinusoidal embeddings of dimension bar_d, their inner products, minus
    bar_d / 2, divided by the compression ratios 8h/H: (H, L, L)."""
    positions = np.arange(seq_len)[..., None]
    i = np.arange(bar_d // 2)
    pos_embs = np.concatenate([np.sin(positions / base ** (2 * i / bar_d)), np.cos(positions / base ** (2 * i / bar_d))], axis=-1)
    sandwich = np.matmul(pos_embs, pos_embs.T) - bar_d / 2
    compression_ratio = np.arange(1, heads + 1) * 8 / heads
    return sandwich[None, ...] / compression_ratio[..., None, None]


@pytest.mark.parametrize("heads,bar_d", [(4, 128), (12, 64)])
def test_sandwich_equals_the_numpy_reference(heads, bar_d):
    L = 300
    ref = sandwich_numpy_reference(heads, L, bar_d)
    got = Sandwich(heads, bar_d).bias(0, L, 0, L, "cpu").double().numpy()
    causal = np.tril(np.ones((L, L), dtype=bool))
    assert np.abs(got - ref)[:, causal].max() < 1e-4
    assert np.all(got[:, causal] <= 1e-6) and np.allclose(np.diagonal(got, axis1=1, axis2=2), 0, atol=1e-6)


def test_sandwich_uses_a_1d_table_at_long_range():
    """Queries far out (n ~ 10^5) against a window of keys: the same values as the reference's formula at
    the distances involved, computed without an L x L x d_bar/2 tensor."""
    s = Sandwich(2, 128)
    got = s.bias(100_000, 4, 100_000 - 60, 64, "cpu")
    d = (torch.arange(100_000, 100_004)[:, None] - torch.arange(100_000 - 60, 100_004)[None, :]).clamp(min=0).double()
    w = 1e4 ** (-2 * torch.arange(64, dtype=torch.float64) / 128)
    dot = torch.cos(d[..., None] * w).sum(-1) - 64
    expected = torch.stack([dot / (8 * h / 2) for h in (1, 2)])
    assert (got.double() - expected).abs().max() < 1e-4


def test_kerple_log_formula_shape_and_monotonicity():
    k = KerpleLog(6)
    with torch.no_grad():
        k.r1.copy_(torch.tensor([0.5, 1.0, 2.0, 0.001, 1.0, 3.0]))
        k.r2.copy_(torch.tensor([1.0, 0.1, 2.0, 1.0, -1.0, 0.5]))
    bias = k.bias(50, 10, 0, 60, "cpu")
    assert bias.shape == (6, 10, 60) and bias.dtype == torch.float32
    r1 = torch.tensor([0.5, 1.0, 2.0, 0.01, 1.0, 3.0])  # clamped at 1e-2: r1, r2 > 0
    r2 = torch.tensor([1.0, 0.1, 2.0, 1.0, 0.01, 0.5])
    dist = torch.arange(0, 60).double()
    expected = -r1[:, None].double() * torch.log(1 + r2[:, None].double() * dist)
    row = bias[:, 9, :].flip(-1)  # query 59 against keys 59, 58, ..., 0: distances 0 .. 59
    assert (row.double() - expected).abs().max() < 1e-5
    assert (row[:, 0] == 0).all() and (row[:, 1:] < row[:, :-1]).all()  # 0 at distance 0, strictly falling
    bias.sum().backward()
    assert k.r1.grad is not None and k.r2.grad is not None  # learnable


def test_t5_bias_buckets_match_torchscale_and_are_monotone():
    """The package's own T5 bias (no TorchScale at run time) against TorchScale's RelativePositionBias holding the
    same table: equal biases on every causal pair, equal buckets at every distance to 10^5, the same initialisation
    from the same seed."""
    torch.manual_seed(3)
    t5 = T5Bias(4, num_buckets=32, max_distance=128)
    torch.manual_seed(3)
    ref_module = RelativePositionBias(bidirectional=False, num_buckets=32, max_distance=128, n_heads=4)
    assert torch.equal(t5.t5.relative_attention_bias.weight, ref_module.relative_attention_bias.weight)
    L = 400
    ours = t5.bias(0, L, 0, L, "cpu")
    ref = ref_module.compute_bias(L, L)[0]  # TorchScale's own (H, L, L) computation
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool)).expand(4, -1, -1)
    assert torch.equal(ours[causal], ref[causal])
    far = torch.arange(0, 100_000)
    assert torch.equal(t5.buckets(far), RelativePositionBias._relative_position_bucket(
        -far, bidirectional=False, num_buckets=32, max_distance=128))
    buckets = t5.buckets(torch.arange(0, 1000))
    assert buckets[:16].tolist() == list(range(16))  # exact buckets for short distances
    assert bool((buckets[1:] >= buckets[:-1]).all())  # monotone in distance
    assert set(buckets[128:].tolist()) == {31}  # everything from max_distance on shares the last bucket
    assert set(t5.state_dict()) == {"t5.relative_attention_bias.weight"}  # TorchScale's name


@pytest.mark.parametrize("activation, subln", [("gelu", False), ("relu", True), ("swish", False)])
def test_feedforward_equals_torchscale(activation, subln):
    """The package's FFN (TorchScale's layout, no TorchScale at run time) against TorchScale's FeedForwardNetwork:
    the same initialisation from the same seed, the same state-dict names, equal outputs in fp32 and bf16."""
    from torchscale.component.feedforward_network import FeedForwardNetwork as Reference

    from lex_plugin.modules.feedforward import FeedForwardNetwork

    torch.manual_seed(7)
    ours = FeedForwardNetwork(32, 80, activation, 0.0, 0.0, 1e-5, subln)
    torch.manual_seed(7)
    ref = Reference(32, 80, activation, 0.0, 0.0, 1e-5, subln)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    x = torch.randn(3, 7, 32)
    assert torch.equal(ours(x), ref(x))
    assert torch.equal(ours.to(torch.bfloat16)(x.bfloat16()), ref.to(torch.bfloat16)(x.bfloat16()))
    with pytest.raises(ValueError, match="activation"):
        FeedForwardNetwork(32, 80, "tanh", 0.0, 0.0, 1e-5)


def test_sinusoidal_rows_match_fairseq():
    """Row n of fairseq's table is position n (its row padding_idx zeroed; its models start counting at
    padding_idx + 1, ours at 0). fairseq forms the angles in fp32, we in float64: equal to fp32 rounding of
    n * w, so up to ~n * 6e-8 apart."""
    C = 64
    fs = SinusoidalPositionalEmbedding.get_embedding(3000, C, padding_idx=1)
    ours = SinusoidalPositions(C).embed(2, 2998, "cpu")
    assert (ours - fs[2:3000]).abs().max() < 3e-4
    assert (ours[:100] - fs[2:102]).abs().max() < 1e-5
    odd = SinusoidalPositions(7).embed(5, 3, "cpu")
    assert odd.shape == (3, 7) and (odd[:, -1] == 0).all()


def test_learned_positions_past_the_table_are_a_clear_error():
    table = LearnedPositions(32, 16)
    assert table.embed(30, 2, "cpu").shape == (2, 16)
    with pytest.raises(ValueError, match="table of 32 positions.*--tokens-per-sample <= 32"):
        table.embed(30, 3, "cpu")
    model = build_lex_model(tokens_per_sample=32, pos_emb="learned")
    assert model.max_positions() == 32
    with torch.no_grad(), pytest.raises(ValueError, match="table of 32 positions"):
        model(random_tokens(model.decoder.dictionary, 1, 33))
    assert build_lex_model(tokens_per_sample=32, pos_emb="learned", max_target_positions=100).max_positions() == 100


# ---- attention with a bias against naive attention ------------------------------------------------------

def naive_biased_attention(q, k, v, bias, allowed):
    """float64 softmax(q k^T / sqrt(d) + bias, masked) v with the bias of global positions."""
    q, k, v = q.double(), k.double(), v.double()
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + bias.double()
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def make_bias(kind: str, heads: int):
    torch.manual_seed(3)
    if kind == "alibi":
        return ALiBi(heads)
    if kind == "sandwich":
        return Sandwich(heads, 32)
    if kind == "smoothed_sandwich":
        return SmoothedSandwich(heads)
    if kind == "kerple_log":
        return KerpleLog(heads)
    if kind == "kerple_power":
        return KerplePower(heads)
    assert kind == "t5", kind
    t5 = T5Bias(heads, 16, 40)
    with torch.no_grad():
        t5.t5.relative_attention_bias.weight.normal_()
    return t5


WINDOWS = [AttentionWindow.full(), AttentionWindow.bca(L_TRAIN), AttentionWindow.sliding(L_TRAIN)]


@pytest.mark.parametrize("kind", BIAS_SCHEMES)
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("padding", ["none", "left"])
def test_biased_windows_match_naive_attention(kind, window, padding):
    """Window-local biases in every window, and the chunked full-causal path (forced to several chunks
    here), equal one global (H, L, L) bias with an explicit mask."""
    B, H, D, L = 3, 2, 16, 3 * L_TRAIN + 5
    torch.manual_seed(7)
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    pad = None
    if padding == "left":
        pad = torch.zeros(B, L, dtype=torch.bool)
        pad[1, :10] = True
    bias = make_bias(kind, H)
    with torch.no_grad():
        got = run_attention(q, k, v, window, bias, key_padding_mask=pad, bias_elements=3 * 2 * 40 * 100,
                            group_tokens=L_TRAIN)  # a few chunks of ~40 queries, several window groups
        allowed = window_mask(window, L)[None, None]
        if pad is not None:
            allowed = (allowed & ~pad[:, None, None, :]) | torch.eye(L, dtype=torch.bool)
        expected = naive_biased_attention(q, k, v, bias.bias(0, L, 0, L, "cpu"), allowed)
    real = torch.ones(B, L, dtype=torch.bool) if pad is None else ~pad
    assert (got.double() - expected).abs().permute(0, 2, 1, 3)[real].max() <= 1e-5


def test_full_attention_bias_is_never_length_squared(monkeypatch):
    """At L = 4096 with ALiBi and full attention, no bias block has more than BIAS_ELEMENTS / (B H) entries
    (so no L x L bias or mask), and BCA asks for one (H, c, 2c) bias whatever L."""
    sizes = []
    bias = ALiBi(4)
    original = ALiBi.bias

    def spy(self, q_start, q_len, k_start, k_len, device):
        sizes.append(q_len * k_len)
        return original(self, q_start, q_len, k_start, k_len, device)

    monkeypatch.setattr(ALiBi, "bias", spy)
    L = 4096
    q, k, v = (torch.randn(1, 4, L, 16) for _ in range(3))
    with torch.no_grad():
        run_attention(q, k, v, AttentionWindow.full(), bias, bias_elements=2**20)
        assert max(sizes) <= 2**20 // 4 < L * L and len(sizes) > 1
        sizes.clear()
        run_attention(q, k, v, AttentionWindow.bca(256), bias)
        assert max(sizes) == 128 * 256


def test_bias_cache_keeps_small_blocks_only():
    """A BCA-sized block is cached and reused (the same tensor, for every layer and window); a long-range
    chunk of full attention is not kept, so memory held between calls stays bounded at any length."""
    bias = ALiBi(4)
    small = bias.bias(128, 128, 0, 256, "cpu")
    assert bias.bias(128, 128, 0, 256, "cpu") is small and len(bias._cache) == 1
    rows = CACHE_ELEMENTS // (4 * 1024) + 1  # just over the bound
    large = bias.bias(1024, rows, 0, 1024 + rows, "cpu")
    assert large.numel() > CACHE_ELEMENTS and len(bias._cache) == 1
    assert torch.equal(large[:, 0, :2], torch.tensor(alibi_slopes(4))[:, None] * torch.tensor([-1024.0, -1023.0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["alibi", "sandwich"])
def test_bias_under_bca_is_finite_at_64k_in_half_precision(kind, dtype):
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 4).eval().to(dtype)
    x = torch.randn(1, 65536, 64).to(dtype)
    with torch.no_grad():
        out = attn(x, make_bias(kind, 4), spec=AttentionSpec(AttentionWindow.bca(512)))
    assert out.dtype == dtype and torch.isfinite(out).all()


# ---- the model, every scheme ----------------------------------------------------------------------------

@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_incremental_equals_parallel_for_every_scheme(scheme, window):
    """Prompt in parallel, then token by token through the (bounded) cache: the logits of one parallel
    forward, to 1e-4 in fp32, past the training length (learned: up to its table)."""
    model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=scheme)
    model = model.under(AttentionSpec(window))
    length = L_TRAIN if scheme == "learned" else 3 * L_TRAIN + 7
    tokens = random_tokens(model.decoder.dictionary, 2, length, seed=5)
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = [model.decoder(tokens[:, :12], incremental_state=state)[0]]
        steps += [model.decoder(tokens[:, :t], incremental_state=state)[0] for t in range(13, length + 1)]
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-4


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_builds_what_it_says(scheme):
    spec = POSITION_SCHEMES[scheme]
    model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=scheme)
    dec = model.decoder
    assert dec.position_kind == spec.kind and all(p.kind == spec.kind for p in dec.positions)
    assert len(dec.positions) == (dec.num_layers if spec.per_layer else 1)
    assert (model.max_positions() == L_TRAIN) == (scheme == "learned")  # only a learned table stops at l
    names = set(model.state_dict())
    learned = {"kerple_log": "decoder.positions.3.r1", "kerple_power": "decoder.positions.3.r2",
               "t5": "decoder.positions.0.t5.relative_attention_bias.weight", "learned": "decoder.positions.0.weight"}
    if scheme in learned:
        assert learned[scheme] in names
    else:  # nothing position-related is state: fixed tables are recomputed in fp32, never saved or cast
        assert not any("position" in n or "xpos" in n for n in names)


def test_old_checkpoint_names_load():
    """Checkpoints written before the registry (``position_bias.N``, ``embed_positions.weight``) load."""
    for scheme, old, new in [("kerple_log", "decoder.position_bias.", "decoder.positions."),
                             ("learned", "decoder.embed_positions.", "decoder.positions.0.")]:
        model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=scheme, seed=1)
        state = {k.replace(new, old, 1) if k.startswith(new) else k: v.clone() for k, v in model.state_dict().items()}
        if scheme == "learned":
            state = {k.replace("decoder.embed_positions.0.", "decoder.embed_positions."): v for k, v in state.items()}
        assert any(k.startswith(old) for k in state)
        fresh = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=scheme, seed=2)
        fresh.upgrade_state_dict(state)
        fresh.load_state_dict(state, strict=True)
        for k, v in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[k], v), k


def test_readme_scheme_table_is_the_registry():
    from conftest import REPO

    assert scheme_table() in (REPO / "docs" / "positions.md").read_text()


def test_position_tables_stay_fp32_under_half():
    model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb="sinusoidal").half()
    assert model.decoder.positions[0].embed(0, 8, "cpu").dtype == torch.float32
    for scheme in ("kerple_log", "kerple_power"):
        model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=scheme).half()
        assert model.decoder.positions[0].bias(0, 4, 0, 4, "cpu").dtype == torch.float32


def test_bad_scheme_options_are_rejected():
    with pytest.raises(ValueError, match="sandwich-dim"):
        build_lex_model(pos_emb="sandwich", sandwich_dim=63)
    with pytest.raises(ValueError, match="t5-num-buckets"):
        build_lex_model(pos_emb="t5", t5_num_buckets=1)


# ---- real text ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_short_training_on_real_text_lowers_the_loss(scheme, real_batches):
    windows, d = real_batches
    model = build_lex_model(dictionary=d, tokens_per_sample=64, pos_emb=scheme, decoder_layers=2, dropout=0.0,
                            share_decoder_input_output_embed=True).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(25):
        batch = windows[torch.randint(0, windows.size(0), (16,), generator=g)]
        logits, _ = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.7, losses  # nats per token, from ~ln(1000) = 6.9


# ---- the two schemes added through the registry, and gradients ---------------------------------------------

def _distances(q_start, q_len, k_start, k_len):
    n = torch.arange(q_start, q_start + q_len, dtype=torch.float64)[:, None]
    m = torch.arange(k_start, k_start + k_len, dtype=torch.float64)[None, :]
    return n - m, (m <= n)


def test_smoothed_sandwich_is_the_papers_log_fit():
    """Chi et al. section 6.2: y = -0.825 log(1 + |m - n|) - 0.8, the same for every head."""
    r, causal = _distances(1000, 5, 980, 30)
    got = SmoothedSandwich(3).bias(1000, 5, 980, 30, "cpu").double()
    expected = -0.825 * torch.log(1 + r) - 0.8
    for h in range(3):
        assert torch.allclose(got[h][causal], expected[causal], rtol=0, atol=1e-6)


def test_kerple_power_is_minus_r1_distance_to_the_r2_with_its_constraints():
    """KERPLE's power kernel c - r1 |m - n|^r2 (c dropped) with r1 > 0 and 0 < r2 <= 2 enforced by clamping."""
    k = KerplePower(4)
    with torch.no_grad():
        k.r1.copy_(torch.tensor([0.5, 1.0, 3.0, -1.0]))
        k.r2.copy_(torch.tensor([0.5, 1.0, 2.5, 0.0]))
    r1 = torch.tensor([0.5, 1.0, 3.0, 0.01], dtype=torch.float64)[:, None, None]
    r2 = torch.tensor([0.5, 1.0, 2.0, 0.01], dtype=torch.float64)[:, None, None]
    r, causal = _distances(50, 10, 0, 60)
    expected = -r1 * r.clamp(min=0) ** r2
    got = k.bias(50, 10, 0, 60, "cpu").double()
    assert torch.allclose(got[:, causal], expected[:, causal], rtol=1e-6, atol=1e-5)


def reference_bias(kind: str, scheme, length: int, params) -> torch.Tensor:
    """float64 (H, L, L) bias from the papers' formulas, with ``params`` (float64 leaves holding the
    scheme's parameters: KERPLE's r1, r2; T5's (buckets, H) table)."""
    r, _ = _distances(0, length, 0, length)
    r = r.clamp(min=0)
    heads = scheme.num_heads
    if kind == "alibi":
        return -torch.tensor(alibi_slopes(heads), dtype=torch.float64)[:, None, None] * r
    if kind == "sandwich":
        w = 10000.0 ** (-2.0 * torch.arange(scheme.dim // 2, dtype=torch.float64) / scheme.dim)
        dot = torch.cos(r[..., None] * w).sum(-1) - scheme.dim / 2
        return dot / (torch.arange(1, heads + 1, dtype=torch.float64) * 8.0 / heads)[:, None, None]
    if kind == "smoothed_sandwich":
        return (-0.825 * torch.log1p(r) - 0.8).expand(heads, -1, -1)
    if kind == "kerple_log":
        r1, r2 = params
        return -r1[:, None, None] * torch.log1p(r2[:, None, None] * r)
    if kind == "kerple_power":
        r1, r2 = params
        power = torch.where(r > 0, r.clamp(min=1) ** r2[:, None, None], torch.zeros_like(r))
        return -r1[:, None, None] * power
    assert kind == "t5"
    # TorchScale's own causal bucketing of the relative position m - n, then a lookup in the table
    buckets = RelativePositionBias._relative_position_bucket(
        -r.long(), bidirectional=False, num_buckets=scheme.t5.num_buckets, max_distance=scheme.t5.max_distance)
    (table,) = params
    return table[buckets].permute(2, 0, 1)


@pytest.mark.parametrize("kind", BIAS_SCHEMES + ["xpos"])
def test_training_gradients_match_a_float64_reference(kind):
    """The training path (planner + executor, fp32, SDPA) against float64 attention with the scheme written
    out: equal outputs and equal gradients for q, k, v and the scheme's parameters."""
    B, H, D, L = 2, 2, 16, 40
    torch.manual_seed(5)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    scheme = XPos(D, scale_base=32.0) if kind == "xpos" else make_bias(kind, H)
    params = list(scheme.parameters())
    if kind in ("kerple_log", "kerple_power"):
        with torch.no_grad():  # inside the constraints, where the clamps pass gradients
            params[0].uniform_(0.5, 1.5)
            params[1].uniform_(0.3, 0.9)
    out = run_attention(q, k, v, AttentionWindow.full(), scheme)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, *params], grad_out)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    if kind == "xpos":
        i = torch.arange(D // 2, dtype=torch.float64)
        theta = 10000.0 ** (-2 * i / D)
        zeta = (2 * i / D + 0.4) / 1.4
        n = torch.arange(L, dtype=torch.float64)[:, None]
        rot_q = torch.polar(zeta ** (n / 32.0), n * theta)
        rot_k = torch.polar(zeta ** (-n / 32.0), n * theta)
        qc = torch.view_as_real(torch.view_as_complex(q64.unflatten(-1, (-1, 2))) * rot_q).flatten(-2)
        kc = torch.view_as_real(torch.view_as_complex(k64.unflatten(-1, (-1, 2))) * rot_k).flatten(-2)
        logits = qc @ kc.transpose(-1, -2) / math.sqrt(D)
        ref_params = []
    else:
        ref_params = [p.detach().double().requires_grad_() for p in params]
        bias = reference_bias(kind, scheme, L, ref_params)
        logits = q64 @ k64.transpose(-1, -2) / math.sqrt(D) + bias
    expected = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1) @ v64
    want = torch.autograd.grad(expected, [q64, k64, v64, *ref_params], grad_out.double(), allow_unused=True)
    assert (out.double() - expected).abs().max() <= 1e-5
    for name, a, b in zip(["q", "k", "v"] + [f"param{i}" for i in range(len(params))], got, want):
        scale = b.abs().max().clamp(min=1.0)
        assert (a.double() - b).abs().max() / scale <= 1e-4, name

"""BCA and sliding-window attention against naive attention with an explicit mask and global xPos."""

import math

import pytest
import torch

from conftest import build_lex_model, random_tokens, run_attention, window_mask, xpos_pair
from lex_plugin.modules.attention import LexSelfAttention
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow
from lex_plugin.modules.positions import XPos, alibi_slopes

L_TRAIN = 32  # training length l: BCA blocks of 16


def naive_attention(q, k, v, allowed):
    """float64 softmax(q k^T / sqrt(d) + mask) v; q, k already carry xPos at global positions."""
    q, k, v = q.double(), k.double(), v.double()
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def reference(q, k, v, window, xpos, pad=None):
    L = q.size(2)
    allowed = window_mask(window, L)[None, None]
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
        allowed = allowed | torch.eye(L, dtype=torch.bool)  # a pad query sees itself (as the module does)
    qx, kx = xpos_pair(xpos, q, k, q_start=0, k_start=0)
    return naive_attention(qx, kx, v, allowed)


WINDOWS = [AttentionWindow.bca(L_TRAIN), AttentionWindow.sliding(L_TRAIN)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("length", [L_TRAIN // 2, L_TRAIN, 3 * L_TRAIN + 5])
@pytest.mark.parametrize("padding", ["none", "right", "left"])
@pytest.mark.parametrize("group_tokens", [8192, 2 * L_TRAIN // 2], ids=["one-group", "2-windows-per-group"])
def test_window_matches_naive_masked_attention(window, length, padding, group_tokens):
    torch.manual_seed(length)
    B, H, D = 3, 2, 16
    q, k, v = (torch.randn(B, H, length, D) for _ in range(3))
    pad = None
    if padding != "none":
        pad = torch.zeros(B, length, dtype=torch.bool)
        cut = max(1, length // 3)
        if padding == "right":
            pad[1, length - cut :] = True
        else:
            pad[1, :cut] = True
            pad[2, : cut // 2] = True
    xpos = XPos(D)
    got = run_attention(q, k, v, window, xpos, key_padding_mask=pad, group_tokens=group_tokens)
    expected = reference(q, k, v, window, xpos, pad)
    real = torch.ones(B, length, dtype=torch.bool) if pad is None else ~pad
    diff = (got.double() - expected).abs().permute(0, 2, 1, 3)[real]
    assert diff.max() <= 1e-5


def test_window_masks_follow_the_paper():
    """Figure 3: block b sees block b-1 and itself causally; every query past block 0 sees between w + 1
    and 2w keys (block 0: causal); the sliding window sees exactly its W most recent positions."""
    bca = window_mask(AttentionWindow.bca(8), 20)  # w = 4
    seen = bca.sum(-1)
    assert seen[:4].tolist() == [1, 2, 3, 4]
    assert seen[4:].tolist() == [5, 6, 7, 8] * 4
    assert bca[9, 4] and not bca[9, 3] and bca[9, 9] and not bca[9, 10]
    sw = window_mask(AttentionWindow.sliding(5), 20)
    assert sw.sum(-1).tolist() == [1, 2, 3, 4] + [5] * 16


def test_bca_is_full_attention_up_to_the_training_length():
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 2, L_TRAIN)
    with torch.no_grad():
        full, _ = model(tokens)
        model = model.under(AttentionSpec(AttentionWindow.bca(L_TRAIN)))
        bca, _ = model(tokens)
        longer = random_tokens(model.decoder.dictionary, 2, 4 * L_TRAIN)
        bca_long, _ = model(longer)
        model = model.under(AttentionSpec(AttentionWindow.full()))
        full_long, _ = model(longer)
    assert torch.equal(full, bca)
    assert torch.allclose(bca_long[:, :L_TRAIN], full_long[:, :L_TRAIN], atol=1e-5)
    assert not torch.allclose(bca_long[:, -1], full_long[:, -1], atol=1e-3)  # BCA truly limits the context


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_prompt_then_token_by_token_equals_parallel_window(window):
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    model = model.under(AttentionSpec(window))
    tokens = random_tokens(model.decoder.dictionary, 2, 3 * L_TRAIN + 7, seed=3)
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = [model.decoder(tokens[:, :40], incremental_state=state)[0]]
        for t in range(41, tokens.size(1) + 1):
            steps.append(model.decoder(tokens[:, :t], incremental_state=state)[0])
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bca_is_finite_at_64k_in_half_precision(dtype):
    """Window-local xPos keeps zeta^(+-n/B) bounded: one layer at L = 65536 stays finite."""
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 1).eval().to(dtype)
    x = torch.randn(1, 65536, 64).to(dtype)
    with torch.no_grad():
        out = attn(x, XPos(64), spec=AttentionSpec(AttentionWindow.bca(512)))
    assert out.dtype == dtype and torch.isfinite(out).all()
    # the same keys under global positions overflow in this dtype: zeta_min^(-L/2B) is astronomically large
    assert XPos(64).rotate(x[:, :, :], start=0, center=0, keys=True).isinf().any()
    assert AttentionWindow.bca(512).span == 512 and AttentionWindow.sliding(7).span == 7


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: AttentionWindow.bca(33), "even"),
        (lambda: AttentionWindow.sliding(0), "positive"),
        (lambda: AttentionWindow("local", 4), "mode"),
    ],
)
def test_bad_windows_are_rejected(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_generation_cache_is_bounded_and_exact(window):
    """Token by token over 3l + 7 tokens: the same logits as the parallel windowed forward, while every
    layer's cache holds at most l (BCA) or W (sliding) keys and the reported length keeps counting."""
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    model = model.under(AttentionSpec(window))
    tokens = random_tokens(model.decoder.dictionary, 2, 3 * L_TRAIN + 7, seed=11)
    bound = L_TRAIN if window.mode == "bca" else window.stride
    sizes = []
    with torch.no_grad():
        full, _ = model(tokens)
        state, steps = {}, []
        for t in range(1, tokens.size(1) + 1):
            steps.append(model.decoder(tokens[:, :t], incremental_state=state)[0])
            attn = model.decoder.layers[0].self_attn
            sizes.append(attn.cached_keys(state))
            assert attn.cached_length(state) == t
    # between calls the cache holds what the next query can see besides itself: at most l - 1 (or W - 1)
    assert max(sizes) == bound - 1
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-4


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padded"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "alibi"])
def test_one_query_over_a_feature_major_cache_equals_float64_attention(bias, padded, monkeypatch):
    """A generation step's one query over a long cache (on CPU in fp32: keys and values re-laid (D, S), two
    matrix-vector products) equals float64 softmax attention, with an ALiBi bias and padded keys too; the layout survives
    growth and a beam reorder (which keeps the selected rows), and goes back for several queries."""
    from lex_plugin.modules.attention import HeldKeys, KeyValueCache, attend, kv_cache, plan
    from lex_plugin.modules.positions import ALiBi, NoPositions

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 100)
    torch.manual_seed(5)
    B, H, D, S = 3, 4, 16, 300
    window = AttentionWindow.full()
    scheme = ALiBi(H) if bias else NoPositions()
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cache = KeyValueCache(AttentionSpec(window))
    cache.append(k[:, :, :70], v[:, :, :70])
    assert cache.held(queries=1).keys.stride(-1) == 1  # 70 keys: below the threshold, SDPA's layout
    for a in range(70, S, 70):  # grows 140 -> 420 rows, feature-major from 140 keys on
        cache.append(k[:, :, a : a + 70], v[:, :, a : a + 70])
        keys, values = cache.held(queries=1).keys, cache.held(queries=1).values
        assert keys.stride(-2) == 1 and values.stride(-2) == 1 and torch.equal(keys, k[:, :, : a + 70])
    order = torch.tensor([2, 0])
    cache.reorder(order)
    keys, values = cache.held().keys, cache.held().values
    assert keys.stride(-2) == 1 and torch.equal(keys, k[order]) and torch.equal(values, v[order])
    q = torch.randn(2, H, 1, D)
    pad = torch.zeros(2, S, dtype=torch.bool)
    pad[1, :57] = True  # a left-padded prompt
    chunks = plan(window, q_start=S - 1, q_len=1, has_bias=bias, padded=padded)
    held = HeldKeys(keys, values, pad if padded else None, center=0, feature_major=True)
    got = attend(q, held, chunks, spec=AttentionSpec(window), scheme=scheme, q_start=S - 1)
    logits = q.double() @ k[order].double().transpose(-1, -2) / math.sqrt(D)
    if bias:
        logits = logits + torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None] * -torch.arange(
            S - 1, -1, -1, dtype=torch.float64)
    if padded:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    expected = torch.softmax(logits, dim=-1) @ v[order].double()
    assert (got.double() - expected).abs().max() <= 1e-5
    keys, values = cache.held(queries=2).keys, cache.held(queries=2).values
    assert keys.stride(-1) == 1 and torch.equal(keys, k[order]) and torch.equal(values, v[order])


def test_a_half_cache_widens_to_fp32_for_one_query_and_narrows_back(monkeypatch):
    """A bf16 cache on CPU read by one query over FEATURE_MAJOR_KEYS keys or more is re-laid feature-major in fp32 (its
    values exactly: bf16 widens losslessly); it stays so as it grows past its capacity, and goes back to bf16
    sequence-major for several queries. One with attention sinks, whose keys join the window's, stays bf16."""
    from lex_plugin.modules.attention import KeyValueCache, kv_cache
    from lex_plugin.modules.positions import NoPositions

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 20)
    torch.manual_seed(4)
    k, v = (torch.randn(1, 2, 90, 8, dtype=torch.bfloat16) for _ in range(2))
    cache = KeyValueCache(AttentionSpec())
    cache.append(k[:, :, :10], v[:, :, :10])
    assert cache.held(queries=1).keys.dtype == torch.bfloat16  # 10 keys: below the threshold
    cache.append(k[:, :, 10:30], v[:, :, 10:30])
    held = cache.held(queries=1)
    assert held.feature_major and held.keys.stride(-2) == 1 and held.keys.dtype == held.values.dtype == torch.float32
    assert torch.equal(held.keys, k[:, :, :30].float()) and torch.equal(held.values, v[:, :, :30].float())
    cache.append(k[:, :, 30:], v[:, :, 30:])  # 90 keys: past the first buffer's rows
    held = cache.held(queries=1)
    assert cache.capacity >= 90 and held.feature_major and held.keys.dtype == torch.float32
    assert torch.equal(held.keys, k.float()) and torch.equal(held.values, v.float())
    held = cache.held(queries=2)
    assert not held.feature_major and held.keys.stride(-1) == 1 and held.keys.dtype == held.values.dtype == torch.bfloat16
    assert torch.equal(held.keys, k) and torch.equal(held.values, v)
    spec = AttentionSpec(AttentionWindow.sliding(200).with_sinks(2))
    sunk = KeyValueCache.after_prefill(spec, NoPositions(), k, v, None)
    assert sunk.sink_length == 2 and sunk.held(queries=1).keys.dtype == torch.bfloat16


@pytest.mark.parametrize("pos_emb", ["xpos", "alibi"])
def test_generation_after_a_chunked_prefill_equals_parallel_through_both_layouts(pos_emb, monkeypatch):
    """Full attention: a chunked prefill (sequence-major), single steps (feature-major from 40 keys), a
    chunk again (back), single steps again: the same logits as one parallel forward."""
    from lex_plugin.modules.attention import kv_cache

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 40)
    model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=pos_emb)
    tokens = random_tokens(model.decoder.dictionary, 2, 3 * L_TRAIN, seed=17)
    cuts = [0, 40, 50, 70, tokens.size(1)]
    layouts = []
    with torch.no_grad():
        full, _ = model(tokens)
        state, outs = {}, []
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            if i % 2 == 0:  # positions a .. b - 1 as one chunk
                outs.append(model.decoder(tokens[:, :b], incremental_state=state)[0])
            else:
                outs += [model.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(a, b)]
            layouts.append(model.decoder.layers[0].self_attn.cache(state).feature_major)
    assert layouts == [False, True, False, True]
    assert (torch.cat(outs, 1) - full).abs().max() <= 1e-4


@pytest.mark.parametrize("mode", ["full", "dca"])
def test_bf16_generation_over_a_widened_cache_is_as_close_to_fp32_as_a_parallel_bf16_pass(mode, monkeypatch):
    """A bf16 model (xPos) generating one token at a time past FEATURE_MAJOR_KEYS keys reads fp32 feature-major caches
    (under DCA: raw keys, which each piece rotates) and returns bf16; its logits are as close to fp32 attention over the same
    bf16 weights as one parallel bf16 forward's are (within 1.5x its error), the first steps included."""
    import copy

    from lex_plugin.modules.attention import kv_cache
    from lex_plugin.modules.attention.spec import AttentionOptions

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 40)
    half = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb="xpos").to(torch.bfloat16)
    reference = copy.deepcopy(half).float()  # the same (bf16-rounded) weights in fp32
    spec = AttentionOptions(mode=mode).spec(L_TRAIN)
    tokens = random_tokens(half.decoder.dictionary, 1, 4 * L_TRAIN, seed=21)
    with torch.no_grad():
        expected = reference(tokens, spec=spec)[0][:, 40:]
        parallel = half(tokens, spec=spec)[0][:, 40:]
        state = {}
        half.decoder(tokens[:, :40], incremental_state=state, spec=spec)
        steps = [half.decoder(tokens[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(40, tokens.size(1))]
    cache = half.decoder.layers[0].self_attn.cache(state)
    assert steps[-1].dtype == torch.bfloat16 and cache.held().keys.dtype == torch.float32
    assert cache.feature_major  # (under DCA its raw keys, which each piece rotates)
    err_steps = (torch.cat(steps, 1).float() - expected).abs().max()
    err_parallel = (parallel.float() - expected).abs().max()
    assert err_steps <= 1.5 * err_parallel, (float(err_steps), float(err_parallel))


def test_changing_the_window_mid_generation_is_refused():
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 1, 10)
    state = {}
    with torch.no_grad():
        model.decoder(tokens[:, :5], incremental_state=state)
        model = model.under(AttentionSpec(AttentionWindow.bca(L_TRAIN)))
        with pytest.raises(ValueError, match="new incremental state"):
            model.decoder(tokens[:, :6], incremental_state=state)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_blockwise_evaluation_equals_parallel(window):
    """The length evaluator's block-at-a-time pass (bounded cache, memory flat in L) scores exactly what
    one parallel windowed forward scores, including a final sample shorter than the others."""
    import torch.nn.functional as F

    from lex_plugin.evaluation.length_eval import evaluate_lengths

    model = build_lex_model(tokens_per_sample=L_TRAIN)
    d = model.decoder.dictionary
    stream = random_tokens(d, 1, 7 * L_TRAIN + 3, seed=21)[0]
    length = 3 * L_TRAIN
    kwargs = dict(eos=d.eos(), pad=d.pad(), max_tokens=4 * L_TRAIN, training_length=L_TRAIN, progress=False)
    blockwise = evaluate_lengths(model, stream, [length], AttentionSpec(window), **kwargs)[0]
    source = torch.cat([stream.new_tensor([d.eos()]), stream[:-1]])
    nll = 0.0
    with torch.no_grad():
        for start in range(0, stream.numel(), length):
            src, tgt = source[start : start + length][None], stream[start : start + length][None]
            logits = model(src, spec=AttentionSpec(window))[0]
            nll += float(F.cross_entropy(logits[0].double(), tgt[0], reduction="sum"))
    assert blockwise.tokens == stream.numel()
    assert blockwise.window == str(window)
    assert blockwise.nll == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [dict(pos_emb="rope"), dict(xpos_scalar_zeta=True), dict(xpos_no_rotation=True), dict(pos_emb="none")],
    ids=["rope", "scalar-zeta", "no-rotation", "nope"],
)
def test_other_rotary_schemes_work_under_windows_and_the_cache(overrides):
    """RoPE, the Table 4 ablations and NoPE go through the same windows and bounded cache as xPos."""
    model = build_lex_model(tokens_per_sample=L_TRAIN, **overrides)
    model = model.under(AttentionSpec(AttentionWindow.bca(L_TRAIN)))
    tokens = random_tokens(model.decoder.dictionary, 2, 3 * L_TRAIN + 7, seed=13)
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = [model.decoder(tokens[:, :t], incremental_state=state)[0] for t in range(1, tokens.size(1) + 1)]
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-4
    xpos = model.decoder.positions[0]
    if overrides.get("pos_emb") == "none":
        assert xpos.kind == "none"
    else:
        assert xpos.use_scale == (overrides.get("pos_emb") != "rope")
        assert xpos.scalar_zeta == overrides.get("xpos_scalar_zeta", False)
        assert xpos.rotation == (not overrides.get("xpos_no_rotation", False))


# ---- the cache's protocol: centres, long prefills, padded beams ------------------------------------------

def test_keys_rescaled_to_a_new_centre_equal_keys_rotated_there():
    """rescale_keys(c1, c2) turns keys rotated at centre c1 into keys rotated at c2 (xPos's zeta^((c2 - c1)/B))."""
    xpos = XPos(16)
    k = torch.randn(2, 40, 16)
    at_c1 = xpos.rotate(k, start=1000, center=768, keys=True)
    at_c2 = xpos.rotate(k, start=1000, center=1280, keys=True)
    assert torch.allclose(at_c1 * xpos.rescale_keys(768, 1280, "cpu"), at_c2, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(at_c1, at_c2, atol=1e-3)  # the factor matters
    assert XPos(16, use_scale=False).rescale_keys(768, 1280, "cpu") is None  # RoPE keys do not depend on it


@pytest.mark.parametrize("window", [AttentionWindow.full(), AttentionWindow.bca(L_TRAIN)], ids=str)
def test_generation_through_many_recentrings_equals_parallel(window, monkeypatch):
    """With the centre allowed only 8 positions of drift, a 150-token generation re-centres the cache about
    every 8 steps (keys multiplied by rescale_keys each time): the logits stay those of one parallel forward."""
    from lex_plugin.modules.positions import xpos as xpos_module

    monkeypatch.setattr(xpos_module, "DEFAULT_MAX_LOG_SCALE", 1e-6)  # max_center_offset -> CENTER_STEP
    monkeypatch.setattr(xpos_module, "CENTER_STEP", 8)
    monkeypatch.setattr(XPos, "center_step", 8)
    model = build_lex_model(tokens_per_sample=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 2, 150, seed=3)
    spec = AttentionSpec(window)
    attn = model.decoder.layers[0].self_attn
    centres = set()
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        state = {}
        steps = [model(tokens[:, :20], incremental_state=state, spec=spec)[0]]
        for t in range(21, 151):
            steps.append(model(tokens[:, :t], incremental_state=state, spec=spec)[0])
            centres.add(attn.cache(state).center)
    assert len(centres) > 10  # it really moved, many times
    assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4


@pytest.mark.parametrize("window", [AttentionWindow.full(), AttentionWindow.bca(L_TRAIN), AttentionWindow.sliding(L_TRAIN)], ids=str)
@pytest.mark.parametrize("pos_emb", ["xpos", "alibi"])
def test_a_long_prompt_then_generation_equals_parallel(window, pos_emb):
    """A 300-token prompt in one pass (its keys stored rotated at a centre past the first CENTER_STEP = 256
    positions), then 40 steps: the logits of one parallel forward."""
    model = build_lex_model(tokens_per_sample=L_TRAIN, pos_emb=pos_emb)
    tokens = random_tokens(model.decoder.dictionary, 2, 340, seed=8)
    spec = AttentionSpec(window)
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        state = {}
        steps = [model(tokens[:, :300], incremental_state=state, spec=spec)[0]]
        steps += [model(tokens[:, :t], incremental_state=state, spec=spec)[0] for t in range(301, 341)]
    assert model.decoder.layers[0].self_attn.cache(state).center >= 256 if pos_emb == "xpos" else True
    assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4


def test_a_beam_reorder_moves_the_padding_with_the_keys():
    from lex_plugin.modules.attention import KeyValueCache

    cache = KeyValueCache(AttentionSpec())
    k, v = torch.randn(3, 2, 10, 4), torch.randn(3, 2, 10, 4)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[1, :4] = True  # only the second row is left-padded
    cache.append(k, v, pad)
    order = torch.tensor([1, 1, 0])
    cache.reorder(order)
    held = cache.held()
    keys, values, padding = held.keys, held.values, held.padding
    assert torch.equal(keys, k[order]) and torch.equal(values, v[order]) and torch.equal(padding, pad[order])


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_bucket_losses_add_up_and_equal_their_positions(window):
    """Each position bucket's summed loss equals the parallel forward's losses at exactly its positions, and
    the buckets add up to the pass (a mean in place of a sum, or a shifted edge, fails here)."""
    import torch.nn.functional as F

    from lex_plugin.evaluation.length_eval import evaluate_lengths

    model = build_lex_model(tokens_per_sample=L_TRAIN)
    d = model.decoder.dictionary
    length = 4 * L_TRAIN
    stream = random_tokens(d, 1, 2 * length, seed=4)[0]
    result = evaluate_lengths(model, stream, [length], AttentionSpec(window), d.eos(), d.pad(), max_tokens=4 * length,
                              training_length=L_TRAIN, progress=False)[0]
    source = torch.cat([stream.new_tensor([d.eos()]), stream[:-1]]).view(2, length)
    with torch.no_grad():
        nll = F.cross_entropy(model(source, spec=AttentionSpec(window))[0].double().transpose(1, 2), stream.view(2, length),
                              reduction="none")  # (2, L)
    assert [(b.start, b.end) for b in result.buckets] == [(0, L_TRAIN), (L_TRAIN, 2 * L_TRAIN), (2 * L_TRAIN, 4 * L_TRAIN)]
    for b in result.buckets:
        assert b.tokens == 2 * (b.end - b.start)
        assert b.nll == pytest.approx(float(nll[:, b.start : b.end].sum()), rel=1e-6)
    assert sum(b.nll for b in result.buckets) == pytest.approx(result.nll, rel=1e-12)
    assert sum(b.tokens for b in result.buckets) == result.tokens == stream.numel()


def test_a_segment_longer_than_the_cache_takes_is_refused():
    from lex_plugin.modules.attention import KeyValueCache

    xpos = XPos(16)
    cache = KeyValueCache.after_prefill(AttentionSpec(), xpos, torch.randn(1, 1, 4, 16), torch.randn(1, 1, 4, 16), None)
    too_many = cache.segment_length(torch.float16) + 1
    x = torch.randn(1, 1, too_many, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="exceed the cache's segment"):
        cache.extend(x, x, x)
    assert KeyValueCache.after_prefill(AttentionSpec(), XPos(16, use_scale=False), x, x, None).segment_length(x.dtype) is None


@pytest.mark.parametrize("window", [AttentionWindow.full(), AttentionWindow.bca(16)], ids=str)
def test_new_positions_past_the_caches_segment_run_in_segments_equal_to_the_parallel_forward(window):
    """xPos with scale base 6 lets a cache take 31 positions per segment in fp32 (its scale stays in range about one
    centre): 100 new positions after a prefill of 20 run in 4 segments, each at its own positions and centre, and
    equal the parallel forward."""
    from lex_plugin.modules.attention import KeyValueCache

    torch.manual_seed(6)
    attn = LexSelfAttention(64, 4).eval()
    xpos = XPos(16, scale_base=6)
    x = torch.randn(2, 120, 64)
    spec = AttentionSpec(window)
    probe = KeyValueCache.after_prefill(spec, xpos, x.new_zeros(1, 1, 4, 16), x.new_zeros(1, 1, 4, 16), None)
    assert probe.segment_length(torch.float32) == 31
    with torch.no_grad():
        parallel = attn(x, xpos, spec=spec)
        state: dict = {}
        steps = torch.cat([attn(x[:, :20], xpos, incremental_state=state, spec=spec),
                           attn(x[:, 20:], xpos, incremental_state=state, spec=spec)], dim=1)
    assert attn.cached_length(state) == 120
    assert attn.cached_keys(state) <= (16 if window.bounded else 120)  # each segment trimmed to what BCA still sees
    assert (steps - parallel).abs().max() <= 1e-4 * parallel.abs().max()

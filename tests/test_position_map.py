"""Bounded-distance attention (ReRoPE, Leaky ReRoPE, Self-Extend, Dual Chunk Attention) and log-n scaling
against naive float64 attention whose logits are written from each paper's distance formula; through the
key/value cache equal to one parallel forward; bad combinations refused."""

import math

import pytest
import torch

from conftest import build_lex_model, random_tokens
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, HeldKeys, attend, plan
from lex_plugin.modules.attention.position_map import (
    DualChunk, LeakyReRoPE, ReRoPE, SelfExtend, position_map_from_options)
from lex_plugin.modules.attention.temperature import logn_scale
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.biases import ALiBi, alibi_slopes

L_TRAIN = 32


def paper_distance(method, n: int, m: int) -> float:
    """The remapped distance of query n and key m, written from each paper (not from the package)."""
    d = n - m
    if isinstance(method, ReRoPE):  # Su 2023: min(d, w)
        return min(d, method.window)
    if isinstance(method, LeakyReRoPE):  # d below w, w + (d - w) / k beyond
        return d if d < method.window else method.window + (d - method.window) / method.k
    if isinstance(method, SelfExtend):  # Jin et al. 2024, Eq. 3-4
        G, w = method.group, method.window
        return d if d < w else n // G - m // G + w - w // G
    # An et al. 2024 (ChunkLlama): keys at m mod c; queries by chunk relation
    s, c = method.chunk_size, method.chunk_size - method.local_window
    gap = n // c - m // c
    q = n % c if gap == 0 else min(n % c + c, s) if gap == 1 else min(2 * c - 1, s)  # qc_t[c - 1] for inter-chunk
    return q - m % c


def naive(q, k, v, dist, visible, kind: str, heads: int, scale_base: float = 512.0):
    """float64 attention with logits from the distance of each pair: xPos / RoPE rotation (and xPos's decay
    zeta^(d / scale_base)) by the distance, or ALiBi's -slope * distance."""
    q, k, v = q.double(), k.double(), v.double()
    d = q.size(-1)
    if kind in ("xpos", "rope"):
        i = torch.arange(d // 2, dtype=torch.float64)
        theta = 10000.0 ** (-2 * i / d)
        phase = torch.exp(1j * dist[..., None] * theta)
        if kind == "xpos":
            phase = phase * ((2 * i / d + 0.4) / 1.4) ** (dist[..., None] / scale_base)
        qz, kz = torch.complex(q[..., 0::2], q[..., 1::2]), torch.complex(k[..., 0::2], k[..., 1::2])
        logits = (qz[..., :, None, :] * kz[..., None, :, :].conj() * phase).real.sum(-1)
    else:
        logits = q @ k.transpose(-1, -2)
    logits = logits / math.sqrt(d)
    if kind == "alibi":
        logits = logits - torch.tensor(alibi_slopes(heads), dtype=torch.float64)[:, None, None] * dist
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v


def scheme_of(kind: str, heads: int, d: int):
    return {"xpos": lambda: XPos(d), "rope": lambda: XPos(d, use_scale=False), "alibi": lambda: ALiBi(heads)}[kind]()


def run(q, k, v, spec, scheme, bias_elements=1 << 24, key_padding_mask=None):
    chunks = plan(spec.window, q_len=q.size(2), has_bias=True, batch_heads=q.size(0) * q.size(1),
                  bias_elements=bias_elements, padded=key_padding_mask is not None)
    return attend(q, HeldKeys(k, v, key_padding_mask), chunks, spec=spec, scheme=scheme)


METHODS = [ReRoPE(L_TRAIN // 2), LeakyReRoPE(L_TRAIN // 2, 4.0), SelfExtend(4, L_TRAIN // 4), SelfExtend(3, 7),
           DualChunk(3 * L_TRAIN // 4, L_TRAIN // 16), DualChunk(24, 14)]  # the last: 2c - 1 = 19 < s


# every method on every scheme kind, but Leaky ReRoPE's fractional distances on ALiBi (refused: see below)
COMBINATIONS = [(m, kind) for kind in ("xpos", "rope", "alibi") for m in METHODS if kind != "alibi" or m.integer]


@pytest.mark.parametrize("method,kind", COMBINATIONS, ids=[f"{k}-{m}" for m, k in COMBINATIONS])
@pytest.mark.parametrize("length", [L_TRAIN, 4 * L_TRAIN, 16 * L_TRAIN])
def test_each_method_equals_its_formula_in_float64(method, kind, length, monkeypatch):
    """Logits from the paper's distance (rotation by it, xPos's decay zeta^(d'/B), ALiBi's slope times it),
    one softmax over every causal key; planned chunks of 3 queries (bias_elements) at 1l and 4l, query blocks
    of 40 inside one chunk at 16l, so that the pieces straddle chunk and DCA-chunk boundaries."""
    from lex_plugin.modules.attention.kernels import remapped

    monkeypatch.setattr(remapped, "MAP_QUERY_BLOCK", 40)
    torch.manual_seed(0)
    B, H, D = 1, 2, 16
    q, k, v = (torch.randn(B, H, length, D) for _ in range(3))
    dist = torch.tensor([[paper_distance(method, n, m) if m <= n else 0.0 for m in range(length)]
                         for n in range(length)], dtype=torch.float64)
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    expected = naive(q, k, v, dist, visible, kind, H)
    chunk = 3 if length < 16 * L_TRAIN else length
    got = run(q, k, v, AttentionSpec(position_map=method), scheme_of(kind, H, D), bias_elements=B * H * chunk * length)
    assert (got.double() - expected).abs().max() < 2e-5
    assert float(method.distance(torch.tensor([length - 1]), torch.arange(length)).max()) == float(dist.max())


@pytest.mark.parametrize("method", METHODS[:1] + METHODS[2:], ids=str)
def test_methods_keep_their_formula_in_bf16(method):
    """bf16 queries, keys and values at 8l: within bf16's resolution of the float64 reference of the same
    bf16 inputs (position math stays fp32)."""
    torch.manual_seed(1)
    B, H, D, length = 1, 2, 16, 8 * L_TRAIN
    q, k, v = (torch.randn(B, H, length, D).bfloat16() for _ in range(3))
    dist = torch.tensor([[paper_distance(method, n, m) if m <= n else 0.0 for m in range(length)]
                         for n in range(length)], dtype=torch.float64)
    expected = naive(q, k, v, dist, torch.ones(length, length, dtype=torch.bool).tril(), "xpos", H)
    got = run(q, k, v, AttentionSpec(position_map=method), XPos(D))
    assert got.dtype == torch.bfloat16
    assert (got.double() - expected).abs().max() < 3e-2


@pytest.mark.parametrize("spec", [AttentionSpec(logn=L_TRAIN), AttentionSpec(AttentionWindow.bca(L_TRAIN), logn=L_TRAIN),
                                  AttentionSpec(AttentionWindow.sliding(L_TRAIN // 2).with_sinks(2), logn=8),
                                  AttentionSpec(position_map=ReRoPE(L_TRAIN // 2), logn=L_TRAIN)], ids=str)
def test_logn_scales_each_query_by_the_keys_it_sees(spec):
    """log-n: query n times max(1, log(keys seen) / log(l)) (Qwen's use_logn_attn under full attention: log(n + 1));
    the same as the naive attention of the scaled queries."""
    torch.manual_seed(2)
    B, H, D, length = 1, 2, 16, 6 * L_TRAIN
    q, k, v = (torch.randn(B, H, length, D) for _ in range(3))
    window = spec.window
    n = torch.arange(length)
    seen = torch.tensor([int(window.allowed(torch.tensor(p), n).sum()) for p in range(length)])
    if window.mode == "full":
        assert torch.equal(seen, n + 1)
    factor = (seen.double().log() / math.log(spec.logn)).clamp(min=1)
    assert torch.allclose(logn_scale(seen, spec.logn).double(), factor, atol=1e-6)
    if window.mode == "bca":
        assert factor.max() == 1  # BCA never sees more than l keys: log-n changes nothing
    method = spec.position_map
    dist = torch.tensor([[paper_distance(method, p, m) if method else p - m for m in range(length)]
                         for p in range(length)], dtype=torch.float64)
    visible = window.allowed(n[:, None], n[None, :])
    if window.sinks:  # sinks seen at their StreamingLLM distance
        from test_sinks import distances
        dist = distances(window, length)[0].double()
    expected = naive(q * factor[:, None].float(), k, v, dist, visible, "xpos", H)
    got = run(q, k, v, spec, XPos(D), bias_elements=B * H * 5 * length)
    assert (got.double() - expected).abs().max() < 2e-5


@pytest.mark.parametrize("pos_emb,method", [(p, m) for p in ("xpos", "alibi") for m in ("rerope", "leaky_rerope", "self_extend", "dca")
                                            if p == "xpos" or m != "leaky_rerope"])
def test_token_by_token_equals_one_parallel_forward(method, pos_emb):
    """A prompt of 3l in one chunk or in chunks of 23, then one token at a time to 5l, through the cache
    (un-rotated keys, rotated at remapped positions at every step): equal to one parallel forward (1e-4)."""
    model = build_lex_model(pos_emb=pos_emb, decoder_layers=2).eval()
    spec = AttentionSpec(position_map=position_map_from_options(method, L_TRAIN), logn=L_TRAIN)
    tokens = random_tokens(model.decoder.dictionary, 1, 5 * L_TRAIN)
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        for step in (3 * L_TRAIN, 23):
            state = {}
            outs = [model(tokens[:, :a + min(step, 3 * L_TRAIN - a)], incremental_state=state, spec=spec)[0]
                    for a in range(0, 3 * L_TRAIN, step)]
            outs += [model(tokens[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(3 * L_TRAIN, 5 * L_TRAIN)]
            assert (torch.cat(outs, 1) - parallel).abs().max() <= 1e-4


def test_bad_combinations_are_refused():
    with pytest.raises(ValueError, match="does not combine with the bca"):
        AttentionSpec(AttentionWindow.bca(L_TRAIN), position_map=ReRoPE(8))
    with pytest.raises(ValueError, match="--self-extend-group 4 is an option of --position-map self_extend; this is --position-map rerope"):
        position_map_from_options("rerope", L_TRAIN, self_extend_group=4)
    with pytest.raises(ValueError, match="--rerope-window 32 must be below the training length l = 32"):
        position_map_from_options("rerope", L_TRAIN, rerope_window=32)
    with pytest.raises(ValueError, match="--dca-chunk-size 40 must be below the training length"):
        position_map_from_options("dca", L_TRAIN, dca_chunk_size=40)
    with pytest.raises(ValueError, match="needs the training length l"):
        position_map_from_options("self_extend", None)
    with pytest.raises(ValueError, match="must be one of rerope, leaky_rerope, self_extend, dca"):
        position_map_from_options("yarn", L_TRAIN)
    tokens = torch.tensor([[5, 6, 7]])
    for pos_emb, method, message in (("none", "rerope", "NoPE has no positions"), ("sinusoidal", "dca", "absolute"),
                                     ("alibi", "leaky_rerope", "fractional")):
        model = build_lex_model(pos_emb=pos_emb, decoder_layers=1)
        with pytest.raises(ValueError, match=message):
            model(tokens, spec=AttentionSpec(position_map=position_map_from_options(method, L_TRAIN)))
    with pytest.raises(ValueError, match="log-n .* learned"):
        build_lex_model(pos_emb="learned", decoder_layers=1)(tokens, spec=AttentionSpec(logn=L_TRAIN))


def test_eval_lm_and_lex_commands_take_every_position_map(data_bin, trained, tmp_path):
    """fairseq-eval-lm --eval-windows full,rerope,leaky_rerope,self_extend,dca --logn: one row per method and
    length, labelled with its options; at L = l log-n is 1, and a method changes only distances >= its window.
    ``lex score --position-map`` and ``lex passkey --windows`` run the same specs; an option no mode takes is
    refused, naming its method."""
    import json
    import subprocess
    import sys

    from conftest import REPO, TRAIN_LEN, run_cli

    ckpt, _ = trained
    l = TRAIN_LEN
    run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--path", str(ckpt),
             "--task", "lex_language_modeling", "--gen-subset", "valid", "--tokens-per-sample", str(l),
             "--batch-size", "8", "--num-workers", "0", "--eval-lengths", f"{l},{4 * l}", "--logn",
             "--eval-windows", "full,rerope,leaky_rerope,self_extend,dca", "--self-extend-group", "4",
             "--eval-tokens", "2000", "--report-json", str(tmp_path / "r.json")])
    rows = {(r["window"], r["length"]): r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    labels = ["full+logn", f"rerope(window={l // 2})+logn", f"leaky_rerope(window={l // 2},k=16)+logn",
              f"self_extend(G=4,w={l // 4})+logn", f"dca(s={3 * l // 4},w={l // 16})+logn"]
    assert set(rows) == {(w, L) for w in labels for L in (l, 4 * l)}
    assert all(r["tokens"] == 2000 and math.isfinite(r["loss"]) for r in rows.values())
    assert {rows[(w, l)]["attention"]["mode"] for w in labels} == {"full", "rerope", "leaky_rerope", "self_extend", "dca"}
    for w in labels[1:]:  # distances >= the window exist at L = l, so each method changes the loss a little
        assert 0 < abs(rows[(w, l)]["loss"] - rows[("full+logn", l)]["loss"]) < 0.5

    from lex_plugin.hub_interface import from_pretrained

    hub = from_pretrained(ckpt.parent, ckpt.name, data_bin, window="rerope", rerope_window=16, logn=True)
    assert str(hub.spec) == "rerope(window=16)+logn" and hub.spec.logn == l

    out = run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), str(REPO / "README.md"), "--path", str(ckpt),
                   "--position-map", "self_extend", "--logn"]).stdout
    assert f"window self_extend(G=8,w={l // 4})+logn: ppl" in out
    bad = subprocess.run([sys.executable, "-m", "lex_plugin.cli", "passkey", str(data_bin), "--path", str(ckpt),
                          "--windows", "full,bca", "--dca-chunk-size", "40", "--lengths", "128", "--trials", "1"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "--dca-chunk-size 40 is an option of --position-map dca; none of the modes full, bca" in bad.stderr


@pytest.mark.parametrize("padded", [False, True])
def test_the_log_sum_exp_path_is_the_same_fused_or_explicit(padded):
    """The fused CPU kernel and the explicit fp32 path (what other devices run) give the same output and
    log-sum-exp, with a row that sees no key (output 0, log-sum-exp -inf) and a per-sample mask."""
    from lex_plugin.modules.attention.kernels.ops import attention_lse

    torch.manual_seed(3)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    allowed = torch.rand(2, 1, 5, 7) > 0.4 if padded else torch.rand(5, 7) > 0.4
    allowed[..., 0, :] = False
    fused, explicit = attention_lse(q, k, v, allowed, fused=True), attention_lse(q, k, v, allowed, fused=False)
    assert torch.allclose(fused[0], explicit[0], atol=1e-5) and torch.equal(fused[1].isinf(), explicit[1].isinf())
    finite = explicit[1].isfinite()
    assert torch.allclose(fused[1][finite], explicit[1][finite], atol=1e-5)
    assert (explicit[0][..., 0, :] == 0).all() and explicit[1][..., 0].eq(float("-inf")).all()
    logits = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(8)).masked_fill(~allowed, float("-inf"))
    assert torch.allclose(explicit[1][finite].double(), torch.logsumexp(logits, -1)[finite], atol=1e-5)


def test_a_torch_without_the_private_flash_kernel_takes_the_explicit_path(monkeypatch):
    """The private ATen op is looked up, not assumed: where torch has no op of that name the default path is the
    explicit one (same output), and forcing the fused one says what to do."""
    from lex_plugin.modules.attention.kernels import ops

    torch.manual_seed(4)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    allowed = torch.rand(5, 7) > 0.3
    assert ops.FLASH_CPU_KERNEL is not None  # this torch has it: the default is the fused kernel
    calls = []
    real = ops.FLASH_CPU_KERNEL
    monkeypatch.setattr(ops, "FLASH_CPU_KERNEL", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fused = ops.attention_lse(q, k, v, allowed)
    assert calls == [1]
    monkeypatch.setattr(ops, "FLASH_CPU_KERNEL", None)  # a torch that renamed or dropped the op
    out, lse = ops.attention_lse(q, k, v, allowed)
    assert torch.allclose(out, fused[0], atol=1e-5) and torch.allclose(lse, fused[1], atol=1e-5)
    with pytest.raises(RuntimeError, match="explicit path"):
        ops.attention_lse(q, k, v, allowed, fused=True)


@pytest.mark.parametrize("method", [ReRoPE(L_TRAIN // 2), DualChunk(3 * L_TRAIN // 4, L_TRAIN // 16)], ids=str)
@pytest.mark.parametrize("kind", ["xpos", "alibi"])
def test_padded_keys_are_hidden_under_a_position_map(method, kind, monkeypatch):
    """Left padding (a batch of prompts of different lengths): padded keys are seen by no query, under every
    piece; the real rows equal float64 attention with those keys masked."""
    from lex_plugin.modules.attention.kernels import remapped

    monkeypatch.setattr(remapped, "MAP_QUERY_BLOCK", 40)
    torch.manual_seed(4)
    B, H, D, length = 2, 2, 16, 4 * L_TRAIN
    q, k, v = (torch.randn(B, H, length, D) for _ in range(3))
    pad = torch.zeros(B, length, dtype=torch.bool)
    pad[1, :5] = True
    dist = torch.tensor([[paper_distance(method, n, m) if m <= n else 0.0 for m in range(length)]
                         for n in range(length)], dtype=torch.float64)
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = (visible[None, None] & ~pad[:, None, None, :]) | torch.eye(length, dtype=torch.bool)
    expected = naive(q, k, v, dist, allowed, kind, H)
    got = run(q, k, v, AttentionSpec(position_map=method), scheme_of(kind, H, D), key_padding_mask=pad)
    real = ~pad
    assert (got.double() - expected).abs().permute(0, 2, 1, 3)[real].max() < 2e-5


@pytest.mark.parametrize("start,end,block", [(0, 4096, 2048), (5, 3000, 500), (700, 705, 2048), (0, 1, 40)])
def test_dca_query_blocks_end_at_chunk_boundaries(start, end, block):
    """DCA's query blocks tile [start, end) in order, none longer than the block, none straddling a chunk of c
    positions (inside one chunk the successive and inter-chunk pieces need no mask); other maps cut every block."""
    dca = DualChunk(768, 64)
    c = dca.chunk_length
    blocks = dca.query_blocks(start, end, block)
    assert blocks[0][0] == start and blocks[-1][1] == end
    assert all(a < b <= a + block for a, b in blocks)
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(blocks, blocks[1:]))
    assert all(a // c == (b - 1) // c for a, b in blocks)
    assert ReRoPE(128).query_blocks(start, end, block) == [(a, min(end, a + block)) for a in range(start, end, block)]


@pytest.mark.parametrize("method,dtype,scale_base,length", [
    (None, torch.float32, 8, 2048), (None, torch.bfloat16, 8, 2048), (None, torch.float16, 128, 4096),
    (SelfExtend(2, 8), torch.float32, 8, 4096), (LeakyReRoPE(8, 2.0), torch.float32, 8, 4096),
], ids=str)
def test_xpos_stays_finite_and_exact_far_past_its_scale_range(method, dtype, scale_base, length):
    """Full attention (one parallel pass) and position maps whose far keys sit at m / G: with a small scale base
    B, zeta_0^(+-L/2B) about the middle of the keys would overflow the dtype (e^160 in fp32 at L = 2048, B = 8;
    e^20 in fp16 at L = 4096, B = 128). Rotated about the middle of each chunk's queries, in chunks the planner
    bounds by the dtype's range, every output is finite and equals float64 attention of Eq. 12."""
    from lex_plugin.modules.attention import dense_query_limit

    torch.manual_seed(3)
    H, D = 1, 16
    q, k, v = (torch.randn(1, H, length, D).to(dtype) for _ in range(3))
    scheme, spec = XPos(D, scale_base=scale_base), AttentionSpec(position_map=method)
    chunks = plan(spec.window, q_len=length, dense_queries=dense_query_limit(scheme, dtype))
    if method is None:
        assert len(chunks) > 1  # the range bounds a chunk's queries
    got = attend(q, HeldKeys(k, v), chunks, spec=spec, scheme=scheme).double()
    assert torch.isfinite(got).all()
    m = torch.arange(length)
    for a in range(0, length, 512):  # the float64 reference, by blocks of queries
        n = torch.arange(a, a + 512)
        dist = (n[:, None] - m[None, :]).clamp(min=0).double()
        if isinstance(method, SelfExtend):  # the papers' formulas (paper_distance), vectorized
            G, w = method.group, method.window
            dist = torch.where(dist < w, dist, (n[:, None] // G - m[None, :] // G + w - w // G).clamp(min=0).double())
        elif isinstance(method, LeakyReRoPE):
            dist = torch.where(dist < method.window, dist, method.window + (dist - method.window) / method.k)
        expected = naive(q[:, :, a : a + 512], k, v, dist, m[None, :] <= n[:, None], "xpos", H, scale_base)
        assert (got[:, :, a : a + 512] - expected).abs().max() < {torch.float32: 2e-5}.get(dtype, 3e-2)


@pytest.mark.parametrize("method", ["self_extend", "dca", "leaky_rerope"])
def test_a_generation_step_rotates_only_the_new_keys_of_each_far_piece(method, monkeypatch):
    """The cache keeps each piece's rotated keys between steps (kv_cache.RotatedPieces): past the prefill, a step
    rotates a handful of keys at most (the exact pieces' window and the new key), not all of them; and the logits
    are those of one parallel forward (1e-4), xPos whose scale moves with the piece's centre included."""
    from lex_plugin.modules.positions.xpos import XPos as Scheme

    model = build_lex_model(pos_emb="xpos", decoder_layers=1, tokens_per_sample=L_TRAIN).eval()
    spec = AttentionSpec(position_map=position_map_from_options(method, L_TRAIN))
    tokens = random_tokens(model.decoder.dictionary, 1, 12 * L_TRAIN)
    rotated = []
    original = Scheme.rotate_at

    def counting(self, x, positions, **kw):
        if kw.get("keys"):
            rotated.append(x.size(-2))
        return original(self, x, positions, **kw)

    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        monkeypatch.setattr(Scheme, "rotate_at", counting)
        state = {}
        outs = [model(tokens[:, : 2 * L_TRAIN], incremental_state=state, spec=spec)[0]]
        per_step = []
        for t in range(2 * L_TRAIN, tokens.size(1)):
            rotated.clear()
            outs.append(model(tokens[:, : t + 1], incremental_state=state, spec=spec)[0])
            per_step.append(sum(rotated))
    assert (torch.cat(outs, 1) - parallel).abs().max() <= 1e-4
    # at most the exact pieces' keys (< l) and a few new ones per step, with a rare start-over at a new centre; DCA's
    # three pieces share one rotated copy of the keys (each at m mod c about one centre): the new key alone
    bound = 1 if method == "dca" else L_TRAIN + 2
    assert sorted(per_step)[len(per_step) // 2] <= bound, per_step


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_the_pieces_partition_the_pairs_at_the_formula_distance(method):
    """Every (query, key) pair of a block is scored by exactly one piece, at the paper's distance (its query position
    minus its key position), for blocks inside one DCA chunk (whole ranges, no select) and straddling chunks."""
    for n0, n1, m0 in ((40, 41, 0), (40, 48, 0), (17, 60, 0), (100, 101, 5), (70, 90, 30)):
        n, m = torch.arange(n0, n1), torch.arange(m0, n1)
        count = torch.zeros(n.numel(), m.numel(), dtype=torch.long)
        for piece in method.pieces(n, m):
            select = torch.ones(n.numel(), piece.hi - piece.lo, dtype=torch.bool) if piece.select is None else piece.select
            count[:, piece.lo : piece.hi] += select
            for i, j in select.nonzero().tolist():
                if m[piece.lo + j] <= n[i]:
                    got = float(piece.q_pos[i] - piece.k_pos[j])
                    assert got == pytest.approx(paper_distance(method, int(n[i]), int(m[piece.lo + j]))), (n0, n1, i, j)
        causal = m[None, :] <= n[:, None]
        assert (count[causal] == 1).all(), (n0, n1, m0)


def test_a_reorder_of_the_batch_starts_the_rotated_pieces_over():
    """Beam search reorders the cache's rows: the kept rotated keys must follow (they start over), so the steps after
    a swap of the two rows equal a parallel forward of the swapped rows."""
    model = build_lex_model(pos_emb="rope", decoder_layers=1, tokens_per_sample=L_TRAIN).eval()
    spec = AttentionSpec(position_map=position_map_from_options("self_extend", L_TRAIN))
    tokens = random_tokens(model.decoder.dictionary, 2, 6 * L_TRAIN, seed=3)
    swap = torch.tensor([1, 0])
    with torch.no_grad():
        state = {}
        model(tokens[:, : 4 * L_TRAIN], incremental_state=state, spec=spec)
        for t in range(4 * L_TRAIN, 5 * L_TRAIN):
            model(tokens[:, : t + 1], incremental_state=state, spec=spec)
        model.decoder.reorder_incremental_state_scripting(state, swap)
        swapped = tokens[swap]
        steps = [model(swapped[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(5 * L_TRAIN, 6 * L_TRAIN)]
        parallel = model(swapped, spec=spec)[0][:, 5 * L_TRAIN:]
    assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", [m for m in METHODS if not isinstance(m, LeakyReRoPE)] + [LeakyReRoPE(L_TRAIN // 2, 4.0)],
                         ids=str)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_one_query_steps_equal_the_formula_with_padding(method, dtype, padded):
    """A generation step (one query over every key before it, as a cache holds them, the pieces' logits in one row and
    one softmax) equals float64 attention at the paper's distances for rotary schemes, with a left-padded sample
    (and without padding: every key visible, no mask formed), for the last queries of 4l; bf16 inputs within bf16's
    resolution."""
    torch.manual_seed(6)
    B, H, D, length = 2, 2, 16, 4 * L_TRAIN
    q, k, v = (torch.randn(B, H, length, D).to(dtype) for _ in range(3))
    pad = torch.zeros(B, length, dtype=torch.bool)
    pad[1, :9] = padded
    dist = torch.tensor([[paper_distance(method, n, m) if m <= n else 0.0 for m in range(length)]
                         for n in range(length)], dtype=torch.float64)
    allowed = (torch.ones(length, length, dtype=torch.bool).tril()[None, None] & ~pad[:, None, None, :]) | torch.eye(
        length, dtype=torch.bool)
    expected = naive(q, k, v, dist, allowed, "xpos", H)
    spec = AttentionSpec(position_map=method)
    for t in range(length - 5, length):
        chunks = plan(spec.window, q_start=t, q_len=1, padded=padded)
        got = attend(q[:, :, t : t + 1], HeldKeys(k[:, :, : t + 1], v[:, :, : t + 1], pad[:, : t + 1] if padded else None),
                     chunks, spec=spec,
                     scheme=XPos(D), q_start=t)
        assert got.dtype == dtype
        assert (got.double() - expected[:, :, t : t + 1]).abs().max() < (2e-5 if dtype == torch.float32 else 3e-2)


def test_a_raw_cache_is_laid_out_for_one_query_under_a_position_map(monkeypatch):
    """Under a position map the cache holds raw keys; single steps re-lay it feature-major (the one-row step reads
    values as long rows) and the logits stay those of one parallel forward."""
    from lex_plugin.modules.attention import kv_cache

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 20)
    model = build_lex_model(pos_emb="xpos", decoder_layers=2).eval()
    spec = AttentionSpec(position_map=position_map_from_options("self_extend", L_TRAIN))
    tokens = random_tokens(model.decoder.dictionary, 1, 3 * L_TRAIN)
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        state = {}
        outs = [model(tokens[:, : 2 * L_TRAIN], incremental_state=state, spec=spec)[0]]
        outs += [model(tokens[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(2 * L_TRAIN, 3 * L_TRAIN)]
    assert model.decoder.layers[0].self_attn.cache(state).feature_major
    assert (torch.cat(outs, 1) - parallel).abs().max() <= 1e-4


@pytest.mark.parametrize("queries", [1, 64])
def test_dca_keeps_xpos_finite_in_fp16_at_a_large_chunk_size(queries):
    """DCA's pieces share one centre (s / 2) only where the scale allows it about every position they use: at l = 16k
    (s = 12288) xPos's scale about s / 2 leaves fp16's range, so each piece takes its own centre again, and queries
    of the second chunk (one step, and a block of 64) stay finite and equal fp32's within fp16's resolution."""
    method, D = DualChunk(12288, 1024), 16
    c = method.chunk_length
    scheme = XPos(D)
    assert scheme.max_center_offset(torch.float16) < method.max_position - scheme.center_near(method.max_position // 2)
    torch.manual_seed(11)
    total = c + 101
    q, k, v = (torch.randn(1, 2, total, D) for _ in range(3))
    spec = AttentionSpec(position_map=method)
    t = total - queries
    out = {}
    for dtype in (torch.float32, torch.float16):
        chunks = plan(spec.window, q_start=t, q_len=queries)
        out[dtype] = attend(q[:, :, t:].to(dtype), HeldKeys(k.to(dtype), v.to(dtype)), chunks, spec=spec, scheme=scheme,
                            q_start=t)
    assert torch.isfinite(out[torch.float16]).all()
    assert (out[torch.float16].float() - out[torch.float32]).abs().max() < 1e-2


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_an_observer_of_one_query_gets_the_windows_mask(method):
    """A one-query step with no padding forms no mask for its own softmax, but its observer still gets the (Tq, Tk)
    visibility of the window (what lex resolution expands over its logits) and the logits of every key."""
    torch.manual_seed(4)
    D, t = 16, 3 * L_TRAIN
    q, k, v = (torch.randn(1, 2, t + 1, D) for _ in range(3))
    seen = []
    attend(q[:, :, t:], HeldKeys(k, v), plan(AttentionWindow.full(), q_start=t, q_len=1),
           spec=AttentionSpec(position_map=method), scheme=XPos(D), q_start=t,
           observer=lambda logits, distance, visible: seen.append((logits.shape, visible.shape, bool(visible.all()))))
    assert seen == [(torch.Size([1, 2, 1, t + 1]), torch.Size([1, t + 1]), True)]


@pytest.mark.parametrize("method", [m for m in METHODS if not isinstance(m, LeakyReRoPE)] + [LeakyReRoPE(L_TRAIN // 2, 4.0)],
                         ids=str)
def test_bf16_steps_over_a_long_cache_take_per_head_products_and_equal_the_formula(method, monkeypatch):
    """Past HALF_STEP_FP32_KEYS keys a bf16 step under a position map runs its long pieces' products per head in bf16:
    the last queries of 2,600 keys equal float64 attention at the paper's distances within bf16's resolution."""
    from lex_plugin.modules.attention.kernels import ops

    calls = []
    original = ops.per_head_products
    monkeypatch.setattr(ops, "per_head_products", lambda a, b: calls.append(1) or original(a, b))
    torch.manual_seed(8)
    B, H, D, length = 1, 2, 16, 2600
    q, k, v = (torch.randn(B, H, length, D).bfloat16() for _ in range(3))
    spec = AttentionSpec(position_map=method)
    for t in (length - 2, length - 1):
        dist = torch.tensor([[paper_distance(method, t, m) for m in range(t + 1)]], dtype=torch.float64)
        expected = naive(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], dist,
                         torch.ones(1, t + 1, dtype=torch.bool), "xpos", H)
        got = attend(q[:, :, t : t + 1], HeldKeys(k[:, :, : t + 1], v[:, :, : t + 1]), plan(spec.window, q_start=t, q_len=1),
                     spec=spec, scheme=XPos(D), q_start=t)
        assert got.dtype == torch.bfloat16
        assert (got.double() - expected).abs().max() < 3e-2
    assert calls


def test_rotated_pieces_keep_one_copy_per_kind_and_rotate_a_piece_they_do_not_reach():
    """RotatedPieces.keys: a piece whose keys the kept copy reaches is a slice of it (only the new keys rotated); a piece
    starting beyond the copy, or about another centre, is rotated alone and leaves the copy as it was."""
    from lex_plugin.modules.attention.kv_cache import RotatedPieces

    torch.manual_seed(3)
    raw = torch.randn(1, 2, 12, 4)
    positions = torch.arange(12) % 5
    rotated = []

    def rotate(keys, pos, center=0):
        rotated.append(keys.size(2))
        return keys * (1 + pos.float()[:, None] - center)

    memo = RotatedPieces()
    expected = rotate(raw, positions)
    rotated.clear()
    assert torch.equal(memo.keys("chunk", 0, raw, 0, 6, positions[:6], rotate), expected[:, :, :6])
    assert torch.equal(memo.keys("chunk", 0, raw, 6, 9, positions[6:9], rotate), expected[:, :, 6:9])  # extends the copy
    assert rotated == [6, 3]
    assert torch.equal(memo.keys("chunk", 0, raw, 10, 12, positions[10:], rotate), expected[:, :, 10:])  # beyond it
    assert torch.equal(memo.keys("chunk", 4, raw, 2, 5, positions[2:5], lambda k, p: rotate(k, p, 4)),
                       rotate(raw[:, :, 2:5], positions[2:5], 4))  # another centre
    rotated.clear()
    assert torch.equal(memo.keys("chunk", 0, raw, 0, 9, positions[:9], rotate), expected[:, :, :9]) and rotated == []

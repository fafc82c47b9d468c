"""The forgetting transformer's forget gate (modules/designs/forget_gate.py; Lin et al. 2025, Forgetting Attention): against
the paper's formula written out in float64 (D_nm = sum_{m < t <= n} log sigmoid(w_f . x_t + b_f) summed term by term
for each pair, not as a difference of running sums; xPos and RoPE from their complex-number formula), gradients of
every projection and of the gate included, under full attention, BCA and a sliding window; token by token through the
cache equal to the parallel forward, alone and in the global layer of a pattern; finite and exact at a long length
where the running sum is large; the candidates' branches of the probes; the export; what it cannot take refused."""

import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, check_design_model, heads64, random_tokens, window_mask
from lex_plugin.modules.attention import AttentionOptions, AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.attention.branch_cache import branch_incremental_state
from lex_plugin.modules.attention.kernels.run import ChunkRun
from lex_plugin.modules.attention.kv_cache import fork_incremental_state
from lex_plugin.modules.designs import ForgetGate, LearnedSinks
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.scheme import NoPositions
from test_xpos import rotated_qkv64

L = 16
D = 16  # head dimension: 64 / 4 heads


def reference(attn: LexSelfAttention, x: torch.Tensor, scheme, window=None, padding=None, sinks=None) -> torch.Tensor:
    """The forget gate's attention in float64: log f_t = log sigmoid(w_f . x_t + b_f) per head; for each pair m <= n
    the sum of log f_t over m < t <= n added to q_n . k_m / sqrt(d) (the position scheme from its complex-number
    formula); the window's mask (default: causal); padded keys hidden but from themselves; a learned sink logit in the
    denominator where given; softmax, values, the output projection."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = rotated_qkv64(attn, x, scheme)
    gates = torch.nn.functional.logsigmoid(heads64(x, attn.forget_proj, H)[..., 0])  # (B, H, T)
    decay = torch.zeros(B, H, T, T, dtype=torch.float64)
    for n in range(T):
        for m in range(n):
            decay[:, :, n, m] = gates[:, :, m + 1 : n + 1].sum(-1)
    visible = window_mask(window or AttentionWindow.full(), T)
    if padding is not None:
        visible = visible & (~padding[:, None, None, :] | torch.eye(T, dtype=torch.bool))
    logits = ((q @ k.transpose(-1, -2)) / math.sqrt(d) + decay).masked_fill(~visible, float("-inf"))
    if sinks is not None:
        logits = torch.cat([sinks.double().view(1, H, 1, 1).expand(B, H, T, 1), logits], -1)
    weights = torch.softmax(logits, -1)[..., (0 if sinks is None else 1):]
    out = (weights @ v).transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def _fox(sinks: bool = False, seed: int = 0) -> LexSelfAttention:
    torch.manual_seed(seed)
    attn = LexSelfAttention(64, 4, designs=[ForgetGate()] + ([LearnedSinks()] if sinks else []))
    with torch.no_grad():  # gates spread over (0, 1): a bias from -2 to 3 per head
        attn.forget_proj.bias.copy_(torch.linspace(-2.0, 3.0, 4))
        if sinks:
            attn.sink_logits.uniform_(-1.0, 1.0)
    return attn


WINDOWS = {"full": AttentionWindow.full(), "bca": AttentionWindow.bca(16), "sliding": AttentionWindow.sliding(12)}


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("scheme", [NoPositions(), XPos(D, use_scale=False), XPos(D)], ids=["nope", "rope", "xpos"])
def test_the_forget_gate_equals_the_papers_formula_in_float64_with_its_gradients(scheme, window):
    attn = _fox()
    x = torch.randn(2, 45, 64)
    spec = AttentionSpec(WINDOWS[window])
    got = attn(x, scheme=scheme, spec=spec)
    expected = reference(attn, x, scheme, window=WINDOWS[window])
    check_against_float64(attn, got, expected, [attn.forget_proj.weight, attn.forget_proj.bias, attn.q_proj.weight,
                                                attn.k_proj.weight, attn.v_proj.weight])


def test_with_learned_sink_logits_the_sink_stays_undecayed_in_each_softmax():
    attn = _fox(sinks=True)
    x = torch.randn(2, 30, 64)
    got = attn(x, scheme=XPos(D))
    check_against_float64(attn, got, reference(attn, x, XPos(D), sinks=attn.sink_logits),
                          [attn.sink_logits, attn.forget_proj.bias])


def test_gates_that_never_forget_are_the_plain_attention():
    """A bias of +40 makes every f_t = 1 within fp32 (log f = -4e-18): the plain layer's output."""
    attn = _fox()
    plain = LexSelfAttention(64, 4)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("forget_proj")})
    with torch.no_grad():
        attn.forget_proj.weight.zero_()
        attn.forget_proj.bias.fill_(40.0)
        x = torch.randn(2, 50, 64)
        assert (attn(x, scheme=XPos(D)) - plain(x, scheme=XPos(D))).abs().max() <= 1e-6


def test_finite_and_exact_where_the_running_sum_is_large():
    """Gates near 0.05 (log f = -3 a token) over 3,000 positions: the running sum reaches -9,000, where fp32 keeps
    steps of 1e-3; the float64 sum keeps each difference exact. Against float64 formed the same way (the last query
    over a 200-key window of the causal map, the far keys' weights below exp(-600))."""
    attn = _fox()
    with torch.no_grad():
        attn.forget_proj.weight.mul_(0.01)
        attn.forget_proj.bias.fill_(-3.0)
        x = torch.randn(1, 3000, 64)
        got = attn(x, scheme=XPos(D))
        assert torch.isfinite(got).all()
        tail = reference(attn, x[:, -200:], XPos(D))  # the decay is by index: the last 200 positions alone
        assert (got[:, -1].double() - tail[:, -1]).abs().max() < 1e-5


def test_keys_beyond_the_decays_horizon_are_left_out_and_the_output_is_unchanged(monkeypatch):
    """Gates near 0.05 (log f = -3 a token) over 5,000 positions, planned in chunks of 838 queries: each chunk after the first
    leaves out the keys whose weights the bound puts below exp(-110) of the row's largest (all but a few dozen), and the output
    equals the same attention over every key (an observer's run keeps them all) to fp32's rounding, at every query.
    Gates that never forget (a bias of +40) leave out nothing."""
    attn = _fox()
    skipped = []
    horizon = ChunkRun.decay_horizon
    monkeypatch.setattr(ChunkRun, "decay_horizon", lambda run, *a: skipped.append(horizon(run, *a)) or skipped[-1])
    with torch.no_grad():
        attn.forget_proj.weight.mul_(0.01)
        attn.forget_proj.bias.fill_(-3.0)
        x = torch.randn(1, 5000, 64)
        got = attn(x, scheme=XPos(D))
        # chunk i starts at query 838 i and keeps under 64 keys before it (e^(-3 * 64) is far below e^(-110))
        assert len(skipped) == 6 and all(max(0, 838 * i - 64) <= s <= 838 * i for i, s in enumerate(skipped)), skipped
        every = attn(x, scheme=XPos(D), observer=lambda *args: None)
        assert (got - every).abs().max() <= 1e-6
        skipped.clear()
        attn.forget_proj.bias.fill_(40.0)
        attn(x, scheme=XPos(D))
        assert skipped and not any(skipped)


@pytest.mark.parametrize("padded", [False, True])
def test_right_padded_keys_are_hidden_as_if_the_row_were_alone(padded):
    attn = _fox()
    x = torch.randn(2, 40, 64)
    padding = torch.zeros(2, 40, dtype=torch.bool)
    padding[1, 29:] = True
    with torch.no_grad():
        batch = attn(x, scheme=XPos(D), key_padding_mask=padding if padded else None)
        alone = attn(x[1:, :29], scheme=XPos(D))
    assert torch.isfinite(batch).all() and (batch[1, :29] - alone[0]).abs().max() <= 1e-5


def test_generation_equals_the_parallel_forward_and_the_export_gives_the_same_logits():
    for options in (dict(pos_emb="none", forget_gate=True), dict(pos_emb="rope", forget_gate=True)):
        model = build_lex_model(tokens_per_sample=L, seed=3, **options)
        assert all(layer.self_attn._forget is not None for layer in model.decoder.layers)
        check_design_model(model, options, L, specs=[AttentionSpec(), AttentionSpec(AttentionWindow.bca(L)),
                                                     AttentionSpec(AttentionWindow.sliding(L))])


def test_in_the_global_layer_of_a_pattern_with_the_local_layers_windows():
    options = dict(pos_emb="xpos", forget_gate=True, layer_pattern="xpos/bca*3,none/full")
    model = build_lex_model(tokens_per_sample=L, seed=5, **options)
    assert [m.self_attn._forget is not None for m in model.decoder.layers] == [False, False, False, True]
    check_design_model(model, options, L, specs=[AttentionSpec(), AttentionSpec(AttentionWindow.bca(L))])


SPECS = {"full": AttentionSpec(), "bca": AttentionSpec(AttentionWindow.bca(L)),
         "sliding": AttentionSpec(AttentionWindow.sliding(12))}


@pytest.mark.parametrize("spec", list(SPECS))
def test_chunked_prefill_and_branches_continue_the_prompts_decay(spec):
    """A prompt read 7 positions at a time after a first 10 (the cache trimmed by the window between segments: keys
    and queries start past 0), and the probes' candidates as branches of its cache (``BranchCache``: 13 positions, so
    a bounded window drops the whole prompt and some of each branch's own keys): each equals the whole sequence in one
    pass."""
    model = build_lex_model(tokens_per_sample=L, seed=2, pos_emb="xpos", forget_gate=True).under(SPECS[spec])
    prompt = random_tokens(model.decoder.dictionary, 1, 3 * L, seed=1)
    tails = random_tokens(model.decoder.dictionary, 3, 13, seed=2)
    with torch.no_grad():
        state: dict = {}
        parts = [model.decoder(prompt[:, :10], incremental_state=state)[0]]
        parts += [model.decoder(prompt[:, : t + 7], incremental_state=state)[0] for t in range(10, prompt.size(1), 7)]
        assert (torch.cat(parts, 1) - model(prompt)[0]).abs().max() <= 1e-4
        branches = branch_incremental_state(state, rows=3)
        whole = torch.cat([prompt.expand(3, -1), tails], 1)
        got = model.decoder(whole, incremental_state=branches)[0]
        expected = model(whole)[0][:, -13:]
    assert (got - expected).abs().max() <= 1e-4


def test_beam_reorder_and_fork_carry_the_decay_with_the_keys():
    """Rows swapped (beam search) and a forked state continued apart: each row's next logits equal its sequence run
    in one pass."""
    model = build_lex_model(tokens_per_sample=L, seed=4, pos_emb="none", forget_gate=True)
    tokens = random_tokens(model.decoder.dictionary, 2, 2 * L + 3, seed=3)
    with torch.no_grad():
        state: dict = {}
        model.decoder(tokens[:, :-3], incremental_state=state)
        twin = fork_incremental_state(state)
        model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 0]))
        swapped = tokens.flip(0)
        got = [model.decoder(swapped[:, : t + 1], incremental_state=state)[0] for t in range(2 * L, 2 * L + 3)]
        assert (torch.cat(got, 1) - model(swapped)[0][:, -3:]).abs().max() <= 1e-4
        got = [model.decoder(tokens[:, : t + 1], incremental_state=twin)[0] for t in range(2 * L, 2 * L + 3)]
        assert (torch.cat(got, 1) - model(tokens)[0][:, -3:]).abs().max() <= 1e-4


def test_what_it_cannot_take_is_refused():
    model = build_lex_model(tokens_per_sample=L, forget_gate=True)
    tokens = random_tokens(model.decoder.dictionary, 1, 3 * L)
    for spec, flag in ((AttentionSpec(AttentionWindow.bca(L).with_sinks(2)), "--sink-tokens"),
                       (AttentionOptions("rerope").spec(L), "a position map"),
                       (AttentionOptions("bca", retrieval_blocks=1).spec(L), "--retrieval-blocks")):
        with pytest.raises(ValueError, match=f"{flag} on a model trained with forget_gate"):
            model.under(spec)(tokens)
    with pytest.raises(ValueError, match=r"forget_gate \(--forget-gate\) acts in the global layers of a pattern"):
        build_lex_model(tokens_per_sample=L, forget_gate=True, pos_emb="xpos", layer_pattern="xpos/bca*4")
    with pytest.raises(ValueError, match="forget_gate and moba: .* train with one of them"):
        build_lex_model(tokens_per_sample=L, forget_gate=True, moba_topk=2)


def test_the_gates_stay_fp32_under_bf16_autocast():
    """Each position's log gate adds into the running sum, so its projection runs in fp32 under autocast: the gates of
    a bf16-autocast pass equal the fp32 pass's (the projection rounded to bf16 would move them by ~1e-2)."""
    attn = _fox()
    x = torch.randn(2, 30, 64)
    gate = attn.designs[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = gate.log_forget(attn, x)
    assert under.dtype == torch.float32 and (under - gate.log_forget(attn, x)).abs().max() <= 1e-6


def test_left_padding_leaves_the_real_positions_as_the_row_alone():
    """Left padding (NoPE: no position moves): the pads' gates lie before every real key, outside each real pair's
    (m, n], and the pads are hidden as keys, so the real positions equal the row run alone."""
    attn = _fox()
    x = torch.randn(1, 30, 64)
    padded = torch.cat([torch.randn(1, 5, 64), x], 1)
    padding = torch.zeros(1, 35, dtype=torch.bool)
    padding[:, :5] = True
    with torch.no_grad():
        got = attn(padded, scheme=NoPositions(), key_padding_mask=padding)[:, 5:]
        alone = attn(x, scheme=NoPositions())
    assert (got - alone).abs().max() <= 1e-5

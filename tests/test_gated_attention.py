"""Gated attention (modules/designs/gated_attention.py; Qiu et al. 2025, arXiv 2505.06708, G1): against its formula
written out in float64, gradients included; token by token through the cache against the parallel forward, under
full attention, BCA and inside a layer pattern; recorded and exported to Hugging Face with the same logits; a kind
it does not know refused."""

import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, check_design_model, heads64, window_mask, xpos_pair
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.designs import AttentionGate
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.scheme import NoPositions

L = 16


def _reference(attn: LexSelfAttention, x: torch.Tensor, scheme, window: AttentionWindow, kind: str) -> torch.Tensor:
    """Gated attention in float64, written out: projections, the position scheme, softmax(q k^T / sqrt(d)) v under the
    window's mask, each head's output times sigmoid(x W_g + b_g) (one gate per head, or per element), the heads merged,
    the output projection."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = (heads64(x, proj, H) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    x = x.double()
    if isinstance(scheme, XPos):
        q, k = xpos_pair(scheme, q, k, 0)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    logits = logits.masked_fill(~window_mask(window, T), float("-inf"))
    y = torch.softmax(logits, -1) @ v  # (B, H, T, d)
    gate = torch.sigmoid(x @ attn.gate_proj.weight.double().T + attn.gate_proj.bias.double())  # (B, T, H or C)
    y = y * (gate.view(B, T, H, 1) if kind == "headwise" else gate.view(B, T, H, d)).transpose(1, 2)
    out = y.transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
@pytest.mark.parametrize("scheme", [NoPositions(), XPos(16)], ids=["nope", "xpos"])
@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), 4 * L), (AttentionWindow.bca(L), 4 * L),
                                           (AttentionWindow.sliding(L), 8 * L)], ids=str)
def test_the_gate_equals_its_formula_in_float64_with_its_gradients(kind, scheme, window, length):
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 4, designs=[AttentionGate(kind)])
    assert attn.gate_proj.weight.shape == ((4, 64) if kind == "headwise" else (64, 64))
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme, spec=AttentionSpec(window))
    expected = _reference(attn, x, scheme, window, kind)
    check_against_float64(attn, got, expected, [attn.gate_proj.weight, attn.gate_proj.bias, attn.v_proj.weight])
    plain = LexSelfAttention(64, 4)
    plain.load_state_dict({n: p for n, p in attn.state_dict().items() if not n.startswith("gate_proj")})
    with torch.no_grad():
        assert (plain(x, scheme=scheme, spec=AttentionSpec(window)) - got).abs().max() > 1e-3  # the gate acts


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
def test_generation_equals_the_parallel_forward_in_a_pattern_and_the_export_gives_the_same_logits(kind):
    model = build_lex_model(tokens_per_sample=L, pos_emb="rope", attention_gate=kind, seed=3,
                            layer_pattern="rope/sliding:6,rope/full")
    names = {n for n, _ in model.named_parameters() if "gate" in n}
    assert names == {f"decoder.layers.{i}.self_attn.gate_proj.{w}" for i in range(4) for w in ("weight", "bias")}
    check_design_model(model, dict(pos_emb="rope", attention_gate=kind, layer_pattern="rope/sliding:6,rope/full"), L)


def test_a_kind_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="--attention-gate sigmoid: choose headwise or elementwise"):
        build_lex_model(tokens_per_sample=L, attention_gate="sigmoid")


def test_in_the_global_layers_only_with_the_local_layers_plain():
    """--attention-gate-layers global: the pattern's global layers get the gate, the local ones none (their output is
    the plain layer's: the same weights without the gate give the same local layers' hidden states)."""
    options = dict(pos_emb="xpos", attention_gate="elementwise", attention_gate_layers="global",
                   layer_pattern="xpos/bca*3,none/full", temperature_tuning_beta=0.1)
    model = build_lex_model(tokens_per_sample=L, seed=3, **options)
    names = {n for n, _ in model.named_parameters() if "gate" in n}
    assert names == {f"decoder.layers.3.self_attn.gate_proj.{w}" for w in ("weight", "bias")}
    check_design_model(model, options, L, specs=[AttentionSpec(), AttentionSpec(AttentionWindow.bca(L))])


def test_gate_layers_without_a_gate_or_a_global_layer_are_refused():
    with pytest.raises(ValueError, match="give --attention-gate headwise or elementwise too"):
        build_lex_model(tokens_per_sample=L, attention_gate_layers="global")
    with pytest.raises(ValueError, match="--attention-gate-layers everywhere: choose all or global"):
        build_lex_model(tokens_per_sample=L, attention_gate="headwise", attention_gate_layers="everywhere")
    with pytest.raises(ValueError, match="acts in the global layers of a pattern, and this one has none"):
        build_lex_model(tokens_per_sample=L, pos_emb="rope", attention_gate="headwise", attention_gate_layers="global",
                        layer_pattern="rope/sliding:6*4")

"""Differential attention (modules/designs/differential_attention.py; Ye et al., ICLR 2025, Eq. 1-3): against the
paper's formula written out in float64 (two d/2-dimensional maps; RoPE as the module splits it: the first map at the
paper's d/2-dimensional angles, the second 1/base^(2/d) lower; lambda re-parameterised, the head norm,
1 - lambda_init), gradients included; token by token through the cache against the parallel forward,
under full attention, BCA and inside a layer pattern; bf16 autocast; exported to Hugging Face with the same logits;
a head dimension it cannot split refused."""

import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, check_design_model, heads64, window_mask
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.designs.differential_attention import DifferentialAttention, lambda_init
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.scheme import NoPositions

L = 16
D = 16  # head dimension: 64 / 4 heads


def _rope64(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """RoPE in float64 on interleaved pairs of x (B, H, T, 2m) at positions 0 .., angles theta (m,)."""
    angle = torch.arange(x.size(-2), dtype=torch.float64)[:, None] * theta[None, :]  # (T, m)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()], -1).flatten(-2)


def _reference(attn: LexSelfAttention, x: torch.Tensor, rope: bool, window: AttentionWindow) -> torch.Tensor:
    """The paper in float64: Q1, K1 the even pairs of each head's dimensions and Q2, K2 the odd pairs (d' = d / 2),
    each map with RoPE of its own d' dimensions (the first map base^(-2j/d'), the second base^(-(4j + 2)/d), as the
    module docstring states), (softmax(Q1 K1^T / sqrt(d')) - lambda softmax(Q2 K2^T / sqrt(d'))) V under the window's
    mask, lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, RMSNorm per head, times 1 - lambda_init, the output
    projection."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = (heads64(x, proj, H) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    even = torch.tensor([i for i in range(d) if (i // 2) % 2 == 0])
    odd = torch.tensor([i for i in range(d) if (i // 2) % 2 == 1])
    half = d // 2
    j = torch.arange(half // 2, dtype=torch.float64)
    maps = []
    for dims, theta in ((even, 10000.0 ** (-2 * j / half)), (odd, 10000.0 ** (-(4 * j + 2) / d))):
        qm, km = q[..., dims], k[..., dims]
        if rope:
            qm, km = _rope64(qm, theta), _rope64(km, theta)
        logits = (qm @ km.transpose(-1, -2)) / math.sqrt(half)
        maps.append(torch.softmax(logits.masked_fill(~window_mask(window, T), float("-inf")), -1))
    dot = lambda a, b: (getattr(attn, a).double() * getattr(attn, b).double()).sum()  # noqa: E731
    init = lambda_init(attn.depth)
    lam = torch.exp(dot("lambda_q1", "lambda_k1")) - torch.exp(dot("lambda_q2", "lambda_k2")) + init
    y = (maps[0] - lam * maps[1]) @ v  # (B, H, T, d)
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + attn.diff_norm.eps) * attn.diff_norm.weight.double()
    out = (y * (1 - init)).transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("depth", [0, 3])
@pytest.mark.parametrize("scheme", [NoPositions(), XPos(D, use_scale=False)], ids=["nope", "rope"])
@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), 4 * L), (AttentionWindow.bca(L), 4 * L),
                                           (AttentionWindow.sliding(L), 8 * L)], ids=str)
def test_differential_attention_equals_the_papers_formula_in_float64_with_its_gradients(depth, scheme, window, length):
    torch.manual_seed(depth)
    attn = LexSelfAttention(64, 4, designs=[DifferentialAttention()], depth=depth)
    assert attn.lambda_q1.shape == (D // 2,) and attn.diff_norm.weight.shape == (D,)
    with torch.no_grad():
        attn.diff_norm.weight.uniform_(0.5, 1.5)  # away from its initial ones
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme, spec=AttentionSpec(window))
    expected = _reference(attn, x, isinstance(scheme, XPos), window)
    check_against_float64(attn, got, expected, [attn.lambda_q1, attn.lambda_k2, attn.diff_norm.weight, attn.q_proj.weight])


def test_lambda_init_follows_the_paper():
    """0.8 - 0.6 exp(-0.3 (l - 1)), l = 1 for the first layer: 0.2, then towards 0.8."""
    assert lambda_init(0) == pytest.approx(0.2) and lambda_init(1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    assert lambda_init(40) == pytest.approx(0.8, abs=1e-5)


def test_generation_equals_the_parallel_forward_in_a_pattern_and_the_export_gives_the_same_logits():
    model = build_lex_model(tokens_per_sample=L, pos_emb="rope", differential_attention=True, seed=3,
                            layer_pattern="rope/sliding:6,rope/full")
    names = {n for n, _ in model.named_parameters() if "lambda" in n or "diff_norm" in n}
    assert len(names) == 4 * 5 and [m.self_attn.depth for m in model.decoder.layers] == [0, 1, 2, 3]
    check_design_model(model, dict(pos_emb="rope", differential_attention=True, layer_pattern="rope/sliding:6,rope/full"), L)


def test_a_head_dimension_it_cannot_split_and_attention_dropout_are_refused():
    with pytest.raises(ValueError, match="head dimension \\(6\\) must be a multiple of 4"):
        build_lex_model(tokens_per_sample=L, differential_attention=True, decoder_embed_dim=24, decoder_attention_heads=4)
    with pytest.raises(ValueError, match="--attention-dropout 0.1: each map would drop"):
        build_lex_model(tokens_per_sample=L, differential_attention=True, attention_dropout=0.1)

"""Block retrieval at evaluation (``--bca --retrieval-blocks K``; modules/attention/retrieval.py, the blocks kernel):
on a model trained without it, each query sees BCA's window (its own block of l/2 and the previous one) and the K
earlier blocks whose mean key it scores highest. Against the rule written out in float64 (tests/test_moba.py's
reference with two local blocks), gradients included; K covering every block equal to full attention; token by token
through the cache equal to the parallel forward, alone and on the global layer of a pattern; through fairseq-eval-lm's
flags, the hub's keywords and the Hugging Face export's default spec; what it cannot combine with refused."""

import pytest
import torch

from conftest import build_lex_model, check_against_float64, check_design_model, random_tokens
from lex_plugin.modules.attention import AttentionOptions, AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.attention.kernels import blocks
from lex_plugin.modules.attention.retrieval import BlockRetrieval
from lex_plugin.modules.positions import XPos
from test_moba import D, reference

L = 16  # training length: blocks of 8


def _spec(k: int, length: int = L) -> AttentionSpec:
    return AttentionOptions("bca", retrieval_blocks=k).spec(length)


def test_the_flags_give_bcas_blocks_two_local_and_k_retrieved():
    spec = _spec(2)
    assert spec.retrieval == BlockRetrieval(block=L // 2, topk=4, local=2) and spec.window == AttentionWindow.full()
    assert str(spec) == "bca+retrieval(2)" and spec.fields()["mode"] == "bca" and spec.fields()["retrieval_blocks"] == 2
    assert spec.fields()["stride"] == L // 2


@pytest.mark.parametrize("path", ["masked", "gathered"])
@pytest.mark.parametrize("scheme", [XPos(D, use_scale=False), XPos(D)], ids=["rope", "xpos"])
@pytest.mark.parametrize("k,length", [(1, 64), (2, 70), (3, 40)], ids=str)
def test_retrieval_equals_its_rule_in_float64_with_its_gradients(scheme, k, length, path, monkeypatch):
    """Both of the kernel's ways (one masked SDPA call; each query's blocks gathered)."""
    monkeypatch.setattr(blocks, "DENSE_FACTOR", 1000 if path == "masked" else 0)
    torch.manual_seed(k)
    attn = LexSelfAttention(64, 4)
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme, spec=_spec(k))
    expected = reference(attn, x, scheme, L // 2, k + 2, local=2)
    check_against_float64(attn, got, expected, [attn.q_proj.weight, attn.k_proj.weight])


def test_k_covering_every_block_is_full_attention_and_one_block_less_is_not():
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 4)
    x = torch.randn(1, 10 * (L // 2), 64)
    full = attn(x, scheme=XPos(D))
    assert (attn(x, scheme=XPos(D), spec=_spec(8)) - full).abs().max() <= 1e-6
    assert (attn(x, scheme=XPos(D), spec=_spec(7)) - full).abs().max() > 1e-3  # the last query misses one block


@pytest.mark.parametrize("path", ["masked", "gathered"])
@pytest.mark.parametrize("pattern", [None, "xpos/sliding:4*3,xpos/full"])
def test_generation_equals_the_parallel_forward(pattern, path, monkeypatch):
    monkeypatch.setattr(blocks, "DENSE_FACTOR", 1000 if path == "masked" else 0)
    options = dict(pos_emb="xpos") if pattern is None else dict(pos_emb="xpos", layer_pattern=pattern)
    model = build_lex_model(tokens_per_sample=L, seed=2, **options)
    check_design_model(model, options, L, specs=[_spec(1), _spec(3)])


def test_the_hub_and_the_export_take_it_by_name(tmp_path):
    pytest.importorskip("transformers")
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config

    model = build_lex_model(tokens_per_sample=L, seed=1, pos_emb="xpos")
    tokens = random_tokens(model.decoder.dictionary, 1, 6 * L)
    with torch.no_grad():
        expected = model.under(_spec(2))(tokens)[0]
    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, pos_emb="xpos")
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    config = hf_config(args, model.decoder.dictionary, L)
    config.attention = {"mode": "bca", "retrieval_blocks": 2}
    hf = from_fairseq(model, config)
    with torch.no_grad():
        assert (hf(tokens).logits - expected).abs().max() <= 1e-5


def test_what_it_cannot_combine_with_is_refused():
    with pytest.raises(ValueError, match="--retrieval-blocks .* is an option of --bca"):
        AttentionOptions("sliding", retrieval_blocks=2).spec(L)
    with pytest.raises(ValueError, match="--sink-tokens 4 adds nothing"):
        AttentionOptions("bca", retrieval_blocks=2, sink_tokens=4).spec(L)
    with pytest.raises(ValueError, match="--logn counts the window's keys"):
        AttentionOptions("bca", retrieval_blocks=2, logn=True).spec(L)
    with pytest.raises(ValueError, match="must be at least 1"):
        AttentionOptions("bca", retrieval_blocks=0)
    model = build_lex_model(tokens_per_sample=L, moba_topk=2)
    with pytest.raises(ValueError, match="trained with moba: its layers choose their own blocks"):
        model.under(_spec(1))
    left = random_tokens(model.decoder.dictionary, 2, 3 * L)
    left[0, :5] = model.decoder.dictionary.pad()
    plain = build_lex_model(tokens_per_sample=L, pos_emb="xpos")
    with pytest.raises(ValueError, match="bca\\+retrieval\\(1\\) \\(its blocks count positions"):
        plain.under(_spec(1))(left)
    with pytest.raises(ValueError, match="trained with ssmax: its queries scale"):
        build_lex_model(tokens_per_sample=L, pos_emb="xpos", ssmax=True).under(_spec(1))
    with pytest.raises(ValueError, match="--pos-emb alibi's bias would not enter that gate"):
        build_lex_model(tokens_per_sample=L, pos_emb="alibi").under(_spec(1))

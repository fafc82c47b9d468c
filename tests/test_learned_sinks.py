"""Learned sink logits (--learned-sinks, gpt-oss): a learned logit per layer and head in every softmax's denominator.

Against a float64 reference written out with the sink as an explicit extra softmax column (gradients included), and,
on every chunk shape the executor has (windows, sink tokens, position maps, biases, padding, a generation cache), the
identity that defines it: with the sink, each query's output is the output without it times
sigmoid(lse - s_h), lse the log-sum-exp of the logits the query sees."""

import argparse
import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, heads64, random_tokens
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, HeldKeys, LexSelfAttention, attend, plan
from lex_plugin.modules.attention.position_map import position_map_from_options
from lex_plugin.modules.designs import LearnedSinks
from lex_plugin.modules.positions import ALiBi, NoPositions, XPos

L = 16


def _reference(attn, x, window):
    """softmax over [q k^T / sqrt(d) under the window's mask, s_h] in float64, the sink's column giving no value."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = (heads64(x, proj, H) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    i = torch.arange(T)
    logits = ((q @ k.transpose(-1, -2)) / math.sqrt(d)).masked_fill(~window.allowed(i[:, None], i[None, :]), float("-inf"))
    sink = attn.sink_logits.double()[None, :, None, None].expand(B, H, T, 1)
    probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    out = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), L), (AttentionWindow.full(), 4 * L),
                                           (AttentionWindow.bca(L), 4 * L), (AttentionWindow.sliding(L), 16 * L),
                                           (AttentionWindow.chunked(L), 16 * L)], ids=str)
def test_learned_sinks_equal_an_extra_softmax_column_in_float64_with_their_gradient(window, length):
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 4, designs=[LearnedSinks()])
    assert torch.equal(attn.sink_logits, torch.zeros(4))  # started at 0
    with torch.no_grad():
        attn.sink_logits.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))  # per head; 4 takes most of a short row
    x = torch.randn(2, length, 64)
    got = attn(x, spec=AttentionSpec(window))
    expected = _reference(attn, x, window)
    sinks, _ = check_against_float64(attn, got, expected, [attn.sink_logits, attn.k_proj.weight])
    assert sinks.abs().min() > 0  # every head's sink learns


def _attend_with_lse(q, k, v, spec, scheme, sink, padding=None, q_start=0):
    """attend() on every chunk of its plan, and the log-sum-exp of each query's visible logits as the observer
    hands them over (B, H, T); the output is checked equal to attend() without an observer (which takes the fused
    paths an observer rules out: BCA's windows with sink tokens)."""
    lses = []

    def observer(logits, distance, visible):
        lse = torch.logsumexp(logits.float().masked_fill(~visible, float("-inf")), dim=-1)
        lses.append(lse.flatten(2))

    chunks = plan(spec.window, q_start=q_start, q_len=q.size(2), has_bias=scheme.kind == "bias" or spec.window.sinks > 0,
                  padded=padding is not None, batch_heads=q.size(0) * q.size(1), local_positions=scheme.translation_invariant)
    out = attend(q, HeldKeys(k, v, padding), chunks, spec=spec, scheme=scheme, observer=observer, sink_logits=sink)
    fused = attend(q, HeldKeys(k, v, padding), chunks, spec=spec, scheme=scheme, sink_logits=sink)
    assert (fused - out).abs().max() < 1e-5
    return out, torch.cat(lses, dim=-1)


CASES = [
    ("bca+2 sinks (fused)", AttentionSpec(AttentionWindow.bca(L).with_sinks(2)), XPos(16), False),
    ("sliding+2 sinks", AttentionSpec(AttentionWindow.sliding(L).with_sinks(2)), XPos(16), False),
    ("lm_infinite", AttentionSpec(AttentionWindow.lm_infinite(3, L)), XPos(16), False),
    ("rerope", AttentionSpec(position_map=position_map_from_options("rerope", L)), XPos(16), False),
    ("self_extend", AttentionSpec(position_map=position_map_from_options("self_extend", L)), XPos(16), False),
    ("dca", AttentionSpec(position_map=position_map_from_options("dca", L)), XPos(16), False),
    ("alibi full", AttentionSpec(), ALiBi(4), False),
    ("alibi bca", AttentionSpec(AttentionWindow.bca(L)), ALiBi(4), False),
    ("alibi rerope", AttentionSpec(position_map=position_map_from_options("rerope", L)), ALiBi(4), False),
    ("padded sliding", AttentionSpec(AttentionWindow.sliding(L)), NoPositions(), True),
    ("padded full", AttentionSpec(), XPos(16), True),
]


@pytest.mark.parametrize("name,spec,scheme,padded", CASES, ids=[c[0] for c in CASES])
def test_the_sink_scales_every_chunk_shape_by_sigmoid_of_lse_minus_its_logit(name, spec, scheme, padded):
    torch.manual_seed(1)
    B, H, T, D = 2, 4, 4 * L + 3, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    padding = None
    if padded:
        padding = torch.zeros(B, T, dtype=torch.bool)
        padding[0, 5:9] = True  # padded keys inside the sequence: explicit masks
    sink = torch.tensor([-1.0, 0.5, 2.0, 4.0])
    plain, lse = _attend_with_lse(q, k, v, spec, scheme, None, padding)
    with_sink, lse_again = _attend_with_lse(q, k, v, spec, scheme, sink, padding)
    assert torch.equal(lse, lse_again)  # the observer's logits are the keys', without the sink
    expected = plain.double() * torch.sigmoid(lse.double() - sink.double()[:, None])[..., None]
    assert (with_sink.double() - expected).abs().max() < 1e-5, name
    assert (with_sink - plain).abs().max() > 1e-2  # the sink changes something


def test_generation_with_learned_sinks_equals_the_parallel_forward_and_is_exported(monkeypatch):
    """Token by token through the cache (its one-query feature-major path too: laid out so from 20 keys on) equals one
    parallel forward, under full attention, BCA and ReRoPE, with a layer pattern mixing a sliding and a global layer;
    the Hugging Face export records the option and gives the same logits."""
    from lex_plugin.modules.attention import kv_cache

    monkeypatch.setattr(kv_cache, "FEATURE_MAJOR_KEYS", 20)
    model = build_lex_model(tokens_per_sample=L, pos_emb="rope", learned_sinks=True, seed=3,
                            layer_pattern="rope/sliding:6,rope/full")
    names = {n for n, _ in model.named_parameters() if "sink" in n}
    assert names == {f"decoder.layers.{i}.self_attn.sink_logits" for i in range(4)}
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.sink_logits.uniform_(-1.0, 3.0)
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=4)
    for spec in (AttentionSpec(), AttentionSpec(AttentionWindow.bca(L)),
                 AttentionSpec(position_map=position_map_from_options("rerope", L))):
        view = model.under(spec)
        with torch.no_grad():
            parallel, _ = view(tokens)
            state = {}
            steps = [view.decoder(tokens[:, :L], incremental_state=state)[0]]
            steps += [view.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(L, tokens.size(1))]
        assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4, spec
    plain = build_lex_model(tokens_per_sample=L, pos_emb="rope", seed=3, layer_pattern="rope/sliding:6,rope/full")
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "sink" not in k})
    with torch.no_grad():
        assert (plain(tokens)[0] - model(tokens)[0]).abs().max() > 1e-3

    pytest.importorskip("transformers")
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config

    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, pos_emb="rope", learned_sinks=True,
                              layer_pattern="rope/sliding:6,rope/full")
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    config = hf_config(args, model.decoder.dictionary, L)
    assert config.learned_sinks and config.decoder_config().learned_sinks
    hf = from_fairseq(model, config)
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)[0]).abs().max() <= 1e-5


def _as_first_token(sink_model, plain):
    """``plain`` with the sink model's weights and the sink vector as the embedding of one ordinary token id (the id)."""
    state = {k: v for k, v in sink_model.state_dict().items() if k != "decoder.sink_embedding"}
    plain.load_state_dict(state)
    sink_id = len(plain.decoder.dictionary) - 1
    with torch.no_grad():
        plain.decoder.embed_tokens.weight[sink_id] = sink_model.decoder.sink_embedding
    return sink_id


@pytest.mark.parametrize("pos_emb", ["xpos", "alibi", "sinusoidal"])
def test_the_sink_token_is_a_learned_token_before_every_sequence(pos_emb):
    """The model with --sink-token scores tokens as the same weights score [sink] + tokens with the sink vector as a
    token's embedding (positions shifted by one), under full attention and under BCA keeping it as one sink token; token
    by token through the cache it gives the same logits, and the cache counts tokens."""
    model = build_lex_model(tokens_per_sample=L, pos_emb=pos_emb, sink_token=True, seed=7)
    assert model.decoder.sink_positions == 1 and model.decoder.sink_embedding.shape == (256,)
    plain = build_lex_model(tokens_per_sample=L, pos_emb=pos_emb, seed=8)
    sink_id = _as_first_token(model, plain)
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=9)
    tokens[tokens == sink_id] = sink_id - 1
    keep = torch.arange(len(plain.decoder.dictionary)) != sink_id  # (its output row is the sink vector too when tied)
    for spec in (AttentionSpec(), AttentionSpec(AttentionWindow.bca(L).with_sinks(1))):
        with torch.no_grad():
            got = model.under(spec)(tokens)[0]
            first = torch.full((2, 1), sink_id)
            expected = plain.under(spec)(torch.cat([first, tokens], 1))[0][:, 1:]
            assert (got - expected)[..., keep].abs().max() < 1e-4, spec
            state, view = {}, model.under(spec)
            steps = [view.decoder(tokens[:, :L], incremental_state=state)[0]]
            assert view.decoder.past_length(state) == L
            steps += [view.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(L, tokens.size(1))]
        assert (torch.cat(steps, 1) - got).abs().max() <= 1e-4, spec
    with torch.no_grad():  # padding that causality does not hide (not trailing): the sink is never padding
        padded = tokens.clone()
        padded[0, 3:6] = model.decoder.padding_idx
        got = model(padded)[0]
        expected = plain(torch.cat([torch.full((2, 1), sink_id), padded], 1))[0][:, 1:]
        real = padded.ne(model.decoder.padding_idx)
        assert (got - expected)[..., keep][real].abs().max() < 1e-4
    with torch.no_grad():  # the sink matters
        other = build_lex_model(tokens_per_sample=L, pos_emb=pos_emb, seed=8)
        other.load_state_dict({k: v for k, v in model.state_dict().items() if k != "decoder.sink_embedding"})
        assert (other(tokens)[0] - model(tokens)[0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="--random-positions"):
        build_lex_model(tokens_per_sample=L, sink_token=True, random_positions=4 * L)
    with pytest.raises(ValueError, match="learned position table"):
        build_lex_model(tokens_per_sample=L, sink_token=True, pos_emb="learned")


def test_the_sink_token_is_recorded_and_exported():
    """The Hugging Face config carries --sink-token; the export's logits equal fairseq's, and its cache counts tokens
    (the sink not counted), so a step after a cached prefix gives the parallel logits."""
    pytest.importorskip("transformers")
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config

    model = build_lex_model(tokens_per_sample=L, sink_token=True, seed=7)
    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, sink_token=True)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    config = hf_config(args, model.decoder.dictionary, L)
    assert config.sink_token and config.decoder_config().sink_token
    hf = from_fairseq(model, config)
    tokens = random_tokens(model.decoder.dictionary, 1, 3 * L, seed=2)
    with torch.no_grad():
        parallel = model(tokens)[0]
        assert (hf(tokens).logits - parallel).abs().max() <= 1e-5
        prefix = hf(tokens[:, :20], use_cache=True)
        assert prefix.past_key_values.get_seq_length() == 20
        step = hf(tokens[:, 20:21], past_key_values=prefix.past_key_values, use_cache=True)
        assert (step.logits[:, 0] - parallel[:, 20]).abs().max() <= 1e-4
        greedy = hf.generate(tokens[:, :20], max_new_tokens=5, do_sample=False)
        ids = tokens[:, :20]
        for _ in range(5):
            ids = torch.cat([ids, model(ids)[0][:, -1:].argmax(-1)], 1)
        assert torch.equal(greedy, ids)


def test_the_analysis_refuses_a_sink_token_model_with_a_clear_message():
    """The resolution analysis counts logits by distance; with a sink token at position 0 it would shift the text's
    pairs by one (it crashed on the 300-update run): refused, saying what to do."""
    from lex_plugin.analysis import score_by_distance

    model = build_lex_model(tokens_per_sample=L, sink_token=True, seed=7)
    tokens = random_tokens(model.decoder.dictionary, 1, L)
    with pytest.raises(ValueError, match="trained with --sink-token"):
        score_by_distance(model, tokens, AttentionSpec())
    plain = build_lex_model(tokens_per_sample=L, seed=7)
    sums, counts = score_by_distance(plain, tokens, AttentionSpec())
    assert counts[0] == L and counts[L - 1] == 1

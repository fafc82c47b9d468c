"""lex_lm: attention against TorchScale's reference, causality, incremental decoding, padding, layout."""

import argparse

import pytest
import torch

from conftest import build_lex_model, random_tokens
from lex_plugin.experiments.torchscale_reference import torchscale_attention
from lex_plugin.models import UNBOUNDED_POSITIONS
from lex_plugin.modules.attention import LexSelfAttention
from lex_plugin.modules.positions import XPos


@pytest.mark.parametrize("subln", [False, True])
def test_attention_matches_torchscale_reference(subln):
    torch.manual_seed(0)
    attn = LexSelfAttention(128, 4, subln=subln).eval()
    ref = torchscale_attention(attn)
    x = torch.randn(3, 200, 128)
    causal = torch.triu(torch.full((200, 200), float("-inf")), 1)
    expected, _ = ref(x, x, x, attn_mask=causal)
    got = attn(x, XPos(32))
    assert (got - expected).abs().max() <= 1e-5


def test_attention_left_padding_matches_torchscale():
    torch.manual_seed(1)
    attn = LexSelfAttention(64, 2).eval()
    ref = torchscale_attention(attn)
    x = torch.randn(2, 50, 64)
    pad = torch.zeros(2, 50, dtype=torch.bool)
    pad[1, :13] = True  # left padding in row 1
    causal = torch.triu(torch.full((50, 50), float("-inf")), 1)
    expected, _ = ref(x, x, x, attn_mask=causal, key_padding_mask=pad)
    got = attn(x, XPos(32), key_padding_mask=pad)
    real = ~pad
    assert (got[real] - expected[real]).abs().max() <= 1e-5
    assert torch.isfinite(got).all()  # pad queries see themselves: no empty softmax row


def test_causality_of_full_model():
    model = build_lex_model()
    tokens = random_tokens(model.decoder.dictionary, 2, 64)
    changed = tokens.clone()
    changed[:, 40] = (changed[:, 40] + 1 - 4) % 96 + 4
    with torch.no_grad():
        a, _ = model(tokens)
        b, _ = model(changed)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def full_and_incremental(model, tokens, prompt_len=0):
    """Logits of a parallel forward, and of prompt (parallel) + token-by-token with the cache."""
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = []
        start = max(prompt_len, 1)
        out, _ = model.decoder(tokens[:, :start], incremental_state=state)
        steps.append(out)
        for t in range(start + 1, tokens.size(1) + 1):
            out, _ = model.decoder(tokens[:, :t], incremental_state=state)  # the generator's calling convention
            assert out.size(1) == 1
            steps.append(out)
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("prompt_len", [0, 40])
def test_incremental_equals_parallel_beyond_training_length(prompt_len):
    model = build_lex_model(tokens_per_sample=32)
    assert model.training_length == 32
    tokens = random_tokens(model.decoder.dictionary, 2, 3 * 32 + 5, seed=prompt_len)
    full, inc = full_and_incremental(model, tokens, prompt_len)
    assert full.shape == inc.shape
    assert (full - inc).abs().max() <= 1e-4


def test_padding_does_not_change_real_tokens():
    """Right padding (fairseq's batches) and left padding (xPos is relative) leave real logits unchanged."""
    model = build_lex_model()
    d = model.decoder.dictionary
    seq = random_tokens(d, 1, 30, seed=5)
    with torch.no_grad():
        alone, _ = model(seq)
        right = torch.full((2, 45), d.pad())
        right[0, :30], right[1] = seq[0], random_tokens(d, 1, 45, seed=6)[0]
        out_right, _ = model(right)
        left = torch.full((2, 45), d.pad())
        left[0, 15:], left[1] = seq[0], random_tokens(d, 1, 45, seed=6)[0]
        out_left, _ = model(left)
    assert (out_right[0, :30] - alone[0]).abs().max() <= 1e-5
    assert (out_left[0, 15:] - alone[0]).abs().max() <= 1e-4


LEFT_PADDING_CASES = [  # (model options, attention options, refused?)
    ({}, dict(mode="full"), False),
    ({}, dict(mode="sliding", sliding_window=8), False),
    ({"pos_emb": "rope"}, dict(mode="rerope"), False),
    ({}, dict(mode="bca"), True),
    ({}, dict(mode="bca", sink_tokens=2), True),
    ({}, dict(mode="lm_infinite"), True),
    ({"pos_emb": "rope"}, dict(mode="dca"), True),
    ({"pos_emb": "rope"}, dict(mode="self_extend"), True),
    ({}, dict(mode="full", logn=True), True),
    ({"pos_emb": "sinusoidal"}, dict(mode="full"), True),
    ({"sink_token": True}, dict(mode="full"), True),
    ({"ssmax": True}, dict(mode="full"), True),
    ({"pos_emb": "rope", "layer_pattern": "rope/bca,rope/full"}, dict(mode="full"), True),
]


@pytest.mark.parametrize("model_options, attention, refused", LEFT_PADDING_CASES,
                         ids=[f"{m.get('pos_emb', 'xpos')}-{a}" + ("-" + "-".join(k for k in m if k != "pos_emb") if m else "")
                              for m, a, _ in LEFT_PADDING_CASES])
def test_a_left_padded_batch_scores_its_rows_as_alone_or_is_refused(model_options, attention, refused):
    """The fairseq face (``model(tokens, spec=...)``, what the hub scores with) as the Hugging Face one: left padding
    where only distances between real tokens matter gives each real row its logits alone; where positions count from
    the first token (BCA's blocks, sinks, LM-Infinite, Self-Extend, DCA, log-n, absolute positions, a sink token,
    SSMax, a pattern's BCA layers) it is refused, never a silent wrong number."""
    from lex_plugin.modules.attention import AttentionOptions

    mode = attention.pop("mode")
    model = build_lex_model(tokens_per_sample=16, **model_options)
    spec = AttentionOptions(mode, **attention).spec(16, 40)
    d = model.decoder.dictionary
    left = random_tokens(d, 2, 40, seed=3)
    left[0, :9] = d.pad()
    with torch.no_grad():
        if refused:
            with pytest.raises(ValueError, match="left padding shifts each row's positions"):
                model(left, spec=spec)
            right = left.clone()
            right[0] = torch.cat([left[0, 9:], left[0, :9]])  # the same row padded on the right is scored
            assert torch.isfinite(model(right, spec=spec)[0]).all()
            return
        out, _ = model(left, spec=spec)
        alone, _ = model(left[:1, 9:], spec=spec)
    assert (out[0, 9:] - alone[0]).abs().max() <= 1e-4


def test_reorder_incremental_state_for_beam_search():
    model = build_lex_model()
    tokens = random_tokens(model.decoder.dictionary, 3, 20, seed=7)
    order = torch.tensor([2, 2, 0])
    with torch.no_grad():
        state = {}
        model.decoder(tokens[:, :19], incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        step, _ = model.decoder(tokens[order, :20], incremental_state=state)
        full, _ = model(tokens[order])
    assert (step[:, 0] - full[:, 19]).abs().max() <= 1e-4


def test_state_dict_uses_torchscale_names_and_loads_torchscale_buffers():
    model = build_lex_model()
    keys = set(model.state_dict())
    for name in [
        "decoder.embed_tokens.weight",
        "decoder.layers.0.self_attn.q_proj.weight",
        "decoder.layers.0.self_attn.k_proj.bias",
        "decoder.layers.0.self_attn.v_proj.weight",
        "decoder.layers.0.self_attn.out_proj.weight",
        "decoder.layers.0.self_attn_layer_norm.weight",
        "decoder.layers.0.ffn.fc1.weight",
        "decoder.layers.0.ffn.fc2.weight",
        "decoder.layers.0.final_layer_norm.weight",
        "decoder.layer_norm.weight",
        "decoder.output_projection.weight",
    ]:
        assert name in keys, name
    assert not any("xpos" in k for k in keys)
    # a TorchScale checkpoint carries XPOS's `scale` buffer per layer: accepted and ignored
    ts_state = dict(model.state_dict())
    ts_state["decoder.layers.0.self_attn.xpos.scale"] = torch.ones(32)
    model.upgrade_state_dict(ts_state)
    model.load_state_dict(ts_state, strict=True)


def test_half_leaves_position_math_in_fp32():
    model = build_lex_model()
    tokens = random_tokens(model.decoder.dictionary, 2, 48)
    with torch.no_grad():
        ref, _ = model(tokens)
        model.to(torch.bfloat16)
        low, _ = model(tokens)
    assert model.decoder.positions[0].complex_table(0, 48, 24, False, "cpu").dtype == torch.complex64  # fp32 parts
    assert torch.isfinite(low).all()
    assert (low.float() - ref).abs().max() / ref.abs().max() < 0.05


def test_max_positions_is_not_the_training_length():
    model = build_lex_model(tokens_per_sample=32)
    assert model.max_positions() == UNBOUNDED_POSITIONS > 10**8


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(decoder_embed_dim=100, decoder_attention_heads=3), "divisible"),
        (dict(decoder_embed_dim=96, decoder_attention_heads=32), "even"),
        (dict(decoder_layers=0), "positive"),
        (dict(subln=True, deepnorm=True), "--subln .* and --deepnorm"),
        (dict(subln=True, post_ln=True), "--subln .* and --post-ln"),
        (dict(dropout=1.0), "--dropout"),
        (dict(pos_emb="rope", xpos_scalar_zeta=True), "--xpos-scalar-zeta is an option of --pos-emb xpos; this model is --pos-emb rope"),
        (dict(pos_emb="alibi", xpos_gamma=0.5), "--xpos-gamma 0.5 is an option of --pos-emb xpos; .* alibi"),
        (dict(pos_emb="alibi", rope_theta=500.0), "--rope-theta 500.0 is an option of --pos-emb xpos / rope"),
        # refused at its default value too: given is given (None is "not given")
        (dict(pos_emb="alibi", rope_theta=10000.0), "--rope-theta 10000.0 is an option of .* drop --rope-theta, or choose --pos-emb xpos"),
        (dict(pos_emb="rope", xpos_gamma=0.4), "--xpos-gamma 0.4 is an option of --pos-emb xpos"),
        (dict(pos_emb="xpos", sandwich_dim=64), "--sandwich-dim 64 is an option of --pos-emb sandwich"),
        (dict(pos_emb="alibi", max_target_positions=64), "--max-target-positions 64 is an option of --pos-emb learned"),
        (dict(pos_emb="no_such_scheme"), "--pos-emb must be one of"),
        (dict(pos_emb="sandwich", sandwich_dim=7), "sandwich-dim"),
        (dict(pos_emb="t5", t5_num_buckets=1), "t5-num-buckets"),
        (dict(pos_emb="xpos", xpos_gamma=0.0), "xpos-gamma"),
    ],
)
def test_bad_configuration_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_lex_model(**overrides)


def test_presets():
    sizes = {"lex_lm_small": (6, 512, 8), "lex_lm_base": (12, 768, 12), "lex_lm_medium": (24, 1024, 16)}
    from fairseq.models import ARCH_CONFIG_REGISTRY

    for arch, (layers, dim, heads) in sizes.items():
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        assert (args.decoder_layers, args.decoder_embed_dim, args.decoder_attention_heads) == (layers, dim, heads)
        assert not args.post_ln and not args.deepnorm and str(args.pos_emb) == "xpos"
    args = argparse.Namespace(decoder_layers=2)
    ARCH_CONFIG_REGISTRY["lex_lm_medium"](args)
    assert args.decoder_layers == 2 and args.decoder_ffn_embed_dim == 4096  # explicit values win


@pytest.mark.parametrize("overrides,pre_ln", [({}, True), (dict(post_ln=True), False), (dict(deepnorm=True), False),
                                              (dict(subln=True), True)])
def test_layer_norm_placement_follows_the_options(overrides, pre_ln):
    """--post-ln and --deepnorm give post-LN layers (and no final LayerNorm), the default and --subln pre-LN:
    checked on the outputs, not on a flag: a post-LN layer's output has LayerNorm statistics."""
    model = build_lex_model(**overrides)
    layer = model.decoder.layers[0]
    assert layer.normalize_before == pre_ln and (model.decoder.layer_norm is not None) == pre_ln
    x = torch.randn(2, 8, layer.embed_dim) * 5 + 3
    with torch.no_grad():
        out = layer(x, model.decoder.position(0))
    normed = torch.allclose(out.mean(-1), torch.zeros(2, 8), atol=1e-4) and torch.allclose(out.std(-1, unbiased=False), torch.ones(2, 8), atol=1e-2)
    assert normed == (not pre_ln)

"""Layer patterns (--layer-pattern): each layer's positions and trained window.

A patterned model against a float64 reference written out layer by layer (each layer's mask from its own window,
its own positions), token-by-token generation with each layer's cache size checked at every step, the refusals, the
fairseq round trip and the Hugging Face export."""

import argparse
import copy
import math

import pytest
import torch

from conftest import build_lex_model, make_dictionary, random_tokens, window_mask, xpos_pair
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow
from lex_plugin.modules.attention.position_map import ReRoPE
from lex_plugin.modules.layer_pattern import LayerKind, parse_layer_pattern
from lex_plugin.modules.positions import NoPositions, XPos
from lex_plugin.modules.positions.rope_scaling import RopeScaling

L = 16  # training length


def _reference_attention(attn, x, scheme, window, tuning=None):
    """One layer's attention in float64, written out: projections, the layer's rotation at true positions 0 .. T-1
    (none for NoPE), softmax(q k^T / sqrt(d)) under the explicit mask of its window, output projection; Llama 4's
    factor 1 + beta log1p(floor((p + 1) / F)) on the queries when ``tuning`` = (beta, F)."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim

    def heads(proj):
        return (x @ proj.weight.double().T + proj.bias.double()).view(B, T, H, d).transpose(1, 2)

    q, k, v = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
    if tuning is not None:
        beta, floor = tuning
        p = torch.arange(T, dtype=torch.float64)
        q = q * (1 + beta * torch.log1p(torch.floor((p + 1) / floor)))[:, None]
    if isinstance(scheme, XPos):
        q, k = xpos_pair(scheme, q, k, 0)
    elif scheme.kind == "rotary":
        q, k = scheme.rotate(q, start=0), scheme.rotate(k, start=0, keys=True)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    logits = logits.masked_fill(~window_mask(window, T), float("-inf"))
    out = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def _reference_logits(model, tokens, kinds, global_window, tuning=None):
    """The whole pre-LN model in float64, layer by layer: layer i attends under its pattern window (the global window
    for global layers) with its own positions (none in NoPE layers)."""
    dec = copy.deepcopy(model.decoder).double()
    x = dec.embed_scale * dec.embed_tokens(tokens)
    for layer, kind in zip(dec.layers, kinds):
        scheme = dec.positions[0] if kind.positions else NoPositions()
        window = kind.window or global_window
        h = layer.self_attn_layer_norm(x)
        x = x + _reference_attention(layer.self_attn, h, scheme, window, tuning if kind.is_global else None)
        x = x + layer.ffn(layer.final_layer_norm(x))
    return dec.output_projection(dec.layer_norm(x))


PATTERNS = [
    ("xpos", "xpos/bca*2,none/full"),
    ("rope", "rope/sliding:6,none/full"),
    ("rope", "rope/chunked:8*3,none/full"),
    ("rope", "none/full,rope/sliding:5"),  # SWAN-GPT-like: NoPE first; the pattern repeats over the 4 layers
]


@pytest.mark.parametrize("pos_emb,pattern", PATTERNS, ids=[p for _, p in PATTERNS])
@pytest.mark.parametrize("length,global_window", [(L, AttentionWindow.full()), (4 * L, AttentionWindow.full()),
                                                  (4 * L, AttentionWindow.bca(L)), (16 * L, AttentionWindow.sliding(L))],
                         ids=["l-full", "4l-full", "4l-bca", "16l-sliding"])
def test_a_patterned_model_equals_its_float64_reference_layer_by_layer(pos_emb, pattern, length, global_window):
    model = build_lex_model(tokens_per_sample=L, pos_emb=pos_emb, layer_pattern=pattern, seed=2)
    kinds = model.decoder.layer_kinds
    assert kinds == parse_layer_pattern(pattern, pos_emb, 4, L)
    tokens = random_tokens(model.decoder.dictionary, 2, length, seed=1)
    with torch.no_grad():
        got = model.under(AttentionSpec(global_window))(tokens)[0]
        expected = _reference_logits(model, tokens, kinds, global_window)
    assert (got.double() - expected).abs().max() < 1e-4
    # the pattern matters: the same weights without it give other logits past the local windows
    plain = build_lex_model(tokens_per_sample=L, pos_emb=pos_emb, seed=2)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain.under(AttentionSpec(global_window))(tokens)[0] - got).abs().max() > 1e-3


def test_the_pattern_repeats_over_the_depth_and_parses_strictly():
    kinds = parse_layer_pattern("rope/sliding:128*5,rope/full", "rope", 8, 256)
    assert [k.is_global for k in kinds] == [False] * 5 + [True] + [False] * 2  # cut at the last layer
    assert kinds[0] == LayerKind(True, AttentionWindow.sliding(128)) and kinds[0].describe("rope") == "rope/sliding:128"
    assert parse_layer_pattern("xpos/bca,none/full", "xpos", 2, 256)[0].window == AttentionWindow.bca(256)
    assert parse_layer_pattern("rope/chunked:64", "rope", 1, None)[0].window == AttentionWindow.chunked(64)
    assert parse_layer_pattern("", "rope", 4, 256) is None and parse_layer_pattern(None, "rope", 4, 256) is None
    for text, match in [("rope/sliding", "needs its size"), ("rope/bca:4", "takes no size"), ("alibi/full", "names --pos-emb alibi"),
                        ("rope/window:4", "full, bca, sliding:W or chunked:C"), ("rope/full*0", "at least 1"),
                        ("rope/full*9", "at most as deep"), ("rope full", "not SCHEME/WINDOW"), ("rope/bca*2,none/full", None)]:
        if match is None:
            with pytest.raises(ValueError, match="give --tokens-per-sample"):
                parse_layer_pattern(text, "rope", 4, None)
            continue
        with pytest.raises(ValueError, match=match):
            parse_layer_pattern(text, "rope", 8, 256)


def test_chunked_attention_sees_its_own_chunk_only():
    window = AttentionWindow.chunked(4)
    mask = window_mask(window, 10)
    assert mask[5].tolist() == [False] * 4 + [True, True] + [False] * 4  # keys 4, 5 of chunk [4, 8)
    assert mask[8].tolist() == [False] * 8 + [True, False]
    assert window.span == 4 and window.feed_block == 4 and str(window) == "chunked(4)"
    with pytest.raises(ValueError, match="chunked attention"):
        window.with_sinks(1)
    from lex_plugin.modules.attention.window import window_from_options

    with pytest.raises(ValueError, match="must be one of full, bca, sliding, lm_infinite, got 'chunked'"):
        window_from_options("chunked")  # a layer's trained window, not an evaluation flag


def test_generation_keeps_each_layers_cache_and_equals_the_parallel_forward():
    """A pattern mixing bounded caches (sliding W = 6, chunks of 8) with full ones, SSMax, QK-norm, learned sink logits
    and Llama 4's temperature tuning on the global layers: token by token through the cache equals one parallel forward
    (1e-4), under full attention and under BCA on the global layers, and every layer's cache holds what its window needs
    at every step."""
    model = build_lex_model(tokens_per_sample=L, pos_emb="rope", layer_pattern="rope/sliding:6,none/full,rope/chunked:8",
                            ssmax=True, qk_norm=True, temperature_tuning_beta=0.3, learned_sinks=True, seed=4,
                            decoder_layers=4)
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.sink_logits.uniform_(-1.0, 2.0)
    attn = [layer.self_attn for layer in model.decoder.layers]
    assert [hasattr(a, "temperature_tuning") for a in attn] == [False, True, False, False]  # global layers only
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=5)
    for global_window in (AttentionWindow.full(), AttentionWindow.bca(L)):
        view = model.under(AttentionSpec(global_window))
        windows = [AttentionWindow.sliding(6), global_window, AttentionWindow.chunked(8), AttentionWindow.sliding(6)]
        with torch.no_grad():
            parallel, _ = view(tokens)
            state = {}
            steps = [view.decoder(tokens[:, :3], incremental_state=state)[0]]
            for t in range(3, tokens.size(1)):
                steps.append(view.decoder(tokens[:, : t + 1], incremental_state=state)[0])
                n = t + 1  # positions seen; the next query is at n
                expected = [n - w.first_key(n) for w in windows]
                assert [a.cached_keys(state) for a in attn] == expected, (t, global_window)
        assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4, global_window


def test_the_evaluation_flags_change_the_global_layers_only():
    model = build_lex_model(tokens_per_sample=L, pos_emb="rope", layer_pattern="rope/sliding:6,none/full", seed=1)
    dec = model.decoder
    bca = AttentionSpec(AttentionWindow.bca(L), logn=L)
    assert dec.layer_spec(0, bca) == AttentionSpec(AttentionWindow.sliding(6)) and dec.layer_spec(1, bca) == bca
    # positions' flags need a positioned global layer: this pattern's are NoPE
    with pytest.raises(ValueError, match="global layers, and those of --layer-pattern rope/sliding:6,none/full have none"):
        model.under(AttentionSpec(rope_scaling=RopeScaling("linear", 4.0)))
    with pytest.raises(ValueError, match="--position-map rerope acts on the positions of the global layers"):
        model.under(AttentionSpec(position_map=ReRoPE(L // 2)))
    # SWAN-GPT-like: a positioned and a NoPE global layer; the scaling reaches the positioned one only
    swan = build_lex_model(tokens_per_sample=L, pos_emb="rope", layer_pattern="none/full,rope/full", seed=1).decoder
    scaled = AttentionSpec(rope_scaling=RopeScaling("linear", 4.0))
    assert swan.layer_spec(1, scaled) == scaled and swan.layer_spec(0, scaled) == AttentionSpec()
    local = build_lex_model(tokens_per_sample=L, pos_emb="rope", layer_pattern="rope/sliding:6", seed=1)
    assert local.under(AttentionSpec())
    with pytest.raises(ValueError, match="has none: every layer keeps its trained window"):
        local.under(AttentionSpec(AttentionWindow.bca(L)))


@pytest.mark.parametrize("overrides,match", [
    (dict(pos_emb="sinusoidal", layer_pattern="sinusoidal/sliding:4,none/full"), "adds absolute positions"),
    (dict(pos_emb="kerple_log", layer_pattern="kerple_log/full,none/full"), "parameters in every layer"),
    (dict(pos_emb="rope", layer_pattern="rope/sliding:4,rope/full", random_positions=64), "--random-positions"),
    (dict(pos_emb="rope", layer_pattern="rope/sliding:4", temperature_tuning_beta=0.1), "acts in the global layers"),
    (dict(pos_emb="rope", layer_pattern="xpos/sliding:4"), "names --pos-emb xpos"),
    (dict(pos_emb="rope", layer_pattern="none/full", rope_theta=5000.0), "no layer uses positions, so --rope-theta"),
    (dict(pos_emb="xpos", layer_pattern="none/sliding:4,none/full", xpos_gamma=0.5, rope_theta=10000.0),
     "so --xpos-gamma of --pos-emb xpos"),
], ids=["absolute", "per-layer", "random-positions", "tuning-without-global", "other-scheme", "option-without-positions",
        "options-without-positions"])
def test_a_pattern_the_model_cannot_train_is_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_lex_model(tokens_per_sample=L, **overrides)


def test_a_pattern_without_positions_records_no_scheme_option():
    """A pattern of NoPE layers alone builds when no option of the scheme is given, and its checkpoint's options record
    none (they apply nowhere), so that it loads again through the same refusal."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.models.lex_lm import LexLanguageModel

    def build(**options):  # as fairseq-train does: the args it saves in the checkpoint are these, after build_model
        args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, pos_emb="rope", **options)
        ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
        d = make_dictionary()
        return LexLanguageModel.build_model(args, argparse.Namespace(source_dictionary=d, target_dictionary=d)), args

    model, args = build(layer_pattern="none/full")
    assert not any(k.positions for k in model.decoder.layer_kinds) and args.rope_theta is None
    build(layer_pattern="none/full", rope_theta=args.rope_theta)  # the saved args build again
    build(layer_pattern="none/full", rope_theta=10000.0)  # a checkpoint saved before the check records the default
    _, positioned = build(layer_pattern="rope/full,none/full")
    assert positioned.rope_theta == 10000.0  # with a layer that rotates, the value it was built with is recorded


def test_the_pattern_is_recorded_and_exported():
    """--layer-pattern is a model option: fairseq's build_model records it, the Hugging Face config carries it, and the
    export gives the same logits under full attention and under its default BCA."""
    pytest.importorskip("transformers")
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config
    from lex_plugin.models.lex_lm import LexLanguageModel
    from lex_plugin.modules.attention import AttentionOptions

    model = build_lex_model(tokens_per_sample=L, pos_emb="xpos", layer_pattern="xpos/bca*3,none/full",
                            temperature_tuning_beta=0.2, seed=6)
    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, layer_pattern="xpos/bca*3,none/full",
                              temperature_tuning_beta=0.2)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    built = LexLanguageModel.build_model(args, argparse.Namespace(source_dictionary=model.decoder.dictionary,
                                                                  target_dictionary=model.decoder.dictionary))
    assert built.decoder.layer_kinds == model.decoder.layer_kinds
    tokens = random_tokens(model.decoder.dictionary, 1, 6 * L, seed=2)
    for options in (AttentionOptions(), AttentionOptions("bca")):
        config = hf_config(args, model.decoder.dictionary, L, options)
        assert config.layer_pattern == "xpos/bca*3,none/full" and config.decoder_config().layer_pattern == config.layer_pattern
        hf = from_fairseq(model, config)
        view = model.under(options.spec(L))
        with torch.no_grad():
            assert (hf(tokens).logits - view(tokens)[0]).abs().max() <= 1e-5


def test_fairseq_trains_a_pattern_and_eval_lm_applies_the_window_to_its_global_layers(data_bin, tmp_path):
    """fairseq-train with --layer-pattern, then fairseq-eval-lm with no model flag: the checkpoint rebuilds the pattern,
    and BCA on its global layer is full attention at l and something else past it."""
    import json

    from conftest import REPO, run_cli
    from lex_plugin.experiments.recipe import fairseq_train_command
    from lex_plugin.hub_interface import from_pretrained

    save = tmp_path / "ckpt"
    cmd = fairseq_train_command(data_bin, save, model_args=["--pos-emb", "rope", "--decoder-layers", "2",
                                                            "--layer-pattern", "rope/sliding:8,none/full"],
                                tokens_per_sample=32, batch_size=2, updates=2, warmup=1)
    run_cli(cmd, env={"OMP_NUM_THREADS": "1"}, timeout=300)
    report = tmp_path / "report.json"
    run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
             "--path", str(save / "checkpoint_last.pt"), "--gen-subset", "test", "--batch-size", "4", "--num-workers", "0",
             "--tokens-per-sample", "128", "--eval-lengths", "32,128", "--eval-windows", "full,bca", "--eval-tokens", "512",
             "--report-json", str(report), "--length-report-only"], timeout=300)
    rows = {(r["window"], r["length"]): r for r in json.loads(report.read_text())["results"]}
    hub = from_pretrained(save, "checkpoint_last.pt", data_bin)
    model = hub.models[0]
    assert [k.describe("rope") for k in model.decoder.layer_kinds] == ["rope/sliding:8", "none/full"]
    assert rows[("full", 32)]["ppl"] == pytest.approx(rows[("bca(16)", 32)]["ppl"], rel=1e-5)  # BCA covers l
    assert rows[("full", 128)]["ppl"] != pytest.approx(rows[("bca(16)", 128)]["ppl"], rel=1e-4)  # past l it differs

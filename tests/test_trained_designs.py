"""Designs a model is trained with (issue: trained to extrapolate): QK-norm, Scalable-Softmax and DroPE so far.

Each against a float64 reference written out here, gradients included, and through generation and the Hugging Face
export."""

import argparse
import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, random_tokens, window_mask, xpos_pair
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.attention.position_map import ReRoPE
from lex_plugin.modules.designs import QKNorm, SSMax
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.scheme import NoPositions

L = 16  # training length of the windows


def _qk_norm_reference(attn: LexSelfAttention, x: torch.Tensor, scheme, window: AttentionWindow) -> torch.Tensor:
    """QK-norm attention in float64, written out: projections, RMSNorm of each head's q and k over d with the
    learned weights, the position scheme, softmax(q k^T / sqrt(d)) under the window's mask, the output projection."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    x = x.double()

    def heads(proj):
        return (x @ proj.weight.double().T + proj.bias.double()).view(B, T, H, d).transpose(1, 2)

    def rms(t, weight, eps):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * weight.double()

    q = rms(heads(attn.q_proj), attn.q_norm.weight, attn.q_norm.eps)
    k = rms(heads(attn.k_proj), attn.k_norm.weight, attn.k_norm.eps)
    v = heads(attn.v_proj)
    if isinstance(scheme, XPos):
        q, k = xpos_pair(scheme, q, k, 0)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    logits = logits.masked_fill(~window_mask(window, T), float("-inf"))
    out = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("scheme", [NoPositions(), XPos(16)], ids=["nope", "xpos"])
@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), L), (AttentionWindow.full(), 4 * L),
                                           (AttentionWindow.bca(L), 4 * L), (AttentionWindow.sliding(L), 16 * L)], ids=str)
def test_qk_norm_equals_its_formula_in_float64_with_its_gradients(scheme, window, length):
    torch.manual_seed(0)
    attn = LexSelfAttention(64, 4, designs=[QKNorm()])
    with torch.no_grad():  # weights away from their initial ones, so that a missing weight shows
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme, spec=AttentionSpec(window))
    expected = _qk_norm_reference(attn, x, scheme, window)
    # gradients of the two norm weights and of q_proj against float64 autograd of the formula
    check_against_float64(attn, got, expected, [attn.q_norm.weight, attn.k_norm.weight, attn.q_proj.weight])


def test_qk_norm_changes_the_logits_and_stays_off_by_default():
    plain = build_lex_model(tokens_per_sample=L, seed=3)
    normed = build_lex_model(tokens_per_sample=L, seed=3, qk_norm=True)
    assert not hasattr(plain.decoder.layers[0].self_attn, "q_norm") and not plain.decoder.designs
    names = {n for n, _ in normed.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert names == {f"decoder.layers.{i}.self_attn.{w}_norm.weight" for i in range(4) for w in "qk"}
    tokens = random_tokens(plain.decoder.dictionary, 1, 20)
    with torch.no_grad():
        assert (plain(tokens)[0] - normed(tokens)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("window", [AttentionWindow.full(), AttentionWindow.bca(L)], ids=str)
def test_qk_norm_generation_equals_the_parallel_forward(window):
    model = build_lex_model(tokens_per_sample=L, qk_norm=True, pos_emb="xpos", seed=5)
    view = model.under(AttentionSpec(window))
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=7)
    with torch.no_grad():
        parallel, _ = view(tokens)
        state = {}
        steps = [view.decoder(tokens[:, :L], incremental_state=state)[0]]
        steps += [view.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(L, tokens.size(1))]
    assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4


def test_qk_norm_is_recorded_and_exported():
    """The fairseq model's config carries --qk-norm and --ssmax into the Hugging Face config, whose model gives the same
    logits."""
    pytest.importorskip("transformers")
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config
    from lex_plugin.models.lex_lm import LexLanguageModel

    dictionary = Dictionary()
    for i in range(50):
        dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, qk_norm=True, ssmax=True, decoder_layers=2)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    model = LexLanguageModel.build_model(args, argparse.Namespace(source_dictionary=dictionary,
                                                                  target_dictionary=dictionary)).eval()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
            layer.self_attn.ssmax.uniform_(0.2, 0.6)
    config = hf_config(args, dictionary, L)
    assert config.qk_norm and config.decoder_config().qk_norm and config.ssmax and config.decoder_config().ssmax
    hf = from_fairseq(model, config)
    tokens = random_tokens(dictionary, 1, 3 * L)
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)[0]).abs().max() <= 1e-5
        left = torch.cat([torch.full((1, 5), dictionary.pad()), tokens[:, :20]], 1)
        with pytest.raises(ValueError, match="SSMax"):  # its key count starts at the first position: refused
            hf(left, attention_mask=left.ne(dictionary.pad()).long())


def _ssmax_reference(attn: LexSelfAttention, x: torch.Tensor, window: AttentionWindow) -> torch.Tensor:
    """SSMax attention in float64, written out (Nakanishi 2025): softmax((s_h log n) q k^T / sqrt(d)) v,
    n the keys query p sees under the window (counted here from its mask)."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    x = x.double()

    def heads(proj):
        return (x @ proj.weight.double().T + proj.bias.double()).view(B, T, H, d).transpose(1, 2)

    mask = window_mask(window, T)
    n = mask.sum(-1).double()  # (T,) keys each query sees
    logits = (heads(attn.q_proj) @ heads(attn.k_proj).transpose(-1, -2)) / math.sqrt(d)
    logits = logits * (attn.ssmax.double()[:, None, None] * torch.log(n)[None, :, None])
    out = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ heads(attn.v_proj)
    out = out.transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), L), (AttentionWindow.full(), 4 * L),
                                           (AttentionWindow.bca(L), 4 * L), (AttentionWindow.sliding(L), 16 * L)], ids=str)
def test_ssmax_equals_its_formula_in_float64_with_the_gradient_of_s(window, length):
    torch.manual_seed(1)
    attn = LexSelfAttention(64, 4, designs=[SSMax(L)])
    assert torch.allclose(attn.ssmax, torch.full((4,), 1 / math.log(L)))  # 1 at n = l
    with torch.no_grad():
        attn.ssmax.uniform_(0.2, 0.6)  # per head, away from the initial value
    x = torch.randn(2, length, 64)
    got = attn(x, spec=AttentionSpec(window))
    check_against_float64(attn, got, _ssmax_reference(attn, x, window), [attn.ssmax], atol=1e-6)


def _assert_generation_equals_parallel(model, tokens: torch.Tensor) -> None:
    """Under full attention and BCA: a prefill of l tokens, then one token at a time through the cache, gives the
    logits of one parallel forward (1e-4)."""
    for window in (AttentionWindow.full(), AttentionWindow.bca(L)):
        view = model.under(AttentionSpec(window))
        with torch.no_grad():
            parallel, _ = view(tokens)
            state = {}
            steps = [view.decoder(tokens[:, :L], incremental_state=state)[0]]
            steps += [view.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(L, tokens.size(1))]
        assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4, window


def test_ssmax_generation_equals_the_parallel_forward_and_refuses_logn():
    model = build_lex_model(tokens_per_sample=L, ssmax=True, qk_norm=True, pos_emb="xpos", seed=6)
    assert {n for n, _ in model.named_parameters() if "ssmax" in n} == {f"decoder.layers.{i}.self_attn.ssmax" for i in range(4)}
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=8)
    _assert_generation_equals_parallel(model, tokens)
    with pytest.raises(ValueError, match="--logn on an SSMax model"):
        model.under(AttentionSpec(logn=L))
    with pytest.raises(ValueError, match="needs the training length"):
        build_lex_model(tokens_per_sample=None, ssmax=True)


def test_drope_switches_from_rope_to_nope_at_the_stated_update():
    """Before update N the logits are the RoPE model's, from N on the NoPE model's with the same weights; a spec that
    needs positions is refused once they are dropped; only rotary schemes take the option."""
    drope = build_lex_model(tokens_per_sample=L, pos_emb="rope", drope_start=5, seed=9)
    rope = build_lex_model(tokens_per_sample=L, pos_emb="rope", seed=1)
    nope = build_lex_model(tokens_per_sample=L, pos_emb="none", seed=2)
    rope.load_state_dict(drope.state_dict())
    nope.load_state_dict(drope.state_dict())  # RoPE has no parameters: the same state dict
    tokens = random_tokens(drope.decoder.dictionary, 2, 3 * L, seed=3)
    with torch.no_grad():
        for updates, reference in ((0, rope), (4, rope), (5, nope), (9, nope)):
            drope.set_num_updates(updates)  # what fairseq's train step and checkpoint loader call
            assert torch.equal(drope(tokens)[0], reference(tokens)[0]), updates
        assert (rope(tokens)[0] - nope(tokens)[0]).abs().max() > 1e-3  # the switch changes something
    drope.set_num_updates(5)
    with pytest.raises(ValueError, match="NoPE has no positions"):
        drope.under(AttentionSpec(position_map=ReRoPE(8)))
    drope.set_num_updates(3)
    assert drope.under(AttentionSpec(window=AttentionWindow.bca(L)))  # before the switch, every rotary option
    with pytest.raises(ValueError, match="--drope-start drops rotary positions"):
        build_lex_model(tokens_per_sample=L, pos_emb="alibi", drope_start=5)


def test_a_drope_run_switches_at_the_stated_update_and_a_resumed_run_too(data_bin, tmp_path):
    """fairseq-train with --drope-start 2: stopped after 1 update and resumed to 3. The checkpoint of update 1
    evaluates as RoPE, that of update 3 as NoPE (the same weights); the resumed run logs the switch at update 2."""

    from conftest import run_cli
    from lex_plugin.hub_interface import from_pretrained
    from lex_plugin.experiments.recipe import fairseq_train_command

    save = tmp_path / "ckpt"
    env = {"OMP_NUM_THREADS": "1"}
    logs = []
    for updates in (1, 3):
        cmd = fairseq_train_command(data_bin, save, model_args=["--pos-emb", "rope", "--drope-start", "2",
                                                                "--decoder-layers", "2"],
                                    tokens_per_sample=32, batch_size=2, updates=updates, total_updates=3, warmup=1,
                                    save_interval_updates=1)
        cmd[cmd.index("--keep-interval-updates") + 1] = "-1"  # keep every interval checkpoint
        done = run_cli(cmd, env=env, timeout=300)
        logs.append(done.stdout + done.stderr)
    assert "DroPE" not in logs[0]
    assert logs[1].count("DroPE: positions dropped from update 2 on") == 1
    before = from_pretrained(save, "checkpoint_1_1.pt", data_bin)
    after = from_pretrained(save, "checkpoint_last.pt", data_bin)
    assert not before.models[0].decoder.positions_dropped and after.models[0].decoder.positions_dropped
    tokens = before.encode("It was a dark and stormy night; the rain fell in torrents.")[None]
    with torch.no_grad():
        for hub, dropped in ((before, False), (after, True)):
            model = hub.models[0]
            other = build_lex_model(dictionary=model.decoder.dictionary, tokens_per_sample=32, decoder_layers=2,
                                    pos_emb="none" if dropped else "rope", share_decoder_input_output_embed=True)
            other.load_state_dict(model.state_dict())
            assert torch.equal(model(tokens)[0], other(tokens)[0])


def test_the_attention_temperature_is_drope_recalibration():
    """--attention-temperature C: every logit times beta = 1 + C ln(L / l) (1 up to l), in any mode, with one row label
    per C; attention under it equals softmax(beta q k^T / sqrt(d)) v in float64; no evaluation length, no beta."""
    from lex_plugin.modules.attention import AttentionOptions, HeldKeys, attend, plan
    from lex_plugin.tasks.lex_language_modeling import row_label

    options = AttentionOptions("bca", attention_temperature=0.25)
    spec = options.spec(64, 1024)
    assert spec.logit_scale == pytest.approx(1 + 0.25 * math.log(16)) and spec.window == AttentionWindow.bca(64)
    assert options.spec(64, 64).logit_scale == 1.0 and options.spec(64, 32).logit_scale == 1.0
    assert row_label(spec, options) == "bca(32)+beta(C=0.25)" == row_label(options.spec(64, 4096), options)
    with pytest.raises(ValueError, match="needs the evaluation length"):
        options.spec(64)
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    spec = AttentionSpec(logit_scale=1.7)
    got = attend(q, HeldKeys(k, v), plan(spec.window, q_len=40), spec=spec, scheme=NoPositions())
    logits = 1.7 * q.double() @ k.double().transpose(-1, -2) / 4.0
    logits = logits.masked_fill(~window_mask(AttentionWindow.full(), 40), float("-inf"))
    assert (got.double() - torch.softmax(logits, -1) @ v.double()).abs().max() < 1e-6


# ---- Llama 4's temperature tuning ------------------------------------------------------------------------------

def _tuned_reference(attn: LexSelfAttention, x: torch.Tensor, window: AttentionWindow, beta: float, floor: int,
                     scheme, positions: torch.Tensor = None) -> torch.Tensor:
    """Temperature-tuned attention in float64, written out: queries times 1 + beta log1p(floor((p + 1) / F)) at
    their position p (transformers' modeling_llama4, attn_temperature_tuning), then the scheme's rotation (NoPE or
    xPos at true positions, float64) and masked softmax."""
    B, T, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    x = x.double()

    def heads(proj):
        return (x @ proj.weight.double().T + proj.bias.double()).view(B, T, H, d).transpose(1, 2)

    p = torch.arange(T, dtype=torch.float64) if positions is None else positions.double()[:, None, :]  # (T,) or (B, 1, T)
    factor = 1.0 + beta * torch.log1p(torch.floor((p + 1.0) / floor))
    q, k = heads(attn.q_proj) * factor[..., None], heads(attn.k_proj)
    if isinstance(scheme, XPos):
        q, k = xpos_pair(scheme, q, k, 0)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    out = torch.softmax(logits.masked_fill(~window_mask(window, T), float("-inf")), -1) @ heads(attn.v_proj)
    out = out.transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def test_temperature_tuning_is_llama4s_formula():
    from lex_plugin.modules.designs import TemperatureTuning

    tuning = TemperatureTuning(0.1, 8192)
    p = torch.tensor([0, 8190, 8191, 16382, 16383, 10**9])
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3),
                1 + 0.1 * math.log1p(math.floor((10**9 + 1) / 8192))]
    assert torch.allclose(tuning.scale(p).double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-7)
    with pytest.raises(ValueError, match="must be positive"):
        TemperatureTuning(0.0, 16)
    with pytest.raises(ValueError, match="at least 1 position"):
        TemperatureTuning(0.1, 0)


@pytest.mark.parametrize("scheme", [NoPositions(), XPos(16)], ids=["nope", "xpos"])
@pytest.mark.parametrize("window,length", [(AttentionWindow.full(), L), (AttentionWindow.full(), 4 * L),
                                           (AttentionWindow.bca(L), 4 * L), (AttentionWindow.sliding(L), 16 * L)], ids=str)
def test_temperature_tuning_equals_its_formula_in_float64(scheme, window, length):
    from lex_plugin.modules.designs import TemperatureTuning

    torch.manual_seed(3)
    attn = LexSelfAttention(64, 4, designs=[TemperatureTuning(0.5, L // 2)])
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme, spec=AttentionSpec(window))
    expected = _tuned_reference(attn, x, window, 0.5, L // 2, scheme)
    assert (got.double() - expected).abs().max() < 1e-5
    plain = LexSelfAttention(64, 4)
    plain.load_state_dict(attn.state_dict())
    differs = (plain(x, scheme=scheme, spec=AttentionSpec(window)) - got).abs().amax(dim=(0, 2))  # (T,)
    assert differs[: L // 2 - 1].max() == 0 and differs[L // 2 - 1:].min() > 0  # 1 up to p = F - 2, sharper after


def test_temperature_tuning_follows_per_sample_positions():
    """Randomized positions at training: each sample's queries are scaled at their own positions (B, T)."""
    from lex_plugin.modules.designs import TemperatureTuning

    torch.manual_seed(4)
    attn = LexSelfAttention(64, 4, designs=[TemperatureTuning(0.5, 8)])
    x = torch.randn(2, 20, 64)
    positions = torch.stack([torch.arange(20) * 3, torch.arange(20) + 40])
    got = attn(x, spec=AttentionSpec(AttentionWindow.full()), positions=positions)
    expected = _tuned_reference(attn, x, AttentionWindow.full(), 0.5, 8, NoPositions(), positions)
    assert (got.double() - expected).abs().max() < 1e-5


def test_temperature_tuning_generation_equals_the_parallel_forward_and_is_recorded():
    """A model option (recorded, no flag at evaluation): token by token through the cache equals one parallel forward
    (full and BCA, positions continue in the cache); --logn and a floor without a beta are refused; the export
    carries it and gives the same logits."""
    model = build_lex_model(tokens_per_sample=L, pos_emb="none", temperature_tuning_beta=0.3, seed=4)
    layer = model.decoder.layers[0].self_attn
    assert layer.temperature_tuning.beta == 0.3 and layer.temperature_tuning.floor_scale == L
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=5)
    _assert_generation_equals_parallel(model, tokens)
    with pytest.raises(ValueError, match="temperature tuning"):
        model.under(AttentionSpec(logn=L))
    with pytest.raises(ValueError, match="give --temperature-tuning-beta"):
        build_lex_model(tokens_per_sample=L, temperature_tuning_floor=8)
    with pytest.raises(ValueError, match="must be positive"):
        build_lex_model(tokens_per_sample=L, temperature_tuning_beta=-0.1)
    floor = build_lex_model(tokens_per_sample=L, temperature_tuning_beta=0.1, temperature_tuning_floor=7)
    assert floor.decoder.layers[0].self_attn.temperature_tuning.floor_scale == 7
    with pytest.raises(ValueError, match="at least 1 position"):  # 0 is a value, not "not given"
        build_lex_model(tokens_per_sample=L, temperature_tuning_beta=0.1, temperature_tuning_floor=0)

    pytest.importorskip("transformers")
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config
    from lex_plugin.models.lex_lm import LexLanguageModel

    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, pos_emb="none", temperature_tuning_beta=0.3)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    LexLanguageModel.build_model(args, argparse.Namespace(source_dictionary=model.decoder.dictionary,
                                                          target_dictionary=model.decoder.dictionary))
    assert args.temperature_tuning_floor == L  # F recorded in the checkpoint's config: a later l does not move it
    config = hf_config(args, model.decoder.dictionary, L)
    assert config.temperature_tuning_beta == 0.3 and config.decoder_config().temperature_tuning_beta == 0.3
    assert config.temperature_tuning_floor == L
    hf = from_fairseq(model, config)
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)[0]).abs().max() <= 1e-5
        left = torch.cat([torch.full((1, 5), model.decoder.dictionary.pad()), tokens[:1, :20]], 1)
        with pytest.raises(ValueError, match="temperature tuning"):  # positions counted from the first: refused
            hf(left, attention_mask=left.ne(model.decoder.dictionary.pad()).long())

"""RoPE scaling at evaluation (position interpolation, NTK-aware, YaRN) against the papers' formulas."""

import math

import pytest
import torch

from conftest import REPO, TRAIN_LEN, build_lex_model, random_tokens, run_cli
from lex_plugin.modules.attention import AttentionSpec
from lex_plugin.modules.positions.rope_scaling import RopeScaling, resolve_factor, rope_scaling_from_options
from lex_plugin.modules.positions.xpos import XPos, rope_theta

D, BASE, L_TRAIN = 64, 10000.0, 512


def paper_angles(kind: str, s: float, l: int = L_TRAIN) -> list:
    """theta_i' written out from the papers, one pair at a time, in Python floats."""
    out = []
    for i in range(D // 2):
        theta = BASE ** (-2 * i / D)
        if kind == "linear":  # Chen et al. 2023, Eq. 4: f'(x, m) = f(x, m L / L')
            out.append(theta / s)
        elif kind == "ntk":  # YaRN paper Eq. 13: b' = b s^(|D| / (|D| - 2))
            out.append((BASE * s ** (D / (D - 2))) ** (-2 * i / D))
        else:  # YaRN paper Eq. 16-18 with alpha = 1, beta = 32
            r = l / (2 * math.pi / theta)
            ramp = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / 31
            out.append((1 - ramp) * theta / s + ramp * theta)
    return out


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
@pytest.mark.parametrize("s", [2.0, 8.0, 32.0])
def test_scaled_angles_follow_the_papers(kind, s):
    theta = torch.tensor([BASE ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    got = RopeScaling(kind, s, L_TRAIN).angles(theta, D, BASE)
    assert got.dtype == torch.float64
    assert torch.allclose(got, torch.tensor(paper_angles(kind, s), dtype=torch.float64), rtol=1e-12, atol=0)


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones():
    got = RopeScaling("yarn", 8.0, L_TRAIN).angles(torch.tensor(paper_angles("linear", 1.0), dtype=torch.float64), D, BASE)
    theta = torch.tensor(paper_angles("linear", 1.0), dtype=torch.float64)
    assert got[0] == theta[0]  # wavelength 2 pi << l: untouched
    assert got[-1] == pytest.approx(float(theta[-1]) / 8, rel=1e-12)  # wavelength >> l: interpolated


@pytest.mark.parametrize("kind,s", [("linear", 4.0), ("ntk", 4.0), ("yarn", 4.0), ("yarn", 1.0)])
@pytest.mark.parametrize("use_scale", [True, False])
def test_rotated_logits_equal_the_float64_formula(kind, s, use_scale):
    """q_n . k_m after XPos.rotate with scaling = sum_i Re[q_i conj(k_i) e^{i (n - m) theta_i'}]
    zeta_i^((n - m) / (B div)) t, with div = s for linear (else 1) and t = (0.1 ln s + 1)^2 for YaRN."""
    scaling = RopeScaling(kind, s, L_TRAIN)
    xpos = XPos(D, use_scale=use_scale)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, D, generator=g), torch.randn(1, D, generator=g)
    theta = torch.tensor(paper_angles(kind, s), dtype=torch.float64)
    zeta = torch.tensor([(2 * i / D + 0.4) / 1.4 for i in range(D // 2)], dtype=torch.float64)
    div = s if kind == "linear" else 1.0
    temperature = (0.1 * math.log(s) + 1) ** 2 if kind == "yarn" and s > 1 else 1.0
    qc = torch.complex(q[0, 0::2].double(), q[0, 1::2].double())
    kc = torch.complex(k[0, 0::2].double(), k[0, 1::2].double())
    for n, m in [(5, 3), (900, 10), (3000, 2999), (4100, 100)]:
        center = (m // 256) * 256
        got = float((xpos.rotate(q, start=n, center=center, scaling=scaling) * xpos.rotate(k, start=m, center=center, keys=True, scaling=scaling)).sum())
        decay = zeta ** ((n - m) / (512 * div)) if use_scale else torch.ones_like(zeta)
        want = float((qc * kc.conj() * torch.exp(1j * (n - m) * theta) * decay).real.sum()) * temperature
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4), (n, m)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_factor_one_is_the_trained_model(kind):
    model = build_lex_model()
    tokens = random_tokens(model.decoder.dictionary, 2, 200)
    with torch.no_grad():
        plain = model(tokens)[0]
        scaled = model(tokens, spec=AttentionSpec(rope_scaling=RopeScaling(kind, 1.0, 32)))[0]
        again = model(tokens)[0]
    assert torch.allclose(plain, scaled, atol=1e-5) and torch.equal(plain, again)


@pytest.mark.parametrize("pos_emb", ["xpos", "rope"])
def test_token_by_token_equals_parallel_under_scaling(pos_emb):
    model = build_lex_model(pos_emb=pos_emb)
    tokens = random_tokens(model.decoder.dictionary, 1, 150)
    model = model.under(AttentionSpec(rope_scaling=RopeScaling("linear", 4.0, 32)))
    with torch.no_grad():
        parallel = model(tokens)[0]
        state = {}
        steps = [model(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    assert torch.allclose(torch.cat(steps, dim=1), parallel, atol=1e-4)


def test_bad_scaling_options_are_explained():
    with pytest.raises(ValueError, match="scales rotary positions"):
        build_lex_model(pos_emb="alibi").under(AttentionSpec(rope_scaling=RopeScaling("linear", 2.0, 32)))
    with pytest.raises(ValueError, match="trained without rotation"):  # theta = 0: a scaling would change nothing
        build_lex_model(pos_emb="xpos", xpos_no_rotation=True).under(AttentionSpec(rope_scaling=RopeScaling("ntk", 2.0, 32)))
    with pytest.raises(ValueError, match="must be > 0"):
        rope_scaling_from_options("linear", "0", 32)
    with pytest.raises(ValueError, match="must be > 0"):
        rope_scaling_from_options("ntk", "-2", 32)
    with pytest.raises(ValueError, match="length is not known"):
        rope_scaling_from_options("yarn", "auto", 32, None)
    with pytest.raises(ValueError, match="needs --rope-scaling-factor"):
        rope_scaling_from_options("yarn", None, 32)
    with pytest.raises(ValueError, match="needs --rope-scaling linear"):
        rope_scaling_from_options(None, "2", 32)
    with pytest.raises(ValueError, match="a number > 0 or 'auto'"):
        rope_scaling_from_options("linear", "twice", 32)
    with pytest.raises(ValueError, match="yarn needs the training length"):
        RopeScaling("yarn", 2.0, None)
    assert resolve_factor("auto", 1024, 256) == 4.0 and resolve_factor("auto", 128, 256) == 1.0


def test_eval_lm_length_table_with_yarn_auto(data_bin, trained, tmp_path):
    """fairseq-eval-lm --rope-scaling yarn --rope-scaling-factor auto: s = L / l per row; at L = l (s = 1)
    the row equals the unscaled one, at 4l it differs; rows are labelled full+yarn(s=auto)."""
    import json

    ckpt, _ = trained
    reports = {}
    for name, extra in (("plain", []), ("yarn", ["--rope-scaling", "yarn", "--rope-scaling-factor", "auto"])):
        run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--path", str(ckpt),
                 "--task", "lex_language_modeling", "--gen-subset", "valid", "--tokens-per-sample", str(TRAIN_LEN),
                 "--batch-size", "8", "--num-workers", "0", "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}",
                 "--eval-tokens", "3000", "--report-json", str(tmp_path / f"{name}.json"), *extra])
        reports[name] = {r["length"]: r for r in json.loads((tmp_path / f"{name}.json").read_text())["results"]}
    plain, yarn = reports["plain"], reports["yarn"]
    assert {r["window"] for r in yarn.values()} == {"full+yarn(s=auto)"}
    assert yarn[TRAIN_LEN]["loss"] == pytest.approx(plain[TRAIN_LEN]["loss"], abs=1e-6)
    assert yarn[4 * TRAIN_LEN]["loss"] != pytest.approx(plain[4 * TRAIN_LEN]["loss"], abs=1e-4)
    assert yarn[4 * TRAIN_LEN]["tokens"] == plain[4 * TRAIN_LEN]["tokens"] == 3000



def _hf(kind, s, l, d=64, base=10000.0, seq_len=None, **extra):
    """transformers' own inverse frequencies and attention factor for a Llama config of head dimension d,
    trained length l (``max_position_embeddings``)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = None if kind == "default" else {"rope_type": kind, "factor": s, **extra}
    config = LlamaConfig(hidden_size=d * 2, num_attention_heads=2, head_dim=d, rope_theta=base,
                         max_position_embeddings=l, rope_scaling=scaling)
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    return inv_freq.double(), factor


@pytest.mark.parametrize("kind,s,length", [("default", 1.0, 256), ("linear", 4.0, 1024), ("dynamic", 4.0, 256),
                                           ("dynamic", 4.0, 96), ("dynamic", 4.0, 4096), ("dynamic", 2.0, 8192), ("llama3", 8.0, 4096),
                                           ("longrope", 4.0, 256), ("longrope", 4.0, 1024)])
def test_scalings_equal_hugging_face_transformers(kind, s, length, tmp_path):
    """Inverse frequencies and attention factor equal transformers' ``modeling_rope_utils`` (1e-6 relative)
    for the variants it implements; longrope's factor lists from a JSON file, the long list past l."""
    import json

    d, base, l = 64, 10000.0, 256
    theta = rope_theta(d, base)
    extra, file = {}, None
    if kind == "longrope":
        lists = {"short_factor": [1.0 + 0.05 * i for i in range(d // 2)], "long_factor": [1.0 + 0.3 * i for i in range(d // 2)]}
        file = tmp_path / "factors.json"
        file.write_text(json.dumps(lists))
        extra = lists
    if kind == "llama3":  # Llama 3.1's values; l is its original context
        extra = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": l}
    hf, hf_factor = _hf(kind, s, l, d, base, seq_len=length, **extra)
    if kind == "default":
        ours, factor = theta, 1.0
    else:
        scaling = rope_scaling_from_options(kind, str(s), l, length, file)
        ours, factor = scaling.angles(theta, d, base), scaling.attention_scale
    assert torch.allclose(ours, hf, rtol=1e-6, atol=0)
    assert factor == pytest.approx(hf_factor, rel=1e-6)
    if kind == "dynamic" and length <= l:  # below l dynamic NTK is the trained model (transformers clamps too)
        assert torch.allclose(ours, theta, rtol=1e-12, atol=0)


def test_yarn_follows_the_paper_and_differs_from_transformers_as_documented():
    """Our YaRN ramps linearly in r = l / wavelength (the paper); transformers ramps linearly in the pair index
    between floor and ceil of the indices where r = 32 and r = 1. Equal outside that range and in the attention
    factor; inside it they differ (here by up to a few percent of an angle)."""
    d, base, l, s = 64, 10000.0, 256, 8.0
    theta = rope_theta(d, base)
    ours = RopeScaling("yarn", s, l).angles(theta, d, base)
    hf, hf_factor = _hf("yarn", s, l, d, base)
    r = l * theta / (2 * math.pi)
    outside = (r >= 32) | (r <= 1)
    assert torch.allclose(ours[outside], hf[outside], rtol=1e-6, atol=0)
    inside = (ours[~outside] - hf[~outside]).abs() / hf[~outside]
    assert inside.max() > 1e-3  # the documented difference: not an accident of rounding
    assert RopeScaling("yarn", s, l).attention_scale == pytest.approx(hf_factor, rel=1e-6)


def test_resonance_rounds_every_wavelength_and_dynamic_needs_the_length():
    d, base = 64, 10000.0
    theta = rope_theta(d, base)
    got = rope_scaling_from_options("resonance", None, 256).angles(theta, d, base)
    wavelength = 2 * math.pi / got
    assert torch.allclose(wavelength, wavelength.round(), atol=1e-9)
    assert ((wavelength - 2 * math.pi / theta).abs() <= 0.5 + 1e-9).all()
    with pytest.raises(ValueError, match="takes no --rope-scaling-factor"):
        rope_scaling_from_options("resonance", "2", 256)
    with pytest.raises(ValueError, match="depends on the evaluation length"):
        rope_scaling_from_options("dynamic", "2", 256, None)
    with pytest.raises(ValueError, match="needs --rope-scaling-file"):
        rope_scaling_from_options("longrope", "2", 256, 1024)
    with pytest.raises(ValueError, match="does not use it"):
        rope_scaling_from_options("yarn", "2", 256, 1024, "f.json")


@pytest.mark.parametrize("kind", ["dynamic", "llama3", "resonance"])
def test_new_scalings_token_by_token_equal_parallel(kind):
    """The base of dynamic NTK is fixed by the spec's length: cached keys and later queries share it, so
    token-by-token generation equals one parallel forward (transformers issue 25104 cannot arise)."""
    model = build_lex_model(pos_emb="xpos", decoder_layers=2).eval()
    scaling = rope_scaling_from_options(kind, None if kind == "resonance" else "4", 32, 128)
    spec = AttentionSpec(rope_scaling=scaling)
    tokens = random_tokens(model.decoder.dictionary, 1, 128)
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        plain = model(tokens)[0]
        state = {}
        steps = torch.cat([model(tokens[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(128)], 1)
    assert (steps - parallel).abs().max() <= 1e-4
    assert (parallel - plain).abs().max() > 1e-3  # the scaling does something

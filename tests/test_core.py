"""The attention core's contracts: importable without fairseq, state passed in (specs, views, observers),
one translation from options to a spec."""

import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO, build_lex_model, random_tokens
from lex_plugin.modules.attention import AttentionOptions, AttentionSpec, AttentionWindow
from lex_plugin.modules.attention.window import LM_INFINITE_N_GLOBAL
from lex_plugin.modules.attention.flags import ATTENTION_FLAGS, MODE_SELECTORS, mode_flags
from lex_plugin.modules.positions.rope_scaling import RopeScaling


@pytest.mark.e2e  # starts a process
def test_the_core_imports_and_runs_without_fairseq():
    """``lex_plugin.modules`` (positions, attention, cache, layers) in a fresh interpreter where fairseq cannot
    be imported: a decoder layer runs BCA through the planner, the executor and the cache, and nothing of
    fairseq or of the fairseq-side packages (models, tasks, hub) was loaded."""
    code = textwrap.dedent("""
        import sys
        sys.modules["fairseq"] = None  # import fairseq -> ModuleNotFoundError
        import torch
        from torchscale.architecture.config import DecoderConfig
        from lex_plugin.modules import AttentionSpec, AttentionWindow, LexDecoderLayer, XPos
        config = DecoderConfig(decoder_embed_dim=32, decoder_attention_heads=4, decoder_ffn_embed_dim=64,
                               decoder_layers=1, dropout=0.0)
        layer = LexDecoderLayer(config, 0).eval()
        x = torch.randn(1, 40, 32)
        spec = AttentionSpec(AttentionWindow.bca(16))
        with torch.no_grad():
            full = layer(x, XPos(8), spec=spec)
            state = {}
            steps = torch.cat([layer(x[:, t : t + 1], XPos(8), None, state, spec) for t in range(40)], dim=1)
        assert (steps - full).abs().max() < 1e-4, float((steps - full).abs().max())
        loaded = sorted(m for m in sys.modules if m.startswith("fairseq") and sys.modules[m] is not None)
        above = sorted(m for m in sys.modules if m.startswith(("lex_plugin.models", "lex_plugin.tasks", "lex_plugin.hub")))
        print("fairseq:", loaded, "above:", above)
        assert not loaded and not above
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fairseq: [] above: []" in out.stdout


def test_the_model_stands_below_the_hub_and_evaluation():
    """Layering, read from the source: ``lex_plugin/modules`` imports nothing of the package outside itself,
    and ``lex_plugin/models`` nothing above it (hub, tasks, evaluation, analysis, data preparation, cli), at
    module level or inside a function; the hub nothing of evaluation/."""
    import ast

    above = ("hub_interface", "tasks", "evaluation", "analysis", "data", "cli", "experiments", "export")
    found = []
    for package, banned in (("modules", None), ("models", above)):
        for path in sorted((REPO / "lex_plugin" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level:
                    depth = len(path.relative_to(REPO / "lex_plugin").parts) - 1  # folders below lex_plugin
                    target = (node.module or "").split(".")[0]
                    leaves = node.level > depth  # reaches lex_plugin itself or above
                    if leaves and (banned is None or target in banned):
                        found.append(f"{path.relative_to(REPO)}: from {'.' * node.level}{node.module or ''}")
    hub = [f"hub_interface.py: from {'.' * node.level}{node.module}" for node in ast.walk(ast.parse(
        (REPO / "lex_plugin" / "hub_interface.py").read_text())) if isinstance(node, ast.ImportFrom) and node.level
        and (node.module or "").split(".")[0] in ("evaluation", "analysis", "tasks", "cli", "experiments")]
    assert found + hub == [], found + hub


def test_a_view_shares_the_weights_and_keeps_the_original_default():
    model = build_lex_model(tokens_per_sample=32)
    view = model.under(AttentionSpec(AttentionWindow.bca(32)))
    assert model.decoder.spec == AttentionSpec() and view.decoder.spec.window == AttentionWindow.bca(32)
    assert view.decoder.layers is model.decoder.layers and view.decoder.embed_tokens is model.decoder.embed_tokens
    with torch.no_grad():
        view.decoder.layers[0].self_attn.q_proj.weight.add_(1.0)  # one set of parameters
    assert torch.equal(view.state_dict()["decoder.layers.0.self_attn.q_proj.weight"],
                       model.state_dict()["decoder.layers.0.self_attn.q_proj.weight"])
    assert list(view.state_dict()) == list(model.state_dict())  # checkpoints load into a view unchanged
    tokens = random_tokens(model.decoder.dictionary, 1, 100)
    with torch.no_grad():
        assert torch.equal(view(tokens)[0], model(tokens, spec=view.decoder.spec)[0])
        assert not torch.allclose(view(tokens)[0], model(tokens)[0], atol=1e-3)  # the default really differs


def test_a_spec_the_scheme_cannot_take_is_refused():
    model = build_lex_model(pos_emb="alibi")
    tokens = random_tokens(model.decoder.dictionary, 1, 10)
    scaled = AttentionSpec(rope_scaling=RopeScaling("linear", 2.0, 32))
    with pytest.raises(ValueError, match="scales rotary positions"):
        model(tokens, spec=scaled)
    with pytest.raises(TypeError, match="AttentionSpec"):
        model(tokens, spec=AttentionWindow.full())
    with pytest.raises(TypeError, match="AttentionWindow"):
        AttentionSpec("bca")


def test_the_observer_is_an_argument_of_one_call():
    model = build_lex_model(tokens_per_sample=32)
    tokens = random_tokens(model.decoder.dictionary, 2, 50)
    seen = []
    with torch.no_grad():
        observed = model(tokens, observer=lambda layer, logits, distance, visible: seen.append((layer, logits.shape)))[0]
        plain = model(tokens)[0]
    assert sorted({layer for layer, _ in seen}) == list(range(len(model.decoder.layers)))
    assert all(shape[-2:] == (50, 50) for _, shape in seen)
    assert torch.equal(observed, plain) and len(seen) == len(model.decoder.layers)  # the next call observes nothing


def test_options_translate_to_specs_in_one_place():
    options = AttentionOptions.from_flags({"bca": True, "sink_tokens": 4, "rope_scaling": "linear", "rope_scaling_factor": "auto"})
    assert options.mode == "bca" and options.sink_tokens == 4
    spec = options.spec(64, evaluation_length=256)
    assert spec.window == AttentionWindow.bca(64).with_sinks(4) and spec.rope_scaling == RopeScaling("linear", 4.0, 64)
    assert str(spec) == "bca(32)+sinks(4)+linear(s=4)"
    assert spec.fields() == {"mode": "bca", "stride": 32, "sinks": 4, "logn": False, "logit_scale": None, "retrieval_blocks": None, "rope_scaling": "linear",
                             "rope_scaling_factor": 4.0}
    assert options.for_mode("full").spec(64, 256).window == AttentionWindow.full()  # sinks stay with bca / sliding
    assert options.for_mode("sliding").spec(64, 256).window == AttentionWindow.sliding(64).with_sinks(4)
    lam = AttentionOptions("lm_infinite", n_global=3).spec(64)
    assert lam.window == AttentionWindow.lm_infinite(3, 64) and lam.fields()["mode"] == "lm_infinite"
    with pytest.raises(ValueError, match="choose one of"):
        AttentionOptions.from_flags({"bca": True, "sliding_window": "l"})
    with pytest.raises(ValueError, match="training length"):
        AttentionOptions("bca").spec(None)


@pytest.mark.parametrize("options,modes,owner", [
    (AttentionOptions("bca", l_local=100), ("full", "bca"), "lm_infinite"),
    (AttentionOptions("dca", n_global=4), ("dca", "full"), "lm_infinite"),
    (AttentionOptions("bca", sliding_window=512), ("bca",), "sliding"),
    (AttentionOptions("full", l_local=32), ("full", "rerope"), "lm_infinite"),
    (AttentionOptions("bca", self_extend_group=4), ("bca", "rerope"), "self_extend"),
], ids=str)
def test_an_option_of_another_mode_is_refused_not_ignored(options, modes, owner):
    """LM-Infinite's n_global and l_local, the sliding window's W, a position map's options: given to a mode that
    does not take them (the hub's ``window='bca', sliding_window=512``), refused; in a comparison, kept for the
    mode that owns them and dropped for the others."""
    with pytest.raises(ValueError, match=re.escape(f"is an option of {mode_flags((owner,))}; this evaluation uses")):
        options.spec(64)
    with pytest.raises(ValueError, match="none of the modes"):
        options.check_modes(modes)
    options.check_modes((*modes, owner))
    assert options.for_mode(modes[0]).mode_options == {}
    expected = {"sliding": AttentionWindow.sliding(512), "lm_infinite": AttentionWindow.lm_infinite(options.n_global or LM_INFINITE_N_GLOBAL, options.l_local or 64),
                "self_extend": AttentionWindow.full()}[owner]
    spec = options.for_mode(owner).spec(64)
    assert spec.window == expected and (owner != "self_extend" or spec.position_map.group == 4)


@pytest.mark.parametrize("flags,message", [
    ({"bca": True, "n_global": 10}, "--n-global 10 is an option of --lm-infinite; this evaluation uses --bca"),
    ({"sink_tokens": 0}, "--sink-tokens 0 is an option of --bca / --sliding-window; this evaluation uses full attention"),
    ({"position_map": "rerope", "sink_tokens": 4}, "--sink-tokens 4 is an option of --bca / --sliding-window"),
    ({"lm_infinite": True, "rerope_window": 32}, "--rerope-window 32 is an option of --position-map rerope / leaky_rerope"),
    ({"position_map": "dca", "self_extend_group": 8}, "--self-extend-group 8 is an option of --position-map self_extend"),
], ids=str)
def test_a_foreign_option_is_refused_at_any_value(flags, message):
    """Given is given: an option of another mode is refused at its default value too (``--bca --n-global 10``,
    LM-Infinite's default), and the message says what to drop or choose."""
    with pytest.raises(ValueError, match=re.escape(message)):
        AttentionOptions.from_flags(flags).spec(64, 256)
    owner = ATTENTION_FLAGS[next(n for n in flags if ATTENTION_FLAGS[n].owners)].owners[0]
    assert AttentionOptions.from_flags(flags).for_mode(owner).spec(64, 256)  # kept by the mode that owns it


@pytest.mark.parametrize("flags", [{"lm_infinite": True, "l_local": 0}, {"lm_infinite": True, "n_global": 0},
                                   {"bca": True, "sink_tokens": -1}, {"position_map": "rerope", "rerope_window": -1}], ids=str)
def test_a_value_below_its_flags_minimum_is_refused_on_every_face(flags):
    """A given 0 is not "not given": ``--l-local 0`` was read as l by the task and the hub (``l_local or length``) while
    the lex commands refused it. The flag's one minimum now holds in AttentionOptions, which every face builds."""
    name = next(n for n in flags if n not in MODE_SELECTORS)
    with pytest.raises(ValueError, match=f"{ATTENTION_FLAGS[name].flag} must be at least"):
        AttentionOptions.from_flags(flags)  # the task's path (its args) and the lex commands'
    mode = next(iter(flags)) if next(iter(flags)) != "position_map" else flags["position_map"]
    with pytest.raises(ValueError, match="must be at least"):
        AttentionOptions({"lm_infinite": "lm_infinite", "bca": "bca"}.get(mode, mode), **{name: flags[name]})  # the hub's


def test_every_attention_flag_is_declared_once():
    """The task's fields, the lex commands' options and AttentionOptions come from ATTENTION_FLAGS: each flag
    appears in each, not given by default (None, or off)."""
    from lex_plugin.cli import main
    from lex_plugin.tasks.lex_language_modeling import LexLanguageModelingConfig

    task = {f.name: f for f in dataclasses.fields(LexLanguageModelingConfig)}
    options = {f.name: f.default for f in dataclasses.fields(AttentionOptions)}
    for name, flag in ATTENTION_FLAGS.items():
        assert task[name].default is (False if flag.type is bool else None), name
        if name not in MODE_SELECTORS or name == "sliding_window":
            assert options.pop(name) is (False if flag.type is bool else None), name
        for command in ("score", "export-hf"):
            params = {p.name: p for p in main.commands[command].params}
            option = params[name]
            assert option.opts == [flag.flag] and (option.is_flag if flag.type is bool else option.default is None), (command, name)
        probe = {p.name for p in main.commands["passkey"].params}
        assert (name in probe) == (name not in MODE_SELECTORS or name == "sliding_window"), name
    assert options == {"mode": "full"}  # nothing else in AttentionOptions


def test_a_view_follows_train_and_eval_of_the_original():
    """A view made while training, the original then put in eval mode: the view evaluates too (no randomized
    positions, no dropout), and a window passed the removed way is refused (fairseq's forward swallows unknown
    keywords: it would do nothing)."""
    model = build_lex_model(tokens_per_sample=32, random_positions=64)
    model.train()
    view = model.under(AttentionSpec())
    model.eval()
    tokens = random_tokens(model.decoder.dictionary, 1, 30)
    with torch.no_grad():
        assert torch.equal(view(tokens)[0], model(tokens)[0])
    with pytest.raises(TypeError, match="spec="):
        model(tokens, window=AttentionWindow.bca(32))


def test_the_config_pickles_and_a_scheme_option_is_honoured():
    import pickle

    from lex_plugin.models.lex_lm import LexLanguageModelConfig

    pickle.loads(pickle.dumps(LexLanguageModelConfig()))
    model = build_lex_model(pos_emb="xpos", xpos_gamma=0.5)
    assert model.decoder.positions[0].gamma == 0.5

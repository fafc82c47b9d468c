"""The registry of trained designs (lex_plugin.modules.designs): a design added in one module acts at its point of
attention in every layer, through the cache too, without attention knowing it; the registry refuses a name or an
option declared twice and two designs that add sink logits; the docs' table is the registry's."""

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from conftest import REPO, random_tokens
from lex_plugin.models.builder import build_random_lm
from lex_plugin.modules.attention import AttentionOptions
from lex_plugin.modules.designs import (DESIGNS, DesignOption, DesignSpec, LayerDesign, build_designs, design_table,
                                        register_design, unregister_design)

L = 16


@dataclass(frozen=True)
class _Doubled(LayerDesign):
    """A toy design: every query times a fixed factor, before the position scheme."""

    factor: float

    def queries(self, attention, q, at):
        return q * self.factor


def _toy_build(config) -> Optional[_Doubled]:
    factor = getattr(config, "toy_query_factor", None)
    return _Doubled(float(factor)) if factor else None


TOY = DesignSpec(name="toy_query_factor", summary="queries times a factor", source="this test",
                 options=(DesignOption("toy_query_factor", float, None, "a factor on every query"),), build=_toy_build)


@pytest.fixture
def toy():
    register_design(TOY)
    yield TOY
    unregister_design(TOY.name)


@pytest.mark.parametrize("mode", ["full", "bca", "sliding"])
def test_a_design_added_in_one_place_acts_in_every_layer_and_through_the_cache(toy, mode):
    """The toy's factor on the queries equals the same factor folded into q_proj's weight and bias (the position
    schemes are linear in q): parallel and token by token, under every window, with no change to attention."""
    toy_model, d = build_random_lm("lex_lm_tiny", tokens_per_sample=L, seed=2, pos_emb="xpos", toy_query_factor=2.0)
    folded, _ = build_random_lm("lex_lm_tiny", tokens_per_sample=L, seed=2, pos_emb="xpos")
    with torch.no_grad():
        for layer in folded.decoder.layers:
            layer.self_attn.q_proj.weight.mul_(2.0)
            layer.self_attn.q_proj.bias.mul_(2.0)
    assert [spec.name for spec, _ in toy_model.decoder.designs] == ["toy_query_factor"]
    tokens = random_tokens(d, 2, 4 * L, seed=3)
    spec = AttentionOptions(mode).spec(L)
    with torch.no_grad():
        a, b = toy_model.under(spec)(tokens)[0], folded.under(spec)(tokens)[0]
        state: dict = {}
        steps = torch.cat([toy_model.under(spec)(tokens[:, : n + 1], incremental_state=state)[0][:, -1:]
                           for n in range(2 * L)], 1)
    assert (a - b).abs().max() < 1e-4 and (steps - b[:, : 2 * L]).abs().max() < 1e-4
    plain, _ = build_random_lm("lex_lm_tiny", tokens_per_sample=L, seed=2, pos_emb="xpos")
    with torch.no_grad():
        assert (plain.under(spec)(tokens)[0] - b).abs().max() > 1e-3  # the factor is not a no-op


def test_the_registry_refuses_what_it_cannot_tell_apart(toy):
    with pytest.raises(ValueError, match="registered twice"):
        register_design(TOY)
    with pytest.raises(ValueError, match="--toy-query-factor is declared by two designs"):
        register_design(DesignSpec(name="other", summary="", source="", options=TOY.options, build=_toy_build))

    for name, flag, config, match in (
            ("toy_sinks", "sinks", {"learned_sinks": True}, "learned_sinks and toy_sinks both add a logit"),
            ("toy_placer", "interleaves", {"landmark_block_size": 4, "decoder_embed_dim": 8, "pos_emb": "xpos"},
             "landmark and toy_placer both place vectors between the tokens")):
        design = dataclass(frozen=True)(type("_Toy", (LayerDesign,), {flag: True}))()
        register_design(DesignSpec(name=name, summary="", source="", options=(DesignOption(name, bool, False, ""),),
                                   build=lambda config, name=name, design=design: design if getattr(config, name, False) else None))
        try:
            with pytest.raises(ValueError, match=match):
                build_designs(type("Config", (), {**config, name: True})())
        finally:
            unregister_design(name)
    assert list(DESIGNS)[:4] == ["qk_norm", "ssmax", "temperature_tuning", "learned_sinks"] and list(DESIGNS)[-1] == "toy_query_factor"


def test_the_docs_table_is_the_registry():
    assert design_table() in (REPO / "docs" / "architecture.md").read_text()


def test_a_switch_given_as_text_is_refused_not_read_as_true():
    """``bool("False")`` is True: a design's switch read from a config holding text is refused, naming the flag."""
    from lex_plugin.modules.designs import QK_NORM

    with pytest.raises(ValueError, match="--qk-norm is a switch: give True or False, not the text 'False'"):
        QK_NORM.options[0].read(type("Config", (), {"qk_norm": "False"})())
    assert QK_NORM.options[0].read(type("Config", (), {"qk_norm": None})()) is False

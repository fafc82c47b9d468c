"""Adding a position scheme is one module: a scheme registered from this test file is choosable, built,
validated, refused where it does not apply, and in the table of docs/positions.md; a scheme that is not
translation-invariant gets its true positions under every window, sinks and Λ included."""

import math

import pytest
import torch

from conftest import build_lex_model, random_tokens, run_attention
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow
from lex_plugin.modules.positions import PositionScheme, SchemeOption, SchemeSpec, register_position_scheme, scheme_table
from lex_plugin.modules.positions.scheme import unregister_position_scheme
from test_sinks import distances

TOY = "toy_query_bias"


class QueryScaledBias(PositionScheme):
    """f_h(n, m) = -rate (h + 1) (n - m) (1 + n / 64): a distance bias that grows with the query position n,
    so the logits are *not* a function of n - m alone."""

    kind = "bias"
    translation_invariant = False

    def __init__(self, heads: int, rate: float):
        super().__init__()
        self.heads, self.rate = heads, rate

    def bias_at(self, query, key):
        h = torch.arange(1, self.heads + 1, dtype=torch.float32, device=query.device)
        term = ((query - key).clamp(min=0) * (1 + query / 64)).float()
        return -self.rate * h.view(-1, *([1] * term.dim())) * term

    def bias(self, q_start, q_len, k_start, k_len, device):
        query = torch.arange(q_start, q_start + q_len, device=device)[:, None]
        return self.bias_at(query, torch.arange(k_start, k_start + k_len, device=device)[None, :])


def _validate(config):
    if config.toy_rate <= 0:
        raise ValueError(f"--toy-rate must be > 0, got {config.toy_rate}.")


@pytest.fixture
def toy_scheme():
    spec = register_position_scheme(SchemeSpec(
        TOY, "bias", "a bias that depends on the query position (a test's scheme)", "lex_plugin tests",
        lambda config, layer: QueryScaledBias(config.decoder_attention_heads, config.toy_rate), validate=_validate,
        options=(SchemeOption("toy_rate", float, 0.05, "slope of the toy bias"),),
    ))
    yield spec
    unregister_position_scheme(TOY)


def test_a_scheme_registered_here_is_choosable_built_validated_and_listed(toy_scheme):
    model = build_lex_model(pos_emb=TOY, toy_rate=0.2)
    assert isinstance(model.decoder.positions[0], QueryScaledBias) and model.decoder.positions[0].rate == 0.2
    assert build_lex_model(pos_emb=TOY).decoder.positions[0].rate == 0.05  # the scheme's own default
    with pytest.raises(ValueError, match="--toy-rate must be > 0"):
        build_lex_model(pos_emb=TOY, toy_rate=-1.0)
    with pytest.raises(ValueError, match="--toy-rate 0.3 is an option of --pos-emb toy_query_bias; .* alibi"):
        build_lex_model(pos_emb="alibi", toy_rate=0.3)
    with pytest.raises(ValueError, match="--xpos-gamma 0.5 is an option of --pos-emb xpos"):
        build_lex_model(pos_emb=TOY, xpos_gamma=0.5)
    assert f"| `{TOY}` | bias | a bias that depends on the query position" in scheme_table()
    assert "`--toy-rate` (0.05)" in scheme_table()
    tokens = random_tokens(model.decoder.dictionary, 1, 70)
    with torch.no_grad():  # incremental == parallel through the bounded cache at true positions
        spec = AttentionSpec(AttentionWindow.bca(32))
        parallel = model(tokens, spec=spec)[0]
        state = {}
        steps = torch.cat([model(tokens[:, : t + 1], incremental_state=state, spec=spec)[0] for t in range(70)], 1)
    assert (steps - parallel).abs().max() <= 1e-4


def test_unregistering_removes_the_scheme_and_its_options(toy_scheme):
    from lex_plugin.modules.positions import POSITION_SCHEMES, SCHEME_OPTIONS

    assert TOY in POSITION_SCHEMES and "toy_rate" in SCHEME_OPTIONS
    unregister_position_scheme(TOY)
    assert TOY not in POSITION_SCHEMES and "toy_rate" not in SCHEME_OPTIONS
    register_position_scheme(toy_scheme)  # for the fixture's own clean-up


@pytest.mark.parametrize("window", [
    AttentionWindow.full(), AttentionWindow.bca(16), AttentionWindow.sliding(12), AttentionWindow.bca(16).with_sinks(3),
    AttentionWindow.sliding(12).with_sinks(2), AttentionWindow.lm_infinite(3, 12)], ids=str)
def test_a_query_dependent_bias_sees_true_positions_under_every_window(window):
    """Naive float64 attention with f_h(n, m) at the true query position n: keys inside the window at their own
    position m, sinks at their virtual position n - D (``test_sinks.distances``)."""
    torch.manual_seed(0)
    B, H, D, L = 2, 3, 8, 75
    q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
    scheme = QueryScaledBias(H, 0.05)
    got = run_attention(q, k, v, window, scheme, group_tokens=32)
    dist, visible = distances(window, L)
    n = torch.arange(L)[:, None].expand(L, L)
    bias = scheme.bias_at(n, n - dist).double()  # (H, L, L)
    logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D) + bias
    expected = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v.double()
    assert (got.double() - expected).abs().max() < 1e-5

"""BranchCache: N continuations of a batch-1 prompt over its one cache equal the same continuations over N copies of
the cache (the reordered path), token by token, through re-centring and windows; the prompt's cache stays as it was."""

import pytest
import torch

from conftest import build_lex_model, random_tokens
from lex_plugin.evaluation.passkey import read_prompt
from lex_plugin.modules.attention import AttentionOptions
from lex_plugin.modules.attention.branch_cache import BranchCache, branch_incremental_state
from lex_plugin.modules.positions import XPos


@pytest.mark.parametrize("mode", ["full", "bca", "sliding", "dca"])
def test_branches_continued_token_by_token_equal_reordered_copies(mode, monkeypatch):
    """Rows continued one token per call, eight calls: every call's logits as the copied cache's, with xPos's
    centre allowed 300 positions so that the branch moves its centre after keys of its own are stored."""
    monkeypatch.setattr(XPos, "max_center_offset", lambda self, dtype, scaling=None: 300)
    model = build_lex_model(tokens_per_sample=64, pos_emb="rope" if mode == "dca" else "xpos")
    d = model.decoder.dictionary
    spec = AttentionOptions(mode).spec(64)
    prompt = random_tokens(d, 1, 1067, seed=1)[0]
    rows = random_tokens(d, 3, 8, seed=2)
    trunk = read_prompt(model, prompt, spec, d.eos())
    copies = read_prompt(model, prompt, spec, d.eos())
    model.decoder.reorder_incremental_state_scripting(copies.state, torch.zeros(3, dtype=torch.long))
    state = branch_incremental_state(trunk.state, 3)
    ends = {k: (c.end, c.center) for k, c in trunk.state.items()}
    source = torch.cat([trunk.source.expand(3, -1), rows], 1)
    with torch.no_grad():
        for t in range(trunk.source.size(1), source.size(1) + 1):
            got, _ = model(source[:, :t], incremental_state=state, spec=spec)
            want, _ = model(source[:, :t], incremental_state=copies.state, spec=spec)
            torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert {k: (c.end, c.center) for k, c in trunk.state.items()} == ends  # the trunk as it was
    if mode in ("bca", "sliding"):  # the window's bound holds in the branch too: at most l keys held
        assert all(b.length <= 64 for b in state.values())
    if mode != "dca":  # rotated caches: the branch moved its centre past the trunk's, with keys of its own stored
        assert all(b.center > trunk.state[k].center for k, b in state.items())


def test_a_branch_refuses_a_trunk_continued_under_it_and_a_batch_of_prompts():
    model = build_lex_model(tokens_per_sample=64)
    d = model.decoder.dictionary
    spec = AttentionOptions("full").spec(64)
    trunk = read_prompt(model, random_tokens(d, 1, 100, seed=1)[0], spec, d.eos())
    state = branch_incremental_state(trunk.state, 2)
    with torch.no_grad():
        model(trunk.source, incremental_state=trunk.state, spec=spec)  # the prompt's cache moves on
        with pytest.raises(RuntimeError, match="continued while candidates branched"):
            model(torch.cat([trunk.source, trunk.source[:, -1:]], 1).expand(2, -1), incremental_state=state, spec=spec)
    two = {}
    with torch.no_grad():
        model(random_tokens(d, 2, 20), incremental_state=two, spec=spec)
    with pytest.raises(ValueError, match="batch-1 prompt"):
        BranchCache(next(iter(two.values())), 3)

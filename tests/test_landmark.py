"""Landmark tokens (modules/designs/landmark.py, kernel attention/kernels/landmarks.py; Mohtashami & Jaggi 2023, arXiv
2305.16300, section 3): the grouped softmax against the paper's grouping G, GroupedSoftmax and AttWeight written out
query by query in float64 (xPos, RoPE, NoPE; gradients included), the top-k retrieval of section 3.2 against the same
with the unchosen landmarks left out, top-k over every block equal to the grouped softmax; the decoder's placement of
the landmarks (one after every b tokens, their outputs dropped, the tokens' outputs depending on no later token); token
by token and in chunks through the cache equal to the parallel forward, alone and in the global layer of a layer
pattern, and exported to Hugging Face with the same logits; what it cannot take refused."""

import math

import pytest
import torch

from conftest import build_lex_model, check_against_float64, check_design_model, random_tokens
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, LexSelfAttention
from lex_plugin.modules.attention.kernels import landmarks
from lex_plugin.modules.attention.retrieval import LandmarkRetrieval
from lex_plugin.modules.designs.landmark import Landmark
from lex_plugin.modules.positions import XPos
from lex_plugin.modules.positions.scheme import NoPositions
from test_xpos import rotated_qkv64

L = 16
D = 16  # head dimension: 64 / 4 heads


def paper_weights(logits: torch.Tensor, block: int, topk=None, padding=None) -> torch.Tensor:
    """AttWeight (B, H, T, T) float64 of section 3.1 from the logits (B, H, T, T) over positions laid out as the decoder
    lays them (position s a landmark when s % (b + 1) == b): p_j the landmark of j's block (j itself for a landmark;
    the sequence's length for the last, incomplete block); for query i the group of key j <= i is G_ij = p_j for a
    token, -1 (left out) for j = p_i, p_i for the other landmarks; S_i = GroupedSoftmax(logits_i, G_i); AttWeight_ij =
    0 for a landmark, S_ij in i's own group (p_i: a landmark query's own group is its block's, itself left out),
    S_ij S_i,p_j otherwise. ``topk``: the other landmarks outside query i's k highest logits (per head) leave its
    softmax, and with them their blocks. ``padding`` (B, T) bool: those keys leave every group."""
    B, H, T, _ = logits.shape
    P = block + 1
    s = torch.arange(T)
    landmark = s % P == block
    p = torch.where(landmark, s, s // P * P + block)
    p = torch.where(p < T, p, torch.full_like(p, T))
    weights = torch.zeros(B, H, T, T, dtype=torch.float64)
    for i in range(T):
        j = s[: i + 1]
        group = torch.where(~landmark[j], p[j], p[i].expand(i + 1))
        group = torch.where(j == p[i], torch.full_like(group, -1), group)
        keep = (group >= 0).expand(B, H, -1).clone()  # (B, H, i + 1)
        if padding is not None:
            keep &= ~padding[:, None, : i + 1]
        others = landmark[j] & (j != p[i])
        if topk is not None:
            score = logits[:, :, i, : i + 1].masked_fill(~(others & keep), float("-inf"))
            chosen = torch.zeros_like(keep)
            for _ in range(topk):  # the k highest finite scores, one at a time
                best = score.argmax(-1, keepdim=True)
                chosen.scatter_(-1, best, torch.gather(score, -1, best) > float("-inf"))
                score = score.masked_fill(chosen, float("-inf"))
            dropped = others & ~chosen  # (B, H, i + 1): unchosen landmarks, and their blocks' tokens below
            keep &= ~dropped & ~(~landmark[j] & dropped[..., p[j].clamp(max=i)] & (p[j] <= i))
        z = logits[:, :, i, : i + 1].double()
        S = torch.zeros_like(z)
        for g in group.unique().tolist():
            member = (group == g) & keep
            zg = z.masked_fill(~member, float("-inf"))
            rows = member.any(-1, keepdim=True)
            S = S + torch.where(member, torch.softmax(zg.masked_fill(~rows, 0.0), -1), torch.zeros_like(z))
        weights[:, :, i, : i + 1] = torch.where(landmark[j], torch.zeros_like(S),
                                                torch.where(group == p[i], S, S * S[..., p[j].clamp(max=i)]))
    return weights


def reference(attn: LexSelfAttention, x: torch.Tensor, scheme, block: int, topk=None, padding=None) -> torch.Tensor:
    """Landmark attention in float64 (:func:`paper_weights` on q k^T / sqrt(d) of q, k rotated in float64), then the
    output projection."""
    B, T, C = x.shape
    q, k, v = rotated_qkv64(attn, x, scheme)
    out = paper_weights((q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim), block, topk, padding) @ v
    out = out.transpose(1, 2).reshape(B, T, C)
    return out @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def _landmark(block: int, topk=None, seed: int = 0) -> LexSelfAttention:
    torch.manual_seed(seed)
    return LexSelfAttention(64, 4, designs=[Landmark(LandmarkRetrieval(block, topk), 64)])


@pytest.mark.parametrize("scheme", [NoPositions(), XPos(D, use_scale=False), XPos(D)], ids=["nope", "rope", "xpos"])
@pytest.mark.parametrize("block,topk,length,path", [
    (4, None, 23, "explicit"), (3, None, 32, "explicit"),  # without a top-k every key is read: the explicit way only
    (4, 2, 30, "explicit"), (2, 1, 17, "explicit"), (3, 3, 45, "explicit"),
    (4, 2, 30, "gathered"), (2, 1, 17, "gathered"), (3, 3, 45, "gathered")], ids=str)
def test_the_grouped_softmax_equals_the_papers_formula_in_float64_with_its_gradients(scheme, block, topk, length, path,
                                                                                       monkeypatch):
    """Both of the kernel's ways with a top-k: explicit logits over every key, and each query's blocks gathered."""
    monkeypatch.setattr(landmarks, "DENSE_FACTOR", 1000 if path == "explicit" else 0)
    attn = _landmark(block, topk)
    x = torch.randn(2, length, 64)
    got = attn(x, scheme=scheme)
    expected = reference(attn, x, scheme, block, topk)
    check_against_float64(attn, got, expected, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])


def test_top_k_over_every_block_is_the_grouped_softmax_and_fewer_blocks_differ():
    x = torch.randn(2, 50, 64)
    every = _landmark(4)(x, scheme=XPos(D))
    assert (_landmark(4, 10)(x, scheme=XPos(D)) - every).abs().max() == 0  # 9 earlier blocks at most
    assert (_landmark(4, 2)(x, scheme=XPos(D)) - every).abs().max() > 1e-3


def test_an_output_reads_its_own_block_and_the_chosen_blocks_only():
    """d out_n / d x_m with top-1 retrieval (blocks of 4 tokens and a landmark, 4 heads): n's own block up to n, and at
    most one earlier block per head with its landmark; and the weights of a row sum to one (values all one give one)."""
    attn = _landmark(4, 1)
    x = torch.randn(1, 45, 64)
    for n in (27, 44):
        xi = x.clone().requires_grad_(True)
        attn(xi, scheme=XPos(D))[0, n].sum().backward()
        read = (xi.grad[0].abs().sum(-1) > 0).nonzero().flatten()
        blocks = set((read // 5).tolist())
        assert n // 5 in blocks and max(read.tolist()) == n and 2 <= len(blocks) <= 5 < n // 5 + 1
    with torch.no_grad():
        attn.v_proj.weight.zero_()
        attn.v_proj.bias.fill_(1.0)
        attn.out_proj.weight.copy_(torch.eye(64))
        attn.out_proj.bias.zero_()
        assert (attn(x, scheme=XPos(D)) - 1.0).abs().max() < 1e-6


@pytest.mark.parametrize("path", ["explicit", "gathered"])
def test_padded_keys_leave_every_group(path, monkeypatch):
    monkeypatch.setattr(landmarks, "DENSE_FACTOR", 1000 if path == "explicit" else 0)
    attn = _landmark(4, 2)
    x = torch.randn(2, 40, 64)
    padding = torch.zeros(2, 40, dtype=torch.bool)
    padding[1, 11:14] = True  # inside block 2: two of its tokens and none of its landmark
    padding[0, 30:] = True  # right padding
    with torch.no_grad():
        got = attn(x, scheme=XPos(D), key_padding_mask=padding)
        expected = reference(attn, x, XPos(D), 4, 2, padding=padding)
        alone = attn(x[:1, :30], scheme=XPos(D))
    assert (got[1].double() - expected[1]).abs().max() < 1e-5
    assert (got[0, :30].double() - expected[0, :30]).abs().max() < 1e-5 and (got[0, :30] - alone[0]).abs().max() < 1e-5


@pytest.mark.parametrize("path", ["explicit", "gathered"])
def test_a_padded_query_with_nothing_to_see_takes_its_own_value(path, monkeypatch):
    """A row whose first positions are padding (as a cache continued after a padded start holds): those queries' groups
    are empty, and each takes its own value (finite; the loss ignores it); the real queries after them equal the
    float64 formula with the padded keys left out."""
    monkeypatch.setattr(landmarks, "DENSE_FACTOR", 1000 if path == "explicit" else 0)
    attn = _landmark(4, 2)
    x = torch.randn(2, 40, 64)
    padding = torch.zeros(2, 40, dtype=torch.bool)
    padding[1, :3] = True  # the first three tokens of block 0: nothing before them, no earlier landmark
    with torch.no_grad():
        got = attn(x, scheme=XPos(D), key_padding_mask=padding)
        expected = reference(attn, x, XPos(D), 4, 2, padding=padding)
        own = attn.out_proj(attn.v_proj(x[1, :3]))
    assert (got[1, :3] - own).abs().max() < 1e-5
    assert (got[1, 3:].double() - expected[1, 3:]).abs().max() < 1e-5 and (got[0].double() - expected[0]).abs().max() < 1e-5


def test_the_decoder_places_a_landmark_after_every_b_tokens_and_drops_its_output():
    model = build_lex_model(tokens_per_sample=L, seed=2, pos_emb="xpos", landmark_block_size=4)
    decoder = model.decoder
    tokens = random_tokens(decoder.dictionary, 2, 3 * L)
    seen = []
    observer = lambda layer, logits, distance, visible: seen.append(logits.size(-1))  # noqa: E731
    with torch.no_grad():
        features, states = decoder.extract_features(tokens, observer=observer)
    assert features.shape[1] == 3 * L and all(s.shape[1] == 3 * L for s in states["inner_states"])
    assert set(seen) == {3 * L + 3 * L // 4}  # 48 tokens and 12 landmarks: each layer sees 60 positions
    assert [decoder.tokens_in(n) for n in (0, 4, 5, 9, 10, 60)] == [0, 4, 4, 8, 8, 48]
    # a token's output depends on no later token: change the tail, the head stays
    changed = tokens.clone()
    changed[:, 30:] = random_tokens(decoder.dictionary, 2, 3 * L - 30, seed=9)
    with torch.no_grad():
        assert (model(changed)[0][:, :30] - model(tokens)[0][:, :30]).abs().max() == 0
    with torch.no_grad():  # the landmark's vector enters: zeroing it changes every later block's tokens
        before = model(tokens)[0]
        decoder.landmark_embedding.zero_()
        after = model(tokens)[0]
    assert (after[:, :4] - before[:, :4]).abs().max() == 0 and (after[:, 4:] - before[:, 4:]).abs().max() > 1e-4


@pytest.mark.parametrize("topk", [None, 2])
def test_generation_equals_the_parallel_forward_and_the_export_gives_the_same_logits(topk):
    options = dict(pos_emb="xpos", landmark_block_size=4, **({} if topk is None else {"landmark_topk": topk}))
    model = build_lex_model(tokens_per_sample=L, seed=3, **options)
    assert [m.self_attn._retrieval for m in model.decoder.layers] == [LandmarkRetrieval(4, topk)] * 4
    check_design_model(model, options, L, specs=[AttentionSpec()], flips=0.1 if topk else 0.0)


def test_without_positions_and_without_top_k_generation_equals_the_parallel_forward():
    """Without positions every landmark enters the first layer as the same vector: their scores tie, which the grouped
    softmax over every landmark shares evenly (no choice to flip); a top-k is refused there (below)."""
    options = dict(pos_emb="none", landmark_block_size=4)
    check_design_model(build_lex_model(tokens_per_sample=L, seed=6, **options), options, L, specs=[AttentionSpec()])


def test_equal_scores_choose_the_later_blocks_in_every_pass():
    """Keys equal for every landmark (a value each block's tokens share, the landmarks one key): the top 2 are the two
    most recent earlier blocks for every query, in one pass as in a pass per query."""
    from lex_plugin.modules.attention.kernels.landmarks import _top
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5], [3.0, 3.0, float("-inf"), 1.0, 1.0]])
    assert _top(scores, 2).tolist() == [[False, False, True, True, False], [True, True, False, False, False]]
    assert _top(scores, 3).tolist() == [[False, True, True, True, False], [True, True, False, False, True]]


def test_chunks_that_cross_blocks_equal_one_pass_and_the_cache_counts_tokens():
    model = build_lex_model(tokens_per_sample=L, seed=4, pos_emb="rope", landmark_block_size=3, landmark_topk=2)
    tokens = random_tokens(model.decoder.dictionary, 2, 4 * L, seed=5)
    with torch.no_grad():
        parallel = model(tokens)[0]
        state: dict = {}
        outs = []
        for end in range(7, tokens.size(1) + 7, 7):  # 7 tokens a call: blocks of 3 end inside and at the edges
            outs.append(model.decoder(tokens[:, :end], incremental_state=state)[0])
            assert model.decoder.past_length(state) == min(end, tokens.size(1))
    assert (torch.cat(outs, 1) - parallel).abs().max() <= 1e-4


def test_in_the_global_layer_of_a_pattern_with_the_local_layers_windows():
    options = dict(pos_emb="xpos", landmark_block_size=4, landmark_topk=2, layer_pattern="xpos/bca*3,none/full")
    model = build_lex_model(tokens_per_sample=L, seed=5, **options)
    assert [m.self_attn._retrieval for m in model.decoder.layers] == [None, None, None, LandmarkRetrieval(4, 2)]
    check_design_model(model, options, L, specs=[AttentionSpec()], flips=0.05)


def test_what_it_cannot_take_is_refused():
    with pytest.raises(ValueError, match="--landmark-topk 2 belongs to landmark tokens"):
        build_lex_model(tokens_per_sample=L, landmark_topk=2)
    with pytest.raises(ValueError, match="--landmark-topk 0"):
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, landmark_topk=0)
    with pytest.raises(ValueError, match="not --pos-emb alibi"):
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, pos_emb="alibi")
    with pytest.raises(ValueError, match="with --sink-token"):
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, sink_token=True)
    with pytest.raises(ValueError, match="their scores tie exactly"):  # NoPE in the first (landmark) layer
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, landmark_topk=2, pos_emb="none")
    with pytest.raises(ValueError, match="their scores tie exactly"):
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, landmark_topk=2, pos_emb="xpos",
                        layer_pattern="none/full,xpos/bca*3")
    with pytest.raises(ValueError, match="with --learned-sinks"):
        build_lex_model(tokens_per_sample=L, landmark_block_size=4, learned_sinks=True)
    model = build_lex_model(tokens_per_sample=L, landmark_block_size=4)
    tokens = random_tokens(model.decoder.dictionary, 1, 3 * L)
    with pytest.raises(ValueError, match="its layers run full attention"):
        model.under(AttentionSpec(AttentionWindow.bca(L)))(tokens)
    with pytest.raises(ValueError, match="--retrieval-blocks on a model trained with landmark"):
        from lex_plugin.modules.attention import AttentionOptions
        model.under(AttentionOptions("bca", retrieval_blocks=2).spec(L))


def test_the_probes_candidates_over_one_cache_equal_each_candidate_run_alone():
    """The passkey and RULER probes score N right-padded candidates as branches of the prompt's cache; with blocks of
    4 tokens, prompts of 58 .. 61 tokens put block ends (and so landmarks) at every offset inside the candidates."""
    from lex_plugin.evaluation.passkey import score_candidates

    model = build_lex_model(tokens_per_sample=L, seed=3, pos_emb="xpos", landmark_block_size=4, landmark_topk=2).eval()
    d = model.decoder.dictionary
    for length in (58, 59, 60, 61):
        prompt = random_tokens(d, 1, length, seed=length)[0]
        candidates = [random_tokens(d, 1, n, seed=10 + n)[0] for n in (1, 3, 5, 6)]
        got = score_candidates(model, prompt, candidates, AttentionSpec(), d.eos(), d.pad()).logprob
        for c, score in zip(candidates, got):
            with torch.no_grad():
                lp = model(torch.cat([torch.tensor([d.eos()]), prompt, c])[None])[0][0].double().log_softmax(-1)
            assert abs(score - sum(lp[length + i, c[i]] for i in range(c.numel()))) < 1e-5

"""--random-positions (Ruoss et al. 2023): sorted random position ids per sample at training."""

import json
import math
import re

import pytest
import torch

from conftest import REPO, TRAIN_LEN, build_lex_model, random_tokens, run_cli
from lex_plugin.modules.positions import XPos, alibi_slopes

SCHEMES = ["xpos", "rope", "alibi", "t5", "kerple_log", "sinusoidal", "learned", "none"]


def forward_at(model, tokens, positions):
    """The training forward with the given (B, T) positions instead of random ones (dropout is 0)."""
    model.train()
    model.decoder._random_positions = lambda t: positions
    try:
        with torch.no_grad():
            return model(tokens)[0]
    finally:
        del model.decoder._random_positions
        model.eval()


@pytest.mark.parametrize("pos_emb", SCHEMES)
def test_ordinary_positions_give_the_ordinary_forward(pos_emb):
    table = dict(max_target_positions=512) if pos_emb == "learned" else {}
    model = build_lex_model(pos_emb=pos_emb, random_positions=512, dropout=0.0, **table)
    tokens = random_tokens(model.decoder.dictionary, 2, 48)
    with torch.no_grad():
        plain = model(tokens)[0]
    at = forward_at(model, tokens, torch.arange(48).expand(2, -1))
    assert torch.allclose(at, plain, atol=2e-5)


@pytest.mark.parametrize("pos_emb", ["xpos", "rope", "alibi", "t5", "none", "sinusoidal"])
def test_relative_schemes_see_only_differences(pos_emb):
    """Shifting every position by 300 changes nothing for relative schemes, and does for absolute ones."""
    model = build_lex_model(pos_emb=pos_emb, random_positions=1024, dropout=0.0)
    tokens = random_tokens(model.decoder.dictionary, 2, 40)
    g = torch.Generator().manual_seed(0)
    positions = torch.rand(2, 600, generator=g).argsort(1)[:, :40].sort(1).values
    a, b = forward_at(model, tokens, positions), forward_at(model, tokens, positions + 300)
    if pos_emb == "sinusoidal":
        assert not torch.allclose(a, b, atol=1e-3)
    else:
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_at_random_positions_matches_float64(scheme, padded):
    """Attention at arbitrary positions through the planner and executor == float64 attention with q and k
    rotated one row at a time at their own position (XPos.rotate, one centre) or the ALiBi bias of their
    distances, causal in index order, padded keys hidden."""
    from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, HeldKeys, attend, plan
    from lex_plugin.modules.positions import ALiBi

    torch.manual_seed(0)
    B, H, T, D = 2, 4, 24, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    positions = torch.rand(B, 2000).argsort(1)[:, :T].sort(1).values
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :5] = True  # left padding of the second sample
    pos = XPos(D) if scheme == "xpos" else ALiBi(H)
    chunks = plan(AttentionWindow.full(), q_len=T, has_bias=scheme == "alibi", padded=padded)
    got = attend(q, HeldKeys(k, v, pad if padded else None), chunks, spec=AttentionSpec(), scheme=pos,
                 positions=positions)
    center = 1024
    expected = torch.empty(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if padded:
            allowed = (allowed & ~pad[b][None, :]) | torch.eye(T, dtype=torch.bool)
        if scheme == "xpos":
            qr = torch.cat([pos.rotate(q[b, :, t : t + 1], start=int(positions[b, t]), center=center) for t in range(T)], 1).double()
            kr = torch.cat([pos.rotate(k[b, :, t : t + 1], start=int(positions[b, t]), center=center, keys=True) for t in range(T)], 1).double()
            logits = qr @ kr.transpose(-1, -2) / math.sqrt(D)
        else:
            slopes = torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None]
            distance = (positions[b][:, None] - positions[b][None, :]).clamp(min=0).double()
            logits = q[b].double() @ k[b].double().transpose(-1, -2) / math.sqrt(D) - slopes * distance
        expected[b] = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v[b].double()
    assert (got.double() - expected).abs().max() < 1e-5


def test_positions_are_sorted_distinct_and_in_range():
    model = build_lex_model(random_positions=300, tokens_per_sample=64)
    positions = model.decoder._random_positions(torch.zeros(64, 64, dtype=torch.long))
    assert positions.shape == (64, 64) and int(positions.min()) >= 0 and int(positions.max()) < 300
    assert bool((positions[:, 1:] > positions[:, :-1]).all())  # sorted and distinct
    assert 200 < float(positions[:, -1].float().mean()) < 300  # spread over [0, L_max), not packed at the start
    assert model.decoder._random_positions(torch.zeros(1, 1, dtype=torch.long)) is not None
    assert build_lex_model().decoder._random_positions(torch.zeros(1, 4, dtype=torch.long)) is None


def test_bad_random_positions_are_explained():
    with pytest.raises(ValueError, match="at least --tokens-per-sample"):
        build_lex_model(random_positions=16, tokens_per_sample=32)
    with pytest.raises(ValueError, match="needs --max-target-positions >= 512"):
        build_lex_model(pos_emb="learned", random_positions=512, tokens_per_sample=32, max_target_positions=64)
    from lex_plugin.modules.attention import AttentionSpec, AttentionWindow, HeldKeys, attend, plan

    x = torch.randn(1, 1, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="too far apart"):
        attend(x, HeldKeys(x, x), plan(AttentionWindow.full(), q_len=2), spec=AttentionSpec(), scheme=XPos(16),
               positions=torch.tensor([[0, 20000]]))


def test_fairseq_train_with_random_positions_then_ordinary_evaluation(data_bin, tmp_path):
    proc = run_cli([
        "fairseq-train", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
        "--arch", "lex_lm_tiny", "--decoder-layers", "2", "--random-positions", str(8 * TRAIN_LEN),
        "--tokens-per-sample", str(TRAIN_LEN), "--sample-break-mode", "none", "--batch-size", "8", "--optimizer", "adam",
        "--lr", "2e-3", "--max-update", "12", "--save-dir", str(tmp_path), "--no-epoch-checkpoints",
        "--disable-validation", "--log-format", "json", "--log-interval", "1", "--num-workers", "0", "--seed", "1",
    ])
    losses = [float(json.loads(m)["loss"]) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["random_positions"] == 8 * TRAIN_LEN
    out = run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--path",
                   str(tmp_path / "checkpoint_last.pt"), "--tokens-per-sample", str(4 * TRAIN_LEN), "--num-workers", "0"])
    assert "Perplexity" in out.stdout + out.stderr

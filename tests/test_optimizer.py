"""--optimizer torch_adamw against fairseq's adam (the same options, the same update) on real text."""

import argparse
import copy

import pytest
import torch
from fairseq import optim
from omegaconf import OmegaConf

from conftest import build_lex_model
from lex_plugin.optim import TorchAdamW


def fairseq_optimizer(name, params, **cfg):
    base = {"_name": name, "lr": [cfg.pop("lr")], "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8, "weight_decay": 0.01}
    if name == "adam":
        base.update(use_old_adam=False, fp16_adam_stats=False, tpu=False)
    cfg = OmegaConf.create({**base, **cfg})
    return optim.build_optimizer(cfg, params)


def test_torch_adamw_tracks_fairseq_adam_over_20_updates(real_batches):
    windows, d = real_batches
    model = build_lex_model(dictionary=d, tokens_per_sample=64, decoder_layers=2, dropout=0.0).train()
    twin = copy.deepcopy(model)
    ours = fairseq_optimizer("torch_adamw", [p for p in model.parameters()], lr=2e-3)
    ref = fairseq_optimizer("adam", [p for p in twin.parameters()], lr=2e-3)
    assert isinstance(ours, TorchAdamW) and isinstance(ours.optimizer, torch.optim.AdamW)
    assert ours.optimizer.defaults["foreach"] is True  # CPU: the multi-tensor path
    assert type(ref.optimizer).__module__ == "fairseq.optim.adam"
    g = torch.Generator().manual_seed(0)
    losses = {"ours": [], "ref": []}
    for _ in range(20):
        batch = windows[torch.randint(0, windows.size(0), (8,), generator=g)]
        for name, m, opt in (("ours", model, ours), ("ref", twin, ref)):
            logits, _ = m(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad()
            opt.backward(loss)
            opt.step()
            losses[name].append(loss.item())
    assert losses["ours"][-1] < losses["ours"][0] - 1.0  # it trains
    assert max(abs(a - b) for a, b in zip(losses["ours"], losses["ref"])) < 2e-3, losses
    # eps enters the two updates differently (see the module), so compare the whole parameter vector
    ours_flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref_flat = torch.cat([p.detach().flatten() for p in twin.parameters()])
    start = torch.cat([p.detach().flatten() for p in build_lex_model(dictionary=d, tokens_per_sample=64, decoder_layers=2).parameters()])
    moved = (ref_flat - start).norm()
    assert (ours_flat - ref_flat).norm() < 0.005 * moved, ((ours_flat - ref_flat).norm(), moved)


def test_torch_adamw_refuses_bad_betas_and_memory_efficient_fp16():
    model = build_lex_model(decoder_layers=1)
    with pytest.raises(ValueError, match="--adam-betas"):
        fairseq_optimizer("torch_adamw", list(model.parameters()), lr=1e-3, adam_betas="(0.9, 1.5)")
    opt = fairseq_optimizer("torch_adamw", list(model.parameters()), lr=1e-3)
    assert not opt.supports_memory_efficient_fp16 and opt.supports_flat_params

"""The executor's kernel table: each kind of chunk is run by its kernel, and each kernel's output for a NoPE layer
equals float64 softmax attention over the keys its window lets each query see."""

import math

import pytest
import torch

from lex_plugin.modules.attention import AttentionOptions, HeldKeys, attend, plan
from lex_plugin.modules.attention import executor, kernels
from lex_plugin.modules.positions import NoPositions

L = 16
CASES = {  # attention options -> the kernel kinds its chunks take
    "full": ({"mode": "full"}, {"dense"}),
    "bca": ({"mode": "bca"}, {"dense", "windows"}),
    "sliding": ({"mode": "sliding", "sliding_window": "8"}, {"dense", "windows"}),
    "sinks": ({"mode": "bca", "sink_tokens": 2}, {"sinks"}),
    "rerope": ({"mode": "rerope"}, {"position_map"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_chunk_runs_by_its_kernel_and_equals_float64(case, monkeypatch):
    """Every kind in the table is reached by some mode, and only the kinds that mode's chunks are."""
    options, kinds = CASES[case]
    used = []
    table = {kind: (lambda kind, kernel: lambda run, chunk: used.append(kind) or kernel(run, chunk))(kind, kernel)
             for kind, kernel in kernels.KERNELS.items()}
    monkeypatch.setattr(executor, "KERNELS", table)
    spec = AttentionOptions(**options).spec(L, 4 * L)
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 4 * L, 8
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    window = spec.window
    chunks = plan(window, q_start=0, q_len=T, has_bias=bool(window.sinks) or spec.position_map is not None,
                  batch_heads=B * H)
    got = attend(q, HeldKeys(k, v), chunks, spec=spec, scheme=NoPositions())
    assert set(used) == kinds
    n = torch.arange(T)
    visible = window.in_window(n[:, None], n[None, :]) if not window.sinks else (
        window.in_window(n[:, None], n[None, :]) | (window.sink_visible(n[:, None], n[None, :]) & (n[None, :] < window.sinks)))
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    expected = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v.double()
    assert (got.double() - expected).abs().max() < 1e-5


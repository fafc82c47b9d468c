"""Receptive field by cumulative normalized gradient (Chi et al., receptive-field paper, section 5.1).

For a text of L tokens and the loss of its last prediction (token L given tokens 0 .. L-1), g_m is the
gradient of that loss with respect to the input embedding m positions before the last input
(m = 0: the last input itself); s_m = ||g_m||_2 / sum_n ||g_n||_2 and c_m = s_0 + ... + s_m, so c rises
from the end of the text backwards to 1. The effective receptive field is ERF = min{m : c_m > 0.99}.
The input embedding is the token embedding after scaling (and, for absolute schemes, before the
position vector is added), as in the paper's gradient with respect to the input.

A model whose every layer attends at most W - 1 positions back (sliding window W; BCA: l - 1) has exact
zeros past R (W - 1) for R layers: its theoretical receptive field.
"""

from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor

from ..modules.attention.spec import AttentionSpec
from ..modules.attention.window import AttentionWindow

__all__ = ["cumulative_gradient", "effective_receptive_field", "theoretical_receptive_field"]


def cumulative_gradient(model, tokens: Tensor, spec: AttentionSpec) -> Dict[str, Tensor]:
    """s_m and c_m for one text.

    Args:
        model: a lex_lm model; switched to eval mode (no dropout) for the call.
        tokens: (L + 1,) int64: L inputs and the target of the last one.
        spec: the attention window and scaling of the forward.

    Returns:
        {"s": (L,) float64 normalized gradient norms by distance m from the last input, "c": (L,) their
        cumulative sum}.

    Raises:
        ValueError: fewer than 2 tokens, or a zero gradient (nothing to normalise).
    """
    if tokens.dim() != 1 or tokens.numel() < 2:
        raise ValueError("cumulative_gradient takes one text of at least 2 tokens (inputs and the last target).")
    decoder = model.decoder
    captured = []

    def keep(_module, _args, output):
        output.retain_grad()
        captured.append(output)

    was_training = model.training
    model.eval()
    hook = decoder.embed_tokens.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits, _ = model(tokens[None, :-1], spec=spec)
            loss = F.cross_entropy(logits[0, -1].float(), tokens[-1])
            loss.backward()
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    norms = captured[0].grad[0].double().norm(dim=-1).flip(0)  # (L,), m = 0 is the last input
    total = norms.sum()
    if total <= 0:
        raise ValueError("the last token's loss has a zero gradient with respect to every input.")
    s = norms / total
    return {"s": s, "c": s.cumsum(0)}


def effective_receptive_field(c: Tensor, threshold: float = 0.99) -> int:
    """min{m : c_m > threshold} for a cumulative curve c (1-D, non-decreasing to 1)."""
    above = torch.nonzero(c > threshold)
    return int(above[0]) if above.numel() else int(c.numel())


def theoretical_receptive_field(window: AttentionWindow, layers: int, length: int) -> int:
    """The farthest input (distance from the last) that can reach the last position through ``layers``
    layers: R (W - 1) for a sliding window W, R (l - 1) for BCA with blocks of l / 2 (a query sees back to
    the start of the previous block), L - 1 for full attention; capped at L - 1."""
    if not window.bounded:
        return length - 1
    return min(length - 1, layers * (window.span - 1))

"""Left padding: when it changes the output, and the one check both faces (fairseq's and Hugging Face's) run.

A batch of prompts of different lengths is often aligned on the right, each shorter row padded in front. Its real
tokens then start at position p > 0 instead of 0: harmless where attention depends only on distances between real
tokens, a silent wrong number wherever positions are counted from the first one. :func:`check_left_padding` refuses
the second case with a message that says what to do instead.
"""

from typing import Optional

from torch import Tensor

from .attention.spec import AttentionSpec

__all__ = ["check_left_padding", "left_padding_refusal"]


def left_padding_refusal(decoder, spec: AttentionSpec) -> Optional[str]:
    """Why left padding would change the output of ``decoder`` (a ``DecoderStack``: its position kind, query
    temperatures, sink token and layer pattern) under ``spec``, or None where it cannot.

    A left-padded row's real tokens start at position p > 0, not 0. Where attention depends only on distances
    between visible real tokens (a relative scheme, full or sliding attention without sinks, ReRoPE and Leaky
    ReRoPE's distance maps) the shift changes nothing; everything that counts positions from the first one
    (absolute positions, BCA's blocks, a block retrieval's blocks, sink tokens, LM-Infinite, Self-Extend's groups, DCA's chunks, log-n's
    key count, dynamic NTK's length; a design that counts positions, ``DesignSpec.left_padding``) would see the pads.
    """
    if decoder.position_kind == "absolute":
        return "absolute positions"
    for design, _ in decoder.designs:
        if design.left_padding:
            return design.left_padding
    local = [k.window for k in decoder.layer_kinds or () if k.window is not None
             and (k.window.mode not in ("full", "sliding") or k.window.sinks)]
    if local:
        return f"the layer pattern's {local[0]} layers (their blocks / chunks count positions from the first)"
    if spec.retrieval is not None:
        return f"{spec.retrieval} (its blocks count positions from the first)"
    if spec.window.mode not in ("full", "sliding") or spec.window.sinks:
        return f"{spec.window} attention (its blocks and sink tokens count positions from the first)"
    if spec.position_map is not None and spec.position_map.name not in ("rerope", "leaky_rerope"):
        return f"{spec.position_map.name} (its groups / chunks count positions from the first)"
    if spec.logn:
        return "log-n scaling (it counts the keys from the first position)"
    if spec.rope_scaling is not None and spec.rope_scaling.kind == "dynamic":
        return "dynamic NTK scaling (it scales by the sequence's length)"
    return None


def check_left_padding(decoder, real: Tensor, spec: AttentionSpec) -> None:
    """Refuse left-padded rows (padding first, a real token after it: a batch of prompts of different lengths
    aligned on the right) where the padding would change the real tokens' output (:func:`left_padding_refusal`):
    the Hugging Face face and the fairseq face alike. Padding inside a row is the row as given, and is kept.

    Args:
        real: (B, T) bool, True at real tokens, over every position of the rows (cached ones included).

    Raises:
        ValueError: left padding under a spec or model where positions count from the first token.
    """
    why = left_padding_refusal(decoder, spec)  # first: most calls need no look at the tokens (no device sync)
    if why is None or real.size(1) < 2:
        return
    starts_padded = ~real[:, 0]  # (B,): only a row that starts with padding can be left-padded
    if bool(starts_padded.any()) and bool(real[starts_padded, 1:].any()):
        raise ValueError(f"left padding shifts each row's positions, which changes the output under {why}: "
                         "run the rows one at a time (or pad on the right, for scoring).")

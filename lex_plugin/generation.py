"""The generation loop of ``lex generate`` and ``LexHubInterface.continue_tokens``: one parallel pass over the
prompt, then one token per step through the key/value cache (fairseq-free: any model called as
``model(tokens, incremental_state=state, spec=spec)`` that returns ``(logits, extra)``)."""

import contextlib
from typing import List, Optional

import torch
from torch import Tensor

from .modules.attention.spec import AttentionSpec

__all__ = ["continue_ids", "filter_logits"]


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Top-k then nucleus (top-p) filtering of (V,) logits: removed entries become -inf; the most likely
    token always survives (Holtzman et al. 2020)."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def continue_ids(model, prompt: Tensor, max_len: int, eos: int, pad: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, generator: Optional[torch.Generator] = None, stop_at_eos: bool = False,
                 spec: Optional[AttentionSpec] = None, incremental_state: Optional[dict] = None) -> Tensor:
    """Sample up to ``max_len`` ids after ``prompt`` (temperature 0: greedy; ``<pad>`` is never drawn).

    Args:
        model: a lex_lm (or its decoder view) on the prompt's device, or a callable taking their arguments (then no
            autocast region is opened around the steps).
        prompt: (P,) int64 ids, the stream start ``</s>`` first.
        max_len: tokens to generate (> 0).
        eos, pad: the dictionary's ``</s>`` and ``<pad>`` ids.
        temperature, top_k, top_p: the sampling distribution (:func:`filter_logits`).
        generator: the random generator of the draws (None: torch's default).
        stop_at_eos: stop before a drawn ``</s>``.
        spec: the attention spec (None: the model's default).
        incremental_state: caches (batch 1) already holding the first tokens of ``prompt`` under ``spec``, fewer than
            all of them (``evaluation.passkey.read_prompt``): the first step runs the rest; it is extended in place.
            None: fresh caches.

    Returns:
        (n,) int64 generated ids on the CPU, n <= max_len.

    Raises:
        ValueError: max_len <= 0; ``incremental_state`` already holds the whole prompt (nothing is left to predict
            the first token from).
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}.")
    length = prompt.numel()
    decoder = getattr(model, "decoder", model)
    state: dict = {} if incremental_state is None else incremental_state
    if state and hasattr(decoder, "past_length") and decoder.past_length(state) >= length:
        raise ValueError(f"the incremental state already holds {decoder.past_length(state)} tokens of a {length}-token "
                         "prompt: leave the prompt's last token out of it, so that the first step predicts from it.")
    buffer = prompt.new_empty(1, length + max_len)
    buffer[0, :length] = prompt
    generated: List[int] = []
    # one autocast region: an autocast view casts its weights once, not per step
    region = decoder.autocast_context(prompt.device) if hasattr(decoder, "autocast_context") else contextlib.nullcontext()
    with region:
        for _ in range(max_len):
            logits, _ = model(buffer[:, :length], incremental_state=state, spec=spec)
            last = logits[0, -1].float()
            last[pad] = float("-inf")
            if temperature <= 0:
                token = int(last.argmax())
            else:
                probs = torch.softmax(filter_logits(last / temperature, top_k, top_p), dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            if token == eos and stop_at_eos:
                break
            generated.append(token)
            buffer[0, length] = token
            length += 1
    return torch.tensor(generated, dtype=torch.long)

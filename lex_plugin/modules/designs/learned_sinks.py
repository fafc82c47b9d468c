"""gpt-oss's attention sinks (``--learned-sinks``): a learned logit s_h per layer and head (``self_attn.sink_logits``,
started at 0) that joins every softmax's denominator with no value, exp(z_j) / (exp(s_h) + sum_i exp(z_i)), under
every window, position map and cache (``executor.attend``'s ``sink_logits``): the sink takes a share of the attention
and gives nothing back."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .registry import LayerDesign, switch_design

__all__ = ["LEARNED_SINKS", "LearnedSinks"]


@dataclass(frozen=True)
class LearnedSinks(LayerDesign):
    """Learned sink logits in one layer: (H,) parameters, one per head."""

    sinks = True

    def attach(self, attention) -> None:
        attention.sink_logits = nn.Parameter(torch.zeros(attention.num_heads))

    def sink_logits(self, attention) -> Optional[Tensor]:
        return attention.sink_logits


LEARNED_SINKS = switch_design(
    "learned_sinks",
    summary="a learned logit per layer and head in every softmax's denominator, with no value",
    source="OpenAI gpt-oss (2025): attention sinks, transformers modeling_gpt_oss",
    help="gpt-oss's attention sinks: a learned logit per layer and head that joins every softmax's denominator with no "
         "value (the sink takes a share of the attention and gives nothing back)",
    layer=lambda config: LearnedSinks(),
)

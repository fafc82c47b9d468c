"""StreamingLLM's sink token at pre-training (Xiao et al. 2024, section 3.3; ``--sink-token``): a learned vector
(``decoder.sink_embedding``, (C,), scaled as a token's embedding) placed before every sequence at position 0, at
training and at every evaluation, its output dropped; the tokens sit at positions 1 ... At evaluation ``--sink-tokens
1`` under ``--bca`` or ``--sliding-window`` keeps it visible past the window. The caches count it (the decoder's
``sink_positions``), so generation needs nothing else."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .registry import LayerDesign, switch_design

__all__ = ["SINK_TOKEN", "SinkToken"]


@dataclass(frozen=True)
class SinkToken(LayerDesign):
    """The sink token of a model of width ``dim``."""

    dim: int

    def attach_decoder(self, decoder) -> None:
        decoder.sink_embedding = nn.Parameter(torch.empty(self.dim).normal_(0.0, self.dim**-0.5))

    def prefix(self, decoder) -> Optional[Tensor]:
        return decoder.sink_embedding


def _layer(config) -> SinkToken:
    if int(getattr(config, "random_positions", 0) or 0):
        raise ValueError("--sink-token places a learned token at position 0 of every sample; --random-positions "
                         "draws the positions of each sample. Use one of the two.")
    if getattr(config, "pos_emb", None) == "learned":
        raise ValueError("--sink-token takes position 0, which a learned position table of l rows would then lack for "
                         "the l-th token; use another --pos-emb.")
    return SinkToken(int(config.decoder_embed_dim))


SINK_TOKEN = switch_design(
    "sink_token",
    summary="a learned token before every sequence, at position 0, its output dropped",
    source="Xiao et al. 2024, Efficient Streaming Language Models with Attention Sinks, section 3.3",
    help="StreamingLLM's sink token at pre-training (section 3.3): a learned token placed before every sample, at "
         "training and evaluation alike; --sink-tokens 1 keeps it visible under --bca or --sliding-window",
    layer=_layer,
    left_padding="the sink token (--sink-token: it sits at position 0, before the pads)",
)

"""Landmark tokens (Mohtashami & Jaggi 2023, Random-Access Infinite Context Length for Transformers, arXiv 2305.16300,
section 3; ``--landmark-block-size``, ``--landmark-topk``): after every b tokens the decoder places a landmark token, a
learned vector (``decoder.landmark_embedding``, (C,), scaled as a token's embedding) that runs through every layer as
a token does, its output dropped; attention in the landmark layers is the paper's grouped softmax (section 3.1): each
query's softmax runs over its own block's tokens up to itself and the landmarks of the earlier blocks, and an earlier
block's tokens share their landmark's weight by their softmax within the block, so the landmark's key learns to
stand for its block. ``--landmark-topk k`` keeps each query's k best earlier landmarks, per head (the paper's
retrieval, section 3.2, at training and evaluation alike; change it at evaluation with ``--model-overrides
"{'landmark_topk': 4}"``); without it every landmark competes (the paper's training).

The landmark is inserted here, inside the model, not into the data (the paper's preprocessing): the corpus, the
targets and the loss are the tokens' alone, and positions count landmarks as the paper's do (token t sits at t + t //
b). A block's landmark comes with its last token, in the same call (a generation step that completes a block runs two
positions), so the caches hold it as the parallel pass does. The kernel: ``attention.kernels.landmarks``.

In the global layers of a ``--layer-pattern`` only (the local layers see the landmarks as tokens in their windows);
full attention in those layers (no ``--bca``, sliding window, sinks or position map there); a rotary scheme or none
(xpos, rope, none; a top-k needs positions in the first layer, where every landmark is otherwise the same vector and
the scores tie); no sink token, learned sinks or randomized positions beside it.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..attention.retrieval import LandmarkRetrieval
from ..layer_pattern import parse_layer_pattern
from ..positions.scheme import get_scheme
from .registry import DesignOption, DesignSpec, LayerDesign, register_design

__all__ = ["LANDMARK", "Landmark"]


@dataclass(frozen=True)
class Landmark(LayerDesign):
    """Landmark tokens of a model of width ``dim``: the decoder places them (:meth:`interleave`), the executor runs the
    grouped softmax under ``landmarks``."""

    landmarks: LandmarkRetrieval
    dim: int
    retrieves = True
    interleaves = True
    global_only = True

    def retrieval(self, attention) -> LandmarkRetrieval:
        return self.landmarks

    def attach_decoder(self, decoder) -> None:
        decoder.landmark_embedding = nn.Parameter(torch.empty(self.dim).normal_(0.0, self.dim**-0.5))

    def interleave(self, decoder) -> Optional[Tuple[int, Tensor]]:
        return self.landmarks.block, decoder.landmark_embedding


def _build(config) -> Optional[Landmark]:
    block, topk = (option.read(config) for option in LANDMARK.options)
    if block is None:
        if topk is not None:
            raise ValueError(f"--landmark-topk {topk} belongs to landmark tokens: give --landmark-block-size (50 in the "
                             "paper, at l = 512) too, or leave the top-k out.")
        return None
    pos_emb = getattr(config, "pos_emb", "xpos")
    if get_scheme(pos_emb).kind not in ("rotary", "none"):
        raise ValueError(f"--landmark-block-size scores landmarks by q . k: it takes a rotary position scheme or none "
                         f"(xpos, rope, none), not --pos-emb {pos_emb}.")
    for flag, on in (("--sink-token", getattr(config, "sink_token", False)),
                     ("--learned-sinks", getattr(config, "learned_sinks", False)),
                     ("--random-positions", int(getattr(config, "random_positions", 0) or 0))):
        if on:
            raise ValueError(f"--landmark-block-size with {flag}: the grouped softmax splits each query's softmax by "
                             f"blocks, and {flag} would place a key or positions outside them. Use one of the two.")
    if topk is not None and _first_layer_without_positions(config, pos_emb):
        raise ValueError(f"--landmark-topk {topk} with landmarks in a first layer without positions: every landmark "
                         "enters that layer as the same vector, so their scores tie exactly and the top k is a tie "
                         "broken by rounding. Give the first layer positions (--pos-emb xpos / rope, or a "
                         "--layer-pattern whose landmark layers come after a positioned one), or drop --landmark-topk.")
    return Landmark(LandmarkRetrieval(block=int(block), topk=None if topk is None else int(topk)),
                    int(config.decoder_embed_dim))


def _first_layer_without_positions(config, pos_emb: str) -> bool:
    """Whether the model's first layer is a landmark layer (global) without positions."""
    pattern = getattr(config, "layer_pattern", None)
    if not pattern:
        return get_scheme(pos_emb).kind == "none"
    kinds = parse_layer_pattern(pattern, pos_emb, getattr(config, "decoder_layers", None),
                                getattr(config, "tokens_per_sample", None))
    return kinds[0].is_global and not kinds[0].positions


LANDMARK = register_design(DesignSpec(
    name="landmark",
    summary="a learned landmark token after every b tokens; the grouped softmax weighs each earlier block by its "
            "landmark (and keeps each query's top k with --landmark-topk)",
    source="Mohtashami & Jaggi 2023, Random-Access Infinite Context Length for Transformers (arXiv 2305.16300), "
           "sections 3.1-3.2",
    options=(
        DesignOption("landmark_block_size", int, None,
                     "landmark tokens (Mohtashami & Jaggi 2023): a learned landmark after every b tokens, and the "
                     "grouped softmax in the landmark layers (the paper: 50 at l = 512); default: off"),
        DesignOption("landmark_topk", int, None,
                     "each query keeps its k highest-scoring earlier landmarks (the paper's retrieval; at training "
                     "too: set it at evaluation with --model-overrides); default: every landmark"),
    ),
    build=_build,
    refuses_logn="--logn on a landmark model: log-n scaling counts the window's keys, and a landmark query's softmax "
                 "runs over its own block and the landmarks. Evaluate it without --logn.",
    left_padding="landmark tokens (their blocks count positions from the first column)",
))

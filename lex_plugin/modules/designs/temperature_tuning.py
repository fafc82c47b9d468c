"""Llama 4's attention temperature tuning (``--temperature-tuning-beta``, ``--temperature-tuning-floor``): the query at
absolute position p is multiplied by 1 + beta * log1p(floor((p + 1) / F)) (transformers ``modeling_llama4``,
``attn_temperature_tuning``: beta = ``attn_scale`` 0.1 and F = ``floor_scale`` 8192, Llama 4's training length, on its
global NoPE layers). Here on every layer, or the global layers of a ``--layer-pattern``, with F the model's training
length l unless given: 1 for p < F - 1, then growing as log(p / F), so the queries sharpen only where the context
outgrows training. At training and evaluation alike; no parameters."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .registry import DesignOption, DesignSpec, LayerDesign, QueryContext, register_design

__all__ = ["TEMPERATURE_TUNING", "TemperatureTuning"]


@dataclass(frozen=True)
class TemperatureTuning(LayerDesign):
    """Llama 4's temperature tuning in one layer.

    Args:
        beta: the slope (``--temperature-tuning-beta``), > 0.
        floor_scale: F, in positions (``--temperature-tuning-floor``; default l), >= 1.

    Raises:
        ValueError: beta <= 0 or F < 1.
    """

    beta: float
    floor_scale: int
    global_only = True

    def __post_init__(self):
        if not self.beta > 0:
            raise ValueError(f"--temperature-tuning-beta must be positive (Llama 4 uses 0.1), got {self.beta}; leave it "
                             "out for no temperature tuning.")
        if int(self.floor_scale) < 1:
            raise ValueError(f"--temperature-tuning-floor must be at least 1 position, got {self.floor_scale}.")

    def scale(self, positions: Tensor) -> Tensor:
        """The factor for queries at absolute ``positions`` (any shape, int): fp32 of that shape, formed in float64
        (exact floor at any position)."""
        p = positions.to(torch.float64)
        return (1.0 + self.beta * torch.log1p(torch.floor((p + 1.0) / int(self.floor_scale)))).float()

    def attach(self, attention) -> None:
        attention.temperature_tuning = self  # (read by the tests and the docs: the layer's beta and F)

    def queries(self, attention, q: Tensor, at: QueryContext) -> Tensor:
        where = (at.positions[:, None, :] if at.positions is not None
                 else torch.arange(at.first, at.first + at.length, device=q.device))
        return (q.float() * self.scale(where)[..., None]).to(q.dtype)  # (T,) or (B, 1, T) factor


def _build(config) -> Optional[TemperatureTuning]:
    beta, floor = (option.read(config) for option in TEMPERATURE_TUNING.options)
    if not beta:  # 0: off
        if floor is not None:
            raise ValueError(f"--temperature-tuning-floor {floor} belongs to Llama 4's temperature tuning: give "
                             "--temperature-tuning-beta (0.1 in Llama 4) too, or leave the floor out.")
        return None
    floor = floor if floor is not None else getattr(config, "tokens_per_sample", None)
    if floor is None:
        raise ValueError("--temperature-tuning-beta scales queries past F = l positions: give --tokens-per-sample or "
                         "--temperature-tuning-floor.")
    return TemperatureTuning(float(beta), int(floor))


def _record(args) -> None:
    """F written into the args where only l gave it: a later l (fine-tuning at another length) keeps it."""
    if (getattr(args, "temperature_tuning_beta", 0.0) and getattr(args, "temperature_tuning_floor", None) is None
            and getattr(args, "tokens_per_sample", None)):
        args.temperature_tuning_floor = int(args.tokens_per_sample)


TEMPERATURE_TUNING = register_design(DesignSpec(
    name="temperature_tuning",
    summary="each query times 1 + beta log1p(floor((p + 1) / F)) at its position p",
    source="Llama 4 (Meta 2025): attn_temperature_tuning, transformers modeling_llama4",
    options=(
        DesignOption("temperature_tuning_beta", float, 0.0,
                     "Llama 4's attention temperature tuning: each query times 1 + beta log1p(floor((p + 1) / F)) at its "
                     "position p, at training and evaluation (Llama 4: beta 0.1 on its NoPE layers; here every layer, or "
                     "the global layers of a --layer-pattern); 0: off"),
        DesignOption("temperature_tuning_floor", int, None,
                     "F of --temperature-tuning-beta, in positions (Llama 4: 8192, its training length); default: "
                     "--tokens-per-sample"),
    ),
    build=_build,
    record=_record,
    refuses_logn="--logn on a model trained with Llama 4's temperature tuning (--temperature-tuning-beta): its queries "
                 "already sharpen with their position past l; a log-n factor would scale them twice. Evaluate it "
                 "without --logn.",
    left_padding="Llama 4's temperature tuning (each query's factor counts positions from the first)",
))

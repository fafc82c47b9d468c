"""DroPE (arXiv 2512.12167; ``--drope-start N``): train with the rotary positions for the updates before N and without
them (NoPE, the same weights: RoPE has no parameters) from update N on, e.g. the last ~12% of ``--max-update``.
fairseq tells the model its update count at every step and when it loads a checkpoint (``set_num_updates``), so a
resumed run switches at the same update and a checkpoint from update N on evaluates, and exports, as the NoPE model
it is. No parameters."""

from dataclasses import dataclass
from typing import Optional

from ..positions.scheme import get_scheme
from .registry import DesignOption, DesignSpec, LayerDesign, register_design

__all__ = ["DROPE", "DroPE"]


@dataclass(frozen=True)
class DroPE(LayerDesign):
    """Positions dropped from update ``start`` on."""

    start: int

    def drops_positions(self, num_updates: int) -> bool:
        return num_updates >= self.start

    def __str__(self) -> str:
        return f"DroPE: positions dropped from update {self.start} on"


def _build(config) -> Optional[DroPE]:
    start = DROPE.options[0].read(config)
    if start < 0:
        raise ValueError(f"--drope-start is the update from which positions are dropped (0: off); got {start}.")
    if not start:
        return None
    kind = get_scheme(config.pos_emb).kind
    if kind != "rotary":
        raise ValueError(f"--drope-start drops rotary positions (DroPE: RoPE has no parameters, so the weights stay "
                         f"valid without it); --pos-emb {config.pos_emb} is {kind}. Use rope or xpos.")
    return DroPE(start)


DROPE = register_design(DesignSpec(
    name="drope",
    summary="rotary positions for the updates before N, none (NoPE, the same weights) from update N on",
    source="DroPE (arXiv 2512.12167): dropping positions at the end of training",
    options=(DesignOption("drope_start", int, 0, "DroPE: from this update on, train (and evaluate) with the rotary "
                          "positions dropped (NoPE), e.g. the last ~12% of --max-update; rope / xpos only; 0: off"),),
    build=_build,
))

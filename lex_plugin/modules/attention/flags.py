"""Every attention flag, declared once.

The task's dataclass (``--task lex_language_modeling``), the ``lex`` commands' click options, the hub's
keywords and :class:`~.spec.AttentionOptions` are generated from :data:`ATTENTION_FLAGS`; the mode list
(:data:`ATTENTION_MODES`) is the windows' and the position maps' registries. Each flag that only some modes
take names them (``owners``), and ``ownership.refuse_foreign`` refuses it, at any value, under another mode.

Every value flag defaults to None, meaning "not given": a mode's own default (``--n-global`` 10, a
position map's l/2 ...) is applied where the spec is built, so that a flag given at its default value is
still known to be given, and refused where it does nothing (``--bca --n-global 10``).
"""

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from ..positions.rope_scaling import ROPE_SCALINGS
from .position_map import MAP_OPTIONS, POSITION_MAPS
from .window import LM_INFINITE_N_GLOBAL, MODES

__all__ = ["ATTENTION_FLAGS", "ATTENTION_MODES", "MODE_SELECTORS", "AttentionFlag", "mode_flag", "mode_flags"]

# every attention mode: the windows, then the bounded-distance position maps
ATTENTION_MODES: Tuple[str, ...] = (*MODES, *POSITION_MAPS)


@dataclass(frozen=True)
class AttentionFlag:
    """One attention flag.

    Attributes:
        name: the ``AttentionOptions`` field, hub keyword and task field; the flag is ``--name-with-dashes``.
        type: ``bool`` (a switch, off unless given), ``int``, ``float`` or ``str``.
        help: the help text, with the default where there is one.
        owners: the modes that take it (None: every mode); given under another mode, it is refused.
        minimum: the smallest value an ``int`` / ``float`` flag accepts (the command line checks it).
        choices: the accepted values of a ``str`` flag (a registry's names), or None.
        metavar: how the help shows the value, or None.
    """

    name: str
    type: type
    help: str
    owners: Optional[Tuple[str, ...]] = None
    minimum: Optional[float] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None

    @property
    def flag(self) -> str:
        """``--name-with-dashes``."""
        return "--" + self.name.replace("_", "-")


# The flags that choose the mode (``window.selected_mode``): at most one is given.
MODE_SELECTORS = ("bca", "sliding_window", "lm_infinite", "position_map")

ATTENTION_FLAGS: Dict[str, AttentionFlag] = {f.name: f for f in (
    AttentionFlag("bca", bool, "blockwise causal attention (LeX section 3.3): blocks of l/2, l the training length; "
                  "a bounded cache"),
    AttentionFlag("sliding_window", str, "each query attends its W most recent positions: an integer W, or l (the "
                  "training length)", owners=("sliding",), metavar="W|l"),
    AttentionFlag("lm_infinite", bool, "LM-Infinite's Λ-shaped attention: the first --n-global tokens and the --l-local "
                  "most recent, every distance capped at --l-local"),
    AttentionFlag("position_map", str, "bounded-distance attention over every key: " + ", ".join(POSITION_MAPS)
                  + " (ReRoPE, Leaky ReRoPE, Self-Extend, DCA)", choices=tuple(POSITION_MAPS)),
    AttentionFlag("sink_tokens", int, "attention sinks (StreamingLLM): the first k tokens stay visible under --bca / "
                  "--sliding-window, seen at their place in the cache", owners=("bca", "sliding"), minimum=0),
    AttentionFlag("retrieval_blocks", int, "block retrieval at evaluation (InfLLM, Xiao et al. 2024, with MoBA's gate): "
                  "under --bca each query also attends the K earlier blocks of l/2 whose mean key it scores highest; the "
                  "cache keeps every key", owners=("bca",), minimum=1, metavar="K"),
    AttentionFlag("n_global", int, f"LM-Infinite's global branch: the first N tokens (default {LM_INFINITE_N_GLOBAL})",
                  owners=("lm_infinite",), minimum=1),
    AttentionFlag("l_local", int, "LM-Infinite's local branch (default l)", owners=("lm_infinite",), minimum=1),
    AttentionFlag("training_length", int, "the training length l that BCA halves into blocks and --sliding-window l "
                  "means (default: the checkpoint's tokens_per_sample); even for BCA", minimum=1),
    AttentionFlag("logn", bool, "log-n attention scaling: queries times max(1, log(n) / log(l)), n the keys each "
                  "query sees"),
    AttentionFlag("attention_temperature", float, "DroPE's recalibration at evaluation: every logit times beta = 1 + C "
                  "ln(L / l) at evaluation length L > l (1 up to l; a probe's L is its longest length, as for --rope-scaling-factor "
                  "auto); any mode", minimum=0, metavar="C"),
    AttentionFlag("rope_scaling", str, "RoPE scaling at evaluation for rope / xpos checkpoints: linear (position "
                  "interpolation), ntk (NTK-aware base), yarn (YaRN), dynamic (dynamic NTK), llama3, longrope (with "
                  "--rope-scaling-file), resonance (no factor); with --rope-scaling-factor", choices=tuple(ROPE_SCALINGS)),
    AttentionFlag("rope_scaling_factor", str, "s of --rope-scaling: a number > 0, or auto = max(1, evaluation length "
                  "/ l) (per --eval-lengths row; --tokens-per-sample for fairseq's own pass)", metavar="S|auto"),
    AttentionFlag("rope_scaling_file", str, "LongRoPE's factor lists for --rope-scaling longrope: a JSON object "
                  "{\"short_factor\": [...], \"long_factor\": [...]}, d/2 numbers each", metavar="JSON"),
    *(AttentionFlag(o.name, o.type, o.help, owners=o.owners, minimum=0) for o in MAP_OPTIONS.values()),
)}


def mode_flag(mode: str) -> str:
    """The flag that selects ``mode``: ``--bca``, ``--sliding-window``, ``--lm-infinite``, ``--position-map NAME``,
    or ``full attention`` (no flag)."""
    return {"full": "full attention", "bca": "--bca", "sliding": "--sliding-window",
            "lm_infinite": "--lm-infinite"}.get(mode, f"--position-map {mode}")


def mode_flags(modes: Sequence[str]) -> str:
    """``('bca', 'sliding')`` -> ``--bca / --sliding-window``; position maps share one flag
    (``--position-map rerope / leaky_rerope``)."""
    maps = [m for m in modes if m in POSITION_MAPS]
    words = [mode_flag(m) for m in modes if m not in POSITION_MAPS]
    return " / ".join(words + ([f"--position-map {' / '.join(maps)}"] if maps else []))

"""The attention spec: everything an evaluation chooses about attention, in one frozen value.

A trained model fixes its weights and its position scheme; how it attends at inference is a choice made
per call: the window (full, BCA, sliding, sink tokens, Λ) and a RoPE scaling for rotary schemes. That
choice is an :class:`AttentionSpec`, passed as an argument from the task, the hub, every ``lex`` command
and the analysis tools down to the executor: nothing is set on a model and restored afterwards. A model
view with another default spec (``LexDecoder.under``) shares every weight; fairseq's own scorer and
generator, which call the model without arguments, get that default.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Union

from ..positions.rope_scaling import RopeScaling, rope_scaling_from_options
from .position_map import MAP_OPTIONS, POSITION_MAPS, PositionMap, position_map_from_options
from .window import LM_INFINITE_N_GLOBAL, MODES, AttentionWindow, selected_mode, window_from_options

__all__ = ["AttentionOptions", "AttentionSpec", "FULL_SPEC"]

# the window options and the modes that take them (the position maps' options: position_map.MAP_OPTIONS)
WINDOW_OPTIONS = {"sliding_window": ("sliding",), "n_global": ("lm_infinite",), "l_local": ("lm_infinite",)}


def _owners(name: str) -> tuple:
    """The modes that take the mode-owned option ``name`` (a window's or a position map's)."""
    return MAP_OPTIONS[name].owners if name in MAP_OPTIONS else WINDOW_OPTIONS[name]


def _owned_by(name: str) -> str:
    """'--NAME is an option of OWNER': its position maps, or its window."""
    owner = f"--position-map {' / '.join(_owners(name))}" if name in MAP_OPTIONS else f"the {_owners(name)[0]} window"
    return f"--{name.replace('_', '-')} is an option of {owner}"


@dataclass(frozen=True)
class AttentionSpec:
    """How attention runs at inference.

    Attributes:
        window: which keys each query may attend (:class:`~.window.AttentionWindow`); default full causal.
        rope_scaling: the RoPE scaling of a rotary scheme (:class:`~..positions.rope_scaling.RopeScaling`),
            or None (as trained). A model refuses a scaling when its scheme is not rotary.
        position_map: a bounded-distance method (:mod:`.position_map`: ReRoPE, Leaky ReRoPE, Self-Extend,
            DCA) over full attention, or None. A model refuses one its scheme has no distance for.
        logn: the training length l of log-n attention scaling (queries times max(1, log(n) / log(l)), n the
            number of keys a query sees), or None (off).

    ``str(spec)`` is the label of a report row: the window (or the position map), then ``+scaling`` and
    ``+logn`` when there are.

    Raises:
        TypeError: a window that is not an ``AttentionWindow``, a scaling that is not a ``RopeScaling``, a
            position map that is not a ``PositionMap``.
        ValueError: a position map over a window other than full attention; log-n with l < 2.
    """

    window: AttentionWindow = field(default_factory=AttentionWindow.full)
    rope_scaling: Optional[RopeScaling] = None
    position_map: Optional[PositionMap] = None
    logn: Optional[int] = None

    def __post_init__(self):
        if not isinstance(self.window, AttentionWindow):
            raise TypeError(f"AttentionSpec.window must be an AttentionWindow, got {type(self.window).__name__}.")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError(f"AttentionSpec.rope_scaling must be a RopeScaling or None, got {type(self.rope_scaling).__name__}.")
        if self.position_map is not None:
            if not isinstance(self.position_map, PositionMap):
                raise TypeError(f"AttentionSpec.position_map must be a PositionMap or None, got {type(self.position_map).__name__}.")
            if self.window != AttentionWindow.full():
                raise ValueError(f"--position-map {self.position_map.name} bounds distances over full attention (every key "
                                 f"visible); it does not combine with the {self.window} window.")
        if self.logn is not None and int(self.logn) < 2:
            raise ValueError(f"log-n scaling divides by log(l); l must be >= 2, got {self.logn}.")

    def __str__(self) -> str:
        label = str(self.window) if self.position_map is None else str(self.position_map)
        if self.rope_scaling is not None:
            label += f"+{self.rope_scaling}"
        return label + ("+logn" if self.logn else "")

    def fields(self) -> dict:
        """The spec as structured report fields: mode, stride, sinks, rope_scaling (kind) and
        rope_scaling_factor (s), None where absent."""
        w = self.window
        return {"mode": w.mode if self.position_map is None else self.position_map.name, "stride": w.stride or None,
                "sinks": w.sinks, "logn": bool(self.logn),
                "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.kind,
                "rope_scaling_factor": None if self.rope_scaling is None else float(self.rope_scaling.factor)}


FULL_SPEC = AttentionSpec()


@dataclass(frozen=True)
class AttentionOptions:
    """The user's words for an :class:`AttentionSpec`: the flags of the task (``--bca``, ``--sliding-window``,
    ``--lm-infinite``, ``--n-global``, ``--l-local``, ``--sink-tokens``, ``--position-map`` and its options,
    ``--logn``, ``--training-length``, ``--rope-scaling``, ``--rope-scaling-factor``), of every ``lex`` command,
    of the hub's keywords and of the bench scripts, turned into a spec in one place (:meth:`spec`).

    Attributes:
        mode: ``full``, ``bca``, ``sliding``, ``lm_infinite`` (LM-Infinite) or a position map (``rerope``,
            ``leaky_rerope``, ``self_extend``, ``dca``: full attention at bounded distances).
        sliding_window: W of ``sliding``: a positive integer or ``l`` (default l).
        training_length: l instead of the checkpoint's (``--training-length``), or None.
        sink_tokens: k attention sinks on ``bca`` / ``sliding`` (StreamingLLM).
        n_global, l_local: LM-Infinite's branches (``lm_infinite``; L_local defaults to l).
        rope_scaling, rope_scaling_factor, rope_scaling_file: a kind of ``rope_scaling.ROPE_SCALINGS``, s > 0
            or ``auto``, and LongRoPE's JSON factor lists.
        logn: log-n query scaling against l (any mode).
        rerope_window ... dca_local_window: the position maps' options (``position_map.MAP_OPTIONS``; None:
            the method's default). Each belongs to its methods: given to another mode, it is refused.
    """

    mode: str = "full"
    sliding_window: Optional[Union[int, str]] = None
    training_length: Optional[int] = None
    sink_tokens: int = 0
    n_global: int = LM_INFINITE_N_GLOBAL
    l_local: Optional[int] = None
    rope_scaling: Optional[str] = None
    rope_scaling_factor: Optional[Union[str, float]] = None
    rope_scaling_file: Optional[str] = None
    logn: bool = False
    rerope_window: Optional[int] = None
    leaky_rerope_k: Optional[float] = None
    self_extend_group: Optional[int] = None
    self_extend_window: Optional[int] = None
    dca_chunk_size: Optional[int] = None
    dca_local_window: Optional[int] = None

    @classmethod
    def from_flags(cls, flags: Union[Mapping[str, Any], Any]) -> "AttentionOptions":
        """The options of parsed flags (a mapping, an argparse / click namespace or a fairseq config) with the
        names above and ``bca``, ``lm_infinite``, ``position_map`` (the mode: ``selected_mode``); a missing
        name takes its default.

        Raises:
            ValueError: more than one of --bca, --sliding-window, --lm-infinite and --position-map.
        """
        get = flags.get if isinstance(flags, Mapping) else (lambda name, default=None: getattr(flags, name, default))
        mode = selected_mode(get("bca", False), get("sliding_window"), get("lm_infinite", False), get("position_map"))
        n_global = get("n_global", None)
        return cls(mode, get("sliding_window"), get("training_length"), int(get("sink_tokens", 0) or 0),
                   LM_INFINITE_N_GLOBAL if n_global is None else int(n_global), get("l_local"),
                   get("rope_scaling"), get("rope_scaling_factor"), get("rope_scaling_file"), bool(get("logn", False)),
                   **{name: get(name) for name in MAP_OPTIONS})

    @property
    def mode_options(self) -> dict:
        """The options given that belong to some modes only (name -> value): the position maps' when not None,
        ``sliding_window`` and ``l_local`` when not None, ``n_global`` when not its default."""
        given = {**self.map_options, "sliding_window": self.sliding_window, "l_local": self.l_local,
                 "n_global": None if self.n_global == LM_INFINITE_N_GLOBAL else self.n_global}
        return {name: value for name, value in given.items() if value is not None}

    @property
    def map_options(self) -> dict:
        """The position-map options given (name -> value; None: not given)."""
        return {name: getattr(self, name) for name in MAP_OPTIONS}

    def for_mode(self, mode: str) -> "AttentionOptions":
        """These options under another ``mode`` (a comparison over modes: ``--eval-windows``, ``lex passkey
        --windows``); the sink tokens stay with the modes that take them (bca, sliding), each position-map
        option with its methods and each window option with its window (``--sliding-window`` with sliding,
        ``--n-global`` and ``--l-local`` with lm_infinite); the others drop them (:meth:`check_modes` refuses an
        option no mode takes)."""
        dropped = {name: LM_INFINITE_N_GLOBAL if name == "n_global" else None
                   for name in self.mode_options if mode not in _owners(name)}
        return replace(self, mode=mode, sink_tokens=self.sink_tokens if mode in ("bca", "sliding") else 0, **dropped)

    def check_modes(self, modes) -> None:
        """Refuse options that none of ``modes`` (a comparison's modes) takes.

        Raises:
            ValueError: a position-map or window option no mode takes; sink tokens without a bca / sliding mode.
        """
        for name in self.mode_options:
            if not set(modes) & set(_owners(name)):
                raise ValueError(f"{_owned_by(name)}; none of the modes {', '.join(modes)} takes it.")
        if self.sink_tokens and not set(modes) & {"bca", "sliding"}:
            raise ValueError("--sink-tokens attach to a bounded window: add bca or sliding to the modes.")

    def spec(self, model_training_length: Optional[int], evaluation_length: Optional[int] = None) -> AttentionSpec:
        """The spec for a checkpoint trained on ``model_training_length`` tokens (None if it records none),
        evaluated at ``evaluation_length`` (what ``--rope-scaling-factor auto`` divides by l; None where
        unknown).

        Raises:
            ValueError: as ``window_from_options``, ``position_map_from_options`` and
                ``rope_scaling_from_options`` (a mode that needs l when none is known, sinks on full attention
                or a position map, an option of another mode (a position map's, or ``--l-local`` on BCA),
                ``auto`` without an evaluation length...); log-n without l.
        """
        if self.mode not in MODES and self.mode not in POSITION_MAPS:
            raise ValueError(f"attention mode must be one of {', '.join(MODES + tuple(POSITION_MAPS))}, got {self.mode!r}.")
        foreign = [name for name in self.mode_options if self.mode not in _owners(name)]
        if foreign:
            raise ValueError(f"{_owned_by(foreign[0])}; this evaluation uses {self.mode} attention: drop it, or choose "
                             "that mode.")
        length = self.training_length or model_training_length
        position_map = None
        if self.mode in POSITION_MAPS:
            if self.sink_tokens:
                raise ValueError(f"--sink-tokens attach to a bounded window; --position-map {self.mode} keeps every key visible.")
            position_map = position_map_from_options(self.mode, length, **self.map_options)
            window = AttentionWindow.full()
        else:
            window = window_from_options(self.mode, self.sliding_window, self.training_length, model_training_length,
                                         self.sink_tokens, self.n_global, self.l_local)
        if self.logn and not length:
            raise ValueError("--logn scales queries by log(n) / log(l): give --training-length l (the checkpoint records none).")
        scaling = rope_scaling_from_options(self.rope_scaling, self.rope_scaling_factor, length, evaluation_length,
                                            self.rope_scaling_file)
        return AttentionSpec(window, scaling, position_map, int(length) if self.logn else None)

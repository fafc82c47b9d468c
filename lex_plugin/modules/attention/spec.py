"""The attention spec: everything an evaluation chooses about attention, in one frozen value.

A trained model fixes its weights and its position scheme; how it attends at inference is a choice made
per call: the window (full, BCA, sliding, sink tokens, Λ) and a RoPE scaling for rotary schemes. That
choice is an :class:`AttentionSpec`, passed as an argument from the task, the hub, every ``lex`` command
and the analysis tools down to the executor: nothing is set on a model and restored afterwards. A model
view with another default spec (``LexDecoder.under``) shares every weight; fairseq's own scorer and
generator, which call the model without arguments, get that default.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Union

from ..positions.rope_scaling import RopeScaling, rope_scaling_from_options
from ..ownership import refuse_foreign
from .flags import ATTENTION_FLAGS, ATTENTION_MODES, MODE_SELECTORS, mode_flag, mode_flags
from .position_map import MAP_OPTIONS, POSITION_MAPS, PositionMap, position_map_from_options
from .retrieval import BlockRetrieval
from .window import AttentionWindow, selected_mode, window_from_options

__all__ = ["AttentionOptions", "AttentionSpec", "FULL_SPEC"]

def _owners(name: str) -> tuple:
    """The modes that take the mode-owned option ``name`` (``ATTENTION_FLAGS[name].owners``)."""
    return ATTENTION_FLAGS[name].owners


@dataclass(frozen=True)
class AttentionSpec:
    """How attention runs at inference.

    Attributes:
        window: which keys each query may attend (:class:`~.window.AttentionWindow`); default full causal.
        rope_scaling: the RoPE scaling of a rotary scheme (:class:`~..positions.rope_scaling.RopeScaling`),
            or None (as trained). A model refuses a scaling when its scheme is not rotary.
        position_map: a bounded-distance method (:mod:`.position_map`: ReRoPE, Leaky ReRoPE, Self-Extend,
            DCA) over full attention, or None. A model refuses one its scheme has no distance for.
        logit_scale: beta, a constant factor on every logit (queries times beta; DroPE's recalibration
            ``--attention-temperature``), or None (1).
        logn: the training length l of log-n attention scaling (queries times max(1, log(n) / log(l)), n the
            number of keys a query sees), or None (off).
        retrieval: block retrieval (:class:`~.retrieval.BlockRetrieval`: BCA's window plus the K blocks each query
            scores highest, ``--bca --retrieval-blocks K``) over full attention's keys and cache, or None.

    ``str(spec)`` is the label of a report row: the window (or the position map, or the retrieval), then ``+scaling``
    and ``+logn`` when there are.

    Raises:
        TypeError: a window that is not an ``AttentionWindow``, a scaling that is not a ``RopeScaling``, a
            position map that is not a ``PositionMap``.
        ValueError: a position map over a window other than full attention; log-n with l < 2; a retrieval over a
            window other than full attention, or with a position map or log-n.
    """

    window: AttentionWindow = field(default_factory=AttentionWindow.full)
    rope_scaling: Optional[RopeScaling] = None
    position_map: Optional[PositionMap] = None
    logn: Optional[int] = None
    logit_scale: Optional[float] = None
    retrieval: Optional[BlockRetrieval] = None

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
        if self.logit_scale is not None and not float(self.logit_scale) > 0:
            raise ValueError(f"the logit scale beta must be > 0, got {self.logit_scale}.")
        if self.retrieval is not None:
            if not isinstance(self.retrieval, BlockRetrieval):
                raise TypeError(f"AttentionSpec.retrieval must be a BlockRetrieval or None, got {type(self.retrieval).__name__}.")
            if self.window != AttentionWindow.full() or self.position_map is not None or self.logn:
                raise ValueError(f"{self.retrieval} chooses its blocks among every key (full attention's cache): it does "
                                 "not combine with a bounded window, sink tokens, a position map or --logn.")

    def __str__(self) -> str:
        label = str(self.window) if self.position_map is None else str(self.position_map)
        label = label if self.retrieval is None else str(self.retrieval)
        if self.rope_scaling is not None:
            label += f"+{self.rope_scaling}"
        label += "+logn" if self.logn else ""
        return label + (f"+beta({self.logit_scale:.4g})" if self.logit_scale is not None else "")

    def fields(self) -> dict:
        """The spec as structured report fields: mode, stride, sinks, rope_scaling (kind) and
        rope_scaling_factor (s), None where absent."""
        w = self.window
        mode = w.mode if self.position_map is None else self.position_map.name
        stride = w.stride if self.retrieval is None else self.retrieval.block
        return {"mode": mode if self.retrieval is None else "bca", "stride": stride or None,
                "sinks": w.sinks, "logn": bool(self.logn), "logit_scale": self.logit_scale,
                "retrieval_blocks": None if self.retrieval is None else self.retrieval.topk - self.retrieval.local,
                "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.kind,
                "rope_scaling_factor": None if self.rope_scaling is None else float(self.rope_scaling.factor)}


FULL_SPEC = AttentionSpec()


@dataclass(frozen=True)
class AttentionOptions:
    """The user's words for an :class:`AttentionSpec`: the attention flags (:data:`~.flags.ATTENTION_FLAGS`, one
    declaration for the task, every ``lex`` command, the hub's keywords and the bench scripts), turned into a
    spec in one place (:meth:`spec`).

    Attributes:
        mode: one of :data:`~.flags.ATTENTION_MODES`: ``full``, ``bca``, ``sliding``, ``lm_infinite`` (LM-Infinite)
            or a position map (``rerope``, ``leaky_rerope``, ``self_extend``, ``dca``: full attention at bounded
            distances). The flags ``--bca``, ``--sliding-window``, ``--lm-infinite`` and ``--position-map`` select it.
        sliding_window: W of ``sliding``: a positive integer or ``l`` (default l).
        training_length: l instead of the checkpoint's (``--training-length``), or None.
        sink_tokens: k attention sinks on ``bca`` / ``sliding`` (StreamingLLM).
        retrieval_blocks: K blocks of l/2 retrieved by each query under ``bca`` (InfLLM-style block retrieval), or None.
        n_global, l_local: LM-Infinite's branches (``lm_infinite``; defaults 10 and l).
        rope_scaling, rope_scaling_factor, rope_scaling_file: a kind of ``rope_scaling.ROPE_SCALINGS``, s > 0
            or ``auto``, and LongRoPE's JSON factor lists.
        logn: log-n query scaling against l (any mode).
        attention_temperature: C of DroPE's recalibration: every logit times beta = 1 + C ln(L / l) at an evaluation
            length L > l (1 up to l); needs the evaluation length (any mode).
        rerope_window ... dca_local_window: the position maps' options (``position_map.MAP_OPTIONS``).

    Every value defaults to None, "not given" (the mode's own default applies), so that an option of another
    mode is refused by :meth:`spec` at any value, its default included (``--bca --n-global 10``).
    """

    mode: str = "full"
    sliding_window: Optional[Union[int, str]] = None
    training_length: Optional[int] = None
    sink_tokens: Optional[int] = None
    retrieval_blocks: Optional[int] = None
    n_global: Optional[int] = None
    l_local: Optional[int] = None
    rope_scaling: Optional[str] = None
    rope_scaling_factor: Optional[Union[str, float]] = None
    rope_scaling_file: Optional[str] = None
    logn: bool = False
    attention_temperature: Optional[float] = None
    rerope_window: Optional[int] = None
    leaky_rerope_k: Optional[float] = None
    self_extend_group: Optional[int] = None
    self_extend_window: Optional[int] = None
    dca_chunk_size: Optional[int] = None
    dca_local_window: Optional[int] = None

    def __post_init__(self):
        if self.mode not in ATTENTION_MODES:
            raise ValueError(f"attention mode must be one of {', '.join(ATTENTION_MODES)}, got {self.mode!r}.")
        for name, flag in ATTENTION_FLAGS.items():  # every face (task, hub, lex) held to the flag's one minimum
            value = getattr(self, name, None)
            if flag.minimum is not None and flag.type in (int, float) and value is not None and value < flag.minimum:
                raise ValueError(f"{flag.flag} must be at least {flag.minimum:g}, got {value}: a given value is used as "
                                 f"given, never read as the default; leave {flag.flag} out for its default.")

    @classmethod
    def from_flags(cls, flags: Union[Mapping[str, Any], Any]) -> "AttentionOptions":
        """The options of parsed flags (a mapping, an argparse / click namespace or a fairseq config) named as in
        :data:`~.flags.ATTENTION_FLAGS`; the mode from ``bca``, ``sliding_window``, ``lm_infinite`` and
        ``position_map`` (``selected_mode``); a missing name is not given.

        Raises:
            ValueError: more than one of --bca, --sliding-window, --lm-infinite and --position-map.
        """
        get = flags.get if isinstance(flags, Mapping) else (lambda name, default=None: getattr(flags, name, default))
        mode = selected_mode(*(get(name) for name in MODE_SELECTORS))
        values = {name: get(name) for name in ATTENTION_FLAGS if name not in MODE_SELECTORS or name == "sliding_window"}
        values["logn"] = bool(values["logn"])
        return cls(mode, **values)

    @property
    def mode_options(self) -> dict:
        """The options given (not None) that belong to some modes only: name -> value."""
        return {name: getattr(self, name) for name, flag in ATTENTION_FLAGS.items()
                if flag.owners is not None and getattr(self, name) is not None}

    @property
    def map_options(self) -> dict:
        """The position-map options (name -> value; None: not given)."""
        return {name: getattr(self, name) for name in MAP_OPTIONS}

    def for_mode(self, mode: str) -> "AttentionOptions":
        """These options under another ``mode`` (a comparison over modes: ``--eval-windows``, ``lex passkey
        --windows``): each mode-owned option (sink tokens, a window's size, a position map's options) stays with
        the modes that take it and is dropped for the others (:meth:`check_modes` refuses one no mode takes)."""
        return replace(self, mode=mode, **{name: None for name in self.mode_options if mode not in _owners(name)})

    def check_modes(self, modes) -> None:
        """Refuse options that none of ``modes`` (a comparison's modes) takes.

        Raises:
            ValueError: a mode-owned option (``--sink-tokens``, a window's or a position map's) no mode takes.
        """
        for name, value in self.mode_options.items():
            if not set(modes) & set(_owners(name)):
                raise ValueError(f"{ATTENTION_FLAGS[name].flag} {value} is an option of {mode_flags(_owners(name))}; none of the modes "
                                 f"{', '.join(modes)} takes it: drop it, or add {_owners(name)[0]} to the modes.")

    def spec(self, model_training_length: Optional[int], evaluation_length: Optional[int] = None) -> AttentionSpec:
        """The spec for a checkpoint trained on ``model_training_length`` tokens (None if it records none),
        evaluated at ``evaluation_length`` (what ``--rope-scaling-factor auto`` divides by l; None where
        unknown).

        Raises:
            ValueError: an option of another mode, at any value (``refuse_foreign``: a position map's, sinks on
                full attention or a position map, ``--l-local`` on BCA ...); as ``window_from_options``,
                ``position_map_from_options`` and ``rope_scaling_from_options`` (a mode that needs l when none is
                known, ``auto`` without an evaluation length...); log-n without l.
        """
        refuse_foreign(self.mode_options, self.mode, _owners, mode_flags, f"this evaluation uses {mode_flag(self.mode)}")
        length = self.training_length or model_training_length
        position_map = None
        if self.mode in POSITION_MAPS:
            position_map = position_map_from_options(self.mode, length, **self.map_options)
            window = AttentionWindow.full()
        else:
            window = window_from_options(self.mode, self.sliding_window, self.training_length, model_training_length,
                                         self.sink_tokens or 0, self.n_global, self.l_local)
        retrieval = None
        if self.retrieval_blocks is not None:  # (owned by bca: refuse_foreign refused it under any other mode)
            if self.sink_tokens:
                raise ValueError(f"--retrieval-blocks keeps every key in the cache: --sink-tokens {self.sink_tokens} adds "
                                 "nothing it could not retrieve; drop one of them.")
            if self.logn:
                raise ValueError("--logn counts the window's keys; a query under --retrieval-blocks sees its chosen blocks "
                                 "as well: drop one of them.")
            retrieval = BlockRetrieval(block=window.stride, topk=int(self.retrieval_blocks) + 2, local=2)
            window = AttentionWindow.full()
        if self.logn and not length:
            raise ValueError("--logn scales queries by log(n) / log(l): give --training-length l (the checkpoint records none).")
        beta = None
        if self.attention_temperature is not None:
            if float(self.attention_temperature) < 0:
                raise ValueError(f"--attention-temperature C must be >= 0, got {self.attention_temperature}.")
            if not length or not evaluation_length:
                raise ValueError("--attention-temperature scales logits by 1 + C ln(L / l): it needs the evaluation length "
                                 "L (a length table's rows, a probe's lengths) and the training length l.")
            beta = 1.0 + float(self.attention_temperature) * math.log(max(int(evaluation_length), int(length)) / int(length))
        scaling = rope_scaling_from_options(self.rope_scaling, self.rope_scaling_factor, length, evaluation_length,
                                            self.rope_scaling_file)
        return AttentionSpec(window, scaling, position_map, int(length) if self.logn else None, beta, retrieval)

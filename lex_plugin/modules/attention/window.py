"""Which keys a query may attend: full causal attention, blockwise causal attention (BCA), sliding window.

Vocabulary (used the same way by the task's flags, every ``lex`` command, the hub and the code):

* training length l: the ``--tokens-per-sample`` a checkpoint was trained with;
* BCA block w = l / 2 (LeX section 3.3, Figure 3): queries of block b attend causally to their own block
  and to all of block b - 1, so each query (past the first block) sees between w + 1 and 2w = l keys;
* sliding width W: each query attends its W most recent positions, itself included (the locality
  baseline of LeX Table 5 and of the receptive-field paper);
* chunk C (chunked attention, Llama 4's local layers): the positions are cut into chunks of C and each query
  attends causally within its own chunk only (between 1 and C keys). A layer's trained window
  (``--layer-pattern``), not an evaluation flag.

The windowed kinds have a *stride* c (w for BCA, W for the sliding window, C for chunks): the queries of
block b of c positions only ever need the keys of blocks b - 1 and b (of block b alone for chunks), which is
how the planner cuts long inputs.

Sink keys (attached to a BCA or sliding window; :meth:`AttentionWindow.with_sinks`,
:meth:`AttentionWindow.lm_infinite`): the first k positions stay visible to every query. A sink that
is not already in the query's window is seen at a *virtual* distance, so that no distance exceeds what
training saw:

* attention sinks (StreamingLLM, Xiao et al. 2023, section 3.2): positions by place in the cache. The
  sinks sit right before the window's first key f(p): sink j is at f(p) - k + j (j itself while f(p) <= k),
  distance p - j - max(0, f(p) - k): at most span - 1 + k.
* Λ-shaped attention (LM-Infinite, Han et al. 2023, section 4): a global branch of the first n_global
  positions and a local branch of L_local (a sliding window W = L_local); every distance is capped at
  L_local, so the global branch is seen at distance min(p - j, L_local).
"""

from dataclasses import dataclass
from typing import Optional, Union

from torch import Tensor

__all__ = ["AttentionWindow", "selected_mode", "window_from_options"]

MODES = ("full", "bca", "sliding", "lm_infinite", "chunked")
LM_INFINITE_N_GLOBAL = 10  # default size of LM-Infinite's global branch (--n-global); a handful of starting tokens


@dataclass(frozen=True)
class AttentionWindow:
    """Which keys a query may attend. Build one with :meth:`full`, :meth:`bca`, :meth:`sliding` (and
    :meth:`with_sinks`), :meth:`lm_infinite` or :meth:`chunked`.

    Attributes:
        mode: ``full``, ``bca``, ``sliding``, ``lm_infinite`` (a sliding window whose sinks are LM-Infinite's
            global branch, seen at distances capped at the stride) or ``chunked``.
        stride: c: the BCA block w = l / 2, the sliding width W, LM-Infinite's L_local or the chunk C; 0 for
            ``full``.
        sinks: k, the first positions kept visible to every query (0: none); LM-Infinite's n_global.

    Raises:
        ValueError: unknown mode, a non-positive stride for bca / sliding, sinks without a bounded window
            or more sinks than the stride, ``lm_infinite`` without its global branch (sinks >= 1), sinks on
            chunks.
    """

    mode: str = "full"
    stride: int = 0
    sinks: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention window mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "full" and self.stride <= 0:
            raise ValueError(f"{self.mode} needs a positive size, got {self.stride}")
        if self.sinks < 0:
            raise ValueError(f"the number of sink tokens must be >= 0, got {self.sinks}.")
        if self.sinks and self.mode == "full":
            raise ValueError("sink tokens attach to a bounded window: use them with --bca or --sliding-window "
                             "(full attention already sees every position).")
        if self.sinks > self.stride and self.mode != "full":
            what = {"bca": "the BCA block l/2", "sliding": "the sliding width W"}.get(self.mode, "LM-Infinite's --l-local")
            raise ValueError(f"{self.sinks} sink tokens exceed {what} = {self.stride}; use at most {self.stride}.")
        if self.sinks and self.mode == "chunked":
            raise ValueError("sink tokens attach to BCA or a sliding window; chunked attention (a layer's trained window) "
                             "takes none.")
        if self.mode == "lm_infinite" and not self.sinks:
            raise ValueError("LM-Infinite's Λ-shape needs its global branch: --n-global >= 1 (AttentionWindow.lm_infinite).")

    @classmethod
    def full(cls) -> "AttentionWindow":
        """Causal attention over every earlier position."""
        return cls()

    @classmethod
    def bca(cls, training_length: int) -> "AttentionWindow":
        """BCA for a model trained on ``training_length`` = l tokens: blocks of w = l / 2.

        Raises:
            ValueError: l odd or < 2.
        """
        if training_length < 2 or training_length % 2:
            raise ValueError(
                f"BCA cuts the training length l into blocks of l/2, so l must be even and >= 2; got {training_length}."
            )
        return cls("bca", training_length // 2)

    @classmethod
    def sliding(cls, width: int) -> "AttentionWindow":
        """Each query attends its ``width`` = W most recent positions, itself included.

        Raises:
            ValueError: W < 1.
        """
        if width < 1:
            raise ValueError(f"the sliding window width W must be a positive integer, got {width}.")
        return cls("sliding", int(width))

    def with_sinks(self, sinks: int) -> "AttentionWindow":
        """This BCA or sliding window plus ``sinks`` = k attention-sink tokens (StreamingLLM).

        Raises:
            ValueError: see the class (full attention, k > stride).
        """
        return AttentionWindow(self.mode, self.stride, int(sinks))

    @classmethod
    def lm_infinite(cls, n_global: int, l_local: int) -> "AttentionWindow":
        """LM-Infinite's Λ-shaped attention: the first ``n_global`` positions and the ``l_local`` most recent,
        every distance capped at ``l_local`` (Han et al. 2023, section 4).

        Raises:
            ValueError: l_local < 1, n_global < 1 or n_global > l_local.
        """
        if n_global < 1:
            raise ValueError(f"--n-global must be >= 1 (the global branch), got {n_global}.")
        return cls("lm_infinite", cls.sliding(l_local).stride, int(n_global))

    @classmethod
    def chunked(cls, chunk: int) -> "AttentionWindow":
        """Chunked attention (Llama 4's local layers): positions cut into chunks of ``chunk`` = C, each query
        attending causally within its own chunk (keys C floor(p / C) .. p).

        Raises:
            ValueError: C < 1.
        """
        if chunk < 1:
            raise ValueError(f"the chunk size C must be a positive integer, got {chunk}.")
        return cls("chunked", int(chunk))

    @property
    def bounded(self) -> bool:
        """True for every window but full attention: a query sees at most 2c (BCA) or c keys."""
        return self.mode != "full"

    @property
    def span(self) -> Optional[int]:
        """The most keys one query can see, itself included: 2w = l (BCA), W (sliding), None (full); plus
        the sinks."""
        if self.mode == "full":
            return None
        return (2 * self.stride if self.mode == "bca" else self.stride) + self.sinks

    @property
    def own_block_only(self) -> bool:
        """True for chunks: a block of c queries needs its own c keys alone (not block b - 1's too)."""
        return self.mode == "chunked"

    @property
    def feed_block(self) -> Optional[int]:
        """How many new positions the evaluators feed through the key/value cache at a time (memory flat in L):
        BCA's block c = l/2 and chunks' C (one window per call, SDPA's fused causal kernel); for a sliding window W/4 (at
        least 1): a block of c queries computes c + W - 1 keys each, so W/4 costs 1.25 W per query where
        W would cost 2 W; None for full attention (no window to follow)."""
        if self.mode == "full":
            return None
        return self.stride if self.mode in ("bca", "chunked") else max(1, self.stride // 4)

    def covers(self, length: int) -> bool:
        """True if, for sequences of ``length`` positions, this window is plain causal attention."""
        if self.mode == "full":
            return True
        return length <= (2 * self.stride if self.mode == "bca" else self.stride)

    def first_key(self, position: Union[int, Tensor]):
        """Position of the earliest key visible to a query at ``position`` (an int, or an int64 tensor of
        positions, elementwise)."""
        if self.mode == "full":
            first = position * 0
        elif self.mode == "bca":
            first = (position // self.stride - 1) * self.stride
        elif self.mode == "chunked":
            first = position // self.stride * self.stride
        else:
            first = position - self.stride + 1
        return first.clamp(min=0) if isinstance(first, Tensor) else max(0, first)

    def visible_keys(self, query: Tensor) -> Tensor:
        """How many keys each query at positions ``query`` (int64) sees: its window and the sinks outside it."""
        first = self.first_key(query)
        return query - first + 1 + (first.clamp(max=self.sinks) if self.sinks else 0)

    def in_window(self, query: Tensor, key: Tensor) -> Tensor:
        """Boolean: key inside the query's window, first_key(query) <= key <= query (broadcast)."""
        return (key <= query) & (key >= self.first_key(query))

    def sink_visible(self, query: Tensor, key: Tensor) -> Tensor:
        """Boolean: ``key`` is a sink the query sees outside its window (key < min(k, first_key(query)))."""
        return (key < self.sinks) & (key < self.first_key(query))

    def allowed(self, query: Tensor, key: Tensor) -> Tensor:
        """Boolean visibility of keys at positions ``key`` to queries at ``query`` (broadcast): in the window
        or a sink."""
        visible = self.in_window(query, key)
        return visible | self.sink_visible(query, key) if self.sinks else visible

    def sink_distance(self, query: Tensor, key: Tensor) -> Tensor:
        """The distance at which a query sees sink ``key`` outside its window (int64, broadcast): StreamingLLM
        p - j - max(0, f(p) - k), or LM-Infinite min(p - j, L_local)."""
        if self.mode == "lm_infinite":
            return (query - key).clamp(max=self.stride)
        return query - key - (self.first_key(query) - self.sinks).clamp(min=0)

    def __str__(self) -> str:
        if self.mode == "lm_infinite":
            return f"lm_infinite({self.sinks},{self.stride})"
        if self.mode == "chunked":
            return f"chunked({self.stride})"
        name = "full" if self.mode == "full" else f"{self.mode}({self.stride})"
        return f"{name}+sinks({self.sinks})" if self.sinks else name


def window_from_options(
    mode: str = "full",
    sliding_window: Optional[Union[int, str]] = None,
    training_length: Optional[int] = None,
    model_training_length: Optional[int] = None,
    sink_tokens: int = 0,
    n_global: Optional[int] = None,
    l_local: Optional[int] = None,
) -> AttentionWindow:
    """The translation from user options to a window, behind ``AttentionOptions.spec`` (task flags, ``lex``
    commands, hub, bench scripts).

    Args:
        mode: ``full``, ``bca``, ``sliding`` or ``lm_infinite`` (LM-Infinite).
        sliding_window: W for ``sliding``: a positive integer, or ``l`` (the training length); default l.
        training_length: ``--training-length``: l to use instead of the checkpoint's.
        model_training_length: the ``tokens_per_sample`` recorded in the checkpoint, or None.
        sink_tokens: ``--sink-tokens`` k added to a ``bca`` or ``sliding`` window (StreamingLLM).
        n_global, l_local: ``--n-global``, ``--l-local`` of ``lm_infinite`` (None: 10, and L_local = l as in the paper).

    Raises:
        ValueError: an unknown mode; BCA, ``sliding`` with W = l or ``lm_infinite`` without L_local when l is
            unknown; an odd l for BCA; a width that is neither a positive integer nor ``l``; a non-positive
            ``training_length``; sinks on full attention or more than the stride.
    """
    if training_length is not None and int(training_length) <= 0:
        raise ValueError(f"--training-length must be a positive integer, got {training_length}.")
    length = int(training_length) if training_length else model_training_length
    if mode not in MODES or mode == "chunked":  # chunks are a layer's trained window (--layer-pattern), not a flag
        raise ValueError(f"attention window mode must be one of {', '.join(m for m in MODES if m != 'chunked')}, got {mode!r}.")
    if mode == "lm_infinite":
        if sink_tokens:
            raise ValueError("--sink-tokens and LM-Infinite's --n-global both add global tokens; choose one.")
        if l_local is None and not length:
            raise ValueError("LM-Infinite needs L_local: give --l-local, or a checkpoint that records its training length.")
        return AttentionWindow.lm_infinite(LM_INFINITE_N_GLOBAL if n_global is None else int(n_global),
                                           int(length if l_local is None else l_local))
    if mode == "full":
        return AttentionWindow.full().with_sinks(sink_tokens) if sink_tokens else AttentionWindow.full()
    width = None
    if mode == "sliding" and sliding_window is not None and str(sliding_window).strip() != "l":
        text = str(sliding_window).strip()
        if not text.isdigit() or int(text) <= 0:
            raise ValueError(f"--sliding-window takes a positive integer W or 'l' (the training length); got {sliding_window!r}.")
        width = int(text)
    if width is None and not length:
        raise ValueError(
            f"{mode} needs the training length l, and this checkpoint records no tokens_per_sample; give it with "
            "--training-length l" + (" (or --sliding-window W)." if mode == "sliding" else ".")
        )
    window = AttentionWindow.bca(int(length)) if mode == "bca" else AttentionWindow.sliding(width or int(length))
    return window.with_sinks(sink_tokens) if sink_tokens else window


def selected_mode(bca: bool, sliding_window: Optional[Union[int, str]], lm_infinite: bool = False,
                  position_map: Optional[str] = None) -> str:
    """``bca``, ``sliding``, ``lm_infinite``, a position map's name or ``full`` from the flags ``--bca``,
    ``--sliding-window``, ``--lm-infinite`` and ``--position-map``.

    Raises:
        ValueError: more than one given.
    """
    if sum([bool(bca), sliding_window is not None, bool(lm_infinite), bool(position_map)]) > 1:
        raise ValueError("choose one of --bca, --sliding-window, --lm-infinite and --position-map.")
    if position_map:
        return str(position_map)
    return "bca" if bca else "sliding" if sliding_window is not None else "lm_infinite" if lm_infinite else "full"

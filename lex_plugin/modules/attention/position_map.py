"""Bounded-distance attention: every key stays visible, but the distances the position scheme sees are remapped
so that none exceeds what training saw. Each method is a *position map*: a set of pieces, each giving the
positions at which queries and keys are rotated (or biased) for the (query, key) pairs it selects.

The methods (``--position-map``, or a mode of ``--eval-windows``), with n the query position, m the key
position, d = n - m:

* ``rerope`` (Su 2023, "ReRoPE"; reference ``bojone/rerope``, ``rerope_patch.py``): d if d < w, else w.
  Pieces: exact (q at n, k at m) for d < w; capped (q at w, k at 0) for d >= w. Default w = l / 2.
* ``leaky_rerope`` (same reference, ``leaky_rerope_patch.py``): d if d < w, else w + (d - w) / k. Pieces:
  exact for d < w; q at (n + w (k - 1)) / k, k at m / k (fractional) for d >= w. Default w = l / 2, k = 16 (the
  reference's).
* ``self_extend`` (Jin et al. 2024, "LLM Maybe LongLM", Eq. 3-4; ``datamllab/LongLM``,
  ``self_extend_patch/Llama.py``): d if d < w_n (the neighbour window), else
  floor(n / G) - floor(m / G) + w_n - floor(w_n / G). Pieces: exact for d < w_n; q at floor(n/G) + w_n -
  floor(w_n/G), k at floor(m/G) for d >= w_n. The newest reference divides w_n / G without flooring (its flash
  and legacy paths floor); the two agree when G divides w_n, as the defaults do. Defaults G = 8, w_n = l / 4
  (the reference's 1024 for l = 4096).
* ``dca`` (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", section 3;
  ``HKUNLP/ChunkLlama``, ``chunkllama_attn_replace.py``): chunk size s (the largest position used; default
  3l/4), local window w_l (default l/16), chunk length c = s - w_l; keys at m mod c; queries at n mod c for keys
  of their own chunk (intra-chunk: d exactly), at min(n mod c + c, s) for keys of the previous chunk
  (successive-chunk), at min(2c - 1, s) for every earlier chunk (inter-chunk: the reference's successive
  position of a chunk's last query; s with the defaults). Every distance is at most s < l.

xPos under a position map: the decay follows the remapped distance, zeta^(d'/B) with d' the piece's q position
minus its k position (the natural choice: the model sees (rotation, decay) pairs of training distances only).

Bias schemes (ALiBi, Sandwich, KERPLE, T5) see the remapped distance d' in their bias f_h(d') where it is an
integer (``rerope``, ``self_extend``, ``dca``); ``leaky_rerope``'s fractional distances are refused for them.
NoPE and absolute schemes have no distance to remap: refused.

Numerics: positions are int64 or float64 (``leaky_rerope``); rotations are formed in float64 and applied in fp32;
the executor runs each piece on SDPA's fused kernel and merges the pieces in fp32 by their log-sum-exps
(``kernels.remapped``).
"""

from dataclasses import dataclass, fields
from typing import Callable, ClassVar, Dict, List, NamedTuple, Optional, Tuple, Type

import torch
from torch import Tensor

from ..ownership import refuse_foreign

__all__ = ["DualChunk", "LeakyReRoPE", "MAP_OPTIONS", "MapOption", "POSITION_MAPS", "Piece", "PositionMap", "ReRoPE", "SelfExtend",
           "position_map_from_options"]


class Piece(NamedTuple):
    """One score set of a position map over queries at n (Tq,) and keys [lo, hi) of the keys at m (Tk,).

    Attributes:
        q_pos: (Tq,) positions the queries are rotated at (int64 or float64).
        lo, hi: the range of key indices the piece may select (outside it, it selects nothing).
        k_pos: (hi - lo,) positions those keys are rotated at.
        select: (Tq, hi - lo) bool: the pairs this piece scores (the pieces of a map partition the causal pairs;
            causality itself is the window's), or None: every pair of the range.
        kind: the rotation its keys share with the map's other pieces of that kind (``exact``, ``far``; DCA's three
            pieces are all ``chunk``: keys at m mod c): a key's position in a piece of one kind depends on the key
            alone, so a generation cache keeps one rotated copy of each kind's keys (``kv_cache.RotatedPieces``).
        center: the position its queries and keys are rotated about (rounded down by the scheme's ``center_near``)
            where every position the map uses (0 .. ``PositionMap.max_position``) lies within the scale's range of
            it; otherwise, or None, the middle of its query positions. Pieces of one kind share their rotated keys
            while they share a centre.
    """

    q_pos: Tensor
    lo: int
    hi: int
    k_pos: Tensor
    select: Optional[Tensor]
    kind: str = ""
    center: Optional[int] = None


@dataclass(frozen=True)
class PositionMap:
    """Base of the bounded-distance methods (module docstring). Subclasses are frozen dataclasses whose fields
    are the method's options; ``name`` is its ``--position-map`` name."""

    name: ClassVar[str] = ""
    integer: ClassVar[bool] = True  # remapped distances are integers (bias schemes can take them)

    @property
    def max_position(self) -> int:
        """The largest query or key position a piece of the map with a shared centre (``Piece.center``) uses; 0 for a
        map whose pieces have none."""
        return 0

    def distance(self, n: Tensor, m: Tensor) -> Tensor:
        """The remapped distance d' of queries at ``n`` and keys at ``m`` (int64, broadcast; m <= n), float64."""
        raise NotImplementedError

    def pieces(self, n: Tensor, m: Tensor) -> List[Piece]:
        """The score sets for queries at ``n`` (Tq,) and keys at ``m`` (Tk,), both int64 contiguous ranges."""
        raise NotImplementedError

    def query_blocks(self, start: int, end: int, block: int) -> List[Tuple[int, int]]:
        """Query positions [start, end) cut into blocks of at most ``block`` that the executor runs one at a time
        (each block meets only the keys its pieces can select). Default: every ``block`` positions."""
        return [(a, min(end, a + block)) for a in range(start, end, block)]

    def __str__(self) -> str:
        values = ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))
        return f"{self.name}({values})"


def _range(m: Tensor, lo: int, hi: int):
    """[lo, hi) clipped to the indices of the keys ``m`` (empty: lo == hi)."""
    lo, hi = max(0, lo), min(m.numel(), hi)
    return lo, max(lo, hi)


def _exact_and_far(n: Tensor, m: Tensor, w: int, far_q: Tensor, far_k_fn) -> List[Piece]:
    """The two pieces of ReRoPE-like maps: exact distances below ``w``, the far piece at and beyond it."""
    k0 = int(m[0])
    out = []
    lo, hi = _range(m, int(n[0]) - w + 1 - k0, int(n[-1]) + 1 - k0)
    if hi > lo:
        out.append(Piece(n, lo, hi, m[lo:hi], m[None, lo:hi] > (n - w)[:, None], "exact"))  # d < w
    lo, hi = _range(m, 0, int(n[-1]) - w + 1 - k0)
    if hi > lo:
        out.append(Piece(far_q, lo, hi, far_k_fn(m[lo:hi]), m[None, lo:hi] <= (n - w)[:, None], "far"))  # d >= w
    return out


@dataclass(frozen=True)
class ReRoPE(PositionMap):
    """ReRoPE: distance min(d, w) (module docstring). ``window``: w >= 1."""

    name: ClassVar[str] = "rerope"
    window: int

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"--rerope-window must be >= 1, got {self.window}.")

    def distance(self, n, m):
        return (n - m).clamp(max=self.window).double()

    def pieces(self, n, m):
        return _exact_and_far(n, m, self.window, torch.full_like(n, self.window), torch.zeros_like)


@dataclass(frozen=True)
class LeakyReRoPE(PositionMap):
    """Leaky ReRoPE: d below w, w + (d - w) / k beyond (module docstring). ``window``: w >= 1; ``k`` > 1."""

    name: ClassVar[str] = "leaky_rerope"
    integer: ClassVar[bool] = False
    window: int
    k: float = 16.0

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"--rerope-window must be >= 1, got {self.window}.")
        if not self.k > 1:
            raise ValueError(f"--leaky-rerope-k must be > 1 (k = 1 is plain RoPE), got {self.k}.")

    def distance(self, n, m):
        d = (n - m).double()
        return torch.where(d < self.window, d, self.window + (d - self.window) / self.k)

    def pieces(self, n, m):
        far_q = (n.double() + self.window * (self.k - 1)) / self.k
        return _exact_and_far(n, m, self.window, far_q, lambda keys: keys.double() / self.k)


@dataclass(frozen=True)
class SelfExtend(PositionMap):
    """Self-Extend: exact below the neighbour window w_n, grouped by G beyond (module docstring)."""

    name: ClassVar[str] = "self_extend"
    group: int
    window: int

    def __post_init__(self):
        if self.group < 1:
            raise ValueError(f"--self-extend-group must be >= 1, got {self.group}.")
        if self.window < 1:
            raise ValueError(f"--self-extend-window must be >= 1, got {self.window}.")

    @property
    def shift(self) -> int:
        return self.window - self.window // self.group

    def distance(self, n, m):
        d = n - m
        grouped = torch.div(n, self.group, rounding_mode="floor") - torch.div(m, self.group, rounding_mode="floor")
        return torch.where(d < self.window, d, grouped + self.shift).double()

    def pieces(self, n, m):
        far_q = torch.div(n, self.group, rounding_mode="floor") + self.shift
        return _exact_and_far(n, m, self.window, far_q, lambda keys: torch.div(keys, self.group, rounding_mode="floor"))

    def __str__(self) -> str:
        return f"self_extend(G={self.group},w={self.window})"


@dataclass(frozen=True)
class DualChunk(PositionMap):
    """Dual Chunk Attention (module docstring): ``chunk_size`` s, ``local_window`` w_l, 0 <= w_l < s."""

    name: ClassVar[str] = "dca"
    chunk_size: int
    local_window: int

    def __post_init__(self):
        if self.local_window < 0 or self.chunk_size - self.local_window < 1:
            raise ValueError(f"--dca-chunk-size s and --dca-local-window w need 0 <= w < s; got s = {self.chunk_size}, "
                             f"w = {self.local_window}.")

    @property
    def chunk_length(self) -> int:
        """c = s - w_l: the length of a chunk."""
        return self.chunk_size - self.local_window

    @property
    def max_position(self) -> int:
        """s: every query (n mod c, min(n mod c + c, s), min(2c - 1, s)) and key (m mod c) position lies in [0, s]."""
        return self.chunk_size

    def _query(self, n: Tensor, relation: str) -> Tensor:
        c, s = self.chunk_length, self.chunk_size
        if relation == "intra":
            return n % c
        if relation == "successive":
            return (n % c + c).clamp(max=s)
        return torch.full_like(n, min(2 * c - 1, s))  # the successive position of a chunk's last query

    def distance(self, n, m):
        c = self.chunk_length
        gap = torch.div(n, c, rounding_mode="floor") - torch.div(m, c, rounding_mode="floor")
        n, m = torch.broadcast_tensors(n, m)
        q = torch.where(gap == 0, self._query(n, "intra"), torch.where(gap == 1, self._query(n, "successive"),
                                                                        self._query(n, "inter")))
        return (q - m % c).double()

    def query_blocks(self, start, end, block):
        """Cut at chunk boundaries as well: a block inside one chunk selects whole chunks in its successive and
        inter-chunk pieces (no mask; only the intra-chunk piece is causal), where a block straddling chunks
        needs a staircase mask in every piece."""
        c = self.chunk_length
        cuts = sorted({start, end, *range((start // c + 1) * c, end, c)})
        return [blk for a, b in zip(cuts, cuts[1:]) for blk in PositionMap.query_blocks(self, a, b, block)]

    def pieces(self, n, m):
        """The inter-chunk, successive-chunk and intra-chunk pieces, in the order of their keys. Every piece rotates
        a key at m mod c; about one centre (s / 2, rounded down by the scheme: queries and keys all lie in [0, s]) the
        three share their rotated keys (kind ``chunk``), where the scheme's scale allows that centre (always for
        RoPE; xPos in fp16 at large s does not, and takes each piece's own). Queries within one chunk
        (``query_blocks``) select every key of each range."""
        c, k0 = self.chunk_length, int(m[0])
        first, last = int(n[0]) // c, int(n[-1]) // c
        chunk_n = torch.div(n, c, rounding_mode="floor")[:, None]
        out = []
        for relation, lo, hi in (("inter", 0, (last - 1) * c), ("successive", (first - 1) * c, last * c),
                                 ("intra", first * c, int(n[-1]) + 1)):
            lo, hi = _range(m, lo - k0, hi - k0)
            if hi <= lo:
                continue
            select = None
            if first != last:  # queries straddling chunks: a staircase in every piece
                gap = chunk_n - torch.div(m[lo:hi], c, rounding_mode="floor")[None, :]
                select = gap == 0 if relation == "intra" else gap == 1 if relation == "successive" else gap >= 2
            out.append(Piece(self._query(n, relation), lo, hi, m[lo:hi] % c, select, "chunk", self.chunk_size // 2))
        return out

    def __str__(self) -> str:
        return f"dca(s={self.chunk_size},w={self.local_window})"


POSITION_MAPS: Dict[str, Type[PositionMap]] = {cls.name: cls for cls in (ReRoPE, LeakyReRoPE, SelfExtend, DualChunk)}

class MapOption(NamedTuple):
    """One option of a position map, a flag of the task and of every ``lex`` command (``--rerope-window``...).

    Attributes:
        name: the flag's attribute (``rerope_window``); owners: the methods that take it; field: the
        method's dataclass field; type: int or float; default: a function of the training length l; help.
    """

    name: str
    owners: Tuple[str, ...]
    field: str
    type: type
    default: Callable[[int], float]
    help: str


MAP_OPTIONS: Dict[str, MapOption] = {o.name: o for o in (
    MapOption("rerope_window", ("rerope", "leaky_rerope"), "window", int, lambda l: l // 2,
              "ReRoPE / Leaky ReRoPE window w: exact distances below it (default l/2)"),
    MapOption("leaky_rerope_k", ("leaky_rerope",), "k", float, lambda l: 16.0,
              "Leaky ReRoPE's k: distance w + (d - w)/k beyond w (default 16)"),
    MapOption("self_extend_group", ("self_extend",), "group", int, lambda l: 8,
              "Self-Extend group size G (default 8)"),
    MapOption("self_extend_window", ("self_extend",), "window", int, lambda l: max(1, l // 4),
              "Self-Extend neighbour window w_n (default l/4)"),
    MapOption("dca_chunk_size", ("dca",), "chunk_size", int, lambda l: 3 * l // 4,
              "Dual Chunk Attention chunk size s, the largest position used (default 3l/4)"),
    MapOption("dca_local_window", ("dca",), "local_window", int, lambda l: l // 16,
              "Dual Chunk Attention local window (default l/16)"),
)}


def position_map_from_options(name: str, training_length: Optional[int], **options) -> PositionMap:
    """The position map ``name`` for a model trained on ``training_length`` = l tokens, its options given as
    keywords of :data:`MAP_OPTIONS` (None: the default).

    Raises:
        ValueError: an unknown name; an option of another method (naming both); a default that needs l when
            none is known; a window or chunk size >= l; invalid values (the classes').
    """
    if name not in POSITION_MAPS:
        raise ValueError(f"--position-map must be one of {', '.join(POSITION_MAPS)}, got {name!r}.")
    refuse_foreign(options, name, lambda option: MAP_OPTIONS[option].owners, lambda owners: "--position-map " + " / ".join(owners),
                   f"this is --position-map {name}")
    values = {}
    for option in MAP_OPTIONS.values():
        if name not in option.owners:
            continue
        value = options.get(option.name)
        if value is None:
            if not training_length:
                raise ValueError(f"--position-map {name} needs the training length l for its default "
                                 f"--{option.name.replace('_', '-')}: give --training-length or the option.")
            value = option.default(int(training_length))
        values[option.field] = option.type(value)
        if training_length and option.field in ("window", "chunk_size") and values[option.field] >= int(training_length):
            raise ValueError(f"--{option.name.replace('_', '-')} {values[option.field]} must be below the training length "
                             f"l = {training_length}: the point of --position-map {name} is that no distance reaches l.")
    return POSITION_MAPS[name](**values)

"""The key/value cache of one attention layer: preallocated, grown geometrically, trimmed to the window.

The cache owns its protocol. :meth:`KeyValueCache.after_prefill` starts it from a parallel pass;
:meth:`KeyValueCache.extend` takes each later segment of new positions (at most :meth:`segment_length`
of them): it re-centres if needed, stores the segment's keys rotated, keeps the sink tokens, and returns
the segment's queries rotated at the same centre; :meth:`trim` then drops what no later query sees.
The scheme says how its keys depend on a centre (``center_near``, ``max_center_offset``,
``rescale_keys``); the cache decides when to move it.

Keys are stored *rotated* by the position scheme at the cache's centre (xPos: zeta^(-(m - c)/B), RoPE:
the rotation alone), so a generation step rotates one query and one key, never the whole cache. The
cache moves its centre when new positions get too far from it (``XPos.max_center_offset``): the stored
keys are multiplied by one (d,) factor (``rescale_keys``), which only shrinks them, so every stored
value stays finite at any length.

Layout: a buffer is sequence-major, (B, H, cap, D) in memory, what SDPA's kernels read, or, for a
generation step's single query over at least ``FEATURE_MAJOR_KEYS`` keys on CPU, feature-major and fp32,
(B, H, D, cap) in memory: the step's two matrix-vector products (``executor``) then read keys and values
as long contiguous rows, at about the memory bandwidth. ``held(queries)`` re-lays the buffers when the
kind of reader changes (once when generation starts after a chunked prefill; back if several queries
come again); ``held`` always gives (B, H, T, D) views. A bf16 / fp16 cache (bf16 autocast, a half model) is widened
to fp32 when it goes feature-major, and narrowed back to the model's dtype with the layout: on CPU a half-precision
product costs about 50 us a call whatever its size, and over long caches PyTorch's batched half products copy the
cache first, so the widened step runs at fp32's speed where the half one ran at half of it; it holds the cache in
fp32's bytes meanwhile (examples/lex_lm/BENCHMARKS.md, "bf16 generation at 16k"). A half cache with attention sinks,
or under ``FEATURE_MAJOR_KEYS`` keys, stays sequence-major in its dtype (``kernels.ops.one_query``).

Appending writes into a buffer of capacity ``cap`` >= the live length; when the buffer is full the live
keys move to its front (when they fill at most half of it: a bounded window) or it doubles (full
attention): O(1) amortised per token, no copy of the whole cache per step. Under BCA or a sliding window
the cache drops keys no later query can see (``drop_before``), so it holds at most l or W positions, plus,
with attention sinks, the first k keys and values un-rotated (``sinks``: they are rotated at a
virtual place at every use).
"""

import copy
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["HeldKeys", "KeyValueCache", "RotatedPieces", "cumulative_decay", "fork_incremental_state"]

MIN_CAPACITY = 64
FEATURE_MAJOR_KEYS = 4096  # below this, PyTorch's CPU SDPA kernel is as fast for one query (BENCHMARKS.md, fourth run)


@dataclass(frozen=True)
class HeldKeys:
    """The keys and values attention reads, and what it must know about them, in one frozen value: a parallel
    pass's (``HeldKeys(k, v, padding)``) or a generation cache's (:meth:`KeyValueCache.held`), handed to
    ``executor.attend`` whole.

    Attributes:
        keys, values: (B, H, S, D) at positions start .. start + S - 1.
        padding: (B, S) bool, True at padding, or None (no held key is padding).
        start: the position of the first key.
        center: the centre the keys (and the queries read against them) are rotated at; None: raw, each chunk
            rotates them (a parallel pass; a cache under a position map).
        sinks: (keys, values, padding) of the sink positions 0 .. s - 1, keys raw, padding (B, s) or None; None: the
            first keys of ``keys`` (a pass that starts at position 0).
        feature_major: keys and values are views of (B, H, D, S) memory (a cache laid out for one query).
        rotated_pieces: a cache's keys as each piece of its position map rotates them (:class:`RotatedPieces`), or
            None (a parallel pass; no position map).
        decay: (B, H, S) float64 cumulative log forget gate c_m = sum_{t <= m} log f_t of each key (the forgetting
            transformer's decay: the logit of query n and key m gains c_n - c_m, the queries being the last keys), or
            None (no forget gate).
    """

    keys: Tensor
    values: Tensor
    padding: Optional[Tensor] = None
    start: int = 0
    center: Optional[int] = None
    sinks: Optional[Tuple[Tensor, Tensor, Optional[Tensor]]] = None
    feature_major: bool = False
    rotated_pieces: Optional["RotatedPieces"] = None
    decay: Optional[Tensor] = None


def cumulative_decay(log_forget: Tensor, before: Optional[Tensor] = None) -> Tensor:
    """c_m = c_before + sum of ``log_forget`` up to m: (B, H, T) float64 from (B, H, T) log forget gates (<= 0) and the
    (B, H) cumulative value of the position before the first (None: 0). float64, so that c_n - c_m keeps fp32's
    precision in the difference however long the sequence (c grows by up to |log f| a token)."""
    out = log_forget.double().cumsum(-1)
    return out if before is None else out + before[..., None]


class RotatedPieces:
    """A generation cache's keys as the pieces of its position map rotate them, kept between steps.

    Under a position map the cache holds raw keys, and each piece rotates the keys it selects at its own positions
    (Self-Extend's far piece at floor(m / G), DCA's pieces at m mod c, ...). A key's position in the pieces of one
    kind depends on the key alone, so the kind's rotated keys of indices 0 .. filled - 1 stay valid from step to step
    while its centre stays (xPos's scale is relative to it; RoPE's rotation too, as the executor applies it): each
    step rotates only the keys added since, and a piece whose keys start at or before ``filled`` is a slice of them
    (DCA's three pieces, taken in the order of their keys, share one copy). A new centre, fewer cached keys than
    rotated ones (a cache started over), or a reorder of the batch starts over.
    """

    def __init__(self):
        self._held: dict = {}  # kind -> (centre, buffer (B, H, cap, D), rows filled)

    def keys(self, kind: str, center: int, raw: Tensor, lo: int, hi: int, positions: Tensor, rotate) -> Tensor:
        """The keys of indices lo .. hi - 1 rotated at ``positions`` about ``center`` ((B, H, hi - lo, D): a view of
        the kept copy, or a fresh rotation when the copy has not reached ``lo``, which it then does not keep).

        Args:
            kind: the piece's kind (``position_map.Piece.kind``).
            center: the centre the piece rotates about.
            raw: (B, H, T, D) every raw key the cache holds (hi <= T).
            lo, hi: the piece's key indices.
            positions: (hi - lo,) the piece's position of each of its keys.
            rotate: ``rotate(keys, positions)``: the piece's rotation of some keys at some positions.
        """
        held = self._held.get(kind)
        if held is None or held[0] != center or held[2] > raw.size(2) or held[1].size(0) != raw.size(0):
            if lo > 0:  # nothing kept reaches the piece: rotate its keys alone
                return rotate(raw[:, :, lo:hi], positions)
            buffer = raw.new_empty(*raw.shape[:2], max(MIN_CAPACITY, 2 * hi), raw.size(3))
            filled = 0
        else:
            _, buffer, filled = held
            if filled < lo:
                return rotate(raw[:, :, lo:hi], positions)
        if hi > filled:
            if hi > buffer.size(2):
                grown = buffer.new_empty(*buffer.shape[:2], 2 * hi, buffer.size(3))
                grown[:, :, :filled] = buffer[:, :, :filled]
                buffer = grown
            buffer[:, :, filled:hi] = rotate(raw[:, :, filled:hi], positions[filled - lo :])
            filled = hi
        self._held[kind] = (center, buffer, filled)
        return buffer[:, :, lo:hi]

    def clear(self) -> None:
        """Forget every piece's keys (a reorder of the batch)."""
        self._held.clear()


class SegmentedAttention:
    """The loop a generation cache runs over new positions, so that attention asks it once (:meth:`attend`). A cache
    that mixes it in provides ``end``, ``segment_length``, ``extend``, ``held`` and ``trim`` (:class:`KeyValueCache`,
    ``branch_cache.BranchCache``)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
               attention: Callable[[Tensor, HeldKeys, int], Tensor], log_forget: Optional[Tensor] = None) -> Tensor:
        """Attention of T new positions after the held ones, in segments the cache can take (xPos's scale stays in
        range: ``segment_length``): each segment is stored (``extend``: queries rotated as its keys), attended by
        ``attention(queries (B, H, t, D), held keys, first position)`` over what the cache holds, then the keys no
        later query sees are dropped (``trim``).

        Args:
            q, k, v: (B, H, T, D) raw queries, keys and values of positions ``end`` .. ``end`` + T - 1.
            key_padding_mask: (B, T) bool, True at padding, or None.
            attention: one segment's attention, (B, H, t, D) out in q's dtype.
            log_forget: (B, H, T) fp32 log forget gates of the new positions (a forget gate's layer), or None.

        Returns:
            (B, H, T, D): the segments' outputs in order.
        """
        length = q.size(2)
        segment = self.segment_length(q.dtype) or length
        outs = []
        for a in range(0, length, segment):
            b = min(length, a + segment)
            first = self.end
            pad = None if key_padding_mask is None else key_padding_mask[:, a:b]
            gates = None if log_forget is None else log_forget[:, :, a:b]
            rotated = self.extend(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], pad, log_forget=gates)
            outs.append(attention(rotated, self.held(queries=b - a), first))
            self.trim()
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class KeyValueCache(SegmentedAttention):
    """Keys (rotated at ``center``), values and padding of positions start .. end - 1 of one layer.

    Args:
        spec: the ``AttentionSpec`` (window, RoPE scaling) the cache serves; a cache is never reused
            across specs.
        scheme: the layer's position scheme (``PositionScheme``): how keys are rotated and re-centred.

    Attributes:
        start: position of the first held key; ``end``: one past the last.
        center: the centre the stored keys are rotated at (un-rotated under a position map: ``raw``).
        feature_major: the buffers' layout: (B, H, D, cap) in memory (True) or (B, H, cap, D) (module docstring).
    """

    def __init__(self, spec, scheme=None):
        self.spec = spec
        self.scheme = scheme
        self.start = 0
        self.center = 0
        self._k: Optional[Tensor] = None  # (B, H, cap, D)
        self._v: Optional[Tensor] = None
        self._pad: Optional[Tensor] = None  # (B, cap) bool, allocated on the first padded key
        self._decay: Optional[Tensor] = None  # (B, H, cap) float64 cumulative log forget gates (a forget gate's layer)
        self._offset = 0  # buffer row of position ``start``
        self.feature_major = False  # layout of the buffers (module docstring)
        self._length = 0
        self._dtype: Optional[torch.dtype] = None  # the keys' dtype as the model gives them (a widened cache holds fp32)
        self.sink_k: Optional[Tensor] = None  # (B, H, s, D) un-rotated keys of positions 0 .. s - 1 (sink tokens)
        self.sink_v: Optional[Tensor] = None
        self.sink_pad: Optional[Tensor] = None  # (B, s) bool: which sink positions are padding
        # each position-map piece's rotated keys, kept between generation steps (raw caches only)
        self.rotated_pieces = RotatedPieces() if spec.position_map is not None else None

    @property
    def raw(self) -> bool:
        """Keys stored un-rotated (a position map rotates every key at remapped positions at each use)."""
        return self.spec.position_map is not None

    @property
    def length(self) -> int:
        """Number of positions held."""
        return self._length

    @property
    def end(self) -> int:
        """Positions processed so far (one past the last held)."""
        return self.start + self._length

    @property
    def capacity(self) -> int:
        """Rows allocated (0 before the first append)."""
        return 0 if self._k is None else self._k.size(2)

    def _reserve(self, extra: int, like: Tensor) -> None:
        need = self._length + extra
        if self._k is not None and self._offset + need <= self._k.size(2):
            return
        cap = self.capacity
        if self._k is not None and need <= cap // 2:
            new_cap = cap  # bounded window: move the live rows to the front
        else:
            new_cap = max(MIN_CAPACITY, 2 * need, 2 * cap)
        self._move(like, new_cap, self.feature_major)

    def _move(self, like: Tensor, cap: int, feature_major: bool) -> None:
        """New buffers of ``cap`` rows in the given layout, the live rows copied to their front (the old
        buffers are freed after the copy: a layer's cache is held twice for that moment)."""
        k, v = (_buffer(like, like.size(0), cap, feature_major) for _ in range(2))
        pad = None if self._pad is None else torch.zeros(like.size(0), cap, dtype=torch.bool, device=like.device)
        decay = None if self._decay is None else self._decay.new_zeros(like.size(0), like.size(1), cap)
        if self._k is not None and self._length:
            live = slice(self._offset, self._offset + self._length)
            k[:, :, : self._length] = self._k[:, :, live]
            v[:, :, : self._length] = self._v[:, :, live]
            if pad is not None:
                pad[:, : self._length] = self._pad[:, live]
            if decay is not None:
                decay[:, :, : self._length] = self._decay[:, :, live]
        self._k, self._v, self._pad, self._offset, self.feature_major = k, v, pad, 0, feature_major
        self._decay = decay

    def append(self, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None, start: Optional[int] = None,
               decay: Optional[Tensor] = None) -> None:
        """Store keys ``k`` (already rotated at ``center``) and values ``v``, both (B, H, T, D), for the
        next T positions (or, on an empty cache, for positions ``start`` ..), with (B, T) padding or None, and (a
        forget gate's layer) their (B, H, T) float64 cumulative decay (``HeldKeys.decay``), given on every append or
        on none.

        Raises:
            ValueError: a start on a cache that holds keys; a decay given on some appends and not on others."""
        if start is not None:
            if self._length:
                raise ValueError("only an empty cache takes a start position.")
            self.start = start
        if (decay is None) != (self._decay is None) and self._k is not None:
            raise ValueError("a forget gate's cache takes the decay of every key it stores, or of none.")
        if decay is not None and self._decay is None:
            self._decay = decay.new_zeros(k.size(0), k.size(1), 0)  # allocated with the buffers (_move)
        tokens = k.size(2)
        if self._k is None:
            self._dtype = k.dtype
        self._reserve(tokens, k if self._k is None else self._k)  # a widened cache stays fp32 as it grows
        rows = slice(self._offset + self._length, self._offset + self._length + tokens)
        self._k[:, :, rows] = k
        self._v[:, :, rows] = v
        if decay is not None:
            self._decay[:, :, rows] = decay
        if key_padding_mask is not None and bool(key_padding_mask.any()) and self._pad is None:
            self._pad = torch.zeros(k.size(0), self.capacity, dtype=torch.bool, device=k.device)
        if self._pad is not None:
            self._pad[:, rows] = False if key_padding_mask is None else key_padding_mask
        self._length += tokens

    def held(self, queries: Optional[int] = None) -> HeldKeys:
        """What attention reads now, in one frozen value: the live keys and values (views, no copy), their
        padding (None when none is padding), the first position, the centre (None: raw keys), the sinks and the
        layout.

        Args:
            queries: how many new queries will read the views, to lay the buffers out for them (module
                docstring; a change of layout copies the live rows once): one query over at least
                ``FEATURE_MAJOR_KEYS`` keys on CPU -> feature-major in fp32 (a bf16 / fp16 cache widened, unless it
                holds sinks), several -> sequence-major in the model's dtype.
                None keeps the layout.
        """
        if queries is not None and self._k is not None:
            if queries > 1 and self.feature_major:  # back to sequence-major, in the model's dtype
                self._move(self._k[:, :, :0].to(self._dtype), self.capacity, False)
            elif (queries == 1 and not self.feature_major and self._length >= FEATURE_MAJOR_KEYS
                  and self._k.device.type == "cpu" and (self._k.dtype == torch.float32 or self.sink_k is None)):
                self._move(self._k[:, :, :0].float(), self.capacity, True)  # a bf16 / fp16 cache widens to fp32
        live = slice(self._offset, self._offset + self._length)
        pad = None if self._pad is None else self._pad[:, live]
        if pad is not None and not bool(pad.any()):
            pad = None
        decay = None if self._decay is None else self._decay[:, :, live]
        return HeldKeys(self._k[:, :, live], self._v[:, :, live], pad, self.start, None if self.raw else self.center,
                        self.sinks, self.feature_major, self.rotated_pieces, decay)

    @property
    def last_decay(self) -> Optional[Tensor]:
        """(B, H) float64 cumulative decay of the last position processed (a forget gate's layer), or None."""
        if self._decay is None or not self._length:
            return None
        return self._decay[:, :, self._offset + self._length - 1]

    def drop_before(self, position: int) -> None:
        """Forget keys at positions < ``position`` (no copy)."""
        drop = min(self._length, position - self.start)
        if drop > 0:
            self._offset += drop
            self._length -= drop
            self.start += drop

    @classmethod
    def after_prefill(cls, spec, scheme, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                      decay: Optional[Tensor] = None) -> "KeyValueCache":
        """The cache after a parallel pass over positions 0 .. T - 1 (raw keys and values (B, H, T, D), (B, T)
        padding or None, the (B, H, T) float64 cumulative decay of a forget gate's layer or None): the keys the next
        query sees, rotated at a centre near the end (so every stored xPos scale is <= 1), and the sinks."""
        length = k.size(2)
        keep = spec.window.first_key(length)
        cache = cls(spec, scheme)
        cache.center = scheme.center_near(length - 1)
        keys = k[:, :, keep:] if cache.raw else scheme.rotate(k[:, :, keep:], start=keep, center=cache.center, keys=True,
                                                                          scaling=spec.rope_scaling)
        cache.append(keys, v[:, :, keep:], None if key_padding_mask is None else key_padding_mask[:, keep:], start=keep,
                     decay=None if decay is None else decay[:, :, keep:])
        cache._keep_sinks(k, v, 0, key_padding_mask)
        return cache

    def segment_length(self, dtype) -> Optional[int]:
        """The most new positions one :meth:`extend` may take in ``dtype`` (the scheme's scale stays in
        range), or None: any."""
        limit = None if self.raw else self.scheme.max_center_offset(dtype, self.spec.rope_scaling)
        return None if limit is None else max(1, limit - self.scheme.center_step)

    def extend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None,
               log_forget: Optional[Tensor] = None) -> Tensor:
        """New positions end .. end + T - 1 (raw q, k, v (B, H, T, D), T <= ``segment_length``; padding (B, T)
        or None; a forget gate's (B, H, T) fp32 log gates or None): moves the centre first if the last would lie too
        far from it, stores the keys rotated at the centre (and their cumulative decay), keeps the sinks among them,
        and returns the queries rotated at the same centre.

        Raises:
            ValueError: more positions than ``segment_length``; log gates on a cache without decay or the reverse.
        """
        scheme, scaling = self.scheme, self.spec.rope_scaling
        decay = None if log_forget is None else cumulative_decay(log_forget, self.last_decay)
        if self.raw:
            self.append(k, v, key_padding_mask, decay=decay)
            return q
        first, last = self.end, self.end + q.size(2) - 1
        limit = scheme.max_center_offset(q.dtype, scaling)
        if limit is not None:
            segment = max(1, limit - scheme.center_step)  # segment_length, from the limit already at hand
            if q.size(2) > segment:
                raise ValueError(f"{q.size(2)} new positions exceed the cache's segment of {segment}.")
            if last - self.center > limit:
                self._recenter(scheme.center_near(first))
        self.append(scheme.rotate(k, start=first, center=self.center, keys=True, scaling=scaling), v, key_padding_mask,
                    decay=decay)
        self._keep_sinks(k, v, first, key_padding_mask)
        return scheme.rotate(q, start=first, center=self.center, keys=False, scaling=scaling)

    def trim(self) -> None:
        """Drop the keys no later query sees under the window."""
        self.drop_before(self.spec.window.first_key(self.end))

    @property
    def sinks(self) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
        """(keys, values, padding (B, s) bool) of the sink positions held, keys un-rotated, or None without
        sinks."""
        if not self.spec.window.sinks or self.sink_k is None:
            return None
        return self.sink_k, self.sink_v, self.sink_pad

    def _recenter(self, center: int) -> None:
        """Move the centre to ``center``, multiplying the stored keys by the scheme's factor (formed in fp32)."""
        factor = self.scheme.rescale_keys(self.center, center, self._k.device if self._k is not None else "cpu",
                                          self.spec.rope_scaling)
        if factor is not None and self._length:
            live = self._k[:, :, self._offset : self._offset + self._length]
            live.copy_(live.float() * factor)
        self.center = center

    def _keep_sinks(self, k: Tensor, v: Tensor, start: int, key_padding_mask: Optional[Tensor]) -> None:
        """Keep the un-rotated keys and values (B, H, T, D) of positions start .. start + T - 1 that are among
        the window's first k positions, and their (B, T) padding (attention sinks stay visible after the
        window moves on; padded ones never are)."""
        sinks = self.spec.window.sinks
        if start >= sinks:
            return
        take = min(k.size(2), sinks - start)
        new_k, new_v = k[:, :, :take].clone(), v[:, :, :take].clone()
        new_pad = (torch.zeros(k.size(0), take, dtype=torch.bool, device=k.device) if key_padding_mask is None
                   else key_padding_mask[:, :take].clone())
        if self.sink_k is None:
            self.sink_k, self.sink_v, self.sink_pad = new_k, new_v, new_pad
        else:
            self.sink_k, self.sink_v = torch.cat([self.sink_k, new_k], 2), torch.cat([self.sink_v, new_v], 2)
            self.sink_pad = torch.cat([self.sink_pad, new_pad], 1)

    @property
    def sink_length(self) -> int:
        """Sink positions held besides the window's keys."""
        return 0 if self.sink_k is None else self.sink_k.size(2)

    def fork(self) -> "KeyValueCache":
        """An independent copy: the same positions, centre, keys, values, padding and sinks, in buffers of its own, so
        that one prompt read once can be continued twice (greedy decoding and candidate scoring, ``evaluation.passkey``).
        Extending either leaves the other as it was. The rotated pieces of a position map are not copied (the fork
        rotates its own at its first step)."""
        twin = copy.copy(self)
        twin.rotated_pieces = None if self.rotated_pieces is None else RotatedPieces()
        held = self._k if self._k is not None else self.sink_k
        if held is not None:
            twin.reorder(torch.arange(held.size(0), device=held.device))  # index_select: fresh buffers, same layout
        return twin

    def reorder(self, order: Tensor) -> None:
        """Select batch rows ``order`` (beam search)."""
        if self.rotated_pieces is not None:
            self.rotated_pieces.clear()
        if self.sink_k is not None:
            self.sink_k, self.sink_v = self.sink_k.index_select(0, order), self.sink_v.index_select(0, order)
            self.sink_pad = self.sink_pad.index_select(0, order)
        if self._k is None:
            return
        if self.feature_major:  # select in the (B, H, D, cap) memory, so the copy keeps the layout
            self._k, self._v = (t.transpose(-1, -2).index_select(0, order).transpose(-1, -2) for t in (self._k, self._v))
        else:
            self._k, self._v = self._k.index_select(0, order), self._v.index_select(0, order)
        if self._pad is not None:
            self._pad = self._pad.index_select(0, order)
        if self._decay is not None:
            self._decay = self._decay.index_select(0, order)


def _buffer(like: Tensor, batch: int, rows: int, feature_major: bool) -> Tensor:
    """An uninitialised (batch, H, rows, D) buffer with ``like``'s H, D, dtype and device: contiguous, or a
    transposed view of (batch, H, D, rows) memory (feature-major)."""
    _, heads, _, dim = like.shape
    if feature_major:
        return like.new_empty(batch, heads, dim, rows).transpose(-1, -2)
    return like.new_empty(batch, heads, rows, dim)


def fork_incremental_state(state: Dict[str, "KeyValueCache"]) -> Dict[str, "KeyValueCache"]:
    """A copy of a model's incremental state (every layer's :class:`KeyValueCache`, :meth:`KeyValueCache.fork`):
    continuing the copy leaves ``state`` as it was.

    Raises:
        TypeError: ``state`` holds something other than this module's caches (it is not a lex_lm's state).
    """
    strangers = sorted(k for k, v in state.items() if not isinstance(v, KeyValueCache))
    if strangers:
        raise TypeError(f"cannot fork an incremental state holding {strangers}: only a lex_lm's key/value caches fork.")
    return {k: v.fork() for k, v in state.items()}

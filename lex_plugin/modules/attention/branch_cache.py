"""N continuations of one prompt over its one cache: the candidates a probe scores, without N copies of the prompt.

A probe reads a prompt once (batch 1) and scores N candidate continuations of it (``evaluation.passkey
.score_continuations``). :class:`BranchCache` is a layer's cache for those N rows: the prompt's cache (the *trunk*, a
:class:`~.kv_cache.KeyValueCache` of batch 1) is read through views and never written, and the N rows' own positions
are kept in small buffers of their own. What attention reads (:meth:`held`) is the trunk's live keys broadcast to N
rows and the rows' own keys after them; the trunk is left as it was, so the same prompt can be continued again (by
greedy decoding, or another set of candidates) without a fork.

Notation: N rows, H heads, S trunk positions held, t the rows' own positions so far, D the head dimension.
"""

from typing import Optional

import torch
from torch import Tensor

from .kv_cache import HeldKeys, KeyValueCache, RotatedPieces, SegmentedAttention, cumulative_decay

__all__ = ["BranchCache", "branch_incremental_state"]


class BranchCache(SegmentedAttention):
    """``rows`` continuations of a batch-1 ``trunk``: the interface of :class:`~.kv_cache.KeyValueCache` that
    self-attention's step uses (``spec``, ``end``, ``segment_length``, ``extend``, ``held``, ``trim``, ``length``,
    ``sink_length``), and its segment loop (``SegmentedAttention.attend``).

    Args:
        trunk: the prompt's cache, batch 1; read, never written.
        rows: N, the continuations.

    Raises:
        ValueError: a trunk of another batch than 1.
    """

    def __init__(self, trunk: KeyValueCache, rows: int):
        prefix = trunk.held()  # views of the live rows, in the trunk's layout (no re-layout: the trunk is not touched)
        if prefix.keys.size(0) != 1:
            raise ValueError(f"a branch continues a batch-1 prompt; this cache holds {prefix.keys.size(0)} rows.")
        self.trunk, self.rows, self.spec, self.scheme = trunk, rows, trunk.spec, trunk.scheme
        self.center, self.raw = trunk.center, trunk.raw  # the branch's centre: the trunk's until its rows go too far
        self._prefix = prefix
        self._trunk_at = (trunk.end, trunk.center)  # the trunk as the views saw it (held() checks it did not move)
        self._factor: Optional[Tensor] = None  # (D,) the trunk's keys from its centre to the branch's (None: same)
        self._skip = 0  # trunk positions dropped by the window since the branch began (a view's offset)
        self._k: Optional[Tensor] = None  # (N, H, t, D) the rows' own keys, rotated at the trunk's centre
        self._v: Optional[Tensor] = None
        self._pad: Optional[Tensor] = None  # (N, t) bool
        self._decay: Optional[Tensor] = None  # (N, H, t) float64 the rows' cumulative decay (a forget gate's layer)
        self._start = trunk.end  # position of the rows' first own key
        self._dropped = 0  # own keys dropped by the window
        self._rotated = RotatedPieces() if trunk.rotated_pieces is not None else None

    @property
    def start(self) -> int:
        """Position of the first key held."""
        held = self._prefix.keys.size(2) - self._skip
        return self._prefix.start + self._skip if held > 0 else self._start + self._dropped

    @property
    def end(self) -> int:
        """Positions processed so far: the prompt's and the rows' own."""
        return self._start + (0 if self._k is None else self._k.size(2))

    @property
    def length(self) -> int:
        """Positions held (the trunk's still visible ones and the rows' own)."""
        return self.end - self.start

    @property
    def sink_length(self) -> int:
        """Sink positions held besides the window's keys: the trunk's (the rows start after them)."""
        return self.trunk.sink_length

    def segment_length(self, dtype) -> Optional[int]:
        """The most new positions one :meth:`extend` may take in ``dtype`` (the scheme's scale stays in range), or
        None: any (as ``KeyValueCache.segment_length``)."""
        limit = None if self.raw else self.scheme.max_center_offset(dtype, self.spec.rope_scaling)
        return None if limit is None else max(1, limit - self.scheme.center_step)

    def extend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None,
               log_forget: Optional[Tensor] = None) -> Tensor:
        """The rows' next positions (raw q, k, v (N, H, T, D), T <= :meth:`segment_length`, padding (N, T) or None;
        a forget gate's (N, H, T) fp32 log gates or None): the centre moved first if the last would lie too far from
        it (the branch's own; the trunk keeps its), keys stored rotated at the centre (with their cumulative decay,
        continuing the prompt's), queries returned rotated at it.

        Raises:
            ValueError: more positions than :meth:`segment_length`, or sink positions still to come (a prompt shorter
                than its sinks); log gates where the prompt's cache has no decay, or none where it has.
        """
        if (log_forget is None) != (self._prefix.decay is None):
            raise ValueError("a forget gate's branch takes the log gates of its new positions (and only then).")
        first, last = self.end, self.end + q.size(2) - 1
        if self.spec.window.sinks > first:
            raise ValueError("a branch continues a prompt that holds its sink positions; this one is shorter.")
        if not self.raw:
            scaling = self.spec.rope_scaling
            limit, segment = self.scheme.max_center_offset(q.dtype, scaling), self.segment_length(q.dtype)
            if limit is not None:
                if q.size(2) > segment:
                    raise ValueError(f"{q.size(2)} new positions exceed the cache's segment of {segment}.")
                if last - self.center > limit:
                    self._recenter(self.scheme.center_near(first))
            k = self.scheme.rotate(k, start=first, center=self.center, keys=True, scaling=scaling)
            q = self.scheme.rotate(q, start=first, center=self.center, keys=False, scaling=scaling)
        pad = torch.zeros(k.size(0), k.size(2), dtype=torch.bool, device=k.device) if key_padding_mask is None \
            else key_padding_mask
        if log_forget is not None:  # (after every check: the decay grows with the keys or not at all)
            before = (self._decay[:, :, -1] if self._decay is not None
                      else self._prefix.decay[:, :, -1].expand(log_forget.size(0), -1))
            decay = cumulative_decay(log_forget, before)
            self._decay = decay if self._decay is None else torch.cat([self._decay, decay], 2)
        if self._k is None:
            self._k, self._v, self._pad = k, v, pad
        else:
            self._k, self._v = torch.cat([self._k, k], 2), torch.cat([self._v, v], 2)
            self._pad = torch.cat([self._pad, pad], 1)
        return q

    def _recenter(self, center: int) -> None:
        """Move the branch's centre: its own keys multiplied by the scheme's factor (formed in fp32), the trunk's
        read with theirs from the trunk's centre at every :meth:`held` (the trunk itself keeps its centre)."""
        device, scaling = self._prefix.keys.device, self.spec.rope_scaling
        factor = self.scheme.rescale_keys(self.center, center, device, scaling)
        if factor is not None and self._k is not None:
            self._k = (self._k.float() * factor).to(self._k.dtype)
        self._factor = self.scheme.rescale_keys(self.trunk.center, center, device, scaling)
        self.center = center

    def held(self, queries: Optional[int] = None) -> HeldKeys:
        """The trunk's visible keys broadcast to the N rows, then each row's own ((N, H, S + t, D), one layer's
        copy for this call), their padding, the first position, the centre and the trunk's sinks broadcast.

        Raises:
            RuntimeError: the trunk was continued while the branch lived (its views would read moved keys).
        """
        if (self.trunk.end, self.trunk.center) != self._trunk_at:
            raise RuntimeError("the prompt's cache was continued while candidates branched from it; branch again.")
        p, n = self._prefix, self.rows
        keys, values = p.keys[:, :, self._skip:], p.values[:, :, self._skip:]
        if self._factor is not None:  # the trunk's keys at the branch's centre (one batch-1 copy)
            keys = (keys.float() * self._factor).to(keys.dtype)
        own_k, own_v = self._k[:, :, self._dropped:], self._v[:, :, self._dropped:]
        shape = (n, keys.size(1), keys.size(2), keys.size(3))
        keys = torch.cat([keys.expand(shape).to(own_k.dtype), own_k], 2)
        values = torch.cat([values.expand(shape).to(own_v.dtype), own_v], 2)
        trunk_pad = (torch.zeros(1, shape[2], dtype=torch.bool, device=keys.device) if p.padding is None
                     else p.padding[:, self._skip:])
        padding = torch.cat([trunk_pad.expand(n, -1), self._pad[:, self._dropped:]], 1)
        decay = None
        if p.decay is not None:
            trunk_decay = p.decay[:, :, self._skip:]
            decay = torch.cat([trunk_decay.expand(n, -1, -1), self._decay[:, :, self._dropped:]], 2)
        sinks = None
        if p.sinks is not None:
            sk, sv, sp = p.sinks
            sinks = (sk.expand(n, -1, -1, -1), sv.expand(n, -1, -1, -1), None if sp is None else sp.expand(n, -1))
        return HeldKeys(keys, values, padding if bool(padding.any()) else None, self.start,
                        None if self.raw else self.center, sinks, False, self._rotated, decay)

    def trim(self) -> None:
        """Drop the keys no later query sees under the window (views of the trunk; the rows' own buffers)."""
        first = self.spec.window.first_key(self.end)
        trunk_end = self._prefix.start + self._prefix.keys.size(2)
        self._skip = max(self._skip, min(first, trunk_end) - self._prefix.start)
        if first > self._start:
            self._dropped = max(self._dropped, min(first - self._start, 0 if self._k is None else self._k.size(2)))

    def reorder(self, order: Tensor) -> None:
        """Refused (ValueError): the rows continue one prompt; beam search reorders a cache of its own."""
        raise ValueError("a branch's rows continue one prompt; beam search reorders a cache of its own "
                         "(read the prompt with the batch it needs).")


def branch_incremental_state(state: dict, rows: int) -> dict:
    """Every layer's :class:`BranchCache` of ``rows`` continuations over the batch-1 caches of ``state`` (a model's
    incremental state after a prompt), which is left as it was.

    Raises:
        TypeError: ``state`` holds something other than key/value caches. ValueError: as :class:`BranchCache`.
    """
    strangers = sorted(k for k, v in state.items() if not isinstance(v, KeyValueCache))
    if strangers:
        raise TypeError(f"cannot branch an incremental state holding {strangers}: only a lex_lm's key/value caches do.")
    return {k: BranchCache(v, rows) for k, v in state.items()}

"""Layer patterns (``--layer-pattern``): each layer's position scheme and trained attention window.

The long-context models released since LeX train a *pattern* of layers instead of one kind repeated: Llama 4
interleaves chunked RoPE layers with global NoPE layers (iRoPE), Gemma 2/3 five sliding-window layers with one
global layer, Cohere's RNoPE-SWA sliding RoPE layers with global NoPE layers, SWAN-GPT NoPE and RoPE layers. A
pattern is written as comma-separated entries ``SCHEME/WINDOW``, an entry repeated with ``*N``; the pattern
repeats over the depth, its last repetition cut at the last layer:

* SCHEME: the model's ``--pos-emb`` (written by its name, e.g. ``rope``) or ``none`` (NoPE);
* WINDOW: ``full`` (a *global* layer), or a *local* layer's window, which it keeps at training and at every
  evaluation: ``bca`` (LeX's blocks of l/2), ``sliding:W`` (the W most recent positions) or ``chunked:C``
  (Llama 4: causal within chunks of C).

Examples: ``xpos/bca*3,none/full`` (local xPos under BCA, one global NoPE layer in four);
``rope/sliding:128*5,rope/full`` (Gemma's 5:1); ``rope/sliding:128,none/full`` (RNoPE-SWA);
``rope/chunked:128*3,none/full`` (Llama 4's iRoPE, with ``--temperature-tuning-beta`` on its global layers).

At evaluation the attention flags (``--bca``, ``--sliding-window``, sinks, the position maps, the RoPE scalings,
``--logn``, ``--attention-temperature``) change the *global* layers only; those that act on positions (a position map,
a RoPE scaling) change the global layers that have positions, and are refused when none has. Each layer keeps the
key/value cache its window needs: bounded for local layers, full for global ones (``kv_cache.KeyValueCache.trim``).
"""

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from .attention.window import AttentionWindow

__all__ = ["LayerKind", "parse_layer_pattern"]

_ENTRY = re.compile(r"^(?P<scheme>[A-Za-z0-9_]+)/(?P<window>[a-z]+)(?::(?P<size>\d+))?(?:\*(?P<repeat>\d+))?$")
_SIZED = {"sliding": "W", "chunked": "C"}  # local windows that take a size


@dataclass(frozen=True)
class LayerKind:
    """One layer of a pattern.

    Attributes:
        positions: whether the layer uses the model's position scheme (False: NoPE).
        window: the local window it always attends under, or None: a global layer (full attention at training;
            the evaluation's attention spec at inference).
    """

    positions: bool = True
    window: Optional[AttentionWindow] = None

    @property
    def is_global(self) -> bool:
        """True for a global layer (no trained window of its own)."""
        return self.window is None

    def describe(self, pos_emb: str) -> str:
        """``SCHEME/WINDOW`` as the pattern writes it (``rope/sliding:128``)."""
        scheme = pos_emb if self.positions else "none"
        if self.window is None:
            return f"{scheme}/full"
        size = f":{self.window.stride}" if self.window.mode in _SIZED else ""
        return f"{scheme}/{self.window.mode}{size}"


def parse_layer_pattern(text: Optional[str], pos_emb: str, layers: Optional[int],
                        training_length: Optional[int]) -> Optional[Tuple[LayerKind, ...]]:
    """The layers of ``--layer-pattern text`` (module docstring), one :class:`LayerKind` per layer; None without a
    pattern (every layer global with the model's scheme).

    Args:
        text: the pattern, or None / "" (none).
        pos_emb: the model's ``--pos-emb`` (the one scheme an entry may name besides ``none``).
        layers: the depth (``--decoder-layers``); None: the pattern's own entries, once.
        training_length: l (``--tokens-per-sample``): the BCA block of ``bca`` entries; None if unknown.

    Raises:
        ValueError: an entry that does not parse, names another scheme, a window without its size (or a size on
            ``full`` / ``bca``), ``bca`` without an even training length, a repeat of 0, more entries than layers.
    """
    if not text or not str(text).strip():
        return None
    kinds = []
    for raw in str(text).split(","):
        entry = raw.strip()
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"--layer-pattern entry {entry!r} is not SCHEME/WINDOW[*N]: write e.g. {pos_emb}/sliding:128*5, "
                             f"none/full, {pos_emb}/bca or {pos_emb}/chunked:128.")
        scheme, mode, size, repeat = match["scheme"], match["window"], match["size"], match["repeat"]
        if scheme not in (pos_emb, "none"):
            raise ValueError(f"--layer-pattern entry {entry!r} names --pos-emb {scheme}; a layer uses the model's scheme "
                             f"({pos_emb}) or none (NoPE). Give --pos-emb {scheme} to pattern its layers.")
        if mode not in ("full", "bca", *_SIZED):
            raise ValueError(f"--layer-pattern entry {entry!r}: the window must be full, bca, sliding:W or chunked:C.")
        if (mode in _SIZED) != (size is not None):
            raise ValueError(f"--layer-pattern entry {entry!r}: " + (f"{mode} needs its size, e.g. {mode}:128 ({_SIZED[mode]} in "
                             "positions)." if mode in _SIZED else f"{mode} takes no size (bca's block is l/2)."))
        if mode == "full":
            window = None
        elif mode == "bca":
            if not training_length:
                raise ValueError(f"--layer-pattern entry {entry!r}: BCA's block is l/2; give --tokens-per-sample.")
            window = AttentionWindow.bca(int(training_length))
        else:
            window = AttentionWindow.sliding(int(size)) if mode == "sliding" else AttentionWindow.chunked(int(size))
        count = 1 if repeat is None else int(repeat)
        if count < 1:
            raise ValueError(f"--layer-pattern entry {entry!r}: the repeat *N must be at least 1.")
        kinds += [LayerKind(scheme != "none", window)] * count
    if layers is None:
        return tuple(kinds)
    if len(kinds) > layers:
        raise ValueError(f"--layer-pattern has {len(kinds)} layers; the model has {layers} (--decoder-layers): the pattern "
                         "repeats over the depth, so it can be at most as deep as the model.")
    return tuple(kinds[i % len(kinds)] for i in range(layers))

"""The registry of trained attention designs: each design declares its options, what it refuses, and what it does at
the named points of attention; the decoder, the layers, the fairseq options and the Hugging Face config are derived
from it, and attention calls the points without knowing the design.

Notation: B batch, H heads, T new positions, d head dimension; q, k (B, H, T, d).

The points, in the order attention calls them (``LexSelfAttention.forward``):

1. ``queries_and_keys(attention, q, k)``: before the position scheme, on the new positions (QK-norm);
2. ``queries(attention, q, at)``: a factor on the queries before the position scheme, ``at`` the new queries'
   positions and window (:class:`QueryContext`; SSMax, Llama 4's temperature tuning);
3. ``sink_logits(attention)``: (H,) logits that join every softmax's denominator with no value (learned sinks), at
   most one design per model;
4. ``attend(attention, q, run)``: the attention itself, ``run(queries)`` the executor over the layer's keys and values
   (the cache's included) for queries (B, H, T, d) as it takes them (raw in a parallel pass, where it rotates them with
   the keys; rotated as the cache's keys in a generation step): one call by default, more where a design combines
   several maps over the same keys (differential attention), changing the queries only in ways the position scheme's
   rotation commutes with (a factor per pair of dimensions); at most one design per model;
5. ``retrieval(attention)``: the keys each query attends, chosen by the query (MoBA's top-k blocks, a
   ``kernels.BlockRetrieval`` the executor runs in place of the window's keys), or None; at most one design per model;
6. ``output(attention, out, x)``: the attention's output per head (B, H, T, d), before the heads are merged and
   projected, given the layer's input x (B, T, C) (an output gate);
7. ``log_forget(attention, x)``: (B, H, T) fp32 log forget gates log f_t <= 0 of the new positions, from the layer's
   input x (B, T, C): the logit of query n and key m then gains sum_{m < t <= n} log f_t (the forgetting transformer;
   attention keeps their running sum with the keys, ``kv_cache.HeldKeys.decay``), or None; at most one design per model.

and of the decoder (``modules.decoder.DecoderStack``):

8. ``attach_decoder(decoder)``: the design's parameters on the decoder (the sink token's vector);
9. ``prefix(decoder)``: a (C,) vector placed before every sequence at position 0, its output dropped (the sink
   token); at most one design per model;
10. ``drops_positions(num_updates)``: whether the layers run without positions (NoPE) after that many training
   updates (DroPE);
11. ``interleave(decoder)``: (b, a (C,) vector) placed after every b tokens, its outputs dropped (landmark tokens),
   or None; at most one design per model.

A design is a :class:`DesignSpec` (registered by its module, :func:`register_design`) that builds a
:class:`LayerDesign` from the model's configuration, or None where it is off; the layer's parameters keep the
state-dict names the design gives them (``self_attn.<name>``), so checkpoints trained before the registry load.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor

from ..attention.spec import AttentionSpec
from ..model_option import ModelOption

__all__ = ["DESIGN_OPTIONS", "DESIGNS", "DesignOption", "DesignSpec", "LayerDesign", "QueryContext", "build_designs",
           "design_table", "register_design", "switch_design", "unregister_design"]


DesignOption = ModelOption  # a design's option, a flag of ``--arch lex_lm`` and a ``LexConfig`` field (same name)


@dataclass(frozen=True)
class QueryContext:
    """Where the new queries stand, for a query factor: ``first`` the absolute position of the first new query (the
    cache's end, 0 without one), ``length`` T, ``spec`` the attention spec (its window: the keys each query sees),
    ``positions`` (B, T) int64 per-sample positions (randomized positions at training) or None."""

    first: int
    length: int
    spec: AttentionSpec
    positions: Optional[Tensor] = None


class LayerDesign:
    """What a design does in one attention layer; every point defaults to nothing.

    A subclass is a frozen dataclass of the values the design resolved from the model's configuration.
    """

    global_only = False  # acts in the global layers of a --layer-pattern only (a pattern without one is refused)

    def attach(self, attention) -> None:
        """Create this design's parameters on ``attention`` (a ``LexSelfAttention`` being built), under the
        state-dict names checkpoints hold."""

    def queries_and_keys(self, attention, q: Tensor, k: Tensor) -> Tuple[Tensor, Tensor]:
        """(q, k) of the new positions before the position scheme: (B, H, T, d) each, their dtype kept."""
        return q, k

    def queries(self, attention, q: Tensor, at: QueryContext) -> Tensor:
        """q (B, H, T, d) times this design's factor, before the position scheme; q's dtype kept."""
        return q

    takes_attention = False  # whether attend replaces the one executor call: at most one design of a model may

    def attend(self, attention, q: Tensor, run: Callable[[Tensor], Tensor]) -> Tensor:
        """The attention's output (B, H, T, d) for queries q (B, H, T, d), ``run(queries)`` being the executor over the
        layer's keys and values (what it returns: (B, H, T, d) in q's dtype); the queries may only change by a factor
        per pair of dimensions (module docstring, point 4)."""
        return run(q)

    retrieves = False  # whether retrieval gives the keys each query sees: at most one design of a model may

    def retrieval(self, attention):
        """The block retrieval (``kernels.BlockRetrieval``) the executor runs this layer's attention under, or None."""
        return None

    def output(self, attention, out: Tensor, x: Tensor) -> Tensor:
        """The attention's output per head ``out`` (B, H, T, d) before the heads are merged and projected, given the
        layer's input ``x`` (B, T, C); out's dtype kept."""
        return out

    decays = False  # whether log_forget gives gates: at most one design of a model may

    def log_forget(self, attention, x: Tensor) -> Optional[Tensor]:
        """(B, H, T) fp32 log forget gates (<= 0) of the new positions from the layer's input ``x`` (B, T, C), or None."""
        return None

    def attach_decoder(self, decoder) -> None:
        """Create this design's parameters on ``decoder`` (a ``DecoderStack`` being built)."""

    def prefix(self, decoder) -> Optional[Tensor]:
        """(C,) a vector placed before every sequence at position 0 (its output dropped), or None."""
        return None

    def drops_positions(self, num_updates: int) -> bool:
        """Whether the layers run without positions after ``num_updates`` training updates."""
        return False

    interleaves = False  # whether interleave places vectors: at most one design of a model may

    def interleave(self, decoder) -> Optional[Tuple[int, Tensor]]:
        """(b, a (C,) vector) the decoder places after every b tokens (their outputs dropped), or None."""
        return None

    sinks = False  # whether sink_logits gives logits: at most one design of a model may

    def sink_logits(self, attention) -> Optional[Tensor]:
        """(H,) logits joining every softmax's denominator with no value, or None."""
        return None


@dataclass(frozen=True)
class DesignSpec:
    """One trained design.

    Attributes:
        name: the design's name (its module's name).
        summary: one line for the docs' table; source: paper, section, equation.
        options: its :class:`DesignOption` s (read with their defaults by ``build``).
        build: config -> the :class:`LayerDesign` of every layer it acts in, or None (off); raises ValueError naming
            the option to change. ``config``: TorchScale's ``DecoderConfig`` with the plugin's fields (or the Hugging
            Face export's namespace), ``tokens_per_sample`` the training length.
        record: fairseq args -> None: write the values it resolved into the args, so the checkpoint records them.
        refuses_logn: why ``--logn`` is refused on a model with this design (None: taken).
        left_padding: why a left-padded batch is refused (its factor counts positions from the first column).
    """

    name: str
    summary: str
    source: str
    options: Tuple[DesignOption, ...]
    build: Callable[[object], Optional[LayerDesign]]
    record: Optional[Callable[[object], None]] = None
    refuses_logn: Optional[str] = None
    left_padding: Optional[str] = None


DESIGNS: Dict[str, DesignSpec] = {}
DESIGN_OPTIONS: Dict[str, DesignOption] = {}  # every registered design's options, by name


def register_design(spec: DesignSpec) -> DesignSpec:
    """Add ``spec`` to :data:`DESIGNS` and its options to :data:`DESIGN_OPTIONS`.

    Raises:
        ValueError: a name registered twice, or an option another design declares.
    """
    if spec.name in DESIGNS:
        raise ValueError(f"design {spec.name!r} is registered twice.")
    for option in spec.options:
        if option.name in DESIGN_OPTIONS:
            raise ValueError(f"{option.flag} is declared by two designs.")
    DESIGNS[spec.name] = spec
    DESIGN_OPTIONS.update((option.name, option) for option in spec.options)
    return spec


def switch_design(name: str, *, summary: str, source: str, help: str, layer: Callable[[object], LayerDesign],
                  **fields) -> DesignSpec:
    """Register a design turned on by one switch, ``--name`` (its one option, named as the design): off, it builds
    nothing; on, ``layer(config)`` builds its :class:`LayerDesign` (raising ValueError for what it refuses).
    ``summary``, ``source``: as :class:`DesignSpec`'s; ``help``: the switch's help; ``fields``: the spec's other fields
    (``refuses_logn``, ``left_padding``, ``record``).

    Raises:
        ValueError: as :func:`register_design`.
    """
    switch = DesignOption(name, bool, False, help)
    return register_design(DesignSpec(name=name, summary=summary, source=source, options=(switch,),
                                      build=lambda config: layer(config) if switch.read(config) else None, **fields))


def unregister_design(name: str) -> DesignSpec:
    """Remove design ``name`` and its options (a plugin's or a test's design).

    Raises:
        KeyError: an unknown name.
    """
    spec = DESIGNS.pop(name)
    for option in spec.options:
        DESIGN_OPTIONS.pop(option.name, None)
    return spec


def build_designs(config) -> Tuple[Tuple[DesignSpec, LayerDesign], ...]:
    """The designs ``config`` turns on, in registration order, each with its layer object.

    Raises:
        ValueError: as a design's ``build``; two designs with sink logits, two that replace the attention call, two
            that choose the keys each query sees, two with forget gates, two that place vectors between the tokens, or a
            forget gate with a block retrieval.
    """
    built = tuple((spec, layer) for spec in DESIGNS.values() for layer in [spec.build(config)] if layer is not None)
    sinks = [spec.name for spec, layer in built if layer.sinks]
    if len(sinks) > 1:
        raise ValueError(f"{' and '.join(sinks)} both add a logit to every softmax's denominator; use one of them.")
    takers = [spec.name for spec, layer in built if layer.takes_attention]
    if len(takers) > 1:
        raise ValueError(f"{' and '.join(takers)} both replace how attention is taken; use one of them.")
    retrievers = [spec.name for spec, layer in built if layer.retrieves]
    if len(retrievers) > 1:
        raise ValueError(f"{' and '.join(retrievers)} both choose the keys each query sees; use one of them.")
    decays = [spec.name for spec, layer in built if layer.decays]
    if len(decays) > 1:
        raise ValueError(f"{' and '.join(decays)} both decay the logits by forget gates; use one of them.")
    placers = [spec.name for spec, layer in built if layer.interleaves]
    if len(placers) > 1:
        raise ValueError(f"{' and '.join(placers)} both place vectors between the tokens; use one of them.")
    if decays and retrievers:
        raise ValueError(f"{decays[0]} and {retrievers[0]}: a forget gate's decay is defined over every key at its true "
                         "position, and a block retrieval chooses the keys each query sees; train with one of them.")
    return built


def design_table() -> str:
    """Markdown: every registered design, its flags and source (the table of docs/architecture.md)."""
    rows = ["| design | flags | what it does | source |", "|---|---|---|---|"]
    for spec in DESIGNS.values():
        flags = ", ".join(f"`{o.flag}`" for o in spec.options)
        rows.append(f"| {spec.name} | {flags} | {spec.summary} | {spec.source} |")
    return "\n".join(rows)

"""The position-scheme protocol and the ``--pos-emb`` registry.

A position scheme tells attention where tokens are. Whatever it is, it acts through at most three hooks,
all with positions given as integers (absolute, or local to a window: only differences matter for the
relative kinds):

* ``rotate(x, start, center, keys, scaling)``: a rotation (and scale) of queries or keys (``rotary``: xPos,
  RoPE); ``rotate_at`` the same at arbitrary positions;
* ``bias(q_start, q_len, k_start, k_len, device)``: an additive (H, Tq, Tk) logit bias (``bias``: ALiBi,
  Sandwich, KERPLE, T5); ``bias_at`` the same between arbitrary positions;
* ``embed(start, length, device)``: a vector added to the token embeddings (``absolute``: sinusoidal,
  learned); ``embed_at`` the same at arbitrary positions.

The attention executor calls the first two for every chunk it runs, the decoder the third; nothing else
in the package asks which scheme it has. A scheme never computes attention scores: it transforms queries
and keys, or gives a bias, at the positions it is asked for; the executor alone multiplies, masks and
normalises (``modules.attention.executor``).

Translation invariance: a scheme whose logits depend on n - m alone (every scheme registered here) is
``translation_invariant``, and the executor may place a window's queries and keys at window-local
positions (one table for every window, bounded xPos scales). A scheme that sets it to False is always
given true positions: the planner then cuts no batched windows, and sinks are placed at their virtual
positions in the true frame. ``POSITION_SCHEMES`` maps each ``--pos-emb`` name to a
:class:`SchemeSpec` (how to build it from the model config, how to validate the config, its kind, one
line of help and its source); the choice list of ``--pos-emb``, the model builder, config validation,
the test parametrisation and the table of docs/positions.md all read it. Adding a scheme is one module with a
``register_position_scheme(SchemeSpec(...))`` call, imported by ``positions/__init__.py``.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from torch import Tensor, nn

from ..model_option import ModelOption
from ..ownership import refuse_foreign

__all__ = [
    "KINDS", "POSITION_SCHEMES", "SCHEME_OPTIONS", "NoPositions", "PositionScheme", "SchemeOption", "SchemeSpec",
    "build_positions", "get_scheme", "register_position_scheme", "scheme_option_values", "scheme_table",
    "unregister_position_scheme", "validate_position_config",
]

KINDS = ("rotary", "bias", "absolute", "none")


class PositionScheme(nn.Module):
    """Base of every position scheme: the three hooks, each a no-op here.

    Class attributes:
        kind: one of ``KINDS``.
        max_positions: the longest sequence the scheme can place (None: any length).
        translation_invariant: its logits depend only on n - m (module docstring).
        center_step: the rounding of the centres of ``rotate`` (``center_near``).
    """

    kind = "none"
    max_positions: Optional[int] = None
    translation_invariant = True
    center_step = 1  # centres are multiples of this (``center_near``)

    def rotate(self, x: Tensor, *, start: int = 0, center: Optional[int] = None, keys: bool = False,
               scaling=None) -> Tensor:
        """Queries (``keys=False``) or keys (``keys=True``) x of shape (..., T, d) at positions
        start .. start + T - 1, transformed; ``center`` is a position shared by the queries and keys that
        will be multiplied together (schemes with a position-dependent scale express it relative to the
        center); ``scaling``: the evaluation's RoPE scaling (rotary schemes only; None: as trained).
        Returns x unchanged here; same shape and dtype."""
        return x

    def center_near(self, position: int) -> int:
        """The centre used for queries and keys around ``position``: the largest multiple of ``center_step``
        <= position (rounded so that consecutive calls share cached tables)."""
        return position // self.center_step * self.center_step

    def rescale_keys(self, old_center: int, new_center: int, device, scaling=None) -> Optional[Tensor]:
        """The (d,) fp32 factor that turns keys rotated at ``old_center`` into keys rotated at
        ``new_center``, or None when keys do not depend on the center (everything but xPos)."""
        return None

    def max_center_offset(self, dtype, scaling=None) -> Optional[int]:
        """How far (in positions) a query or key may lie from the center it is rotated at before its
        scale leaves ``dtype``'s safe range; None when unbounded (no scale)."""
        return None

    def bias(self, q_start: int, q_len: int, k_start: int, k_len: int, device) -> Optional[Tensor]:
        """(H, q_len, k_len) fp32 bias of queries at q_start .. against keys at k_start .., or None."""
        return None

    def embed(self, start: int, length: int, device) -> Optional[Tensor]:
        """(length, C) vectors to add to the token embeddings at positions start .., or None."""
        return None

    def rotate_at(self, x: Tensor, positions: Tensor, *, center: int, keys: bool, scaling=None) -> Tensor:
        """Queries or keys x (..., d) at arbitrary positions: an int64 tensor >= 0 broadcastable to
        ``x.shape[:-1]`` (randomized positions, sink keys at virtual places), transformed as ``rotate`` would
        at those positions with the same ``center``. Returns x unchanged here; x's shape and dtype."""
        return x

    def bias_at(self, query: Tensor, key: Tensor) -> Optional[Tensor]:
        """The fp32 bias of queries at positions ``query`` against keys at positions ``key`` (int64 tensors
        that broadcast to a shape S; pairs with key > query are masked by the caller and may hold any finite
        value): (H, *S), or None for schemes without a bias."""
        return None

    def embed_at(self, positions: Tensor) -> Optional[Tensor]:
        """(B, T, C) vectors for arbitrary positions (B, T) int64: the rows of ``embed`` at them, or None for
        schemes without one (ValueError past a learned table, as ``embed``)."""
        table = self.embed(0, int(positions.max()) + 1, positions.device)
        return None if table is None else table[positions]


class NoPositions(PositionScheme):
    """NoPE: no position information at all (causal masking alone orders the tokens)."""


SchemeOption = ModelOption  # a position scheme's option (``model_option.ModelOption``)


@dataclass(frozen=True)
class SchemeSpec:
    """One ``--pos-emb`` entry.

    Attributes:
        name: the ``--pos-emb`` value.
        kind: ``rotary``, ``bias``, ``absolute`` or ``none``.
        summary: one line for ``--help`` and the table of docs/positions.md.
        source: paper, section, equation.
        build: (config, layer index) -> :class:`PositionScheme`. ``config`` is the TorchScale
            ``DecoderConfig`` with the plugin's fields; see ``lex_lm.build_decoder_config``.
        per_layer: one module per layer (KERPLE's parameters are per layer) instead of one shared.
        validate: config -> None, raising ValueError naming the option to change (the config carries the
            scheme's own options, resolved: ``scheme_option_values``).
        options: the scheme's :class:`SchemeOption` s; an option of another scheme given to this one is
            refused. Two schemes may share an option (xPos and RoPE: ``rope_theta``) if they declare it alike.
    """

    name: str
    kind: str
    summary: str
    source: str
    build: Callable[[object, int], PositionScheme]
    per_layer: bool = False
    validate: Optional[Callable[[object], None]] = None
    options: Tuple[SchemeOption, ...] = ()


POSITION_SCHEMES: Dict[str, SchemeSpec] = {}
SCHEME_OPTIONS: Dict[str, SchemeOption] = {}  # every registered scheme's options, by name


def register_position_scheme(spec: SchemeSpec) -> SchemeSpec:
    """Add ``spec`` to ``POSITION_SCHEMES``.

    Raises:
        ValueError: a name registered twice or an unknown kind.
    """
    if spec.name in POSITION_SCHEMES:
        raise ValueError(f"position scheme {spec.name!r} is registered twice.")
    if spec.kind not in KINDS:
        raise ValueError(f"position scheme kind must be one of {KINDS}, got {spec.kind!r}.")
    for option in spec.options:
        known = SCHEME_OPTIONS.get(option.name)
        if known is not None and known != option:
            raise ValueError(f"{option.flag} is declared differently by two position schemes: {known} and {option}.")
    POSITION_SCHEMES[spec.name] = spec
    SCHEME_OPTIONS.update((option.name, option) for option in spec.options)
    return spec


def unregister_position_scheme(name: str) -> SchemeSpec:
    """Remove ``--pos-emb name`` and the options only it declared (a plugin's or a test's scheme).

    Raises:
        ValueError: an unknown name.
    """
    spec = get_scheme(name)
    del POSITION_SCHEMES[name]
    for option in spec.options:
        if not any(option in other.options for other in POSITION_SCHEMES.values()):
            SCHEME_OPTIONS.pop(option.name, None)
    return spec


def scheme_owners(option: str) -> Tuple[str, ...]:
    """The schemes that declare ``option``."""
    return tuple(s.name for s in POSITION_SCHEMES.values() if any(o.name == option for o in s.options))


def scheme_option_values(pos_emb: str, config) -> Dict[str, Any]:
    """The options of scheme ``pos_emb`` read from ``config`` (any object; a missing or None attribute takes
    the option's default), after refusing every option of another scheme that was given (not None), at any
    value: it would do nothing, and the model would silently not be what was asked for.

    Raises:
        ValueError: an unknown scheme, or a foreign option given, naming the option and both schemes
            (``ownership.refuse_foreign``).
    """
    spec = get_scheme(pos_emb)
    own = {option.name for option in spec.options}
    given = {name: getattr(config, name, None) for name in SCHEME_OPTIONS if name not in own}
    refuse_foreign(given, pos_emb, scheme_owners, lambda owners: "--pos-emb " + " / ".join(owners), f"this model is --pos-emb {pos_emb}")
    values = {}
    for option in spec.options:
        value = getattr(config, option.name, None)
        values[option.name] = option.default if value is None else option.type(value)
    return values


def get_scheme(name: str) -> SchemeSpec:
    """The spec of ``--pos-emb name``.

    Raises:
        ValueError: an unknown name, listing the registered ones.
    """
    try:
        return POSITION_SCHEMES[str(name)]
    except KeyError:
        raise ValueError(f"--pos-emb must be one of {', '.join(POSITION_SCHEMES)}; got {name!r}.") from None


def head_dim(config) -> int:
    """d = C / H of a config (``decoder_embed_dim``, ``decoder_attention_heads``)."""
    return config.decoder_embed_dim // config.decoder_attention_heads


def validate_position_config(config) -> None:
    """Resolve the chosen scheme's options on a model config (``scheme_option_values``: each set on
    ``config``, given or default) and run the scheme's validation.

    Raises:
        ValueError: unknown scheme, an option of another scheme, or options the scheme cannot take.
    """
    spec = get_scheme(config.pos_emb)
    for name, value in scheme_option_values(config.pos_emb, config).items():
        setattr(config, name, value)
    if spec.validate is not None:
        spec.validate(config)


def build_positions(config) -> Tuple[str, nn.ModuleList]:
    """The decoder's position modules: (kind, ModuleList of one shared scheme, or one per layer).

    Raises:
        ValueError: as :func:`validate_position_config`.
    """
    spec = get_scheme(config.pos_emb)
    validate_position_config(config)
    count = config.decoder_layers if spec.per_layer else 1
    return spec.kind, nn.ModuleList(spec.build(config, i) for i in range(count))


def scheme_table() -> str:
    """The Markdown table of registered schemes (name, kind, what it does, its options with their defaults,
    source): docs/positions.md's."""
    lines = ["| `--pos-emb` | kind | what it does | options (default) | source |", "|---|---|---|---|---|"]
    for spec in POSITION_SCHEMES.values():
        options = ", ".join(f"`{o.flag}` ({'off' if o.default is False else o.default if o.default is not None else 'see help'})"
                            for o in spec.options) or "none"
        lines.append(f"| `{spec.name}` | {spec.kind} | {spec.summary} | {options} | {spec.source} |")
    return "\n".join(lines)

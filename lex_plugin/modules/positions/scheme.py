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
the test parametrisation and the README's table all read it. Adding a scheme is one module with a
``register_position_scheme(SchemeSpec(...))`` call, imported by ``positions/__init__.py``.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor, nn

__all__ = [
    "KINDS", "POSITION_SCHEMES", "NoPositions", "PositionScheme", "SchemeSpec", "build_positions", "get_scheme",
    "register_position_scheme", "scheme_table", "validate_position_config",
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

    def rotate(self, x: Tensor, start: int, center: int, keys: bool, scaling=None) -> Tensor:
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

    def rotate_at(self, x: Tensor, positions: Tensor, center: int, keys: bool, scaling=None) -> Tensor:
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


@dataclass(frozen=True)
class SchemeSpec:
    """One ``--pos-emb`` entry.

    Attributes:
        name: the ``--pos-emb`` value.
        kind: ``rotary``, ``bias``, ``absolute`` or ``none``.
        summary: one line for ``--help`` and the README's table.
        source: paper, section, equation.
        build: (config, layer index) -> :class:`PositionScheme`. ``config`` is the TorchScale
            ``DecoderConfig`` with the plugin's fields; see ``lex_lm.build_decoder_config``.
        per_layer: one module per layer (KERPLE's parameters are per layer) instead of one shared.
        validate: config -> None, raising ValueError naming the option to change.
        extrapolates: False when positions past the training length have no representation (learned).
    """

    name: str
    kind: str
    summary: str
    source: str
    build: Callable[[object, int], PositionScheme]
    per_layer: bool = False
    validate: Optional[Callable[[object], None]] = None
    extrapolates: bool = True


POSITION_SCHEMES: Dict[str, SchemeSpec] = {}


def register_position_scheme(spec: SchemeSpec) -> SchemeSpec:
    """Add ``spec`` to ``POSITION_SCHEMES``.

    Raises:
        ValueError: a name registered twice or an unknown kind.
    """
    if spec.name in POSITION_SCHEMES:
        raise ValueError(f"position scheme {spec.name!r} is registered twice.")
    if spec.kind not in KINDS:
        raise ValueError(f"position scheme kind must be one of {KINDS}, got {spec.kind!r}.")
    POSITION_SCHEMES[spec.name] = spec
    return spec


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
    """Run the chosen scheme's validation on a model config (``pos_emb`` and its options).

    Raises:
        ValueError: unknown scheme, or options the scheme cannot take.
    """
    spec = get_scheme(config.pos_emb)
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
    """The Markdown table of registered schemes (name, kind, what it does, source): the README's."""
    lines = ["| `--pos-emb` | kind | what it does | source |", "|---|---|---|---|"]
    for spec in POSITION_SCHEMES.values():
        lines.append(f"| `{spec.name}` | {spec.kind} | {spec.summary} | {spec.source} |")
    return "\n".join(lines)

"""The model's structural options, declared once (:data:`MODEL_FIELDS`).

Each field is a TorchScale ``DecoderConfig`` field (fairseq's ``--arch lex_lm`` option of the same name where it is
one) with its type, default, help and Hugging Face name. From this table come fairseq's ``LexModelOptions``
(``models.lex_lm``), the decoder config a checkpoint is built from (a checkpoint saved before a field existed gets
its default: the upgrade path), the HF ``LexConfig``'s fields (``hf.configuration``) and the export's mapping both
ways (:func:`hf_fields`, :func:`decoder_fields`). The position schemes' options and the trained designs' options are
registries of their own (``positions.SCHEME_OPTIONS``, ``designs.DESIGN_OPTIONS``), owned by a scheme or a design;
:func:`model_options` lists the three together with their owners. The attention flags (a window, a position map)
are not the model's: they are chosen at each evaluation (``attention.flags``).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["MODEL_FIELDS", "ModelField", "decoder_fields", "hf_fields", "model_options"]


@dataclass(frozen=True)
class ModelField:
    """One structural option of the model.

    Attributes:
        name: the ``DecoderConfig`` field and, when ``option``, fairseq's ``--name-with-dashes`` option.
        type: ``int``, ``float``, ``str`` or ``bool`` (a switch, off unless given).
        default: fairseq's default, and the value a checkpoint that predates the field is read with.
        help: the option's help text.
        hf: the ``LexConfig`` field it is exported as, or None: training only (dropout rates, randomized positions),
            not part of an exported model.
        negated: the ``LexConfig`` field is its negation (TorchScale names what is off, transformers what is on).
        option: a fairseq option; False for a field derived from others (``vocab_size`` from the dictionary,
            ``decoder_normalize_before`` from ``--post-ln`` / ``--deepnorm``, ``tokens_per_sample`` from the task).
        choices: the accepted values of a ``str`` option, or None.
        optional: the option's value may be None (not given).
    """

    name: str
    type: type
    default: Any
    help: str
    hf: Optional[str] = None
    negated: bool = False
    option: bool = True
    choices: Optional[Tuple[str, ...]] = None
    optional: bool = False

    @property
    def hf_default(self) -> Any:
        """The ``LexConfig`` field's default (the negation of a negated field's)."""
        return (not self.default) if self.negated else self.default


MODEL_FIELDS: Dict[str, ModelField] = {f.name: f for f in (
    ModelField("pos_emb", str, "xpos", "position scheme, any registered one (see --pos-emb's list)", hf="pos_emb"),
    ModelField("random_positions", int, 0, "randomized positions at training (Ruoss et al. 2023): each sample takes "
               "sorted position ids drawn from [0, L_MAX); evaluation uses ordinary positions; 0: off"),
    ModelField("decoder_embed_dim", int, 512, "model dimension C", hf="hidden_size"),
    ModelField("decoder_ffn_embed_dim", int, 2048, "FFN inner dimension", hf="intermediate_size"),
    ModelField("decoder_layers", int, 6, "number of decoder layers", hf="num_hidden_layers"),
    ModelField("decoder_attention_heads", int, 8, "number of attention heads", hf="num_attention_heads"),
    ModelField("post_ln", bool, False, "post-LN layers (LayerNorm after each residual); default pre-LN"),
    ModelField("decoder_normalize_before", bool, True, "pre-LN layers: not --post-ln, not --deepnorm",
               hf="normalize_before", option=False),
    ModelField("subln", bool, False, "Magneto sub-LayerNorm (TorchScale subln; pre-LN)", hf="subln"),
    ModelField("deepnorm", bool, False, "DeepNet: post-LN with residual scaling (2N)^(1/4)", hf="deepnorm"),
    ModelField("activation_fn", str, "gelu", "FFN activation", hf="hidden_act", choices=("relu", "gelu", "swish")),
    ModelField("dropout", float, 0.1, "dropout probability"),
    ModelField("attention_dropout", float, 0.0, "dropout on attention probabilities"),
    ModelField("activation_dropout", float, 0.0, "dropout after the FFN activation"),
    ModelField("drop_path_rate", float, 0.0, "stochastic depth rate of the last layer"),
    ModelField("layernorm_embedding", bool, False, "LayerNorm after the token embedding", hf="layernorm_embedding"),
    ModelField("no_scale_embedding", bool, False, "do not scale embeddings by sqrt(C)", hf="scale_embedding",
               negated=True),
    ModelField("share_decoder_input_output_embed", bool, False, "tie the input embedding and the output projection",
               hf="tie_word_embeddings"),
    ModelField("layernorm_eps", float, 1e-5, "LayerNorm epsilon", hf="layer_norm_eps"),
    ModelField("layer_pattern", str, None, "each layer's positions and trained window, repeated over the depth: "
               "SCHEME/WINDOW[*N],... with SCHEME the --pos-emb or none, WINDOW full (global), bca, sliding:W or "
               "chunked:C (local, kept at evaluation), e.g. 'rope/sliding:128*5,rope/full' (Gemma) or "
               "'xpos/bca*3,none/full'; the evaluation's attention flags change the global layers only",
               hf="layer_pattern", optional=True),
    ModelField("vocab_size", int, 8192, "V, the dictionary's rows (fairseq's specials included)", hf="vocab_size",
               option=False),
    ModelField("tokens_per_sample", int, None, "the training length l (the task's --tokens-per-sample)",
               hf="training_length", option=False, optional=True),
)}

# the dropout rates an exported (inference) model is built with
INFERENCE_RATES = {f.name: 0.0 for f in MODEL_FIELDS.values() if f.type is float and f.name.endswith(("dropout", "rate"))}


def hf_fields(decoder) -> Dict[str, Any]:
    """``LexConfig`` field -> value, from a decoder config (``build_decoder_config``'s, or any object with the
    fields): every field with an HF name."""
    return {f.hf: (not getattr(decoder, f.name)) if f.negated else getattr(decoder, f.name)
            for f in MODEL_FIELDS.values() if f.hf}


def decoder_fields(config) -> Dict[str, Any]:
    """Decoder config field -> value, from a ``LexConfig`` (or any object with its fields): the inverse of
    :func:`hf_fields`, with the training-only rates at 0 (inference) and randomized positions off."""
    values = {f.name: (not getattr(config, f.hf)) if f.negated else getattr(config, f.hf)
              for f in MODEL_FIELDS.values() if f.hf}
    return {**values, **INFERENCE_RATES, "random_positions": 0}


def model_options() -> List[Tuple[str, str, Any]]:
    """Every option of the model as (name, owner, default): owner ``model`` (:data:`MODEL_FIELDS`), ``scheme:NAME``
    (a position scheme's, ``positions.SCHEME_OPTIONS``) or ``design:NAME`` (a trained design's)."""
    from .designs import DESIGNS  # (the registries: every scheme and design registered)
    from .positions.scheme import POSITION_SCHEMES

    rows = [(f.name, "model", f.default) for f in MODEL_FIELDS.values() if f.option]
    for scheme in POSITION_SCHEMES.values():
        rows += [(o.name, f"scheme:{scheme.name}", o.default) for o in scheme.options]
    for design in DESIGNS.values():
        rows += [(o.name, f"design:{design.name}", o.default) for o in design.options]
    return rows

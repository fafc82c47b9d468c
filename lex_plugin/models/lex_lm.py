"""The ``lex_lm`` fairseq model and its architectures (LeX Transformer language model).

Configuration uses TorchScale's ``DecoderConfig`` vocabulary (``decoder_embed_dim``, ``subln``,
``deepnorm``, ``xpos_scale_base`` ...); the dataclass below is its fairseq face, as in fairseq's
``models/transformer_lm.py``. Boolean options are off unless passed (fairseq turns dataclass booleans
into ``store_true`` flags). Layers are pre-LN (TorchScale's LM default) unless ``--post-ln`` or
``--deepnorm`` (DeepNet is post-LN by definition); ``--subln`` (Magneto) is pre-LN and refuses both.
The position schemes' options are not written here: each scheme declares its own (``SchemeSpec.options``,
with their defaults) and the dataclass is assembled from the registry, so a scheme registered before
this module is imported gets its flags, and an option given to a scheme that does not use it is refused.
"""

import copy
from dataclasses import field, make_dataclass
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqLanguageModel, register_model, register_model_architecture
from fairseq.utils import safe_getattr
from omegaconf import II
from torchscale.architecture.config import DecoderConfig

from ..modules.designs import DESIGN_OPTIONS, DESIGNS, DesignOption
from ..modules.positions import POSITION_SCHEMES, SCHEME_OPTIONS, SchemeOption
from ..modules.layer_pattern import parse_layer_pattern
from ..modules.model_fields import MODEL_FIELDS, ModelField
from ..modules.positions.scheme import get_scheme, scheme_option_values, scheme_owners
from .lex_decoder import LexDecoder, build_embedding



def _model_field(f: ModelField):
    """A fairseq dataclass field of ``f`` (``pos_emb``'s help lists the registered schemes)."""
    kind = ChoiceEnum(list(f.choices)) if f.choices else (Optional[f.type] if f.optional else f.type)
    text = f.help if f.name != "pos_emb" else "position scheme, any registered one: " + "; ".join(
        f"{n} ({spec.summary})" for n, spec in POSITION_SCHEMES.items())
    return f.name, kind, field(default=f.default, metadata={"help": text})


# ``--arch lex_lm``'s options that every position scheme shares (``modules.model_fields.MODEL_FIELDS``: TorchScale
# ``DecoderConfig`` names, ``--pos-emb``, ``--random-positions``), and ``tokens_per_sample``, the training length l
# recorded in the checkpoint for BCA at evaluation. The schemes' own options are added from their registry
# (:data:`LexLanguageModelConfig`).
LexModelOptions = make_dataclass(
    "LexModelOptions",
    [_model_field(f) for f in MODEL_FIELDS.values() if f.option]
    + [("tokens_per_sample", int, field(default=II("task.tokens_per_sample")))],
    bases=(FairseqDataclass,),
)
LexModelOptions.__module__ = __name__


def _scheme_option_field(option: SchemeOption):
    owners = "/".join(scheme_owners(option.name))
    default = "off" if option.default is False else option.default if option.default is not None else "see help"
    return (option.name, Optional[option.type],
            field(default=None, metadata={"help": f"{option.help} (--pos-emb {owners}; default {default})"}))


def _design_option_field(option: DesignOption):
    return (option.name, Optional[option.type] if option.default is None else option.type,
            field(default=option.default, metadata={"help": option.help.replace("%", "%%")}))


# The model's options: the shared ones, every registered scheme's own (None: not given, the scheme's default applies;
# given to another scheme: refused, ``scheme_option_values``) and every registered design's, assembled from the
# two registries.
LexLanguageModelConfig = make_dataclass(
    "LexLanguageModelConfig",
    [_scheme_option_field(o) for o in SCHEME_OPTIONS.values()] + [_design_option_field(o) for o in DESIGN_OPTIONS.values()],
    bases=(LexModelOptions,),
)
LexLanguageModelConfig.__module__ = __name__  # (make_dataclass says "types": pickling would fail)
LexLanguageModelConfig.__doc__ = (
    "``--arch lex_lm`` options: :class:`LexModelOptions` plus each registered position scheme's options "
    "(xPos Eq. 12 and its Table 4 ablations, RoPE's base, Sandwich, T5, the learned table size).")


def build_decoder_config(cfg, vocab_size: int) -> DecoderConfig:
    """TorchScale ``DecoderConfig`` from the fairseq model config (Namespace or DictConfig)."""
    # every structural field as given, its default where the checkpoint predates it (the upgrade path)
    values = {f.name: safe_getattr(cfg, f.name, f.default) for f in MODEL_FIELDS.values() if f.option}
    values.update(pos_emb=str(values["pos_emb"]), activation_fn=str(values["activation_fn"]), vocab_size=vocab_size,
                  decoder_normalize_before=not (values["post_ln"] or values["deepnorm"]),
                  random_positions=values["random_positions"] or 0, layer_pattern=values["layer_pattern"] or None,
                  tokens_per_sample=safe_getattr(cfg, "tokens_per_sample", None))
    config = DecoderConfig(**values)  # (it takes the names it knows, and resolves its layout from them)
    for name, value in values.items():
        if not hasattr(config, name):
            setattr(config, name, value)
    # the position scheme and every registered scheme option as given (None: not given); the decoder's
    # ``build_positions`` resolves the chosen scheme's and refuses the others (``scheme_option_values``)
    for name in SCHEME_OPTIONS:
        setattr(config, name, safe_getattr(cfg, name, None))
    for name, option in DESIGN_OPTIONS.items():  # every design's options, as given (its default where not)
        setattr(config, name, option.read(cfg))
    return config


def _positions_unused(cfg) -> bool:
    """Whether ``--layer-pattern`` makes every layer NoPE (``none/...`` entries alone): the scheme then acts nowhere."""
    pattern = safe_getattr(cfg, "layer_pattern", None)
    if not pattern:
        return False
    kinds = parse_layer_pattern(pattern, str(cfg.pos_emb), None, safe_getattr(cfg, "tokens_per_sample", None))
    return not any(k.positions for k in kinds)


def check_config(cfg) -> None:
    """Reject configurations that cannot build or that contradict themselves, naming the options.

    What the position scheme refuses (``SchemeSpec.validate``: an odd head dimension for rotary schemes,
    an odd ``--sandwich-dim`` ...) is checked once, when the decoder builds its positions.

    Raises:
        ValueError: non-positive sizes, C not divisible by heads, ``--subln`` with ``--deepnorm`` or
            ``--post-ln``, dropout outside [0, 1); an option of the position scheme given at another value than its
            default when ``--layer-pattern`` leaves no layer with positions (it would change nothing; the default
            itself passes, which checkpoints saved before this check record).
    """
    if _positions_unused(cfg):
        given = [o.flag for o in get_scheme(str(cfg.pos_emb)).options
                 if safe_getattr(cfg, o.name, None) is not None and safe_getattr(cfg, o.name, None) != o.default]
        if given:
            raise ValueError(f"--layer-pattern {cfg.layer_pattern}: no layer uses positions, so {', '.join(given)} of "
                             f"--pos-emb {cfg.pos_emb} would change nothing; drop {'it' if len(given) == 1 else 'them'}, "
                             f"or give some layers the scheme ({cfg.pos_emb}/WINDOW entries).")
    limit = safe_getattr(cfg, "random_positions", 0) or 0
    if limit:
        length = safe_getattr(cfg, "tokens_per_sample", None)
        if limit < 0 or (length and limit < length):
            raise ValueError(f"--random-positions L_MAX ({limit}) must be at least --tokens-per-sample ({length}).")
    for name in ("decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}.")
    if cfg.decoder_embed_dim % cfg.decoder_attention_heads != 0:
        raise ValueError(
            f"--decoder-embed-dim ({cfg.decoder_embed_dim}) must be divisible by --decoder-attention-heads "
            f"({cfg.decoder_attention_heads})."
        )
    if cfg.subln and (cfg.deepnorm or cfg.post_ln):
        other = "--deepnorm" if cfg.deepnorm else "--post-ln"
        raise ValueError(f"--subln (Magneto, pre-LN) and {other} (post-LN) exclude each other: choose one.")
    for name in ("dropout", "attention_dropout", "activation_dropout", "drop_path_rate"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(cfg, name)}.")


@register_model("lex_lm", dataclass=LexLanguageModelConfig)
class LexLanguageModel(FairseqLanguageModel):
    """LeX Transformer language model (Sun et al., ACL 2023): a pre-LN decoder with xPos attention."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """Removed in 0.2 (deprecated in 0.1): load with ``lex_plugin.from_pretrained`` (same arguments, same hub).

        Raises:
            TypeError: always. fairseq's inherited ``from_pretrained`` would otherwise take this name's place and
                silently drop the attention keywords (``window``, ``sink_tokens``...).
        """
        raise TypeError("LexLanguageModel.from_pretrained was removed in lex_plugin 0.2: call "
                        "lex_plugin.from_pretrained(...) with the same arguments (it returns the same hub).")

    def under(self, spec) -> "LexLanguageModel":
        """This model with ``spec`` (an ``AttentionSpec``: window, RoPE scaling) as the default of every call that
        passes none (fairseq's scorer and generator): a view sharing every weight (``LexDecoder.under``).

        Raises:
            TypeError, ValueError: a spec the position scheme cannot take.
        """
        view = copy.copy(self)
        object.__setattr__(view, "_modules", {**self._modules, "decoder": self.decoder.under(spec)})
        return view

    def with_autocast(self, dtype) -> "LexLanguageModel":
        """This model running every forward under ``torch.autocast(dtype)`` (bf16) with its fp32 weights: a view
        sharing every weight (``LexDecoder.with_autocast``; None: no autocast).

        Raises:
            ValueError: a dtype autocast is not offered in.
        """
        view = copy.copy(self)
        object.__setattr__(view, "_modules", {**self._modules, "decoder": self.decoder.with_autocast(dtype)})
        return view

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's loader, after checking that the checkpoint was trained with this model's dictionary.

        Raises:
            ValueError: the checkpoint's ``decoder.dictionary_digest`` differs from the data-bin's
                dictionary (token ids would mean other words: silent garbage otherwise).
        """
        saved = state_dict.get("decoder.dictionary_digest")
        mine = self.decoder.dictionary_digest
        if saved is not None and not torch.equal(saved.to(mine.device), mine):
            raise ValueError(
                f"this checkpoint was trained with another dictionary than the data-bin's dict.txt "
                f"({len(self.decoder.dictionary)} symbols here; digests {bytes(saved.tolist()).hex()[:12]} vs "
                f"{bytes(mine.tolist()).hex()[:12]}): its token ids would index other words. Use the data-bin it "
                "was trained on, or prepare the new corpus with that data-bin's spm.model and dict.txt."
            )
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's hook: apply the preset defaults, validate (:func:`check_config`, ValueError), build
        the decoder, and remember the training length as ``model.training_length`` (int or None).

        Raises:
            ValueError: a bad configuration; under ``fairseq-hydra-train``, a preset name as ``model._name``
                (fairseq fills the lex_lm defaults in before any preset could apply, so the model would
                silently be another size).
        """
        _refuse_hydra_preset(args)
        lex_lm_architecture(args)
        check_config(args)
        if not _positions_unused(args):  # a pattern without positions records none: none was given, none applies
            for name, value in scheme_option_values(str(args.pos_emb), args).items():
                setattr(args, name, value)  # the checkpoint records the values the scheme was built with
        for design in DESIGNS.values():  # the values a design resolved, recorded in the checkpoint
            if design.record is not None:
                design.record(args)
        config = build_decoder_config(args, len(task.target_dictionary))
        embed_tokens = build_embedding(task.source_dictionary, args.decoder_embed_dim)
        if args.share_decoder_input_output_embed and task.source_dictionary != task.target_dictionary:
            raise ValueError("--share-decoder-input-output-embed needs the same input and output dictionary.")
        model = cls(LexDecoder(config, task.target_dictionary, embed_tokens))
        length = safe_getattr(args, "tokens_per_sample", None)
        # The training length l (tokens per sample at training time), or None if the config lacks it.
        model.training_length: Optional[int] = int(length) if length is not None else None
        return model


def _refuse_hydra_preset(args) -> None:
    name = safe_getattr(args, "_name", None)
    if name in PRESETS and name != "lex_lm":
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():  # fairseq-hydra-train; fairseq-train applies --arch presets itself
            raise ValueError(
                f"model._name: {name} does not apply the {name} preset under fairseq-hydra-train (fairseq merges "
                "lex_lm's defaults first, which would silently give a C = 512, 6-layer model). Use model._name: lex_lm "
                f"with the sizes, e.g. the config group examples/lex_lm/config/model/{name}.yaml (model={name})."
            )


def _set(args, name, value):
    setattr(args, name, safe_getattr(args, name, value))


def lex_lm_architecture(args):
    """Defaults shared by every preset (the dataclass's); explicit command-line values win."""
    for name, dc_field in LexLanguageModelConfig.__dataclass_fields__.items():
        if name != "tokens_per_sample":
            _set(args, name, dc_field.default)


def _preset(name, layers, dim, heads, ffn, dropout):
    @register_model_architecture("lex_lm", name)
    def arch(args):
        _set(args, "decoder_layers", layers)
        _set(args, "decoder_embed_dim", dim)
        _set(args, "decoder_attention_heads", heads)
        _set(args, "decoder_ffn_embed_dim", ffn)
        _set(args, "dropout", dropout)
        lex_lm_architecture(args)

    arch.__name__ = name
    arch.__doc__ = f"{name}: {layers} layers, C={dim}, {heads} heads, FFN {ffn}, dropout {dropout}."
    PRESETS[name] = dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_attention_heads=heads,
                         decoder_ffn_embed_dim=ffn, dropout=dropout)
    return arch


PRESETS = {}  # preset name -> its sizes (the hydra config group examples/lex_lm/config/model/ mirrors them)


lex_lm_tiny = _preset("lex_lm_tiny", 4, 256, 4, 1024, 0.1)  # CPU-sized: tests and the demo
lex_lm_small = _preset("lex_lm_small", 6, 512, 8, 2048, 0.1)
lex_lm_base = _preset("lex_lm_base", 12, 768, 12, 3072, 0.1)
lex_lm_medium = _preset("lex_lm_medium", 24, 1024, 16, 4096, 0.1)  # the LeX paper's Table 7 model
lex_lm_large = _preset("lex_lm_large", 24, 1536, 16, 6144, 0.1)

"""``LexConfig``: a lex_lm checkpoint's model, position scheme and attention options as a Hugging Face config.

The model's fields are those of ``modules.model_fields.MODEL_FIELDS`` under their Hugging Face names (the standard
``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``, ``hidden_act``,
``layer_norm_eps``, ``tie_word_embeddings``; the plugin's own where there is none: ``pos_emb``, ``training_length``,
the layer layout), with the same defaults; then every design's options (``DESIGN_OPTIONS``), the scheme's options
under ``position_options``, ``attention`` (the ``AttentionOptions`` fields of the default attention spec, e.g.
``{"mode": "bca"}``) and the special token ids.
"""

from types import SimpleNamespace
from typing import Any, Dict, Optional

from transformers import PretrainedConfig

from ..modules.designs import DESIGN_OPTIONS
from ..modules.model_fields import MODEL_FIELDS, decoder_fields

__all__ = ["LexConfig", "MODEL_TYPE"]

MODEL_TYPE = "lex_lm"


class LexConfig(PretrainedConfig):
    """Configuration of :class:`~lex_plugin.hf.modeling.LexForCausalLM`.

    Args:
        position_options: the ``--pos-emb`` scheme's options, resolved (name -> value).
        attention: the default attention spec's ``AttentionOptions`` fields (name -> value; ``{}``: full
            attention as trained).
        **kwargs: the model's fields under their HF names (``modules.model_fields.MODEL_FIELDS``: ``vocab_size``
            V, the rows of fairseq's dictionary; ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
            ``intermediate_size``; ``hidden_act``; ``layer_norm_eps``; ``pos_emb``; ``training_length`` l; the
            layout ``normalize_before``, ``deepnorm``, ``subln``, ``layernorm_embedding``, ``scale_embedding``;
            ``layer_pattern``; ``tie_word_embeddings``; missing: the table's default), every registered design's
            options under their own names (``modules.designs.DESIGN_OPTIONS``; missing: the design's default), then
            transformers' own.
        dictionary_digest: hex MD5 of the vocabulary's symbols (``modules.decoder.symbols_digest``), or None.
        use_cache: ``forward`` returns a :class:`~lex_plugin.hf.modeling.LexCache` unless told otherwise.
        max_position_embeddings: the length tools feed at once (lm-eval's rolling window, a serving engine's
            context); not a limit of the model, which runs at any length (a learned table's size excepted).

    Raises (when the model is built from it, :class:`~lex_plugin.hf.modeling.LexForCausalLM`):
        ValueError: an unknown scheme or attention option.
    """

    model_type = MODEL_TYPE

    def __init__(
        self,
        position_options: Optional[Dict[str, Any]] = None,
        attention: Optional[Dict[str, Any]] = None,
        dictionary_digest: Optional[str] = None,
        use_cache: bool = True,
        max_position_embeddings: Optional[int] = None,
        bos_token_id: int = 2,
        pad_token_id: int = 1,
        eos_token_id: int = 2,
        **kwargs,
    ):
        for f in MODEL_FIELDS.values():  # the model's fields, by their HF names (the table's defaults)
            if f.hf and f.hf != "tie_word_embeddings":  # (transformers' own field: PretrainedConfig sets it)
                setattr(self, f.hf, kwargs.pop(f.hf, f.hf_default))
        tie_word_embeddings = kwargs.pop("tie_word_embeddings", MODEL_FIELDS["share_decoder_input_output_embed"].default)
        self.position_options = dict(position_options or {})
        self.attention = dict(attention or {})
        window = self.attention.get("sliding_window")
        if isinstance(window, str) and window.isdigit():
            self.attention["sliding_window"] = int(window)  # W as a number ("l" stays a word)
        self.max_position_embeddings = max_position_embeddings
        for name, option in DESIGN_OPTIONS.items():
            setattr(self, name, kwargs.pop(name, option.default))
        self.dictionary_digest = dictionary_digest
        self.use_cache = use_cache
        super().__init__(bos_token_id=bos_token_id, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    def decoder_config(self) -> SimpleNamespace:
        """The fields of TorchScale's ``DecoderConfig`` (plus ``pos_emb``, its options, ``tokens_per_sample``) the
        decoder stack is built from, as ``lex_lm.build_decoder_config`` gives them to fairseq's model (layout
        already resolved: ``normalize_before``, ``deepnorm`` and ``subln`` as trained); dropout 0 (inference).
        A plain namespace: the export runs without TorchScale."""
        from ..modules.positions import SCHEME_OPTIONS  # (the package: every scheme registered)

        config = SimpleNamespace(**decoder_fields(self), **{name: getattr(self, name) for name in DESIGN_OPTIONS})
        for name in SCHEME_OPTIONS:
            setattr(config, name, self.position_options.get(name))
        return config

"""``LexConfig``: a lex_lm checkpoint's model, position scheme and attention options as a Hugging Face config.

The standard names (``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``intermediate_size``, ``hidden_act``, ``layer_norm_eps``, ``tie_word_embeddings``, the special token ids)
are mapped from TorchScale's ``DecoderConfig``; what has no standard name keeps the plugin's (``pos_emb`` and
its scheme's options under ``position_options``, ``training_length``, ``attention``: the ``AttentionOptions``
fields of the default attention spec, e.g. ``{"mode": "bca"}``).
"""

from types import SimpleNamespace
from typing import Any, Dict, Optional

from transformers import PretrainedConfig

from ..modules.designs import DESIGN_OPTIONS

__all__ = ["HF_NAMES", "LexConfig", "MODEL_TYPE", "NEGATED_HF_NAMES"]

MODEL_TYPE = "lex_lm"

# The one name table: TorchScale ``DecoderConfig`` field (fairseq's ``--arch lex_lm`` options use the same names)
# -> ``LexConfig`` field, read both ways (``hf_config`` on export, ``LexConfig.decoder_config`` on load).
HF_NAMES = {
    "vocab_size": "vocab_size",
    "decoder_embed_dim": "hidden_size",
    "decoder_layers": "num_hidden_layers",
    "decoder_attention_heads": "num_attention_heads",
    "decoder_ffn_embed_dim": "intermediate_size",
    "activation_fn": "hidden_act",
    "layernorm_eps": "layer_norm_eps",
    "pos_emb": "pos_emb",
    "decoder_normalize_before": "normalize_before",
    "deepnorm": "deepnorm",
    "subln": "subln",
    "layernorm_embedding": "layernorm_embedding",
    "layer_pattern": "layer_pattern",
    "share_decoder_input_output_embed": "tie_word_embeddings",
    "tokens_per_sample": "training_length",
}
# the same for the fields whose meaning is inverted: TorchScale says what is off, transformers what is on
NEGATED_HF_NAMES = {"no_scale_embedding": "scale_embedding"}


class LexConfig(PretrainedConfig):
    """Configuration of :class:`~lex_plugin.hf.modeling.LexForCausalLM`.

    Args:
        vocab_size: V, the rows of fairseq's dictionary (``dict.txt`` plus the 4 specials, padding included).
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: C, layers, heads, FFN width.
        hidden_act: ``gelu``, ``relu`` or ``swish`` (TorchScale's ``activation_fn``).
        layer_norm_eps: LayerNorm epsilon.
        pos_emb: the ``--pos-emb`` scheme; ``position_options``: its options, resolved (name -> value).
        training_length: l, the tokens per sample the model was trained on (BCA's blocks, log-n, auto scalings).
        attention: the default attention spec's ``AttentionOptions`` fields (name -> value; ``{}``: full
            attention as trained).
        normalize_before, deepnorm, subln, layernorm_embedding, scale_embedding: the layer layout.
        layer_pattern: each layer's positions and trained window (``--layer-pattern``; None: every layer global).
        **kwargs: every registered design's options under their own names (``modules.designs.DESIGN_OPTIONS``:
            ``qk_norm``, ``ssmax``, ``learned_sinks``, ``sink_token`` ...; missing: the design's default),
            then transformers' own.
        tie_word_embeddings: the output projection is the token embedding.
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
        vocab_size: int = 8192,
        hidden_size: int = 256,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        intermediate_size: int = 1024,
        hidden_act: str = "gelu",
        layer_norm_eps: float = 1e-5,
        pos_emb: str = "xpos",
        position_options: Optional[Dict[str, Any]] = None,
        training_length: Optional[int] = None,
        attention: Optional[Dict[str, Any]] = None,
        normalize_before: bool = True,
        deepnorm: bool = False,
        subln: bool = False,
        layernorm_embedding: bool = False,
        layer_pattern: Optional[str] = None,
        scale_embedding: bool = True,
        tie_word_embeddings: bool = False,
        dictionary_digest: Optional[str] = None,
        use_cache: bool = True,
        max_position_embeddings: Optional[int] = None,
        bos_token_id: int = 2,
        pad_token_id: int = 1,
        eos_token_id: int = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.pos_emb = pos_emb
        self.position_options = dict(position_options or {})
        self.training_length = training_length
        self.attention = dict(attention or {})
        window = self.attention.get("sliding_window")
        if isinstance(window, str) and window.isdigit():
            self.attention["sliding_window"] = int(window)  # W as a number ("l" stays a word)
        self.max_position_embeddings = max_position_embeddings
        self.normalize_before = normalize_before
        self.deepnorm = deepnorm
        self.subln = subln
        self.layernorm_embedding = layernorm_embedding
        self.layer_pattern = layer_pattern
        for name, option in DESIGN_OPTIONS.items():
            setattr(self, name, kwargs.pop(name, option.default))
        self.scale_embedding = scale_embedding
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

        config = SimpleNamespace(
            **{name: getattr(self, hf) for name, hf in HF_NAMES.items()},
            **{name: not getattr(self, hf) for name, hf in NEGATED_HF_NAMES.items()},
            **{name: getattr(self, name) for name in DESIGN_OPTIONS},
            dropout=0.0, drop_path_rate=0.0, attention_dropout=0.0, activation_dropout=0.0, random_positions=0,
        )
        for name in SCHEME_OPTIONS:
            setattr(config, name, self.position_options.get(name))
        return config

"""``LexForCausalLM``: a lex_lm checkpoint as a Hugging Face causal LM, running the package's own attention core.

The decoder is :class:`~lex_plugin.modules.decoder.DecoderStack` (the very module fairseq's ``LexDecoder``
runs: same state-dict names, same planner, executor and key/value cache), so under the same attention spec
the logits equal the fairseq model's. ``generate()`` goes through transformers' cache API with
:class:`LexCache`: the package's per-layer ``KeyValueCache`` behind the ``Cache`` interface, which under BCA
or a sliding window holds at most l or W positions however long the generation runs.

The default attention spec is the config's ``attention`` (``AttentionOptions`` fields: ``{"mode": "bca"}``,
``{"mode": "sliding", "sliding_window": "l"}``, a position map, a RoPE scaling, ``logn``); ``forward(spec=)``
takes another per call, as the fairseq decoder does.
"""

import os
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from ..modules.attention.self_attention import IncrementalState
from ..modules.attention.spec import AttentionOptions, AttentionSpec
from ..modules.decoder import DecoderStack
from ..modules.padding import check_left_padding
from ..modules.positions import POSITION_SCHEMES, SCHEME_OPTIONS
from .configuration import LexConfig

__all__ = ["LexCache", "LexCore", "LexForCausalLM", "LexModel", "LexPreTrainedModel", "attention_spec"]

logger = logging.get_logger(__name__)

# transformers 5 names the cache ``cache`` (forward's argument, the outputs' field, generate's model kwargs) where
# 4.x says ``past_key_values``; the model takes either and answers in the installed version's name
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
# transformers 5: {tied weight: its source}; 4.x: the tied weights
TIED_WEIGHTS = ({"decoder.output_projection.weight": "decoder.embed_tokens.weight"} if CACHE_FIELD == "cache"
                else ["decoder.output_projection.weight"])


def attention_spec(config: LexConfig) -> AttentionSpec:
    """The default attention spec of ``config`` (``AttentionOptions(**config.attention)`` at its training length;
    a relative ``rope_scaling_file`` is taken inside the model directory, which must be local).

    Raises:
        ValueError: an unknown attention option, a relative ``rope_scaling_file`` without a local model directory, or options ``AttentionOptions.spec`` refuses (a mode needing l
            when the config has none, ``rope_scaling_factor: auto``, which needs an evaluation length...).
    """
    fields = set(AttentionOptions.__dataclass_fields__)
    unknown = sorted(set(config.attention) - fields)
    if unknown:
        raise ValueError(f"config.json attention has unknown option(s) {unknown}; known: {', '.join(sorted(fields))}.")
    options = dict(config.attention)
    file = options.get("rope_scaling_file")
    if file and not Path(file).is_absolute():
        if not (config.name_or_path and Path(config.name_or_path).is_dir()):
            raise ValueError(f"config.json attention.rope_scaling_file {file!r} is relative to the model directory, "
                             f"which is known only when the model loads from a local directory (name_or_path "
                             f"{config.name_or_path!r}): download the repository and load it from its path.")
        options["rope_scaling_file"] = str(Path(config.name_or_path) / file)
    if options.get("rope_scaling_factor") == "auto":
        raise ValueError("config.json attention.rope_scaling_factor is 'auto', which depends on each evaluation's length; "
                         "give the factor s as a number.")
    return AttentionOptions(**options).spec(config.training_length)


class LexCore(DecoderStack, nn.Module):
    """The decoder stack built from a :class:`LexConfig` (state-dict names as fairseq's ``decoder.*``).

    Raises:
        ValueError: an unknown ``pos_emb``, a ``position_options`` name no scheme has, options the scheme
            refuses, or an attention spec it cannot take.
    """

    def __init__(self, config: LexConfig):
        nn.Module.__init__(self)
        if config.pos_emb not in POSITION_SCHEMES:
            raise ValueError(f"config.json pos_emb {config.pos_emb!r} is not a registered position scheme; this lex_plugin "
                             f"knows {', '.join(POSITION_SCHEMES)}. Re-export the checkpoint, or install the plugin "
                             "that registers the scheme.")
        unknown = sorted(set(config.position_options) - set(SCHEME_OPTIONS))
        if unknown:
            raise ValueError(f"config.json position_options has unknown option(s) {unknown}; the registered schemes' "
                             f"options are {', '.join(sorted(SCHEME_OPTIONS))}.")
        embed = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.build_stack(config.decoder_config(), embed, config.vocab_size, attention_spec(config))

    # transformers' switch: ``gradient_checkpointing_enable()`` sets it and ``_gradient_checkpointing_func``
    gradient_checkpointing = False

    @property
    def checkpointing(self) -> bool:
        """Whether this pass recomputes each layer in the backward pass: gradient checkpointing on, training,
        gradients enabled."""
        return self.gradient_checkpointing and self.training and torch.is_grad_enabled()

    def run_layer(self, layer: nn.Module, x: Tensor, *args) -> Tensor:
        """One layer; under gradient checkpointing (:attr:`checkpointing`) its activations are recomputed in the
        backward pass instead of kept (``torch.utils.checkpoint`` through transformers' function)."""
        if self.checkpointing:
            return self._gradient_checkpointing_func(layer.__call__, x, *args)
        return layer(x, *args)


class LexCache(Cache):
    """transformers' ``Cache`` over the package's key/value caches (one ``KeyValueCache`` per layer, keys stored
    rotated at the cache's centre: ``modules.attention.kv_cache``).

    Under BCA the caches keep the last l positions at most, under a sliding window W (plus the sink tokens),
    under full attention every position: :meth:`held_positions` says how many. Beam search reorders them
    (:meth:`reorder_cache`); cropping (assisted generation, contrastive search) is refused, as the legacy tuple
    view (the stored keys are rotated, not the raw projections).

    Attributes:
        state: the incremental state the layers read and write (layer key -> ``KeyValueCache``).
    """

    def __init__(self):
        super().__init__(layers=[])
        self.state: IncrementalState = {}
        # the tokens among the positions the layers ran, set by the model: its sink token and landmarks not counted
        self.tokens_in = lambda positions: positions

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens processed so far (what the next token's index is; the model's sink token and landmarks not counted)."""
        return self.tokens_in(max((cache.end for cache in self.state.values()), default=0))

    def held_positions(self) -> int:
        """Key positions held now by the largest layer cache (window and sinks)."""
        return max((cache.length + cache.sink_length for cache in self.state.values()), default=0)

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        """transformers' cache API: -1, no fixed size (the cache grows as needed; a bounded window trims it)."""
        return -1  # grows as needed; a bounded window trims it (held_positions)

    def reset(self):
        """Drop every layer's keys and values (an empty cache, as a fresh one)."""
        self.state.clear()

    def reorder_cache(self, beam_idx: torch.LongTensor):
        """Select batch rows ``beam_idx`` of every layer's cache (beam search)."""
        for cache in self.state.values():
            cache.reorder(beam_idx)

    def batch_select_indices(self, indices: Tensor):
        """Keep batch rows ``indices`` (1-D int64) of every layer's cache (transformers' name for :meth:`reorder_cache`)."""
        self.reorder_cache(indices)

    def _refuse(self, what: str):
        raise NotImplementedError(f"LexCache does not support {what} (assisted generation, contrastive search); use "
                                  "greedy, sampling or beam search.")

    def crop(self, max_length: int):
        """Refused (NotImplementedError): assisted generation's rollback has no meaning for a windowed cache here."""
        self._refuse("cropping")

    def batch_repeat_interleave(self, repeats: int):
        """Refused (NotImplementedError): contrastive search's row repetition is not supported."""
        self._refuse("repeat-interleaving")

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return bool(self.state)

    def __len__(self) -> int:
        return len(self.state)

    def __getitem__(self, layer_idx: int):
        self._refuse("the legacy (key, value) view")

    def __iter__(self):
        self._refuse("the legacy (key, value) view")

    def __repr__(self) -> str:
        return f"LexCache(positions={self.get_seq_length()}, held={self.held_positions()}, layers={len(self.state)})"


class LexPreTrainedModel(PreTrainedModel):
    """What :class:`LexModel` and :class:`LexForCausalLM` share: the config class, the weights' names
    (``decoder.*``, fairseq's), gradient checkpointing over the layers."""

    config_class = LexConfig
    base_model_prefix = "decoder"
    _no_split_modules = ["LexDecoderLayer"]
    _tied_weights_keys = TIED_WEIGHTS  # (both hold the output projection: the weights' names are fairseq's)
    supports_gradient_checkpointing = True

    def __init__(self, config: LexConfig):
        super().__init__(config)
        self.decoder = LexCore(config)
        self.post_init()

    def _init_weights(self, module):
        pass  # every module initialises itself as fairseq's does; from_pretrained then loads the weights

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, then the weight files made readable as the other files are
        (safetensors writes them mode 0600 whatever the umask): the mode of the config.json written beside them."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        mode = (Path(save_directory) / "config.json").stat().st_mode & 0o777  # (written under the umask)
        for path in Path(save_directory).glob("*.safetensors*"):
            os.chmod(path, mode)
        return out

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.decoder.embed_tokens = value

    @property
    def spec(self) -> AttentionSpec:
        """The default attention spec (the config's ``attention``)."""
        return self.decoder.spec

    def _features(self, input_ids, attention_mask, past_key_values, use_cache, position_ids, output_attentions,
                  inputs_embeds, spec):
        """(features (B, T, C), [embedding output, each layer's output], cache or None): the checks and the
        run shared by both heads (arguments as in :meth:`LexForCausalLM.forward`)."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError(f"{type(self).__name__} takes input_ids (fairseq dictionary ids), not inputs_embeds.")
        if output_attentions:
            raise ValueError("output_attentions is not offered: under BCA, windows and position maps attention runs in "
                             "chunks whose (T, S) weights are never formed. The package's analysis tools read each "
                             "chunk's logits through the attention executor's observer (lex receptive-field).")
        if past_key_values is not None and not isinstance(past_key_values, LexCache):
            raise TypeError(f"past_key_values must be a LexCache (or None), got {type(past_key_values).__name__}: the "
                            "layers keep the package's own key/value cache.")
        if self.decoder.checkpointing:
            if past_key_values is not None:
                raise ValueError("gradient checkpointing recomputes each layer in the backward pass, which would write "
                                 "the cache twice: train without past_key_values.")
            if use_cache:
                logger.warning_once("use_cache=True is incompatible with gradient checkpointing: no cache is returned.")
            use_cache = False
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = past_key_values if past_key_values is not None else (LexCache() if use_cache else None)
        if cache is not None:
            cache.tokens_in = self.decoder.tokens_in  # the model's, whoever made the cache
        past = 0 if cache is None else cache.get_seq_length()
        if position_ids is not None:
            expected = torch.arange(past, past + input_ids.size(1), device=input_ids.device).expand_as(input_ids)
            if position_ids.shape[-1] != input_ids.size(1) or not torch.equal(position_ids.expand_as(input_ids), expected):
                raise ValueError(f"position_ids must be the positions the model counts itself ({past} .. "
                                 f"{past + input_ids.size(1) - 1} after {past} cached ones): the position scheme, the "
                                 "window's blocks and the cache count positions from the first token. Leave them out.")
        padding = None
        if attention_mask is not None:
            if attention_mask.size(1) < input_ids.size(1):
                raise ValueError(f"attention_mask covers {attention_mask.size(1)} positions, fewer than the "
                                 f"{input_ids.size(1)} input ids.")
            padding = attention_mask[:, -input_ids.size(1):].eq(0)
            check_left_padding(self.decoder, attention_mask.ne(0), self.spec if spec is None else spec)
        state = None if cache is None else cache.state
        features, inner_states = self.decoder.stack_features(input_ids, state, spec, padding_mask=padding, prefix=False)
        return features, inner_states, cache


class LexModel(LexPreTrainedModel):
    """The lex_lm decoder without its output projection: ``AutoModel.from_pretrained(DIR, trust_remote_code=True)``
    returns the final hidden states (after the last LayerNorm of a pre-LN model). Arguments as
    :meth:`LexForCausalLM.forward`, without ``labels`` and ``logits_to_keep``.

    Returns:
        ``BaseModelOutputWithPast``: ``last_hidden_state`` (B, T, C), ``past_key_values``, ``hidden_states``
        (the embedding output and every layer's output, with ``output_hidden_states``); a tuple of those that
        are not None with ``return_dict=False``.
    """

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[Tensor] = None,
                past_key_values: Optional["LexCache"] = None, use_cache: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                position_ids: Optional[torch.LongTensor] = None, output_attentions: Optional[bool] = None,
                inputs_embeds: Optional[Tensor] = None, spec: Optional[AttentionSpec] = None,
                cache: Optional["LexCache"] = None, **unknown):
        """Final hidden states of ``input_ids`` (class docstring).

        Raises:
            TypeError: a keyword this model does not take (``labels`` and ``logits_to_keep`` are
                :class:`LexForCausalLM`'s, whose head gives logits), rather than ignoring it.
            ValueError: as :meth:`LexForCausalLM.forward`.
        """
        _refuse_unknown(unknown, "LexModel (hidden states; labels and logits_to_keep are LexForCausalLM's)")
        features, inner_states, cache = self._features(input_ids, attention_mask, _one_cache(past_key_values, cache),
                                                       use_cache, position_ids, output_attentions, inputs_embeds, spec)
        hidden = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        out = BaseModelOutputWithPast(last_hidden_state=features, hidden_states=tuple(inner_states) if hidden else None,
                                      **{CACHE_FIELD: cache})
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()


class LexForCausalLM(LexPreTrainedModel, GenerationMixin):
    """A lex_lm language model for transformers: ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``
    on a directory written by ``lex export-hf``.

    Args:
        config: :class:`LexConfig`.

    Raises:
        ValueError: as :class:`LexCore`.
    """

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder.output_projection

    def set_output_embeddings(self, value: nn.Linear):
        self.decoder.output_projection = value

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate() gets a LexCache from the first forward, never a DynamicCache

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[Tensor] = None,
        past_key_values: Optional[LexCache] = None,
        use_cache: Optional[bool] = None,
        labels: Optional[torch.LongTensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        position_ids: Optional[torch.LongTensor] = None,
        output_attentions: Optional[bool] = None,
        inputs_embeds: Optional[Tensor] = None,
        logits_to_keep: int = 0,
        spec: Optional[AttentionSpec] = None,
        cache: Optional[LexCache] = None,
        **unknown,
    ):
        """Next-token logits of ``input_ids``.

        Args:
            input_ids: (B, T) int64 fairseq dictionary ids: the new positions (after ``past_key_values``' ones).
            attention_mask: (B, past + T) or (B, T), 1 at real tokens, 0 at padding; None: every token is real. Only
                the last T columns are read as padding (the cache keeps the padding of earlier positions). Left
                padding (batched ``generate()``) only where it cannot change the output (``padding.left_padding_refusal``).
            past_key_values: a :class:`LexCache` from an earlier call, or None (``cache`` in transformers 5: either
                name is taken).
            use_cache: return a :class:`LexCache` holding these positions (default ``config.use_cache``; off
                while training under gradient checkpointing).
            labels: (B, T) targets (-100: ignored); the loss is the mean cross-entropy of logits[:, :-1]
                against labels[:, 1:] (nats), as transformers' causal LMs.
            output_hidden_states: also return the embedding output and every layer's output.
            return_dict: False: a tuple of the output's fields that are not None (loss first when given).
            position_ids: accepted only as the positions the model counts itself (past .. past + T - 1 in every
                row); any other value is refused (the scheme, the window and the cache count from the first token).
            output_attentions: refused when True (no (T, S) weights are formed).
            logits_to_keep: > 0: logits of the last that many positions only (``generate()`` asks for 1: a long
                prompt's (T, V) logits are never formed); 0: every position.
            spec: the attention spec of this call (default :attr:`spec`).

        Returns:
            ``CausalLMOutputWithPast``: ``logits`` (B, T, V) in the weights' dtype, ``past_key_values``,
            ``loss``, ``hidden_states``; a tuple with ``return_dict=False``.

        Raises:
            ValueError: ``inputs_embeds`` (token ids only), ``output_attentions``, ``position_ids`` other than the
                model's own, an attention mask shorter than ``input_ids``, left padding under a spec it would
                change, ``labels`` with ``logits_to_keep``, a cache under gradient checkpointing.
            TypeError: ``past_key_values`` that is not a :class:`LexCache`; a keyword this model does not take
                (a misspelt one is refused rather than ignored).
        """
        _refuse_unknown(unknown, "LexForCausalLM")
        if labels is not None and logits_to_keep:
            raise ValueError("labels score every position: call without logits_to_keep.")
        features, inner_states, cache = self._features(input_ids, attention_mask, _one_cache(past_key_values, cache),
                                                       use_cache, position_ids, output_attentions, inputs_embeds, spec)
        logits = self.decoder.output_layer(features[:, -logits_to_keep:] if logits_to_keep else features)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        hidden = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=tuple(inner_states) if hidden else None,
                                     **{CACHE_FIELD: cache})
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values: Optional[LexCache] = None,
                                      attention_mask: Optional[Tensor] = None, use_cache: Optional[bool] = None,
                                      logits_to_keep: int = 0, cache: Optional[LexCache] = None, **unused) -> dict:
        """The positions not yet in the cache (all of the prompt at the first step, then one token)."""
        cache = _one_cache(past_key_values, cache)
        past = 0 if cache is None else cache.get_seq_length()
        return {"input_ids": input_ids[:, past:], CACHE_FIELD: cache, "attention_mask": attention_mask,
                "use_cache": True if use_cache is None else use_cache, "logits_to_keep": logits_to_keep}


def _refuse_unknown(unknown: dict, model: str) -> None:
    """Raise TypeError naming the keywords of ``unknown`` (a forward's ``**unknown``), if any.

    Raises:
        TypeError: ``unknown`` is not empty.
    """
    if unknown:
        raise TypeError(f"{model}.forward() got keyword(s) it does not take: {', '.join(sorted(unknown))}. Check the "
                        "spelling against its docstring.")


def _one_cache(past_key_values: Optional[LexCache], cache: Optional[LexCache]) -> Optional[LexCache]:
    """The cache given under either name (transformers 4: ``past_key_values``, 5: ``cache``).

    Raises:
        ValueError: both given.
    """
    if past_key_values is not None and cache is not None:
        raise ValueError("give the cache once: past_key_values (transformers 4) or cache (transformers 5).")
    return cache if cache is not None else past_key_values

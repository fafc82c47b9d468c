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

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..modules.attention.self_attention import IncrementalState
from ..modules.attention.spec import AttentionOptions, AttentionSpec
from ..modules.decoder import DecoderStack
from ..modules.positions import POSITION_SCHEMES, SCHEME_OPTIONS
from .configuration import LexConfig

__all__ = ["LexCache", "LexCore", "LexForCausalLM", "attention_spec", "left_padding_refusal"]


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


def left_padding_refusal(position_kind: str, spec: AttentionSpec) -> Optional[str]:
    """Why left padding would change this model's output under ``spec``, or None where it cannot.

    A left-padded row's real tokens start at position p > 0, not 0. Where attention depends only on distances
    between visible real tokens (a relative scheme, full or sliding attention without sinks, ReRoPE and Leaky
    ReRoPE's distance maps) the shift changes nothing; everything that counts positions from the first one
    (absolute positions, BCA's blocks, sink tokens, LM-Infinite, Self-Extend's groups, DCA's chunks, log-n's
    key count, dynamic NTK's length) would see the pads.
    """
    if position_kind == "absolute":
        return "absolute positions"
    if spec.window.mode not in ("full", "sliding") or spec.window.sinks:
        return f"{spec.window} attention (its blocks and sink tokens count positions from the first)"
    if spec.position_map is not None and spec.position_map.name not in ("rerope", "leaky_rerope"):
        return f"{spec.position_map.name} (its groups / chunks count positions from the first)"
    if spec.logn:
        return "log-n scaling (it counts the keys from the first position)"
    if spec.rope_scaling is not None and spec.rope_scaling.kind == "dynamic":
        return "dynamic NTK scaling (it scales by the sequence's length)"
    return None


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

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions processed so far (what the next token's position is)."""
        return max((cache.end for cache in self.state.values()), default=0)

    def held_positions(self) -> int:
        """Key positions held now by the largest layer cache (window and sinks)."""
        return max((cache.length + cache.sink_length for cache in self.state.values()), default=0)

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1  # grows as needed; a bounded window trims it (held_positions)

    def reset(self):
        self.state.clear()

    def reorder_cache(self, beam_idx: torch.LongTensor):
        """Select batch rows ``beam_idx`` of every layer's cache (beam search)."""
        for cache in self.state.values():
            cache.reorder(beam_idx)

    def batch_select_indices(self, indices: Tensor):
        self.reorder_cache(indices)

    def _refuse(self, what: str):
        raise NotImplementedError(f"LexCache does not support {what} (assisted generation, contrastive search); use "
                                  "greedy, sampling or beam search.")

    def crop(self, max_length: int):
        self._refuse("cropping")

    def batch_repeat_interleave(self, repeats: int):
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


class LexForCausalLM(PreTrainedModel, GenerationMixin):
    """A lex_lm language model for transformers: ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``
    on a directory written by ``lex export-hf``.

    Args:
        config: :class:`LexConfig`.

    Raises:
        ValueError: as :class:`LexCore`.
    """

    config_class = LexConfig
    base_model_prefix = "decoder"
    _no_split_modules = ["LexDecoderLayer"]
    _tied_weights_keys = ["decoder.output_projection.weight"]
    supports_gradient_checkpointing = False

    def __init__(self, config: LexConfig):
        super().__init__(config)
        self.decoder = LexCore(config)
        self.post_init()

    def _init_weights(self, module):
        pass  # every module initialises itself as fairseq's does; from_pretrained then loads the weights

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.decoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder.output_projection

    def set_output_embeddings(self, value: nn.Linear):
        self.decoder.output_projection = value

    @property
    def spec(self) -> AttentionSpec:
        """The default attention spec (the config's ``attention``)."""
        return self.decoder.spec

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
        inputs_embeds: Optional[Tensor] = None,
        logits_to_keep: int = 0,
        spec: Optional[AttentionSpec] = None,
        **unused,
    ) -> CausalLMOutputWithPast:
        """Next-token logits of ``input_ids``.

        Args:
            input_ids: (B, T) int64 fairseq dictionary ids: the new positions (after ``past_key_values``' ones).
            attention_mask: (B, past + T) or (B, T), 1 at real tokens, 0 at padding; None: every token is real. Only
                the last T columns are read as padding (the cache keeps the padding of earlier positions). Left
                padding (batched ``generate()``) only where it cannot change the output (:func:`left_padding_refusal`).
            past_key_values: a :class:`LexCache` from an earlier call, or None.
            use_cache: return a :class:`LexCache` holding these positions (default ``config.use_cache``).
            labels: (B, T) targets (-100: ignored); the loss is the mean cross-entropy of logits[:, :-1]
                against labels[:, 1:] (nats), as transformers' causal LMs.
            output_hidden_states: also return the embedding output and every layer's output.
            logits_to_keep: > 0: logits of the last that many positions only (``generate()`` asks for 1: a long
                prompt's (T, V) logits are never formed); 0: every position.
            spec: the attention spec of this call (default :attr:`spec`).

        Returns:
            ``CausalLMOutputWithPast``: ``logits`` (B, T, V) in the weights' dtype, ``past_key_values``,
            ``loss``, ``hidden_states``.

        Raises:
            ValueError: ``inputs_embeds`` (token ids only), an attention mask shorter than ``input_ids``, left
                padding under a spec it would change, ``labels`` with ``logits_to_keep``.
            TypeError: ``past_key_values`` that is not a :class:`LexCache`.
        """
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("LexForCausalLM takes input_ids (fairseq dictionary ids), not inputs_embeds.")
        if past_key_values is not None and not isinstance(past_key_values, LexCache):
            raise TypeError(f"past_key_values must be a LexCache (or None), got {type(past_key_values).__name__}: the "
                            "layers keep the package's own key/value cache.")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = past_key_values if past_key_values is not None else (LexCache() if use_cache else None)
        padding = None
        if attention_mask is not None:
            if attention_mask.size(1) < input_ids.size(1):
                raise ValueError(f"attention_mask covers {attention_mask.size(1)} positions, fewer than the "
                                 f"{input_ids.size(1)} input ids.")
            padding = attention_mask[:, -input_ids.size(1):].eq(0)
            real = attention_mask.ne(0)
            if (real[:, 1:] & ~real[:, :-1]).any():  # a pad before a real token: left padding
                why = left_padding_refusal(self.decoder.position_kind, self.spec if spec is None else spec)
                if why is not None:
                    raise ValueError(f"left padding shifts each row's positions, which changes the output under {why}: "
                                     "run the rows one at a time (or pad on the right, for scoring).")
        state = None if cache is None else cache.state
        if labels is not None and logits_to_keep:
            raise ValueError("labels score every position: call without logits_to_keep.")
        features, inner_states = self.decoder.stack_features(input_ids, state, spec, padding_mask=padding, prefix=False)
        logits = self.decoder.output_layer(features[:, -logits_to_keep:] if logits_to_keep else features)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache,
                                      hidden_states=tuple(inner_states) if output_hidden_states else None)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values: Optional[LexCache] = None,
                                      attention_mask: Optional[Tensor] = None, use_cache: Optional[bool] = None,
                                      logits_to_keep: int = 0, **unused) -> dict:
        """The positions not yet in the cache (all of the prompt at the first step, then one token)."""
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        return {"input_ids": input_ids[:, past:], "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": True if use_cache is None else use_cache, "logits_to_keep": logits_to_keep}

"""``lex export-hf``: a fairseq lex_lm checkpoint as a Hugging Face model directory.

The directory holds ``config.json`` (:class:`~.configuration.LexConfig`: the model, its position scheme with
every option resolved, the training length, the default attention spec), ``model.safetensors`` (the decoder's
state dict under fairseq's names), ``generation_config.json``, the tokenizer (``dict.txt``, ``spm.model``,
``tokenizer_config.json``) and three small modules, ``configuration_lex.py``, ``modeling_lex.py`` and
``tokenization_lex.py``, named by ``auto_map`` so that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load it with
``trust_remote_code=True``. They import ``lex_plugin.hf`` (this package's fairseq-free core: the exported model
runs the same attention code as fairseq's); fairseq is needed only to export.
"""

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from ..data.prepare import BPE_MODEL, META_FILE
from ..modules.attention.spec import AttentionOptions
from .configuration import LexConfig
from .modeling import LexForCausalLM
from .tokenization import LexTokenizer

__all__ = ["AUTO_MAP", "EXPORT_FILES", "REMOTE_CODE", "export_hf", "from_fairseq", "hf_config"]

logger = logging.getLogger(__name__)

# the modules auto_map names, written into the export: each re-exports one class of lex_plugin.hf
REMOTE_CODE = {
    "configuration_lex.py": ("LexConfig", "lex_plugin.hf.configuration"),
    "modeling_lex.py": ("LexForCausalLM", "lex_plugin.hf.modeling"),
    "tokenization_lex.py": ("LexTokenizer", "lex_plugin.hf.tokenization"),
}
# every file an export writes (``--force`` removes them first, so that no stale file of an earlier export stays)
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "dict.txt", "spm.model",
                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "rope_scaling.json",
                *REMOTE_CODE)
AUTO_MAP = {"AutoConfig": "configuration_lex.LexConfig", "AutoModelForCausalLM": "modeling_lex.LexForCausalLM"}


def _attention_fields(options: AttentionOptions) -> dict:
    """The options that differ from their defaults (a readable ``config.json``: ``{"mode": "bca"}``)."""
    default = AttentionOptions()
    return {name: getattr(options, name) for name in AttentionOptions.__dataclass_fields__
            if getattr(options, name) != getattr(default, name)}


def hf_config(model_cfg, dictionary, training_length: Optional[int], options: Optional[AttentionOptions] = None) -> LexConfig:
    """The :class:`LexConfig` of a lex_lm built from ``model_cfg`` (fairseq's model config: the checkpoint's
    ``cfg.model`` or an argparse Namespace of ``--arch lex_lm`` options) over ``dictionary`` (fairseq's), trained
    at ``training_length``, with ``options`` as the default attention (None: full).

    Raises:
        ValueError: a RoPE scaling factor ``auto`` (it depends on each evaluation's length: give s); options
            ``AttentionOptions.spec`` refuses.
    """
    from ..models.lex_lm import build_decoder_config
    from ..modules.decoder import symbols_digest
    from ..modules.positions.absolute import _learned_size
    from ..modules.positions.scheme import get_scheme, scheme_option_values

    options = options or AttentionOptions()
    if options.rope_scaling_factor == "auto":
        raise ValueError("--rope-scaling-factor auto depends on each evaluation's length; an export fixes one spec: "
                         "give the factor s (evaluation length / l).")
    options.spec(training_length)  # refuse now what the export could not run
    decoder = build_decoder_config(model_cfg, len(dictionary))
    # the scheme's own options, resolved (the task's config may carry others' values, e.g. max_target_positions)
    own = SimpleNamespace(**{o.name: getattr(decoder, o.name, None) for o in get_scheme(decoder.pos_emb).options})
    position_options = scheme_option_values(decoder.pos_emb, own)
    if decoder.pos_emb == "learned":  # the table's size as built (--random-positions may make it larger than l)
        position_options["max_target_positions"] = _learned_size(decoder)
    return LexConfig(
        vocab_size=len(dictionary), hidden_size=decoder.decoder_embed_dim, num_hidden_layers=decoder.decoder_layers,
        num_attention_heads=decoder.decoder_attention_heads, intermediate_size=decoder.decoder_ffn_embed_dim,
        hidden_act=decoder.activation_fn, layer_norm_eps=decoder.layernorm_eps, pos_emb=decoder.pos_emb,
        position_options=position_options, training_length=training_length,
        attention=_attention_fields(options), normalize_before=decoder.decoder_normalize_before,
        deepnorm=decoder.deepnorm, subln=decoder.subln, layernorm_embedding=decoder.layernorm_embedding,
        scale_embedding=not decoder.no_scale_embedding, tie_word_embeddings=decoder.share_decoder_input_output_embed,
        dictionary_digest=bytes(symbols_digest(dictionary.symbols).tolist()).hex(), bos_token_id=dictionary.eos(),
        pad_token_id=dictionary.pad(), eos_token_id=dictionary.eos(),
    )


def from_fairseq(model, config: LexConfig) -> LexForCausalLM:
    """A :class:`LexForCausalLM` of ``config`` holding a fairseq lex_lm's weights (fp32, eval mode).

    Raises:
        RuntimeError: the state dicts differ (a config that is not the model's).
    """
    state = {k[len("decoder."):]: v.float() for k, v in model.state_dict().items()
             if k.startswith("decoder.") and k != "decoder.dictionary_digest"}
    hf = LexForCausalLM(config)
    hf.decoder.load_state_dict(state, strict=True)
    return hf.eval()


def export_hf(checkpoint: Path, data: Path, out: Path, options: Optional[AttentionOptions] = None,
              force: bool = False) -> LexForCausalLM:
    """Write the Hugging Face directory of ``checkpoint`` (module docstring).

    Args:
        checkpoint: a lex_lm checkpoint file (``checkpoint_last.pt``).
        data: the data-bin it was trained on (``dict.txt``, ``spm.model``, ``lex_prepare.json``).
        out: the directory to write (created; must be empty unless ``force``).
        options: the default attention spec of the export (``AttentionOptions``: window, position map, RoPE
            scaling, log-n); None: full attention.
        force: write into a non-empty ``out``, first removing the files an export writes (:data:`EXPORT_FILES`);
            other files stay.

    Returns:
        The exported model (fp32, eval mode), its weights equal to the checkpoint's.

    Raises:
        FileNotFoundError: no checkpoint or data-bin. FileExistsError: ``out`` is not empty and not ``force``.
        ValueError: as :func:`hf_config`; a checkpoint that is not a lex_lm.
    """
    from ..hub_interface import from_pretrained

    checkpoint, data, out = Path(checkpoint), Path(data), Path(out)
    options = options or AttentionOptions()
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty; choose another directory or pass --force.")
    hub = from_pretrained(checkpoint.parent, checkpoint.name, data)
    if not hasattr(hub.models[0].decoder, "stack_features"):
        raise ValueError(f"{checkpoint} is not a lex_lm checkpoint (arch {hub.cfg.model._name}); only lex_lm exports.")
    model = hub.models[0]
    model.decoder.check_spec(hub.spec_for(options))  # refuse now what the scheme could not run
    config = hf_config(hub.cfg.model, hub.tgt_dict, hub.training_length, options)
    config.auto_map = dict(AUTO_MAP)
    model = from_fairseq(hub.models[0], config)  # before anything is written: a failure leaves ``out`` as it was
    scaling_file = options.rope_scaling_file
    if scaling_file:  # carried inside the export, named relative to it
        model.config.attention["rope_scaling_file"] = "rope_scaling.json"
    model.config.name_or_path = str(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in EXPORT_FILES:  # an earlier export's files (only with --force: ``out`` is empty otherwise)
        (out / name).unlink(missing_ok=True)
    if scaling_file:
        shutil.copyfile(scaling_file, out / "rope_scaling.json")
    model.generation_config.suppress_tokens = [hub.tgt_dict.pad()]  # lex generate never samples <pad>
    model.save_pretrained(out, safe_serialization=True)

    meta = json.loads((data / META_FILE).read_text()) if (data / META_FILE).is_file() else {}
    spm_file = data / (meta.get("bpe_model") or BPE_MODEL) if meta.get("bpe") == "sentencepiece" else None
    if meta.get("bpe") is None:
        logger.warning("%s has no %s: the tokenizer keeps Moses words (no SentencePiece)", data, META_FILE)
    tokenizer = LexTokenizer(str(data / "dict.txt"), str(spm_file) if spm_file else None, meta.get("lang", "en"))
    tokenizer.save_pretrained(out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["tokenization_lex.LexTokenizer", None]}
    tok_config["tokenizer_class"] = "LexTokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    for name, (cls, module) in REMOTE_CODE.items():
        (out / name).write_text(f'"""{cls} of lex_plugin (pip install lex_plugin: torch and torchscale; fairseq is not '
                                f'needed to load)."""\n\nfrom {module} import {cls}  # noqa: F401\n')
    return model


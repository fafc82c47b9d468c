"""``lex export-hf``: a fairseq lex_lm checkpoint as a self-contained Hugging Face model directory.

The directory holds ``config.json`` (:class:`~lex_plugin.hf.configuration.LexConfig`: the model, its position
scheme with every option resolved, the training length, the default attention spec, ``auto_map``),
``model.safetensors`` (the decoder's state dict under fairseq's names), ``generation_config.json``, the tokenizer
(``dict.txt``, ``spm.model``, ``tokenizer_config.json``), a model card (``README.md``) and the remote code:
``configuration_lex.py``, ``modeling_lex.py``, ``tokenization_lex.py`` and the package modules they import, as
flat files generated from this package's sources (:mod:`.remote_code`). ``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM`` and ``AutoTokenizer`` load it with ``trust_remote_code=True`` where only torch,
transformers, safetensors, sentencepiece and sacremoses are installed. Every file is written mode 0644.
"""

import json
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Optional, Sequence

from ..data.text import BPE_MODEL, META_FILE
from ..hf.configuration import LexConfig
from ..hf.modeling import LexForCausalLM
from ..hf.tokenization import LexTokenizer
from ..modules.attention.spec import AttentionOptions
from .model_card import CardReport, model_card
from .remote_code import remote_code

__all__ = ["AUTO_MAP", "MAX_POSITIONS_PER_L", "export_hf", "from_fairseq", "hf_config", "save_model"]

logger = logging.getLogger(__name__)

AUTO_MAP = {"AutoConfig": "configuration_lex.LexConfig", "AutoModel": "modeling_lex.LexModel",
            "AutoModelForCausalLM": "modeling_lex.LexForCausalLM"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_lex.LexTokenizer", None]}
# the files an export writes besides the remote code (``--force`` removes them and every ``.py`` first)
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "dict.txt", "spm.model",
                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "rope_scaling.json",
                "README.md")
# max_position_embeddings by default: the longest length the project's length tables measure (16 l)
MAX_POSITIONS_PER_L = 16


def _attention_fields(options: AttentionOptions) -> dict:
    """The options that differ from their defaults (a readable ``config.json``: ``{"mode": "bca"}``)."""
    default = AttentionOptions()
    return {name: getattr(options, name) for name in AttentionOptions.__dataclass_fields__
            if getattr(options, name) != getattr(default, name)}


def hf_config(model_cfg, dictionary, training_length: Optional[int], options: Optional[AttentionOptions] = None,
              max_position_embeddings: Optional[int] = None, positions_dropped: bool = False) -> LexConfig:
    """The :class:`LexConfig` of a lex_lm built from ``model_cfg`` (fairseq's model config: the checkpoint's
    ``cfg.model`` or an argparse Namespace of ``--arch lex_lm`` options) over ``dictionary`` (fairseq's), trained
    at ``training_length``, with ``options`` as the default attention (None: full).
    ``max_position_embeddings``: what tools read as the length to feed at once (None: 16 l, or a learned
    table's size, or 2,048 without l); not a limit of the model. ``positions_dropped``: DroPE has dropped the
    model's rotary positions (``DecoderStack.positions_dropped``): the export is the NoPE model it now is.

    Raises:
        ValueError: a RoPE scaling factor ``auto`` (it depends on each evaluation's length: give s); options
            ``AttentionOptions.spec`` refuses; ``max_position_embeddings`` < 1 or beyond a learned table.
    """
    from ..models.lex_lm import build_decoder_config
    from ..modules.decoder import symbols_digest
    from ..modules.designs import DESIGN_OPTIONS
    from ..modules.model_fields import hf_fields
    from ..modules.positions.absolute import _learned_size
    from ..modules.positions.scheme import get_scheme, scheme_option_values

    options = options or AttentionOptions()
    if options.rope_scaling_factor == "auto":
        raise ValueError("--rope-scaling-factor auto depends on each evaluation's length; an export fixes one spec: "
                         "give the factor s (evaluation length / l).")
    options.spec(training_length)  # refuse now what the export could not run
    decoder = build_decoder_config(model_cfg, len(dictionary))
    if positions_dropped:  # DroPE's model from its switch on: the same weights without positions, nothing to switch
        decoder.pos_emb, decoder.drope_start = "none", 0
    # the scheme's own options, resolved (the task's config may carry others' values, e.g. max_target_positions)
    own = SimpleNamespace(**{o.name: getattr(decoder, o.name, None) for o in get_scheme(decoder.pos_emb).options})
    position_options = scheme_option_values(decoder.pos_emb, own)
    table = None  # the rows of a learned position table, the one scheme with a length limit
    if decoder.pos_emb == "learned":  # the table's size as built (--random-positions may make it larger than l)
        table = position_options["max_target_positions"] = _learned_size(decoder)
    if max_position_embeddings is None:
        max_position_embeddings = table or (MAX_POSITIONS_PER_L * training_length if training_length else 2048)
    if max_position_embeddings < 1 or (table and max_position_embeddings > table):
        raise ValueError(f"--max-position-embeddings must be between 1 and {table or 'any length'} "
                         f"({'the learned table' if table else 'positive'}); got {max_position_embeddings}.")
    decoder.tokens_per_sample = training_length  # the l given (the checkpoint's, or --training-length)
    return LexConfig(
        **hf_fields(decoder),
        **{name: getattr(decoder, name) for name in DESIGN_OPTIONS},
        position_options=position_options, attention=_attention_fields(options), dictionary_digest=bytes(symbols_digest(dictionary.symbols).tolist()).hex(), bos_token_id=dictionary.eos(),
        pad_token_id=dictionary.pad(), eos_token_id=dictionary.eos(), max_position_embeddings=max_position_embeddings,
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
              force: bool = False, max_position_embeddings: Optional[int] = None,
              length_report: Optional[Path] = None, probe_reports: Sequence[Path] = ()) -> LexForCausalLM:
    """Write the Hugging Face directory of ``checkpoint`` (module docstring).

    Args:
        checkpoint: a lex_lm checkpoint file (``checkpoint_last.pt``).
        data: the data-bin it was trained on (``dict.txt``, ``spm.model``, ``lex_prepare.json``).
        out: the directory to write (created; must be empty unless ``force``).
        options: the default attention spec of the export (``AttentionOptions``: window, position map, RoPE
            scaling, log-n); None: full attention.
        force: write into a non-empty ``out``, first removing the files an export writes (:data:`EXPORT_FILES`
            and every ``.py``); other files stay.
        max_position_embeddings: as :func:`hf_config`.
        length_report: an ``--eval-lengths`` JSON (``fairseq-eval-lm ... --report-json``) whose perplexity table
            the model card shows; None: the card says how to measure it.
        probe_reports: reports of the far-context probes whose figures the card shows (``lex passkey``, ``ruler``,
            ``babilong --json``; ``fairseq-eval-lm --longppl --report-json`` for its LongPPL), each with its
            provenance, in the Hub's ``model-index`` too (``model_card.eval_results``).

    Returns:
        The exported model (fp32, eval mode), its weights equal to the checkpoint's.

    Raises:
        FileNotFoundError: no checkpoint, data-bin, length or probe report; a data-bin without ``lex_prepare.json`` (its
            tokenization is unknown: the hub would take text as already tokenized, the export's tokenizer could not
            match it). FileExistsError: ``out`` is not empty and
            not ``force``. ValueError: as :func:`hf_config`; a checkpoint that is not a lex_lm; a report of
            another kind than its option takes, of another training length than the model's, or giving a figure
            another gives (``model_card.CardReport.read``, ``model_card.model_card``).
            ``remote_code.RemoteCodeError``: the package's inference modules import something an export cannot carry.
    """
    from ..hub_interface import from_pretrained

    checkpoint, data, out = Path(checkpoint), Path(data), Path(out)
    options = options or AttentionOptions()
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty; choose another directory or pass --force.")
    reports = ([CardReport.read(length_report, probe=False)] if length_report is not None else []) + [
        CardReport.read(path, probe=True) for path in probe_reports]  # before anything is written
    if not (data / META_FILE).is_file():
        raise FileNotFoundError(f"{data} has no {META_FILE}, so how its text was tokenized is unknown and the export's "
                                "tokenizer could not match the model's; give the data-bin lex prepare wrote (or one "
                                "made with lex prepare --like it).")
    meta = json.loads((data / META_FILE).read_text())
    code = remote_code()  # before anything is written: a failure leaves ``out`` as it was
    hub = from_pretrained(checkpoint.parent, checkpoint.name, data)
    if not hasattr(hub.models[0].decoder, "stack_features"):
        raise ValueError(f"{checkpoint} is not a lex_lm checkpoint (arch {hub.cfg.model._name}); only lex_lm exports.")
    model = hub.models[0]
    model.decoder.check_spec(hub.spec_for(options))  # refuse now what the scheme could not run
    config = hf_config(hub.cfg.model, hub.tgt_dict, hub.training_length, options, max_position_embeddings,
                       positions_dropped=hub.models[0].decoder.positions_dropped)
    model = from_fairseq(hub.models[0], config)
    card = model_card(config, str(model.spec), checkpoint, reports, bpe=meta.get("bpe"), name=out.resolve().name)
    scaling_file = options.rope_scaling_file
    if scaling_file:  # carried inside the export, named relative to it
        model.config.attention["rope_scaling_file"] = "rope_scaling.json"
    model.config.name_or_path = str(out)
    out.mkdir(parents=True, exist_ok=True)
    if force:  # an earlier export's files (``out`` is empty otherwise)
        for name in EXPORT_FILES:
            (out / name).unlink(missing_ok=True)
        for stale in out.glob("*.py"):
            stale.unlink()
    if scaling_file:
        shutil.copyfile(scaling_file, out / "rope_scaling.json")
    model.generation_config.suppress_tokens = [hub.tgt_dict.pad()]  # lex generate never samples <pad>
    save_model(model, out, code)

    spm_file = data / (meta.get("bpe_model") or BPE_MODEL) if meta.get("bpe") == "sentencepiece" else None
    tokenizer = LexTokenizer(str(data / "dict.txt"), str(spm_file) if spm_file else None, meta.get("lang", "en"),
                             bpe="sentencepiece" if spm_file else None)
    tokenizer.save_pretrained(out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = dict(TOKENIZER_AUTO_MAP)
    tok_config["tokenizer_class"] = "LexTokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "README.md").write_text(card, encoding="utf-8")
    _readable(out)
    return model


def save_model(model: LexForCausalLM, out: Path, code: Optional[Dict[str, str]] = None) -> None:
    """Write ``model`` (config with ``auto_map``, weights, generation config) and the remote code into ``out``:
    a directory ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` loads without this package
    (no tokenizer: :func:`export_hf` adds it). ``code``: :func:`~.remote_code.remote_code`'s files (None: made now).

    Raises:
        ``remote_code.RemoteCodeError``: as :func:`~.remote_code.remote_code`.
    """
    code = remote_code() if code is None else code
    out = Path(out)
    model.config.auto_map = dict(AUTO_MAP)
    model.save_pretrained(out, safe_serialization=True)
    for name, text in code.items():
        (out / name).write_text(text, encoding="utf-8")


def _readable(out: Path) -> None:
    for path in out.iterdir():  # every file 0644, whatever the umask
        if path.is_file():
            os.chmod(path, 0o644)

"""Generation and scoring from Python, in the manner of fairseq's ``TransformerLanguageModel.from_pretrained``.

    import lex_plugin
    lm = lex_plugin.from_pretrained("checkpoints/lex_tiny", "checkpoint_last.pt", "data-bin/pg", window="bca")
    lm.continue_text("It was a dark and stormy night", max_len=100, top_p=0.9, seed=1)
    lm.sample("It was a dark and stormy night", beam=4, max_len_b=50)     # fairseq's generator
    lm.score("It was a dark and stormy night.")["positional_scores"]

    from lex_plugin.evaluation.documents import score_document                # a whole document, any length
    score_document(lm, open("book.txt").read()).ppl

Text goes through exactly what ``lex prepare`` did (Moses normalisation and tokenization, the corpus'
SentencePiece model from ``lex_prepare.json`` in the data-bin). ``continue_text`` runs the prompt in one
parallel pass (BCA chunked forward) and then one token per step through the bounded key/value cache, so
under BCA memory and per-token time stay flat however long it generates. ``sample``/``score``/``generate``
are fairseq's (beam search, sampling), which feed the prompt one token per step.
"""

import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Optional, Union

import torch
from fairseq import hub_utils
from fairseq.hub_utils import GeneratorHubInterface
from torch import Tensor, nn

from .data.text import BPE_MODEL, META_FILE
from .generation import continue_ids, filter_logits
from .modules.attention.spec import AttentionOptions, AttentionSpec
from .modules.attention.window import AttentionWindow

logger = logging.getLogger(__name__)

__all__ = ["LexHubInterface", "from_pretrained", "filter_logits"]


class LexHubInterface(GeneratorHubInterface):
    """fairseq's ``GeneratorHubInterface`` plus an attention window and a fast sampler for LeX models."""

    @property
    def training_length(self) -> Optional[int]:
        """tokens_per_sample the checkpoint was trained with, or None."""
        return getattr(self.models[0], "training_length", None)

    @property
    def spec(self) -> AttentionSpec:
        """The attention spec (window, RoPE scaling) every call without one uses: sample, score,
        generate, continue_text (and ``evaluation.score_document``). Fixed; :meth:`under` gives a hub with another."""
        return self.models[0].decoder.spec

    @property
    def window(self) -> AttentionWindow:
        """The window of :attr:`spec`."""
        return self.spec.window

    def spec_for(self, options: Optional[AttentionOptions] = None, evaluation_length: Optional[int] = None,
                 **flags) -> AttentionSpec:
        """The spec of ``options`` (or of keyword ``flags``: ``AttentionOptions`` fields) for this checkpoint's
        training length (``AttentionOptions.spec``; ValueError as there)."""
        options = AttentionOptions(**flags) if options is None else options
        return options.spec(self.training_length, evaluation_length)

    def under(self, spec: AttentionSpec) -> "LexHubInterface":
        """This hub with ``spec`` as the default of every call: the same models viewed under it
        (``LexLanguageModel.under``, no copy of the weights), the same task, tokenizer and BPE.

        Raises:
            TypeError, ValueError: a spec the models cannot take.
        """
        view = copy.copy(self)
        models = nn.ModuleList(m.under(spec) for m in self.models)
        models.training = self.models.training  # the flag only: the models are generation-fast (no train())
        object.__setattr__(view, "_modules", {**self._modules, "models": models})
        return view

    def encode(self, sentence: str) -> torch.LongTensor:
        """Text -> token ids (ending with ``</s>``), as the corpus was prepared.

        Raises:
            ValueError: empty text, or text of which no symbol is in the model's dictionary.
        """
        if not sentence or not sentence.strip():
            raise ValueError("empty prompt: give some text to continue or score.")
        tokens = super().encode(sentence)
        unk = self.src_dict.unk()
        # a known token carries text: SentencePiece's bare word-boundary piece does not
        known = [t for t in tokens[:-1].tolist() if t != unk and self.src_dict[t].strip("\u2581 ")]
        if not known:
            raise ValueError(f"none of the symbols of {sentence[:60]!r} is in the model's dictionary.")
        return tokens

    def encode_fragment(self, text: str) -> torch.LongTensor:
        """Text -> (n,) int64 token ids as the corpus was prepared, without ``</s>`` and without the checks of
        :meth:`encode`: a piece of a longer prompt (the passkey probe's intro, needle, question and key)."""
        return self.binarize(self.apply_bpe(self.tokenize(text)))[:-1].long()

    def score_document(self, *args, **kwargs):
        """Moved in 0.2 to ``lex_plugin.evaluation.documents.score_document(hub, text, ...)`` (the hub stands below
        evaluation).

        Raises:
            AttributeError: always, naming the function that scores a document.
        """
        raise AttributeError("LexHubInterface.score_document moved in lex_plugin 0.2: call "
                             "lex_plugin.evaluation.documents.score_document(hub, text, ...) with the same arguments.")

    def continue_text(self, prompt: str, max_len: int = 50, **kwargs) -> str:
        """Sample a continuation of ``prompt``; arguments as :meth:`continue_tokens`. Returns the
        continuation only, detokenized (paragraph ends ``</s>`` dropped)."""
        tokens = self.continue_tokens(prompt, max_len, **kwargs)
        return self.decode(tokens[tokens.ne(self.src_dict.eos())])

    @torch.no_grad()
    def continue_tokens(
        self,
        prompt: str,
        max_len: int = 50,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        stop_at_eos: bool = False,
        spec: Optional[AttentionSpec] = None,
    ) -> Tensor:
        """Sample up to ``max_len`` token ids after ``prompt`` (temperature 0: greedy; ``top_k`` > 0 and
        ``top_p`` < 1 filter the distribution first) under ``spec`` (default :attr:`spec`).

        The prompt (``</s>`` + its tokens, as fairseq's LM task builds it) runs in one parallel pass; each
        new token then runs alone against the key/value cache, which BCA keeps to l positions.

        Returns:
            (n,) int64 ids of the generated tokens, n <= max_len.
        """
        prompt_tokens = self.encode(prompt)[:-1]
        generator = torch.Generator(device=self.device)
        if seed is not None:
            generator.manual_seed(seed)
        eos = self.src_dict.eos()
        prompt_ids = torch.cat([prompt_tokens.new_tensor([eos]), prompt_tokens]).to(self.device)
        return continue_ids(self.models[0], prompt_ids, max_len, eos, self.src_dict.pad(), temperature, top_k, top_p,
                            generator, stop_at_eos, spec)


def from_pretrained(
    model_name_or_path: Union[str, Path],
    checkpoint_file: str = "checkpoint_best.pt",
    data_name_or_path: Union[str, Path] = ".",
    window: str = "full",
    *,
    evaluation_length: Optional[int] = None,
    bf16_autocast: bool = False,
    device: Union[str, torch.device] = "cpu",
    **kwargs,
) -> LexHubInterface:
    """Load a LeX checkpoint for generation and scoring.

    Args:
        model_name_or_path: directory holding the checkpoint.
        checkpoint_file: file name inside it.
        data_name_or_path: the data-bin made by ``lex prepare`` (``dict.txt``, ``spm.model``,
            ``lex_prepare.json``); relative names starting with '.' are taken inside the model directory.
        window: the attention mode, one of ``flags.ATTENTION_MODES``: ``full``, ``bca``, ``sliding``,
            ``lm_infinite`` or a position map (``rerope``, ``leaky_rerope``, ``self_extend``, ``dca``).
        evaluation_length: the length ``rope_scaling_factor="auto"`` divides by l.
        bf16_autocast: run every forward under ``torch.autocast`` in bf16, fp32 weights
            (``LexLanguageModel.with_autocast``; refused at the first call on a device without bf16 or with
            non-fp32 weights).
        device: where the model runs (``"cpu"``, as fairseq's hub loads it; ``"cuda"``). The ``lex`` commands pass
            CUDA where it is available unless ``--cpu`` is given (``cli.common.command_device``).
        kwargs: the other attention options by name, as the flags say them (``AttentionOptions`` fields, one
            declaration in ``flags.ATTENTION_FLAGS``: ``sliding_window=``, ``training_length=``, ``sink_tokens=``,
            ``n_global=``, ``rope_scaling=``, ``rerope_window=``, ``logn=True`` ...), then fairseq overrides.

    Raises:
        FileNotFoundError: no checkpoint or data-bin there. ValueError: a window the checkpoint cannot take,
            RoPE scaling on a non-rotary checkpoint or with a bad factor.
    """
    model_dir = Path(model_name_or_path)
    if not (model_dir / checkpoint_file).is_file():
        raise FileNotFoundError(f"no checkpoint {model_dir / checkpoint_file}")
    data = Path(data_name_or_path)
    data = model_dir / data if str(data_name_or_path).startswith(".") else data
    if not (data / "dict.txt").is_file():
        raise FileNotFoundError(f"{data} is not a data-bin (no dict.txt); pass the directory lex prepare wrote.")
    meta_path = data / META_FILE
    overrides = dict(kwargs)
    # the attention options by name (sink_tokens, a position map's options, logn ...); the rest is fairseq's
    attention = {f.name: overrides.pop(f.name) for f in dataclasses.fields(AttentionOptions)
                 if f.name != "mode" and f.name in overrides}
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        overrides.setdefault("tokenizer", "lex_moses")
        overrides.setdefault("moses_lang", meta.get("lang", "en"))
        if meta.get("bpe") == "sentencepiece":
            overrides.setdefault("bpe", "sentencepiece")
            overrides.setdefault("sentencepiece_model", str(data / (meta.get("bpe_model") or BPE_MODEL)))
    else:
        logger.warning("%s has no %s: prompts are taken as already tokenized text", data, META_FILE)
    loaded = hub_utils.from_pretrained(
        str(model_dir), checkpoint_file, str(data.resolve()), **overrides
    )
    models = loaded["models"]
    if bf16_autocast:
        models = [m.with_autocast(torch.bfloat16) for m in models]
    if getattr(loaded["task"].args, "add_bos_token", False):
        raise ValueError(f"{model_dir / checkpoint_file} was trained with --add-bos-token: the hub, the lex commands and "
                         "the export feed no leading <s>, so every score would miss the token the model always saw first. "
                         "Evaluate it with fairseq-eval-lm (without --eval-lengths).")
    hub = LexHubInterface(loaded["args"], loaded["task"], models).to(device)
    options = AttentionOptions(window, **attention)
    return hub.under(hub.spec_for(options, evaluation_length))

"""``lex_language_modeling``: fairseq's language-modeling task plus LeX evaluation.

    fairseq-eval-lm data-bin --user-dir lex_plugin --task lex_language_modeling \\
        --path checkpoint_best.pt --tokens-per-sample 8192 --bca \\
        --eval-lengths 256,512,1024,2048,4096,8192 --eval-windows full,bca --report-json report.json

* ``--bca`` / ``--sliding-window W|l`` give the model fairseq builds from the checkpoint its default
  attention spec (``LexLanguageModel.under``: a view, no ``--model-overrides``). The training length l is the ``tokens_per_sample``
  recorded in the checkpoint, or ``--training-length``.
* ``--eval-lengths`` scores the same token stream cut into each length, for each ``--eval-windows``
  mode, prints a table (and the per-position buckets), and writes ``--report-json``
  (:meth:`LexLanguageModelingTask.length_report`, the task's evaluation entry point; fairseq-eval-lm
  reaches it through ``eval_lm_dataloader``, its last task hook before scoring). fairseq's own pass at
  ``--tokens-per-sample`` follows, as usual, unless ``--length-report-only``; each pass shows a progress bar.
* ``--longppl`` adds LongPPL (:mod:`~lex_plugin.evaluation.longppl`) to every row: perplexity over the key
  tokens that an evaluator (``--key-token-model``, default the checkpoint itself, under full attention)
  finds on samples of the longest length; the same tokens for every window and length. ``--key-tokens REPORT``
  reads them from an earlier run's report instead (one common evaluator for every model).
* ``--sink-tokens k`` adds attention sinks to the bca / sliding modes (StreamingLLM); ``--lm-infinite``
  (``--n-global``, ``--l-local``) selects LM-Infinite's Λ-shaped attention, mode ``lm_infinite`` in
  ``--eval-windows``.
* ``--position-map rerope|leaky_rerope|self_extend|dca`` (with each method's own options) keeps every key
  visible at bounded distances (:mod:`~lex_plugin.modules.attention.position_map`), modes of the same names in
  ``--eval-windows``; ``--logn`` scales queries by max(1, log(n) / log(l)) under any mode.
* ``--rope-scaling linear|ntk|yarn --rope-scaling-factor S|auto`` scales a rotary model's positions at
  evaluation (:mod:`~lex_plugin.modules.positions.rope_scaling`); ``auto`` is max(1, L / l) for each
  evaluation length L, and the rows are labelled ``WINDOW+KIND(s=S)``.
* ``--bf16-autocast`` runs every forward of the model it builds (fairseq-train's train and valid steps,
  fairseq-eval-lm, the length report) under ``torch.autocast`` in bf16 with fp32 weights
  (:mod:`~lex_plugin.modules.autocast`).
* ``--answer-only-loss`` (fine-tuning on ``lex passkey-data`` / ``lex ruler-data`` bins, ``--sample-break-mode
  eos``) scores the loss on each row's answer alone (:mod:`~lex_plugin.data.finetune`).
* fairseq silently skips samples longer than ``max_positions()``; this task refuses instead.
"""

import json
import logging
import time
import weakref
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Optional

import torch
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from ..data.stream import split_stream
from ..evaluation.length_eval import evaluate_fixed_target, evaluate_lengths, format_table
from ..evaluation.longppl import KEY_TOKEN_FLAGS, key_token_rule
from ..provenance import provenance
from ..modules.attention.flags import ATTENTION_FLAGS, ATTENTION_MODES, AttentionFlag
from ..modules.attention.spec import AttentionOptions
from ..options import parse_int_list, parse_name_list

logger = logging.getLogger(__name__)


@dataclass
class LexLanguageModelingConfig(LanguageModelingConfig):
    """fairseq's ``language_modeling`` options plus the length-stratified report (``--eval-lengths`` ...); the
    attention flags (``--bca``, ``--sliding-window`` ...) are added from their one declaration
    (:data:`LexLanguageModelingConfig`)."""

    eval_lengths: Optional[str] = field(
        default=None, metadata={"help": "comma-separated evaluation lengths, e.g. 256,512,1024: same stream, each length"}
    )
    eval_windows: Optional[str] = field(
        default=None,
        metadata={"help": f"comma-separated attention modes for --eval-lengths among {','.join(ATTENTION_MODES)} "
                          "(default: the selected one)"},
    )
    eval_tokens: int = field(
        default=0, metadata={"help": "score only the first N tokens of the split in --eval-lengths (0: all)"}
    )
    fixed_target_tokens: int = field(
        default=0,
        metadata={"help": "also run the fixed-target protocol (Chi et al. 3.4): score the last N tokens of windows with each length"},
    )
    fixed_target_samples: int = field(default=64, metadata={"help": "number of samples (stretches of the split whose "
                                                                    "last tokens are scored) of the fixed-target protocol"})
    report_json: Optional[str] = field(default=None, metadata={"help": "write the --eval-lengths results as JSON here"})
    length_report_only: bool = field(
        default=False,
        metadata={"help": "the --eval-lengths report is the whole job: skip fairseq's own pass over the split at "
                          "--tokens-per-sample that follows it"},
    )
    longppl: bool = field(
        default=False,
        metadata={"help": "add LongPPL (Fang et al. 2025) to --eval-lengths: perplexity over the key tokens, those the "
                          "evaluator predicts better by > alpha nats with the long context (samples of the longest "
                          "--eval-lengths) than truncated, at long-context loss < beta; the same tokens for every row"},
    )
    key_token_model: Optional[str] = field(
        default=None,
        metadata={"help": "checkpoint of the --longppl evaluator (same dictionary), under full attention; default: "
                          "the evaluated checkpoint under full attention"},
    )
    key_tokens: Optional[str] = field(
        default=None,
        metadata={"help": "--longppl on the key tokens an earlier run found (its --report-json, same split, "
                          "--eval-tokens and longest --eval-lengths): one common evaluator for every model, the "
                          "evaluator not loaded; its rule is the report's (no --key-token-model, no --longppl-*)"},
    )
    answer_only_loss: bool = field(
        default=False,
        metadata={"help": "fine-tuning on a probe's data-bin (lex passkey-data / ruler-data): the loss on each row's "
                          "answer and end-of-sentence only (SPLIT.answers.npy), the prompt still read; needs "
                          "--sample-break-mode eos; --criterion cross_entropy then projects the answers' positions alone "
                          "onto the vocabulary (answer_cross_entropy: the same loss, faster)"},
    )
    bf16_autocast: bool = field(
        default=False,
        metadata={"help": "run the model's forward under torch.autocast in bf16 (CPU with AVX-512 BF16 / AMX, CUDA 8.0+), "
                          "fp32 weights and optimizer state, no loss scaling: fairseq-train's train and valid steps and "
                          "fairseq-eval-lm; not with --fp16 / --memory-efficient-fp16 / --bf16"},
    )


def _attention_field(flag: AttentionFlag):
    """The task's field of an attention flag: a switch (False: off) or a value (None: not given)."""
    if flag.type is bool:
        return flag.name, bool, field(default=False, metadata={"help": flag.help})
    return flag.name, Optional[flag.type], field(default=None, metadata={"help": flag.help})


# the attention flags (--bca, --sink-tokens, the position maps' options ...) and LongPPL's rule (--longppl-alpha
# ...), from their declarations (None: not given)
LexLanguageModelingConfig = make_dataclass(
    "LexLanguageModelingConfig",
    [_attention_field(flag) for flag in ATTENTION_FLAGS.values()]
    + [(f"longppl_{name}", Optional[kind], field(default=None, metadata={"help": text}))
       for name, kind, text in KEY_TOKEN_FLAGS],
    bases=(LexLanguageModelingConfig,),
)
LexLanguageModelingConfig.__module__ = __name__  # (make_dataclass says "types": pickling would fail)


def _key_token_rule(args, eval_lengths: bool):
    """The ``--longppl`` rule from the task's flags (:func:`~lex_plugin.evaluation.longppl.key_token_rule`), None
    without ``--longppl``.

    Raises:
        ValueError: a ``--longppl-*`` / ``--key-token-model`` flag without ``--longppl``, or ``--longppl`` without
            ``--eval-lengths``.
    """
    flags = {f"longppl_{name}": getattr(args, f"longppl_{name}") for name, _, _ in KEY_TOKEN_FLAGS}
    key_tokens = getattr(args, "key_tokens", None)
    if key_tokens and not args.longppl:
        raise ValueError("--key-tokens gives LongPPL's key tokens; add --longppl.")
    if key_tokens and (args.key_token_model or any(v is not None for v in flags.values())):
        raise ValueError(f"--key-tokens {key_tokens} brings its evaluator's key tokens and rule; drop --key-token-model "
                         "and the --longppl-* flags, or drop --key-tokens to find key tokens again.")
    rule = key_token_rule(args.longppl, args.key_token_model, **flags)
    if rule is not None and not eval_lengths:
        raise ValueError("--longppl is a column of the --eval-lengths report; give --eval-lengths.")
    return rule


def row_label(spec, options: AttentionOptions) -> str:
    """The label of a length table's rows under ``spec`` whatever their length: the RoPE scaling with the factor as
    given (``yarn(s=auto)``), the temperature with its C (``beta(C=0.1)``) instead of their per-length values."""
    label = str(spec)
    if spec.rope_scaling is not None and options.rope_scaling_factor is not None:
        label = label.replace(str(spec.rope_scaling), f"{options.rope_scaling}(s={options.rope_scaling_factor})")
    if spec.logit_scale is not None:
        label = label.replace(f"+beta({spec.logit_scale:.4g})", f"+beta(C={options.attention_temperature:g})")
    return label


@register_task("lex_language_modeling", dataclass=LexLanguageModelingConfig)
class LexLanguageModelingTask(LanguageModelingTask):
    """fairseq ``language_modeling`` with BCA / sliding-window evaluation and length-stratified reports."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.started = time.monotonic()  # the report's wall time counts from the task's set-up
        self.attention_options = AttentionOptions.from_flags(args)
        self.attention_options.check_modes(self.modes)
        self.eval_lengths = parse_int_list(args.eval_lengths, "--eval-lengths")
        self.key_token_rule = _key_token_rule(args, bool(self.eval_lengths))
        if args.length_report_only and not self.eval_lengths:
            raise ValueError("--length-report-only skips fairseq's pass after the --eval-lengths report; give --eval-lengths.")
        if self.eval_lengths and getattr(args, "add_bos_token", False):
            raise ValueError("--eval-lengths cuts the stream into samples without a leading <s>; a model trained with "
                             "--add-bos-token would be scored without the token it always saw first. Drop --eval-lengths "
                             "(fairseq's own pass prepends <s>), or evaluate a model trained without --add-bos-token.")
        self._models = []

    @property
    def modes(self):
        """The attention modes the length report compares: ``--eval-windows``, or the one the flags select."""
        return parse_name_list(self.args.eval_windows or self.attention_options.mode, "--eval-windows")

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq's hook (eval-lm builds models through it): a lex_lm model comes back as a view whose
        default attention spec is the selected window and scaling (fairseq's scorer calls the model
        without one; ``LexLanguageModel.under``).

        Raises:
            ValueError: a window or scaling flag on a model that is not lex_lm, or one it cannot take.
        """
        model = super().build_model(cfg, from_checkpoint)
        options = self.attention_options
        if options != AttentionOptions() or self.eval_lengths:
            if not hasattr(model, "under"):
                raise ValueError(f"--bca / --sliding-window / --rope-scaling / --eval-lengths need a lex_lm model, "
                                 f"not {type(model).__name__}.")
            spec = options.for_mode(options.mode).spec(getattr(model, "training_length", None), self.args.tokens_per_sample)
            model = model.under(spec)
            logger.info("attention: %s (training length %s)", spec, getattr(model, "training_length", None))
        if self.args.bf16_autocast:
            if not hasattr(model, "with_autocast"):
                raise ValueError(f"--bf16-autocast needs a lex_lm model, not {type(model).__name__}.")
            model = model.with_autocast(torch.bfloat16)  # checked at the first forward (device, fp32 weights)
            logger.info("bf16 autocast: forward in bf16, weights fp32")
        self._models.append(weakref.ref(model))
        return model

    def build_criterion(self, cfg):
        """fairseq's hook. Under ``--answer-only-loss`` fairseq's ``cross_entropy`` becomes ``answer_cross_entropy``
        (:mod:`lex_plugin.criterions.answer_cross_entropy`): the same loss and gradients, only the answers' positions
        projected onto the vocabulary. Any other criterion is built as given."""
        if self.args.answer_only_loss and getattr(cfg, "_name", None) == "cross_entropy":
            from ..criterions import AnswerCrossEntropyCriterion

            logger.info("--answer-only-loss: answer_cross_entropy (the answers' positions alone projected onto the vocabulary)")
            return AnswerCrossEntropyCriterion(self, cfg.sentence_avg)
        return super().build_criterion(cfg)  # (fairseq's language_modeling task is a LegacyFairseqTask: cfg alone)

    def eval_lm_dataloader(self, dataset, max_tokens=36000, batch_size=None, max_positions=None, **kwargs):
        """fairseq's eval-lm batches. fairseq-eval-lm calls no other task hook between loading the models
        and scoring, so this is where ``--eval-lengths`` runs :meth:`length_report` first.

        Raises:
            ValueError: a sample longer than ``max_positions`` (fairseq would skip it silently).
        """
        if max_positions is not None:
            too_long = int((dataset.sizes > max_positions).sum())
            if too_long:
                raise ValueError(
                    f"{too_long} of {len(dataset)} samples are longer than the model's max_positions() = {max_positions}; "
                    "fairseq would skip them silently. Lower --tokens-per-sample or use a model that takes this length."
                )
        if self.eval_lengths:
            self.length_report(max_tokens=max_tokens)
            if self.args.length_report_only:
                logger.info("--length-report-only: fairseq's pass over the split at --tokens-per-sample skipped")
                raise SystemExit(0)
        return super().eval_lm_dataloader(dataset, max_tokens=max_tokens, batch_size=batch_size, max_positions=max_positions, **kwargs)

    def length_report(self, model=None, split: Optional[str] = None, max_tokens: int = 36000) -> dict:
        """The task's evaluation entry point: score the split at every ``--eval-lengths`` under every ``--eval-windows`` mode (windowed modes
        block by block through the bounded cache), print the table, write ``--report-json``.

        Returns:
            The report: split, split_tokens, training_length, results (loss in bits, ppl, buckets), provenance
            (``lex_plugin.provenance``: command, commit, device, versions, seed, wall time since the task's set-up).

        Raises:
            ValueError: more than one model, a length past the model's ``max_positions()`` (learned absolute
                positions), or a window the model cannot take.
        """
        if model is None:
            models = [ref() for ref in self._models if ref() is not None]
            if len(models) != 1:
                raise ValueError("--eval-lengths evaluates one model; pass a single --path.")
            model = models[0]
        decoder = model.decoder
        too_long = [L for L in self.eval_lengths if L > model.max_positions()]
        if too_long:
            raise ValueError(
                f"--eval-lengths {','.join(map(str, too_long))} exceed the model's max_positions() = {model.max_positions()} "
                f"(a --pos-emb {getattr(decoder, 'pos_emb', '?')} model has no positions past it); drop those lengths."
            )
        l = getattr(model, "training_length", None)
        split = split or getattr(self, "_gen_subset", None) or "test"
        stream = split_stream(self.args.data.split(":")[0], split, self.dictionary, self.args.dataset_impl)
        if self.args.eval_tokens < 0:
            raise ValueError(f"--eval-tokens must be >= 0, got {self.args.eval_tokens}.")
        if self.args.eval_tokens:
            stream = stream[: self.args.eval_tokens]
        key_tokens, longppl = None, None
        if self.key_token_rule is not None:
            key_tokens, longppl = self._key_tokens(model, stream, l, max_tokens)
        modes = self.modes
        results = []
        # a RoPE scaling (auto: s per length) or a temperature (beta per length): one spec per length
        scaled = self.args.rope_scaling is not None or self.args.attention_temperature is not None
        for mode in modes:
            options = self.attention_options.for_mode(mode)
            for lengths in ([[L] for L in self.eval_lengths] if scaled else [self.eval_lengths]):
                spec = options.spec(l, lengths[0])
                rows = evaluate_lengths(model, stream, lengths, spec, self.dictionary.eos(), self.dictionary.pad(),
                                        max_tokens=max_tokens, training_length=l, key_tokens=key_tokens)
                if self.args.fixed_target_tokens:
                    rows += evaluate_fixed_target(model, stream, lengths, spec, self.dictionary.pad(),
                                                  self.args.fixed_target_tokens, self.args.fixed_target_samples, max_tokens,
                                                  longest=max(self.eval_lengths))
                if scaled:  # one label for every length: "full+yarn(s=auto)", "full+beta(C=0.1)"
                    for r in rows:
                        r.window = row_label(spec, self.attention_options)
                results += rows
        table = format_table(results, l)
        print(f"\nLength-stratified evaluation of {split} ({stream.numel():,} tokens), training length l = {l}\n{table}\n", flush=True)
        report = {"split": split, "split_tokens": stream.numel(), "training_length": l,
                  "data": self.args.data, "results": [r.to_dict() for r in results]}
        if longppl is not None:
            report["longppl"] = longppl
        report["provenance"] = provenance(seed=getattr(self.args, "seed", None), wall_s=time.monotonic() - self.started,
                                          cuda=next(model.parameters()).is_cuda)
        if self.args.report_json:
            Path(self.args.report_json).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.report_json).write_text(json.dumps(report, indent=2))
            logger.info("report written to %s", self.args.report_json)
        return report

    def _key_tokens(self, model, stream, training_length, max_tokens):
        """LongPPL's key tokens of ``stream`` (:func:`~lex_plugin.evaluation.longppl.find_key_tokens`) on samples
        of the longest ``--eval-lengths``, by ``--key-token-model`` or ``model``, under full attention; with
        ``--key-tokens`` those of an earlier run's report (:func:`~lex_plugin.evaluation.longppl.read_key_tokens`).

        Returns:
            ((T,) bool key-token mask, the report's ``longppl`` entry: evaluator, length, rule, key tokens, their
            positions and the stream's fingerprint).

        Raises:
            ValueError: an evaluator whose dictionary differs from the data-bin's; a ``--key-tokens`` report of
                another stream or sample length.
        """
        from ..evaluation.longppl import find_key_tokens, key_token_entry, read_key_tokens
        from ..modules.attention.spec import FULL_SPEC

        length = max(self.eval_lengths)
        if self.args.key_tokens:
            key, entry = read_key_tokens(Path(self.args.key_tokens), stream, length)
            logger.info("LongPPL: %d key tokens of %d by %s, from %s", int(key.sum()), stream.numel(), entry["evaluator"],
                        self.args.key_tokens)
            return key, entry
        evaluator, name = model, "the evaluated checkpoint"
        if self.args.key_token_model:
            from ..hub_interface import from_pretrained

            path = Path(self.args.key_token_model)
            hub = from_pretrained(path.parent, path.name, self.args.data.split(":")[0])
            if hub.src_dict.symbols != self.dictionary.symbols:
                raise ValueError(f"--key-token-model {path} has another dictionary than {self.args.data}; LongPPL compares "
                                 "the same tokens, so the evaluator must share the data-bin's dictionary.")
            evaluator, name = hub.models[0].to(next(model.parameters()).device), str(path)
        rule = self.key_token_rule.resolve(getattr(evaluator, "training_length", None) or training_length)
        if length > evaluator.max_positions():
            raise ValueError(f"the --longppl evaluator {name} takes at most {evaluator.max_positions()} positions (learned "
                             f"positions end there); it cannot read samples of {length} tokens. Give another "
                             "--key-token-model or shorter --eval-lengths.")
        logger.info("LongPPL: key tokens by %s under full attention on samples of %d tokens, %s", name, length, rule)
        key = find_key_tokens(evaluator, stream, length, FULL_SPEC, self.dictionary.eos(), self.dictionary.pad(), rule,
                              max_tokens=max_tokens)
        logger.info("LongPPL: %d key tokens of %d", int(key.sum()), stream.numel())
        return key, key_token_entry(key, stream, name, length, rule)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        """fairseq's loader; remembers the split so the length report scores the same one. With
        ``--answer-only-loss`` the split's targets outside each row's answer become padding
        (:class:`~lex_plugin.data.answer_loss.AnswerOnlyLossDataset`).

        Raises:
            ValueError: ``--answer-only-loss`` with a break mode other than eos, or rows cut in two.
            FileNotFoundError: ``--answer-only-loss`` without the split's answer lengths.
        """
        self._gen_subset = split
        dataset = super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.args.answer_only_loss:
            from fairseq import utils

            from ..data.answer_loss import AnswerOnlyLossDataset
            from ..data.finetune import load_answer_lengths

            if self.args.sample_break_mode != "eos":
                raise ValueError(f"--answer-only-loss needs --sample-break-mode eos (one row per sample), not "
                                 f"{self.args.sample_break_mode}.")
            paths = utils.split_paths(self.args.data)
            prefix = Path(paths[(epoch - 1) % len(paths)]) / split
            self.datasets[split] = AnswerOnlyLossDataset(self.datasets[split], load_answer_lengths(prefix),
                                                         self.dictionary.pad())
            dataset = self.datasets[split]
        return dataset

"""``lex_language_modeling``: fairseq's language-modeling task plus LeX evaluation.

    fairseq-eval-lm data-bin --user-dir lex_plugin --task lex_language_modeling \\
        --path checkpoint_best.pt --tokens-per-sample 8192 --bca \\
        --eval-lengths 256,512,1024,2048,4096,8192 --eval-windows full,bca --report-json report.json

* ``--bca`` / ``--sliding-window`` set the model's attention window when fairseq builds it from the
  checkpoint (no ``--model-overrides``). The training length l is the ``tokens_per_sample`` recorded in
  the checkpoint, or ``--bca-block-size``.
* ``--eval-lengths`` scores the same token stream cut into each length, for each ``--eval-windows``
  mode, prints a table (and the per-position buckets), and writes ``--report-json``. fairseq's own pass
  at ``--tokens-per-sample`` follows, as usual.
* fairseq silently skips samples longer than ``max_positions()``; this task refuses instead.
"""

import json
import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
from fairseq.data import data_utils
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from ..evaluation.length_eval import evaluate_fixed_target, evaluate_lengths, format_table
from ..modules.windowed_attention import AttentionWindow

logger = logging.getLogger(__name__)


@dataclass
class LexLanguageModelingConfig(LanguageModelingConfig):
    """fairseq's ``language_modeling`` options plus the attention window (``--bca``, ``--bca-block-size``,
    ``--sliding-window``) and the length-stratified report (``--eval-lengths`` ...)."""

    bca: bool = field(
        default=False,
        metadata={"help": "blockwise causal attention at evaluation (LeX section 3.3): blocks of l/2, l = training length"},
    )
    bca_block_size: Optional[int] = field(
        default=None,
        metadata={"help": "the length l that BCA halves into blocks (default: the checkpoint's tokens_per_sample); even"},
    )
    sliding_window: Optional[str] = field(
        default=None,
        metadata={"help": "each query attends its W most recent positions; an integer W, or 'l' for the training length"},
    )
    eval_lengths: Optional[str] = field(
        default=None, metadata={"help": "comma-separated evaluation lengths, e.g. 256,512,1024: same stream, each length"}
    )
    eval_windows: Optional[str] = field(
        default=None,
        metadata={"help": "comma-separated window modes for --eval-lengths among full,bca,sliding (default: the selected one)"},
    )
    eval_tokens: int = field(
        default=0, metadata={"help": "score only the first N tokens of the split in --eval-lengths (0: all)"}
    )
    fixed_target_tokens: int = field(
        default=0,
        metadata={"help": "also run the fixed-target protocol (Chi et al. 3.4): score the last N tokens of windows with each length"},
    )
    fixed_target_windows: int = field(default=64, metadata={"help": "number of windows for the fixed-target protocol"})
    report_json: Optional[str] = field(default=None, metadata={"help": "write the --eval-lengths results as JSON here"})


def parse_lengths(text: Optional[str]) -> List[int]:
    """'256,512' -> [256, 512]. Raises ValueError on anything but positive integers."""
    if not text:
        return []
    lengths = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) <= 0:
            raise ValueError(f"--eval-lengths takes positive integers separated by commas; got {part!r} in {text!r}.")
        lengths.append(int(part))
    return lengths


def resolve_window(mode: str, cfg, training_length: Optional[int]) -> AttentionWindow:
    """The ``AttentionWindow`` for ``mode`` under the task's flags (``--bca-block-size``,
    ``--sliding-window W|l``) and the model's training length (``AttentionWindow.for_model``).

    Raises:
        ValueError: BCA or ``--sliding-window l`` without a known training length, an odd BCA length,
            a sliding window that is not a positive integer or 'l'.
    """
    size = None
    if mode == "bca":
        size = cfg.bca_block_size
    elif mode == "sliding" and cfg.sliding_window is not None and str(cfg.sliding_window) != "l":
        if not str(cfg.sliding_window).isdigit() or int(cfg.sliding_window) <= 0:
            raise ValueError(f"--sliding-window takes a positive integer W or 'l'; got {cfg.sliding_window!r}.")
        size = int(cfg.sliding_window)
    return AttentionWindow.for_model(mode, training_length, size)


@register_task("lex_language_modeling", dataclass=LexLanguageModelingConfig)
class LexLanguageModelingTask(LanguageModelingTask):
    """fairseq ``language_modeling`` with BCA / sliding-window evaluation and length-stratified reports."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        if args.bca and args.sliding_window is not None:
            raise ValueError("choose one of --bca and --sliding-window.")
        self.eval_lengths = parse_lengths(args.eval_lengths)
        self._models = []

    @property
    def selected_mode(self) -> str:
        """``bca``, ``sliding`` or ``full``, from the command line."""
        return "bca" if self.args.bca else "sliding" if self.args.sliding_window is not None else "full"

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq's hook (eval-lm builds models through it): set the selected window on a lex_lm model.

        Raises:
            ValueError: a window flag on a model that is not lex_lm, or a window it cannot take.
        """
        model = super().build_model(cfg, from_checkpoint)
        decoder = getattr(model, "decoder", None)
        if self.selected_mode != "full" or self.eval_lengths:
            if not hasattr(decoder, "set_attention_window"):
                raise ValueError(f"--bca / --sliding-window / --eval-lengths need a lex_lm model, not {type(model).__name__}.")
            window = resolve_window(self.selected_mode, self.args, getattr(model, "training_length", None))
            decoder.set_attention_window(window)
            logger.info("attention window: %s (training length %s)", window, getattr(model, "training_length", None))
        self._models.append(weakref.ref(model))
        return model

    def eval_lm_dataloader(self, dataset, max_tokens=36000, batch_size=None, max_positions=None, **kwargs):
        """fairseq's eval-lm batches, after the length report (``--eval-lengths``) if one was asked for.

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
            self.run_length_report(max_tokens)
        return super().eval_lm_dataloader(dataset, max_tokens=max_tokens, batch_size=batch_size, max_positions=max_positions, **kwargs)

    def split_stream(self, split: str) -> torch.Tensor:
        """The whole split as one (T,) int64 token stream (fairseq's --sample-break-mode none order)."""
        path = self.args.data.split(":")[0]
        dataset = data_utils.load_indexed_dataset(f"{path}/{split}", self.dictionary, self.args.dataset_impl)
        if dataset is None:
            raise FileNotFoundError(f"split {split!r} not found under {path}")
        return torch.cat([dataset[i].long() for i in range(len(dataset))])

    def run_length_report(self, max_tokens: int) -> dict:
        """Score the split at every ``--eval-lengths`` under every ``--eval-windows`` mode (windowed modes
        block by block through the bounded cache), print the table, write ``--report-json``.

        Returns:
            The report: split, split_tokens, training_length, results (loss in bits, ppl, buckets).

        Raises:
            ValueError: more than one model, a length past the model's ``max_positions()`` (learned absolute
                positions), or a window the model cannot take.
        """
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
        split = getattr(self, "_gen_subset", None) or "test"
        stream = self.split_stream(split)
        if self.args.eval_tokens < 0:
            raise ValueError(f"--eval-tokens must be >= 0, got {self.args.eval_tokens}.")
        if self.args.eval_tokens:
            stream = stream[: self.args.eval_tokens]
        modes = [m.strip() for m in (self.args.eval_windows or self.selected_mode).split(",") if m.strip()]
        original = decoder.attention_window
        results = []
        try:
            for mode in modes:
                window = resolve_window(mode, self.args, l)
                decoder.set_attention_window(window)
                block = window.size if window.mode != "full" else None  # bounded cache: memory flat in L
                results += evaluate_lengths(model, stream, self.eval_lengths, str(window), self.dictionary.eos(),
                                            self.dictionary.pad(), max_tokens=max_tokens, training_length=l, block=block)
                if self.args.fixed_target_tokens:
                    results += evaluate_fixed_target(model, stream, self.eval_lengths, str(window), self.dictionary.pad(),
                                                     self.args.fixed_target_tokens, self.args.fixed_target_windows,
                                                     max_tokens, block=block)
        finally:
            decoder.set_attention_window(original)
        table = format_table(results, l)
        print(f"\nLength-stratified evaluation of {split} ({stream.numel():,} tokens), training length l = {l}\n{table}\n", flush=True)
        report = {"split": split, "split_tokens": stream.numel(), "training_length": l,
                  "data": self.args.data, "results": [r.to_dict() for r in results]}
        if self.args.report_json:
            Path(self.args.report_json).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.report_json).write_text(json.dumps(report, indent=2))
            logger.info("report written to %s", self.args.report_json)
        return report

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        """fairseq's loader; remembers the split so the length report scores the same one."""
        self._gen_subset = split
        return super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)

"""The reproduction's options: one frozen, typed value passed to every step (``scripts/reproduce.py`` builds it from
its flags; the value checks itself, so that every caller gets the same refusals)."""

from dataclasses import asdict, dataclass, field
from typing import Tuple

__all__ = ["ReproduceOptions"]


@dataclass(frozen=True)
class ReproduceOptions:
    """What every run of one work directory shares.

    Attributes:
        arch: the ``--arch`` preset (``lex_lm_tiny``).
        training_length: l, tokens per sample at training.
        max_update: updates per model (the same token budget for every run).
        batch_size: sequences per update.
        lr: the peak learning rate, as fairseq reads it (``"1.5e-3"``).
        seed: fairseq-train's ``--seed``.
        lengths: the evaluation lengths, sorted, l the shortest.
        eval_tokens: score the first N test tokens at every length.
        resolution_texts: texts per ``lex resolution`` call.
        methods: evaluation-time methods and probes (names of ``catalogue.METHODS`` and ``catalogue.PROBES``).
        passkey_trials: prompts per passkey cell.
        budgets: updates below ``max_update`` at which each run stops, keeps ``checkpoint_uN.pt``, is evaluated,
            and resumes the same schedule.
        bf16_autocast: train under bf16 autocast (fp32 weights and optimizer state).
        probe_windows: the attention modes the probes (passkey, RULER-lite, BABILong-lite, LongPPL) compare, among
            ``catalogue.PROBE_WINDOWS`` and ``leaky_rerope``; each run takes those that apply to it
            (``commands.probe_windows``). Empty: all of them.
        finetune_seeds: the seeds of the probes' fine-tuning (``passkey_finetuned``, ``ruler``, ``babilong``), each
            fine-tuned and probed apart (``passkey_ft_seedN/``, ``passkey_finetuned_seedN.json``,
            ``ruler_answers_seedN.json`` ...; ``seed``'s own under the plain names). Empty: ``seed`` alone.

    Raises:
        ValueError: an odd or non-positive l (BCA's blocks are l/2); lengths without l or with one below it;
            ``eval_tokens`` below the longest length; a budget outside 1 .. max_update - 1; non-positive updates,
            batch, texts or trials; a method, probe or probe window that does not exist. The message names the
            ``scripts/reproduce.py`` flag.
    """

    arch: str = "lex_lm_tiny"
    training_length: int = 256
    max_update: int = 300
    batch_size: int = 16
    lr: str = "1.5e-3"
    seed: int = 1
    lengths: Tuple[int, ...] = field(default_factory=tuple)
    eval_tokens: int = 49152
    resolution_texts: int = 8
    methods: Tuple[str, ...] = ()
    passkey_trials: int = 10
    budgets: Tuple[int, ...] = ()
    bf16_autocast: bool = False
    probe_windows: Tuple[str, ...] = ()
    finetune_seeds: Tuple[int, ...] = ()

    def __post_init__(self):  # lists given by callers become tuples: the value stays frozen
        for name in ("lengths", "methods", "budgets", "probe_windows", "finetune_seeds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        from .catalogue import METHODS, PROBE_WINDOWS, PROBES

        l = self.training_length
        if l < 2 or l % 2:
            raise ValueError(f"--training-length {l}: BCA cuts l into blocks of l/2; give an even length of 2 or more.")
        for flag, value in (("--max-update", self.max_update), ("--batch-size", self.batch_size),
                            ("--resolution-texts", self.resolution_texts), ("--passkey-trials", self.passkey_trials)):
            if value < 1:
                raise ValueError(f"{flag} {value}: give 1 or more.")
        if self.lengths and (l not in self.lengths or min(self.lengths) < l):
            raise ValueError(f"--lengths {','.join(map(str, self.lengths))} must include the training length {l} and "
                             "nothing shorter.")
        if self.lengths and self.eval_tokens < max(self.lengths):
            raise ValueError(f"--eval-tokens {self.eval_tokens} is shorter than the longest length {max(self.lengths)}.")
        if any(not 0 < b < self.max_update for b in self.budgets):
            raise ValueError(f"budgets {sorted(self.budgets)} must lie in 1..{self.max_update - 1}: the last checkpoint "
                             f"(--max-update {self.max_update}) is always evaluated; give --budgets with --max-update.")
        unknown = [m for m in self.methods if m not in METHODS and m not in PROBES]
        if unknown:
            raise ValueError(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join([*METHODS, *PROBES])}.")
        if len(set(self.finetune_seeds)) != len(self.finetune_seeds):
            raise ValueError(f"--finetune-seeds {','.join(map(str, self.finetune_seeds))}: a seed given twice.")
        unknown = [w for w in self.probe_windows if w not in (*PROBE_WINDOWS, "leaky_rerope")]
        if unknown:
            raise ValueError(f"--probe-windows: unknown {', '.join(unknown)}; choose from "
                             f"{', '.join((*PROBE_WINDOWS, 'leaky_rerope'))}.")

    @property
    def extra_seeds(self) -> Tuple[int, ...]:
        """The fine-tuning seeds other than ``seed``, in the order given."""
        return tuple(s for s in self.finetune_seeds if s != self.seed)

    def as_json(self) -> dict:
        """The options as WORK/options.json and results.json record them (lists for the tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

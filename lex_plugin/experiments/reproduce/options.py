"""The reproduction's options: one frozen, typed value passed to every step (``scripts/reproduce.py`` builds it from
its flags, after checking them)."""

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

    def __post_init__(self):  # lists given by callers become tuples: the value stays frozen
        for name in ("lengths", "methods", "budgets", "probe_windows"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def as_json(self) -> dict:
        """The options as WORK/options.json and results.json record them (lists for the tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

"""Which keys a query may attend: full causal attention, blockwise causal attention (BCA), sliding window.

Vocabulary (used the same way by the task's flags, every ``lex`` command, the hub and the code):

* training length l: the ``--tokens-per-sample`` a checkpoint was trained with;
* BCA block w = l / 2 (LeX section 3.3, Figure 3): queries of block b attend causally to their own block
  and to all of block b - 1, so each query (past the first block) sees between w + 1 and 2w = l keys;
* sliding width W: each query attends its W most recent positions, itself included (the locality
  baseline of LeX Table 5 and of the receptive-field paper).

Both windowed kinds have a *stride* c (w for BCA, W for the sliding window): the queries of block b of c
positions only ever need the keys of blocks b - 1 and b, which is how the planner cuts long inputs.
"""

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ["AttentionWindow", "selected_mode", "window_from_options"]

MODES = ("full", "bca", "sliding")


@dataclass(frozen=True)
class AttentionWindow:
    """Which keys a query may attend. Build one with :meth:`full`, :meth:`bca` or :meth:`sliding`.

    Attributes:
        mode: ``full``, ``bca`` or ``sliding``.
        stride: c: the BCA block w = l / 2, or the sliding width W; 0 for ``full``.

    Raises:
        ValueError: unknown mode, or a non-positive stride for bca / sliding.
    """

    mode: str = "full"
    stride: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention window mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "full" and self.stride <= 0:
            raise ValueError(f"{self.mode} needs a positive size, got {self.stride}")

    @classmethod
    def full(cls) -> "AttentionWindow":
        """Causal attention over every earlier position."""
        return cls()

    @classmethod
    def bca(cls, training_length: int) -> "AttentionWindow":
        """BCA for a model trained on ``training_length`` = l tokens: blocks of w = l / 2.

        Raises:
            ValueError: l odd or < 2.
        """
        if training_length < 2 or training_length % 2:
            raise ValueError(
                f"BCA cuts the training length l into blocks of l/2, so l must be even and >= 2; got {training_length}."
            )
        return cls("bca", training_length // 2)

    @classmethod
    def sliding(cls, width: int) -> "AttentionWindow":
        """Each query attends its ``width`` = W most recent positions, itself included.

        Raises:
            ValueError: W < 1.
        """
        if width < 1:
            raise ValueError(f"the sliding window width W must be a positive integer, got {width}.")
        return cls("sliding", int(width))

    @property
    def bounded(self) -> bool:
        """True for BCA and sliding windows: a query sees at most 2c (BCA) or c keys."""
        return self.mode != "full"

    @property
    def training_length(self) -> Optional[int]:
        """l for BCA (2w), else None."""
        return 2 * self.stride if self.mode == "bca" else None

    @property
    def span(self) -> Optional[int]:
        """The most keys one query can see, itself included: 2w = l (BCA), W (sliding), None (full)."""
        if self.mode == "full":
            return None
        return 2 * self.stride if self.mode == "bca" else self.stride

    def covers(self, length: int) -> bool:
        """True if, for sequences of ``length`` positions, this window is plain causal attention."""
        if self.mode == "full":
            return True
        return length <= (2 * self.stride if self.mode == "bca" else self.stride)

    def first_key(self, position: Union[int, Tensor]):
        """Position of the earliest key visible to a query at ``position`` (an int, or an int64 tensor of
        positions, elementwise)."""
        if self.mode == "full":
            first = position * 0
        elif self.mode == "bca":
            first = (position // self.stride - 1) * self.stride
        else:
            first = position - self.stride + 1
        return first.clamp(min=0) if isinstance(first, Tensor) else max(0, first)

    def allowed(self, query: Tensor, key: Tensor) -> Tensor:
        """Boolean visibility of keys at positions ``key`` to queries at ``query`` (broadcast):
        first_key(query) <= key <= query."""
        return (key <= query) & (key >= self.first_key(query))

    def mask(self, length: int, device=None) -> Tensor:
        """The explicit (length, length) boolean mask (True = may attend), for tests and analysis: O(L^2)."""
        i = torch.arange(length, device=device)
        return self.allowed(i[:, None], i[None, :])

    def __str__(self) -> str:
        return "full" if self.mode == "full" else f"{self.mode}({self.stride})"


def window_from_options(
    mode: str = "full",
    sliding_window: Optional[Union[int, str]] = None,
    training_length: Optional[int] = None,
    model_training_length: Optional[int] = None,
) -> AttentionWindow:
    """The one translation from user options to a window (task flags, ``lex`` commands, hub).

    Args:
        mode: ``full``, ``bca`` or ``sliding``.
        sliding_window: W for ``sliding``: a positive integer, or ``l`` (the training length); default l.
        training_length: ``--training-length``: l to use instead of the checkpoint's.
        model_training_length: the ``tokens_per_sample`` recorded in the checkpoint, or None.

    Raises:
        ValueError: an unknown mode; BCA or ``sliding`` with W = l when l is unknown; an odd l for BCA;
            a width that is neither a positive integer nor ``l``; a non-positive ``training_length``.
    """
    if training_length is not None and int(training_length) <= 0:
        raise ValueError(f"--training-length must be a positive integer, got {training_length}.")
    length = int(training_length) if training_length else model_training_length
    if mode == "full":
        return AttentionWindow.full()
    if mode not in MODES:
        raise ValueError(f"attention window mode must be one of {', '.join(MODES)}, got {mode!r}.")
    width = None
    if mode == "sliding" and sliding_window is not None and str(sliding_window).strip() != "l":
        text = str(sliding_window).strip()
        if not text.isdigit() or int(text) <= 0:
            raise ValueError(f"--sliding-window takes a positive integer W or 'l' (the training length); got {sliding_window!r}.")
        width = int(text)
    if width is None and not length:
        raise ValueError(
            f"{mode} needs the training length l, and this checkpoint records no tokens_per_sample; give it with "
            "--training-length l" + (" (or --sliding-window W)." if mode == "sliding" else ".")
        )
    return AttentionWindow.bca(int(length)) if mode == "bca" else AttentionWindow.sliding(width or int(length))


def selected_mode(bca: bool, sliding_window: Optional[Union[int, str]]) -> str:
    """``bca``, ``sliding`` or ``full`` from the flags ``--bca`` and ``--sliding-window``.

    Raises:
        ValueError: both given.
    """
    if bca and sliding_window is not None:
        raise ValueError("choose one of --bca and --sliding-window.")
    return "bca" if bca else "sliding" if sliding_window is not None else "full"

"""The one matplotlib set-up of the package: every PNG (``lex plot``, the analysis commands, the passkey heat
map, the reproduction's panels) is drawn inside :func:`figure`, and length axes get :func:`log_axes`."""

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Tuple

__all__ = ["figure", "heat_map", "log_axes"]


@contextmanager
def figure(out: Path, rows: int = 1, cols: int = 1, size: Tuple[float, float] = (7.0, 4.5), dpi: int = 120,
           **subplots) -> Iterator[tuple]:
    """A figure of ``rows`` x ``cols`` panels (``size`` in inches, for the whole figure) on the Agg backend
    (no display needed); on leaving the block it is laid out tightly, written to the PNG ``out`` (its
    directory created) and closed, also when the block raises.

    Yields:
        (fig, axes) as ``plt.subplots`` returns them (``squeeze`` and ``sharey`` etc. via ``subplots``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, dpi=dpi, **subplots)
    try:
        yield fig, axes
        if not subplots.get("constrained_layout"):
            fig.tight_layout()
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, bbox_inches="tight")
    finally:
        plt.close(fig)


def log_axes(ax, x_base: int = 2, log_y: bool = True) -> None:
    """Length on a log (base ``x_base``) x axis and, with ``log_y``, a log y axis, both labelled with plain
    numbers (256, 1024, 12.5) instead of powers."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.set_xscale("log", base=x_base)
    ax.xaxis.set_major_formatter(plain)
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)


def heat_map(ax, grid, xlabels, ylabels, fmt: str = "{:.2f}"):
    """Scores in [0, 1] as a red-yellow-green heat map on ``ax``, each cell's value written in it (``-`` for NaN:
    a cell not measured), ``xlabels`` / ``ylabels`` under the columns / beside the rows.

    Args:
        grid: rows x columns of floats (a list of lists).

    Returns:
        The image, for a colour bar.
    """
    import math

    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
    ax.set_xticks(range(len(xlabels)), xlabels)
    ax.set_yticks(range(len(ylabels)), ylabels)
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            ax.text(j, i, "-" if math.isnan(value) else fmt.format(value), ha="center", va="center", fontsize=7)
    return image

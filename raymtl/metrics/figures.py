"""Matplotlib building blocks shared by every plot: save a figure, draw a band, a legend.

Figures are built with ``matplotlib.figure.Figure`` (rendered by the Agg canvas) rather than
pyplot, so no global figure state or GUI backend is involved and figures are freed when dropped.
Matplotlib is imported by `new_figure`, when a plot is drawn: a run that draws none (and every
run until its end) does not pay its import.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def new_figure(**settings) -> Figure:
    """A matplotlib Figure (figsize=..., layout=...), matplotlib imported on first use."""
    from matplotlib.figure import Figure

    return Figure(**settings)


def save_figure(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as PNG at ``path`` (creating parent folders)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def add_legend_if_labelled(axes: Axes) -> None:
    """Legend only when something was drawn (an empty run would otherwise warn)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend()


def draw_band(axes: Axes, x, curves: pd.DataFrame, label: str) -> None:
    """Line for the mean across seeds with a shaded min/max band."""
    (line,) = axes.plot(x, curves["mean"], label=label)
    axes.fill_between(x, curves["min"], curves["max"], color=line.get_color(), alpha=0.2)


# A bits axis is logarithmic only when its values span more than this factor: a few percent
# between arms on a log axis is a sliver with labels only at its minor ticks.
LOG_SPAN = 10.0
# A linear bits axis runs from 0 to this fraction above the largest value drawn.
LINEAR_HEADROOM = 0.15
# Most labelled ticks on a bits axis: wider labels (10^6, 1.5 M) than a round's.
BITS_TICKS = 5


def scale_bits_axis(axes: Axes, which: str, values) -> str:
    """Scale and ticks of `axes`' x or y axis (`which`) holding bits, from the `values`
    drawn on it; labels in engineering notation (500 k, 1.5 M, 10 G), short enough not to
    collide. Log when the positive values span more than LOG_SPAN: labels at 1, 2 and 5
    times powers of 10 over two decades or less, else at powers of 10 only (at most
    BITS_TICKS + 1 of them), none at the other minor ticks. Else linear from 0 with at most
    BITS_TICKS labels, up to LINEAR_HEADROOM above the largest value. Returns the scale."""
    from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter

    axis = axes.xaxis if which == "x" else axes.yaxis
    set_scale = axes.set_xscale if which == "x" else axes.set_yscale
    positive = pd.Series(values, dtype=float)
    positive = positive[positive > 0]
    spread = positive.max() / positive.min() if not positive.empty else 1.0
    if spread > LOG_SPAN:
        set_scale("log")
        subs = (1.0, 2.0, 5.0) if spread <= 100 else (1.0,)
        axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=BITS_TICKS + 1))
        axis.set_major_formatter(EngFormatter(places=None, sep=" "))
        axis.set_minor_formatter(NullFormatter())
        return "log"
    set_scale("linear")
    axis.set_major_locator(MaxNLocator(nbins=BITS_TICKS - 1, min_n_ticks=2))
    axis.set_major_formatter(EngFormatter(places=None, sep=" "))
    top = positive.max() * (1 + LINEAR_HEADROOM) if not positive.empty else None
    (axes.set_xlim if which == "x" else axes.set_ylim)(0, top)
    return "linear"

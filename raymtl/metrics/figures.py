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

"""Axes of bits in the comparison plots: log only where the arms span more than 10x (a 2 %
difference on a log axis is a sliver labelled at its minor ticks), and tick labels that do
not overlap (issue 41)."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from raymtl.metrics import figures, plots

ROUNDS = 5


def rounds_table(bits_per_round: float, accuracy_step: float = 0.1) -> pd.DataFrame:
    """A run's rounds table (one seed): every round evaluated, `bits_per_round` bits each."""
    rows = []
    for round_index in range(1, ROUNDS + 1):
        accuracy = min(1.0, 0.2 + accuracy_step * round_index)
        rows.append(
            {
                "seed": 0,
                "round": round_index,
                "mean_loss": 1.0 / round_index,
                "mean_accuracy": accuracy,
                "worst10_accuracy": accuracy - 0.1,
                "bits_up": bits_per_round / 2,
                "bits_down": bits_per_round / 2,
                "cum_bits": bits_per_round * round_index,
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions save, drawn by the Agg canvas (as savefig draws)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figures_saved = []

    def save(figure, path):
        figures_saved.append(figure)
        return figures.save_figure(figure, path)

    monkeypatch.setattr(plots, "save_figure", save)

    def last():
        figure = figures_saved[-1]
        FigureCanvasAgg(figure).draw()
        return figure

    return last


def labels_overlap(axes, which: str) -> list[tuple[str, str]]:
    """Pairs of visible tick labels (major and minor) of `axes`' x or y axis whose boxes
    overlap once drawn."""
    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    axis = axes.xaxis if which == "x" else axes.yaxis
    low, high = sorted(axes.get_xlim() if which == "x" else axes.get_ylim())
    shown = []
    for label in axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True):
        where = label.get_position()[0 if which == "x" else 1]
        if label.get_visible() and label.get_text() and low <= where <= high:
            shown.append((label.get_text(), label.get_window_extent(renderer)))
    return [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(shown, 2)
        if box_a.overlaps(box_b)
    ]


def labelled_ticks(axes, which: str) -> list[str]:
    axis = axes.xaxis if which == "x" else axes.yaxis
    low, high = sorted(axes.get_xlim() if which == "x" else axes.get_ylim())
    return [
        label.get_text()
        for label in axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True)
        if label.get_text() and low <= label.get_position()[0 if which == "x" else 1] <= high
    ]


def test_two_arms_two_percent_apart_get_a_linear_axis_from_zero(tmp_path, drawn):
    arms = {"fedavg": rounds_table(1.0e6), "fedprox": rounds_table(1.02e6)}
    plots.plot_bits_per_round(arms, tmp_path / "bits.png")
    (axes,) = drawn().axes
    assert axes.get_yscale() == "linear"
    bottom, top = axes.get_ylim()
    assert bottom == 0 and top >= 1.02e6
    assert not labels_overlap(axes, "y") and 2 <= len(labelled_ticks(axes, "y")) <= 6

    plots.plot_comparison_metric(arms, "mean_accuracy", tmp_path / "accuracy.png")
    _, bits_axes = drawn().axes
    assert bits_axes.get_xscale() == "linear" and bits_axes.get_xlim()[0] == 0
    assert not labels_overlap(bits_axes, "x")


def test_arms_a_thousand_times_apart_get_a_log_axis(tmp_path, drawn):
    arms = {"fedavg": rounds_table(1.0e6), "sheaf": rounds_table(1.0e3)}
    plots.plot_bits_per_round(arms, tmp_path / "bits.png")
    (axes,) = drawn().axes
    assert axes.get_yscale() == "log"
    assert not labels_overlap(axes, "y")

    plots.plot_comparison_metric(arms, "mean_accuracy", tmp_path / "accuracy.png")
    _, bits_axes = drawn().axes
    assert bits_axes.get_xscale() == "log"
    assert not labels_overlap(bits_axes, "x")


@pytest.mark.parametrize(
    "bits",
    [
        (1.0e6, 1.02e6),  # linear
        (3.0e5, 4.5e5),  # linear: 3e5 to 2.25e6 cumulative
        (2.0e7, 5.0e7, 9.0e7),  # 1.35 decades: a log axis used to label 2-4 x 10^7, 10^8,
        # 2-4 x 10^8 on top of each other
        (1.0e6, 1.5e7),  # labels at 1, 2 and 5 times the powers of 10
        (1.0e3, 1.0e6),
        (1.0, 1.0e12),  # twelve decades on one axis
    ],
)
def test_accuracy_against_bits_tick_labels_do_not_overlap(tmp_path, drawn, bits):
    arms = {f"arm {i}": rounds_table(value) for i, value in enumerate(bits)}
    plots.plot_comparison_metric(arms, "mean_accuracy", tmp_path / "accuracy.png")
    _, bits_axes = drawn().axes
    assert not labels_overlap(bits_axes, "x")
    assert len(labelled_ticks(bits_axes, "x")) >= 2  # still readable
    plots.plot_accuracy_vs_bits(arms["arm 0"], tmp_path / "one.png")
    assert not labels_overlap(drawn().axes[0], "x")


def test_a_run_without_communication_keeps_its_marker_on_a_log_axis(tmp_path, drawn):
    local = rounds_table(0.0)
    arms = {"fedavg": rounds_table(1.0e6), "local": local}
    plots.plot_comparison_metric(arms, "mean_accuracy", tmp_path / "accuracy.png")
    _, bits_axes = drawn().axes
    assert bits_axes.get_xscale() == "log"
    assert any("no bits sent" in text for text in bits_axes.get_legend_handles_labels()[1])

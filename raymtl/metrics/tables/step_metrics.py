"""Reporter of step_metrics.parquet: the scalars steps report (`ctx.report(**scalars)`: a
FedNova client's τ, the server's DP clip bound and clipped count, a client's sample-level ε).

Adds `summary["step_metrics"]`: per scalar, its mean over the rows of the last round each
seed reported it and its maximum there; and `summary["sample_epsilon"]`, the largest
sample-level ε of any client at the end (privacy.sample_level), when there is one.
"""

from __future__ import annotations

from pathlib import Path

from raymtl.metrics.extras import table_reporter
from raymtl.metrics.recorder import Recorder

KEYS = ("seed", "round", "participant")


@table_reporter("step_metrics")
def report_step_metrics(run_dir: Path, summary: dict) -> None:
    table = Recorder.load(run_dir).table("step_metrics")
    figures = {}
    for column in table.columns:
        values = table[["seed", "round", column]].dropna()
        if column in KEYS or values.empty or values[column].dtype == object:
            continue
        last = values[values["round"] == values.groupby("seed")["round"].transform("max")]
        figures[column] = {"mean": float(last[column].mean()), "max": float(last[column].max())}
    if figures:
        summary["step_metrics"] = figures
    if "sample_epsilon" in table.columns and table["sample_epsilon"].notna().any():
        summary["sample_epsilon"] = float(table["sample_epsilon"].max())

"""`raymtl compare`: several algorithms on one partition and one set of seeds.

Each experiment runs into its own run directory inside the comparison directory;
the comparison adds one table (CSV + JSON + printed) and side-by-side figures.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

from raymtl.config import ConfigError, ExperimentConfig, apply_override, load_raw, parse_config
from raymtl.runtime_paths import make_directory


def expand_experiments(items: list[str]) -> list[ExperimentConfig]:
    """Files and `a.b=v` overrides -> configs; `a.b=x,y` fans one file out into several."""
    files = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if not files:
        raise ConfigError("compare: give at least one experiment file")
    fan_key, fan_values = None, [None]
    for item in overrides:
        key, _, value = item.partition("=")
        # A YAML list or mapping (rotations=[0,90]) is one value, not values to fan out.
        if "," in value and not value.lstrip().startswith(("[", "{")):
            if fan_key is not None:
                raise ConfigError(f"{key}: only one override may list several values")
            fan_key, fan_values = key, [v.strip() for v in value.split(",")]
    fixed = [item for item in overrides if not item.startswith(f"{fan_key}=")]
    configs = []
    for path in files:
        base = load_raw(path, fixed)
        for value in fan_values:
            raw = copy.deepcopy(base)
            if fan_key is not None:
                apply_override(raw, f"{fan_key}={value}")
                raw["name"] = f"{raw.get('name', Path(path).stem)}-{value}"
            configs.append(parse_config(raw))
    check_same_setting(configs)
    return configs


def check_same_setting(configs: list[ExperimentConfig]) -> None:
    """A comparison is only fair on the same data partition and seeds."""
    first = configs[0]
    for other in configs[1:]:
        for field in ("data", "seeds", "rounds"):
            if getattr(other, field) != getattr(first, field):
                raise ConfigError(
                    f"{field}: '{other.name}' differs from '{first.name}' (compare needs the same)"
                )
    names = [cfg.name for cfg in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"name: experiments to compare need distinct names, got {names}")


def compare_experiments(
    configs: list[ExperimentConfig], out: Path | None, run_one: Callable, console
) -> Path:
    """Run every config into `out` (default runs/compare-<time>) and tabulate them."""
    from raymtl.metrics import plot_comparison, results_table
    from raymtl.metrics.delta import delta_table, local_reference, record_deltas

    if out is None and "://" in configs[0].output.dir:
        raise ConfigError("--out: give a local comparison folder when output.dir is a URI")
    out = (
        Path(out)
        if out
        else Path(configs[0].output.dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out: '{out}' exists and is not empty; compare writes a new directory")
    make_directory(out)
    runs: dict[str, Path] = {}
    for cfg in configs:
        runs[cfg.name] = run_one(cfg, out / cfg.name)
    summaries = [
        {**json.loads((run_dir / "summary.json").read_text()), "algorithm": name}
        for name, run_dir in runs.items()
    ]
    reference = local_reference(configs)
    if reference is not None:  # Δ%: each arm's mean relative gain over Local across clients
        deltas = record_deltas(runs, reference, out)
        for summary in summaries:
            summary["delta_vs_local"] = deltas[summary["algorithm"]]
    (out / "summary.json").write_text(json.dumps(summaries, indent=2))
    write_table_csv(summaries, out / "table.csv")
    plot_comparison(runs, out / "plots")
    console.print(results_table(summaries, title=f"comparison ({len(runs)} experiments)"))
    if any(summary.get("tasks") for summary in summaries):
        from raymtl.metrics.tasks import task_table

        write_task_csv(summaries, out / "table_tasks.csv")
        console.print(task_table(summaries, title="per task"))
    if reference is not None:
        console.print(delta_table(summaries))
    console.print(f"comparison in [bold]{out}[/]")
    return out


def write_table_csv(summaries: list[dict], path: Path) -> None:
    """One row per experiment: each final figure's mean and std over seeds."""
    import pandas as pd

    rows = []
    for summary in summaries:
        row = {"experiment": summary["algorithm"]}
        for key, value in summary["final"].items():
            row[f"{key}_mean"], row[f"{key}_std"] = value["mean"], value["std"]
        rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)


def write_task_csv(summaries: list[dict], path: Path) -> None:
    """One row per (experiment, task): each final figure's mean and std over seeds."""
    import pandas as pd

    rows = []
    for summary in summaries:
        for task, figures in summary.get("tasks", {}).items():
            row = {"experiment": summary["algorithm"], "task": task, "metric": figures["metric"]}
            for key, value in figures["final"].items():
                row[f"{key}_mean"], row[f"{key}_std"] = value["mean"], value["std"]
            rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)

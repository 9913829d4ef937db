"""The Python API (`raymtl.run`, `raymtl.resume`, `raymtl.load_results`): the CLI's run and
report, without a console. Errors are the CLI's: a `ConfigError` with one line naming the
field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Results:
    """A run's outputs: its resolved config, summary.json and every Parquet table."""

    run_dir: Path
    config: dict
    summary: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def clients(self) -> pd.DataFrame:
        return self.tables["clients"]

    @property
    def rounds(self) -> pd.DataFrame:
        return self.tables["rounds"]

    @property
    def messages(self) -> pd.DataFrame:
        return self.tables["messages"]


def run(experiment, overrides: list[str] = (), run_dir: str | Path | None = None) -> Path | str:
    """Run an experiment (a YAML path, or an `ExperimentConfig`) with `a.b=value` overrides;
    returns the absolute run directory (or its URI, when output.dir is one) once the summary
    and plots are written."""
    from raymtl.config import ExperimentConfig, load_config
    from raymtl.runtime import run_experiment

    if isinstance(experiment, ExperimentConfig):
        cfg = experiment
        if overrides:
            from raymtl.config import apply_override, parse_config

            raw = cfg.model_dump(mode="json")
            for assignment in overrides:
                apply_override(raw, assignment)
            cfg = parse_config(raw)
    else:
        cfg = load_config(experiment, list(overrides))
    return absolute(run_experiment(cfg, run_dir))


def resume(run_dir: str | Path, overrides: list[str] = ()) -> Path:
    """Continue an interrupted run (only `rounds` may change, and only grow)."""
    from raymtl.runtime import resume_experiment

    return absolute(resume_experiment(run_dir, overrides=list(overrides)))


def absolute(run_dir) -> Path | str:
    """A local run directory as an absolute Path; a URI as it is."""
    return run_dir if "://" in str(run_dir) else Path(run_dir).resolve()


def load_results(run_dir: str | Path) -> Results:
    """A finished (or interrupted) run's tables as pandas frames, its config and summary."""
    import json

    import yaml

    from raymtl.config import ConfigError
    from raymtl.metrics.recorder import Recorder

    if "://" in str(run_dir):  # a run kept at a URI: its outputs, fetched to a local folder
        from raymtl.runtime.api import staging_dir
        from raymtl.runtime.storage import Location, fetch

        store = Location.of(str(run_dir))
        run_dir = staging_dir(store)
        fetch(store, run_dir)
    run_dir = Path(run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir: '{run_dir}' has no config.yaml (not a run directory)")
    recorder = Recorder.load(run_dir)
    names = {"clients", "rounds", "messages", *(p.stem for p in run_dir.glob("*.parquet"))}
    summary_path = run_dir / "summary.json"
    return Results(
        run_dir=run_dir,
        config=yaml.safe_load((run_dir / "config.yaml").read_text()),
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else {},
        tables={name: recorder.table(name) for name in sorted(names)},
    )

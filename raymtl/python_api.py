"""The Python API: `raymtl.run`, `raymtl.resume` and `raymtl.load_results`.

`raymtl run` is this module with a progress bar (a `Callback`) and a printed table. An
experiment is an `ExperimentConfig`, a raw mapping (validated as a YAML file would be) or the
path of a YAML file; errors are the CLI's: a `ConfigError` with one line naming the field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from raymtl.callbacks import Callback
from raymtl.config import ConfigError, ExperimentConfig, apply_override, load_raw, parse_config
from raymtl.metrics.recorder import Recorder
from raymtl.runtime.run_dirs import staging_dir
from raymtl.runtime.storage import Location, fetch, is_uri

Experiment = ExperimentConfig | Mapping | str | Path


@dataclass(frozen=True)
class Results:
    """A run's outputs: its resolved config, summary.json and every Parquet table.

    `run_dir` is always a local folder holding them: for a run kept at a URI (`uri`), the
    staging folder the driver wrote before publishing.
    """

    run_dir: Path
    config: dict
    summary: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    uri: str | None = None

    @property
    def clients(self) -> pd.DataFrame:
        return self.tables["clients"]

    @property
    def rounds(self) -> pd.DataFrame:
        return self.tables["rounds"]

    @property
    def messages(self) -> pd.DataFrame:
        return self.tables["messages"]

    @property
    def location(self) -> str:
        """Where the run lives: its URI, or its local folder."""
        return self.uri or str(self.run_dir)


def raw_experiment(experiment: Experiment, overrides: Iterable[str] = ()) -> dict:
    """The experiment as a raw mapping (a copy), with `a.b=value` overrides applied."""
    if isinstance(experiment, ExperimentConfig):
        raw = experiment.model_dump(mode="json")
    elif isinstance(experiment, Mapping):
        raw = copy.deepcopy(dict(experiment))
    elif isinstance(experiment, str | Path):
        raw = load_raw(experiment)
    else:
        raise ConfigError(
            f"experiment: give an ExperimentConfig, a mapping or a YAML path, "
            f"not {type(experiment).__name__}"
        )
    for assignment in overrides:
        apply_override(raw, assignment)
    return raw


def experiment_config(experiment: Experiment, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """The validated experiment (an `ExperimentConfig` without overrides is taken as it is)."""
    overrides = list(overrides)
    if isinstance(experiment, ExperimentConfig) and not overrides:
        return experiment
    return parse_config(raw_experiment(experiment, overrides))


def run(
    experiment: Experiment,
    overrides: Iterable[str] = (),
    callbacks: Iterable[Callback] = (),
    run_dir: str | Path | None = None,
) -> Results:
    """Run every seed of an experiment into a new run directory (or `run_dir`: a path or a
    URI) and return its results once the summary (and plots, unless `output.plots` is
    false) are written. `callbacks` run on this process after every round."""
    from raymtl.runtime import run_experiment  # Ray: only when something runs

    cfg = experiment_config(experiment, overrides)
    return results_of(run_experiment(cfg, run_dir, callbacks=tuple(callbacks)))


def resume(
    run_dir: str | Path, overrides: Iterable[str] = (), callbacks: Iterable[Callback] = ()
) -> Results:
    """Continue an interrupted run (a path or a URI) from its last complete checkpoint; only
    `rounds` (and `runtime`) may change, and rounds only grow."""
    from raymtl.runtime import resume_experiment  # Ray: only when something runs

    where = resume_experiment(run_dir, overrides=list(overrides), callbacks=tuple(callbacks))
    return results_of(where)


def results_of(where: str | Path) -> Results:
    """The results the driver just wrote: in the run folder, or a URI run's staging folder."""
    if not is_uri(where):
        return read_results(Path(where))
    return read_results(staging_dir(Location.of(str(where))), uri=str(where))


def load_results(run_dir: str | Path) -> Results:
    """A finished (or interrupted) run's tables as pandas frames, its config and summary; a run
    kept at a URI is fetched into its local staging folder first."""
    if not is_uri(run_dir):
        return read_results(Path(run_dir))
    store = Location.of(str(run_dir))
    local = staging_dir(store)
    fetch(store, local)
    return read_results(local, uri=store.uri)


def read_results(run_dir: Path, uri: str | None = None) -> Results:
    run_dir = Path(run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir: '{uri or run_dir}' has no config.yaml (not a run directory)")
    recorder = Recorder.load(run_dir)
    names = {"clients", "rounds", "messages", *(p.stem for p in run_dir.glob("*.parquet"))}
    summary_path = run_dir / "summary.json"
    return Results(
        run_dir=run_dir,
        config=yaml.safe_load((run_dir / "config.yaml").read_text()),
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else {},
        tables={name: recorder.table(name) for name in sorted(names)},
        uri=uri,
    )

"""`MLflowCallback`: a run's parameters, per-round metrics and outputs in MLflow.

    raymtl.run("jobs/fedavg_digits.yaml", callbacks=[raymtl.MLflowCallback()])
    raymtl run jobs/fedavg_digits.yaml --mlflow        # or --mlflow-uri http://host:5000

One MLflow run per raymtl run (named after its folder) holds the resolved config as params
(flattened: `algorithm.params.lr`), the final figures of summary.json (`final.mean_accuracy`)
and, as artifacts, the run directory's outputs (config, Parquet tables, summary, plots; not
the checkpoints). Under it, one nested run per seed ("seed 0") holds every numeric column of
rounds.parquet (mean_accuracy, mean_loss, bits_up, cum_bits, wall_time ...) at step = round.
A resumed run goes on in the MLflow runs it started (found by the tag `raymtl.run_dir`).

The store is, in this order: `tracking_uri`, the MLFLOW_TRACKING_URI environment variable, or
the local file store `file:<output.dir>/mlruns` (`mlflow ui --backend-store-uri` reads it).
`mlflow-skinny` is enough for the file store and a tracking server; MLflow 3 keeps the file
store behind MLFLOW_ALLOW_FILE_STORE, which this callback sets for it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from raymtl.api.callbacks import Callback, RoundEvent
from raymtl.config import ConfigError

RUN_DIR_TAG = "raymtl.run_dir"
SEED_TAG = "raymtl.seed"
PARENT_TAG = "mlflow.parentRunId"
PARAMS_PER_BATCH = 100  # MLflow's limit for one log_batch call
PARAM_CHARS = 6000  # MLflow's longest param value
# Columns of rounds.parquet that say which round it is, not how it went.
NOT_METRICS = ("seed", "round")


def flatten(mapping: dict, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}: the config as MLflow params (lists kept whole)."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return {key: value[:PARAM_CHARS] for key, value in flat.items()}


def round_metrics(row: dict) -> dict[str, float]:
    """The round's finite numeric figures (a round without evaluation has NaN accuracy)."""
    metrics = {}
    for key, value in row.items():
        if key in NOT_METRICS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            metrics[key] = float(value)
    return metrics


class MLflowCallback(Callback):
    """Log a raymtl run to MLflow: params, per-round metrics per seed, outputs as artifacts."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError(
                "mlflow: not installed; install raymtl[mlflow] (pip install 'raymtl[mlflow]')"
            ) from None
        self.client_class = MlflowClient
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.client = None
        self.parent_id: str | None = None
        self.seed_runs: dict[int, str] = {}

    def store_uri(self, config) -> str:
        """The tracking URI: given, from the environment, or the local file store."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            return uri
        output = config.output.dir
        folder = Path.cwd() if "://" in output else Path(output).expanduser().resolve()
        return f"file:{folder / 'mlruns'}"

    def on_run_start(self, config, run_dir: Path) -> None:
        uri = self.store_uri(config)
        if uri.startswith("file:") or "://" not in uri:  # the file store (see the docstring)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = self.client_class(tracking_uri=uri)
        self.seed_runs = {}  # one callback may log several runs (raymtl.compare)
        experiment_id = self.experiment_id(self.experiment or config.name)
        existing = self.find_runs(experiment_id, f"tags.`{RUN_DIR_TAG}` = '{run_dir}'")
        parents = [run for run in existing if PARENT_TAG not in run.data.tags]
        if parents:  # a resumed run: go on in the MLflow runs it started
            self.parent_id = parents[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
            self.seed_runs = {
                int(run.data.tags[SEED_TAG]): run.info.run_id
                for run in existing
                if SEED_TAG in run.data.tags
            }
            return
        parent = self.client.create_run(
            experiment_id,
            run_name=Path(run_dir).name,
            tags={RUN_DIR_TAG: str(run_dir), "raymtl.algorithm": config.algorithm.name},
        )
        self.parent_id = parent.info.run_id
        self.log_params(self.parent_id, flatten(config.model_dump(mode="json")))

    def experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        return experiment.experiment_id if experiment else self.client.create_experiment(name)

    def find_runs(self, experiment_id: str, query: str) -> list:
        return list(self.client.search_runs([experiment_id], filter_string=query))

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in sorted(params.items())]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])

    def seed_run(self, seed: int) -> str:
        """The nested MLflow run of one seed (made on its first round)."""
        if seed not in self.seed_runs:
            parent = self.client.get_run(self.parent_id)
            run = self.client.create_run(
                parent.info.experiment_id,
                run_name=f"seed {seed}",
                tags={
                    PARENT_TAG: self.parent_id,
                    SEED_TAG: str(seed),
                    RUN_DIR_TAG: parent.data.tags[RUN_DIR_TAG],
                },
            )
            self.seed_runs[seed] = run.info.run_id
        return self.seed_runs[seed]

    def on_round_end(self, event: RoundEvent) -> None:
        from mlflow.entities import Metric

        run_id = self.seed_run(event.seed)
        stamp = current_millis()
        metrics = [
            Metric(key, value, stamp, event.round)
            for key, value in round_metrics(event.row).items()
        ]
        self.client.log_batch(run_id, metrics=metrics)

    def on_run_end(self, run_dir: Path) -> None:
        from mlflow.entities import Metric

        run_dir = Path(run_dir)
        summary_path = run_dir / "summary.json"
        if summary_path.is_file():
            final = json.loads(summary_path.read_text()).get("final", {})
            stamp = current_millis()
            metrics = [
                Metric(f"final.{name}", figure["mean"], stamp, 0)
                for name, figure in final.items()
                if figure["mean"] is not None and math.isfinite(figure["mean"])
            ]
            self.client.log_batch(self.parent_id, metrics=metrics)
        for item in sorted(run_dir.iterdir()):
            if item.name in ("checkpoints", "mlruns"):  # only for --resume; a store in the run
                continue
            if item.is_dir():
                self.client.log_artifacts(self.parent_id, str(item), item.name)
            else:
                self.client.log_artifact(self.parent_id, str(item))
        for run_id in (*self.seed_runs.values(), self.parent_id):
            self.client.set_terminated(run_id)


def current_millis() -> int:
    return int(time.time() * 1000)

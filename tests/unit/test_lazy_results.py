"""Results at a population's scale: Parquet tables in row groups, read lazily or streamed."""

from __future__ import annotations

import pyarrow.parquet as pq
import yaml

from raymtl.api.results import load_results
from raymtl.config import ExperimentConfig
from raymtl.metrics.recorder import ROW_GROUP_ROWS, Recorder


def write_run(run_dir, clients: int) -> None:
    """A run folder holding config.yaml and `clients` evaluated clients of one round."""
    cfg = ExperimentConfig.model_validate(
        {"data": {"name": "synthetic", "num_clients": clients}, "algorithm": {"name": "fedavg"}}
    )
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    recorder = Recorder(run_dir)
    rows = [
        {"seed": 0, "round": 1, "client": k, "loss": 1.0, "accuracy": (k % 4) / 4, "samples": 3}
        for k in range(clients)
    ]
    recorder.add_clients(rows)
    recorder.add_round({"seed": 0, "round": 1, "mean_accuracy": 0.375})
    recorder.flush()


def test_a_large_clients_table_is_written_in_row_groups_and_read_only_when_asked(tmp_path):
    clients = 2 * ROW_GROUP_ROWS + 10
    write_run(tmp_path / "run", clients)
    assert pq.ParquetFile(tmp_path / "run" / "clients.parquet").num_row_groups == 3

    results = load_results(tmp_path / "run")
    assert {"clients", "rounds", "messages"} <= set(results.tables)
    assert results.tables.loaded() == []  # opening the run read no table

    sizes, total = [], 0.0
    for batch in results.scan("clients", columns=["client", "accuracy"], rows=50_000):
        assert list(batch.columns) == ["client", "accuracy"]
        sizes.append(len(batch))
        total += float(batch["accuracy"].sum())
    assert sum(sizes) == clients and max(sizes) <= 50_000
    assert total == sum((k % 4) / 4 for k in range(clients))
    assert results.tables.loaded() == []  # streaming kept no frame

    assert len(results.rounds) == 1 and results.tables.loaded() == ["rounds"]
    assert len(results.clients) == clients
    assert list(results.scan("no_such_table")) == []

"""A run's results as pandas frames: `Results`, read from a run folder (or the local staging
folder of a run kept at a URI), and `load_results`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from raymtl.config import ConfigError, ExperimentConfig, parse_config
from raymtl.metrics.recorder import SCHEMAS, parquet_path, read_parquet_or_empty
from raymtl.runtime.storage.location import Location, fetch, is_uri
from raymtl.runtime.storage.run_dirs import staging_dir


class LazyTables(Mapping):
    """A run's Parquet tables by name, each read from its file the first time it is asked
    for (and kept): opening a run of a million clients reads none of them."""

    def __init__(self, run_dir: Path):
        self._run_dir = run_dir
        self._names = sorted({*SCHEMAS, *(p.stem for p in run_dir.glob("*.parquet"))})
        self._read: dict[str, pd.DataFrame] = {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._read:
            path = parquet_path(self._run_dir, name)
            if name in SCHEMAS:  # older runs lack newer columns: read as nulls
                table = read_parquet_or_empty(path, SCHEMAS[name])
            else:
                table = pq.read_table(path)
            self._read[name] = table.to_pandas()
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def loaded(self) -> list[str]:
        """The tables read so far."""
        return sorted(self._read)


@dataclass(frozen=True, repr=False)
class Results:
    """A run's outputs: its config (the `ExperimentConfig` it ran with, as callbacks'
    `on_run_start` receives it; `config.model_dump()` is config.yaml as a dict), summary.json
    and every Parquet table: `tables[name]` reads one as a DataFrame when first asked for,
    `scan(name)` streams it a row group at a time.

    `run_dir` is always a local folder holding them: for a run kept at a URI (`uri`), the
    staging folder the driver wrote before publishing.
    """

    run_dir: Path
    config: ExperimentConfig
    summary: dict
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    uri: str | None = None

    def __repr__(self) -> str:
        """One line: where, what ran, the final mean accuracy and the tables' names."""
        accuracy = self.summary.get("final", {}).get("mean_accuracy", {}).get("mean")
        shown = "" if accuracy is None else f", mean_accuracy={accuracy:.4g}"
        return (
            f"Results({self.location!r}, algorithm={self.config.algorithm.name!r}, "
            f"seeds={self.config.seeds}, rounds={self.config.rounds}{shown}, "
            f"tables={sorted(self.tables)})"
        )

    @property
    def clients(self) -> pd.DataFrame:
        return self.tables["clients"]

    @property
    def rounds(self) -> pd.DataFrame:
        return self.tables["rounds"]

    @property
    def messages(self) -> pd.DataFrame:
        return self.tables["messages"]

    def scan(
        self, table: str, columns: list[str] | None = None, rows: int = 65_536
    ) -> Iterator[pd.DataFrame]:
        """`table`'s rows a batch at a time (`rows` at most; `columns`: only these), never
        the whole table at once: how to read clients.parquet of a large population.

        Yields nothing when the run has no such file.
        """
        path = parquet_path(self.run_dir, table)
        if not path.is_file():
            return
        for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=columns):
            yield batch.to_pandas()

    @property
    def location(self) -> str:
        """Where the run lives: its URI, or its local folder."""
        return self.uri or str(self.run_dir)


def results_of(where: str | Path) -> Results:
    """The results the driver just wrote: in the run folder, or a URI run's staging folder."""
    if not is_uri(where):
        return read_results(Path(where))
    return read_results(staging_dir(Location.of(str(where))), uri=str(where))


def load_results(run_dir: str | Path) -> Results:
    """A finished (or interrupted) run's tables as pandas frames, its config (config.yaml
    validated as `--resume` validates it: an `ExperimentConfig`) and summary; a run kept at a
    URI is fetched into its local staging folder first."""
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
    try:  # validated as a resume validates it: its plugins imported first
        config = parse_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    except (ConfigError, ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"run_dir: '{uri or run_dir}' config.yaml: {error}") from None
    summary_path = run_dir / "summary.json"
    return Results(
        run_dir=run_dir,
        config=config,
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else {},
        tables=LazyTables(run_dir),
        uri=uri,
    )

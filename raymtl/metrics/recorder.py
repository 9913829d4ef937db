"""Accumulates per-client, per-round and per-message rows and persists them as Parquet."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

CLIENTS_SCHEMA = pa.schema(
    [
        ("seed", pa.int64()),
        ("round", pa.int64()),
        ("client", pa.int64()),
        ("loss", pa.float64()),
        ("accuracy", pa.float64()),
        ("samples", pa.int64()),
        ("test_samples", pa.int64()),
        ("group", pa.int64()),
        ("task", pa.int64()),
        ("bits_up", pa.int64()),
        ("bits_down", pa.int64()),
        # The task's own metrics (null where they do not apply: see raymtl.tasks.spec).
        ("task_name", pa.string()),
        ("precision", pa.float64()),
        ("recall", pa.float64()),
        ("f1", pa.float64()),
        ("mse", pa.float64()),
        ("mae", pa.float64()),
        ("model", pa.string()),  # the client's model (registry name) and its parameter count
        ("model_params", pa.int64()),
    ]
)

ROUNDS_SCHEMA = pa.schema(
    [
        ("seed", pa.int64()),
        ("round", pa.int64()),
        ("mean_accuracy", pa.float64()),
        ("worst10_accuracy", pa.float64()),
        ("worst20_accuracy", pa.float64()),
        ("std_accuracy", pa.float64()),
        ("mean_loss", pa.float64()),
        # how many clients the evaluation's figures cover (eval_fraction; NaN: not evaluated)
        ("clients_evaluated", pa.float64()),
        ("bits_up", pa.int64()),
        ("bits_down", pa.int64()),
        ("cum_bits_up", pa.int64()),
        ("cum_bits_down", pa.int64()),
        ("cum_bits", pa.int64()),
        ("wall_time", pa.float64()),
        # min_clients_fraction < 1: clients the run went on without, and those left
        ("clients_lost", pa.int64()),
        ("clients_answered", pa.int64()),
        # seconds of the round by kind of phase (runtime/loop/round_loop.py PHASE_KINDS),
        # evaluation, and the clients that ran a local-training step
        ("seconds_train", pa.float64()),
        ("seconds_aggregate", pa.float64()),
        ("seconds_receive", pa.float64()),
        ("seconds_evaluate", pa.float64()),
        ("clients_trained", pa.int64()),
        # floating-point operations by kind of phase, the round's and the run's so far
        # (raymtl/flops.py: model passes and coordinators' steps, by FlopCounterMode)
        ("flops_train", pa.float64()),
        ("flops_aggregate", pa.float64()),
        ("flops_receive", pa.float64()),
        ("flops_evaluate", pa.float64()),
        ("flops", pa.float64()),
        ("cum_flops", pa.float64()),
        # clients' kept state (runtime/hosts/clients.py): bytes and clients in memory and spilled
        # to local disk (beyond runtime.memory_budget), and the working models serving them
        ("state_resident_bytes", pa.int64()),
        ("state_spilled_bytes", pa.int64()),
        ("clients_resident", pa.int64()),
        ("clients_spilled", pa.int64()),
        ("working_models", pa.int64()),
        # client-level DP (privacy.clip): the ε spent so far at the run's δ (privacy.py)
        ("epsilon", pa.float64()),
    ]
)

MESSAGES_SCHEMA = pa.schema(
    [
        ("seed", pa.int64()),
        ("round", pa.int64()),
        ("src", pa.string()),
        ("dst", pa.string()),
        ("src_role", pa.string()),
        ("dst_role", pa.string()),
        ("kind", pa.string()),
        ("bits", pa.int64()),
        # The clients charged with sending / receiving (null for server, LPS and graph): a
        # role held by a client (a task leader) charges its traffic to that client.
        ("src_client", pa.int64()),
        ("dst_client", pa.int64()),
    ]
)

# Table name -> schema; each table lives in ``<run_dir>/<name>.parquet``.
SCHEMAS: dict[str, pa.Schema] = {
    "clients": CLIENTS_SCHEMA,
    "rounds": ROUNDS_SCHEMA,
    "messages": MESSAGES_SCHEMA,
}


def parquet_path(run_dir: Path, table_name: str) -> Path:
    """Where table ``table_name`` of a run is stored."""
    return Path(run_dir) / f"{table_name}.parquet"


# Rows per Parquet row group: a reader can stream a table a group at a time
# (`Results.scan`) instead of holding a population's rows at once.
ROW_GROUP_ROWS = 65_536


def write_parquet_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to a temporary file, then rename it over ``path``.

    The rename is atomic, so a crash mid-write never leaves a truncated file behind for resume.
    The file is cut into row groups of ``ROW_GROUP_ROWS`` rows.
    """
    tmp_path = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp_path, row_group_size=ROW_GROUP_ROWS)
    os.replace(tmp_path, path)


def read_parquet_or_empty(path: Path, schema: pa.Schema) -> pa.Table:
    """Read ``path`` cast to ``schema``; an empty table with the schema's columns if absent."""
    if not path.exists():
        return schema.empty_table()
    table = pq.read_table(path)
    for field in schema:  # runs written before a column existed: the column is null
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)


# Tables that record the run itself, not a round's results: a replay keeps them.
KEPT_ON_REPLAY = ("faults",)


class Recorder:
    """In-memory metric tables of one run directory, flushed to Parquet on demand.

    Rows are converted to Arrow at ``add_*`` time (so type errors surface where the row is
    produced) and kept as a list of chunks that are concatenated on flush.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._chunks: dict[str, list[pa.Table]] = {name: [] for name in SCHEMAS}

    def _append(self, table_name: str, rows: list[dict]) -> None:
        if rows:
            chunk = pa.Table.from_pylist(rows, schema=SCHEMAS.get(table_name))
            self._chunks.setdefault(table_name, []).append(chunk)

    def add_rows(self, table_name: str, rows: list[dict]) -> None:
        """Append rows to an algorithm's own table (e.g. ``graph``); schema inferred.

        Rows must carry ``seed`` and ``round`` so that resume can truncate them.
        """
        self._append(table_name, rows)

    def add_clients(self, rows: list[dict]) -> None:
        """Append per-client evaluation rows (see ``CLIENTS_SCHEMA``)."""
        self._append("clients", rows)

    def add_round(self, row: dict) -> None:
        """Append one per-round summary row (see ``ROUNDS_SCHEMA``)."""
        self._append("rounds", [row])

    def add_messages(self, rows: list[dict]) -> None:
        """Append message accounting rows (see ``MESSAGES_SCHEMA``)."""
        self._append("messages", rows)

    def arrow_table(self, table_name: str) -> pa.Table:
        """All rows of ``table_name`` as one Arrow table (empty with columns if no rows)."""
        chunks = self._chunks.get(table_name, [])
        if not chunks:
            return SCHEMAS[table_name].empty_table() if table_name in SCHEMAS else pa.table({})
        table = pa.concat_tables(chunks, promote_options="default").combine_chunks()
        # Keep a single chunk so repeated flushes don't re-concatenate many small tables.
        self._chunks[table_name] = [table]
        return table

    def flush(self) -> None:
        """(Re)write clients/rounds/messages ``.parquet`` files in ``run_dir`` atomically."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for table_name in self._chunks:
            table = self.arrow_table(table_name)
            if table_name in SCHEMAS or table.num_rows:
                write_parquet_atomically(table, parquet_path(self.run_dir, table_name))

    @classmethod
    def load(cls, run_dir: Path) -> Recorder:
        """Recorder holding the rows already stored in ``run_dir`` (missing files: no rows)."""
        recorder = cls(run_dir)
        for table_name, schema in SCHEMAS.items():
            table = read_parquet_or_empty(parquet_path(recorder.run_dir, table_name), schema)
            if table.num_rows:
                recorder._chunks[table_name] = [table]
        for path in sorted(recorder.run_dir.glob("*.parquet")):
            if path.stem not in SCHEMAS:  # algorithm tables (graph, clusters, ...)
                recorder._chunks[path.stem] = [pq.read_table(path)]
        return recorder

    def truncate_after(self, seed: int, round: int) -> None:
        """Drop the rows of ``seed`` with round > ``round`` (in every table).

        Used on resume: the run restarts from a checkpoint at (seed, round), so anything logged
        after it would otherwise be duplicated. Seeds run one after another, so other seeds'
        rows are either complete or not yet written.
        """
        for table_name in list(self._chunks):
            if table_name in KEPT_ON_REPLAY:
                continue
            table = self.arrow_table(table_name)
            if not table.num_rows:
                continue
            later = pc.and_(pc.equal(table["seed"], seed), pc.greater(table["round"], round))
            kept = table.filter(pc.invert(later))
            self._chunks[table_name] = [kept] if kept.num_rows else []

    def table(self, table_name: str) -> pd.DataFrame:
        """Any table's rows as a DataFrame (empty if it has none)."""
        return self.arrow_table(table_name).to_pandas()

    def clients(self) -> pd.DataFrame:
        """Per-client rows as a DataFrame."""
        return self.arrow_table("clients").to_pandas()

    def rounds(self) -> pd.DataFrame:
        """Per-round rows as a DataFrame."""
        return self.arrow_table("rounds").to_pandas()

    def messages(self) -> pd.DataFrame:
        """Per-message rows as a DataFrame."""
        return self.arrow_table("messages").to_pandas()

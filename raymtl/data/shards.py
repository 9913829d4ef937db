"""Client shards and the pieces every partition kind shares to build them.

Both the label-skew kinds (partitions.py) and the majority-task splits (task_splits.py) use
these: size/quantity validation, rotation/mask groups, quantity weights, the per-client
stratified train/test split and its size check, and the `ClientShard` they all return.
This module imports neither of them, so partitions.py -> task_splits.py -> shards.py has no
cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Every client needs at least this many train / test samples.
MIN_TRAIN, MIN_TEST = 2, 1
QUANTITIES = ("equal", "lognormal", "powerlaw")


@dataclass(frozen=True)
class ClientShard:
    """One client's slice of the pool: sample indices plus its group and task."""

    client_id: int
    train_idx: np.ndarray  # indices into the pool
    test_idx: np.ndarray  # indices into the pool, stratified like train
    group: int  # rotation/mask group (0 when none)
    rotation: int  # degrees, multiple of 90
    mask_prob: float  # probability of dropping each 2x2 patch
    task: int  # task id (0 when no task groups)
    task_classes: tuple[int, ...] | None  # original class ids of the task; None = no relabel
    source: str | None = None  # the dataset the indices point into; None = data.name
    key: int | None = None  # natural: the data's own client (a generated pool's client to make)


def fail(field: str, problem: str) -> ValueError:
    """The error for a bad `data.partition.<field>` setting, or for `data.num_clients` (the
    field the experiment file gives it as), returned for the caller to raise."""
    path = "data.num_clients" if field == "num_clients" else f"data.partition.{field}"
    return ValueError(f"{path}: {problem}")


def validate_sizes(quantity, sigma, exponent, test_fraction, max_samples) -> None:
    """Check the quantity skew, the test fraction and the per-client sample cap."""
    if quantity not in QUANTITIES:
        raise fail("quantity", f"{quantity!r} is not one of {', '.join(QUANTITIES)}")
    if quantity == "lognormal" and not sigma > 0:
        raise fail("quantity_sigma", f"{sigma} must be > 0")
    if quantity == "powerlaw" and not exponent > 0:
        raise fail("quantity_exponent", f"{exponent} must be > 0")
    if not 0 < test_fraction < 1:
        raise fail("test_fraction", f"{test_fraction} must be in (0, 1)")
    if max_samples is not None and max_samples < MIN_TRAIN + MIN_TEST:
        raise fail("max_samples_per_client", f"{max_samples} must be >= {MIN_TRAIN + MIN_TEST}")


def group_settings(rotations, mask_probs) -> list[tuple[int, float]]:
    """(rotation, mask_prob) per group; groups come from whichever list is given."""
    if rotations is None and mask_probs is None:
        return []
    if rotations is not None and mask_probs is not None and len(rotations) != len(mask_probs):
        raise fail("mask_probs", f"{len(mask_probs)} values but rotations has {len(rotations)}")
    rotations = list(rotations) if rotations is not None else [0] * len(mask_probs)
    mask_probs = list(mask_probs) if mask_probs is not None else [0.0] * len(rotations)
    if not rotations:
        raise fail("rotations", "must list at least one group")
    for degrees in rotations:
        if int(degrees) != degrees or degrees % 90:
            raise fail("rotations", f"{degrees} is not a multiple of 90")
    for prob in mask_probs:
        if not 0 <= prob < 1:
            raise fail("mask_probs", f"{prob} must be in [0, 1)")
    return list(zip(map(int, rotations), map(float, mask_probs), strict=True))


def quantity_weights(quantity: str, num_clients: int, sigma: float, exponent: float, rng):
    """Relative client sizes: all 1 ("equal"), lognormal(0, sigma), or a shuffled power law."""
    if quantity == "lognormal":
        return rng.lognormal(0.0, sigma, num_clients)
    if quantity == "powerlaw":
        return rng.permutation(np.arange(1, num_clients + 1, dtype=float) ** -exponent)
    return np.ones(num_clients)


def train_test_split(idx, labels, test_fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per class: shuffle, then test gets round(n * test_fraction), clipped to [1, n - 1]."""
    train, test = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for label in np.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == label])
        n_test = min(max(round(members.size * test_fraction), 1), members.size - 1)
        test.append(members[:n_test])
        train.append(members[n_test:])
    train_idx, test_idx = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
    if test_idx.size == 0 and train_idx.size > MIN_TRAIN:  # only singleton classes
        moved = rng.integers(train_idx.size)
        test_idx, train_idx = train_idx[moved : moved + 1], np.delete(train_idx, moved)
    return train_idx, test_idx


def check_client_size(client: int, train: np.ndarray, test: np.ndarray, quantity: str) -> None:
    """Raise unless the client holds at least MIN_TRAIN train and MIN_TEST test samples."""
    if train.size < MIN_TRAIN or test.size < MIN_TEST:
        field = "quantity" if quantity != "equal" else "num_clients"
        got = f"client {client} gets {train.size} train / {test.size} test samples"
        raise fail(field, f"{got}, needs {MIN_TRAIN} / {MIN_TEST}; use fewer clients or skew")


def make_shard(
    client: int,
    train: np.ndarray,
    test: np.ndarray,
    groups: list[tuple[int, float]],
    task: int = 0,
    task_classes: tuple[int, ...] | None = None,
) -> ClientShard:
    """The client's shard; its rotation/mask group is client % len(groups) (none if empty)."""
    group = client % len(groups) if groups else 0
    rotation, mask_prob = groups[group] if groups else (0, 0.0)
    return ClientShard(client, train, test, group, rotation, mask_prob, task, task_classes)


class ShardTable(Mapping):
    """Participant name ("client/<id>", `prefix` + client_id) -> ClientShard, held as
    columns: what a host's spec carries to it.

    A million clients' shards pickled one object each cost seconds on the driver and again
    on every host (about 100 bytes and 8 µs a shard); as columns they travel as a few numpy
    arrays, and a shard is rebuilt when a host asks for it.
    """

    def __init__(self, shards: list[ClientShard], prefix: str = "client/"):
        self._columns, self._prefix = _columns(shards), prefix
        self._index()

    def _index(self) -> None:
        ids = self._columns["client_id"].tolist()
        self._row = {f"{self._prefix}{client}": row for row, client in enumerate(ids)}

    def __getitem__(self, name: str) -> ClientShard:
        return _shard(self._columns, self._row[name])

    def __iter__(self):
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)

    def __getstate__(self) -> dict:
        return {"columns": self._columns, "prefix": self._prefix}  # the names are rebuilt

    def __setstate__(self, state: dict) -> None:
        self._columns, self._prefix = state["columns"], state["prefix"]
        self._index()


def _indices(parts: list) -> dict:
    """Index sets as columns: ranges as (start, stop), arrays concatenated with offsets."""
    if all(isinstance(part, range) and part.step == 1 for part in parts):
        bounds = np.array([(part.start, part.stop) for part in parts], dtype=np.int64)
        return {"ranges": bounds.reshape(-1, 2)}
    arrays = [np.asarray(part, dtype=np.int64) for part in parts]
    offsets = np.cumsum([0, *(len(array) for array in arrays)])
    flat = np.concatenate(arrays) if arrays else np.empty(0, np.int64)
    return {"flat": flat, "offsets": offsets}


def _index(column: dict, row: int):
    if "ranges" in column:
        start, stop = column["ranges"][row]
        return range(int(start), int(stop))
    offsets = column["offsets"]
    return column["flat"][offsets[row] : offsets[row + 1]]


def _columns(shards: list[ClientShard]) -> dict:
    return {
        "client_id": np.array([s.client_id for s in shards], dtype=np.int64),
        "train": _indices([s.train_idx for s in shards]),
        "test": _indices([s.test_idx for s in shards]),
        "group": np.array([s.group for s in shards], dtype=np.int64),
        "rotation": np.array([s.rotation for s in shards], dtype=np.int64),
        "mask_prob": np.array([s.mask_prob for s in shards], dtype=np.float64),
        "task": np.array([s.task for s in shards], dtype=np.int64),
        # few distinct values: kept as Python objects, one per shard, shared
        "task_classes": [s.task_classes for s in shards],
        "source": [s.source for s in shards],
        "key": np.array([-1 if s.key is None else s.key for s in shards], dtype=np.int64),
    }


def _shard(columns: dict, row: int) -> ClientShard:
    key = int(columns["key"][row])
    return ClientShard(
        int(columns["client_id"][row]),
        _index(columns["train"], row),
        _index(columns["test"], row),
        int(columns["group"][row]),
        int(columns["rotation"][row]),
        float(columns["mask_prob"][row]),
        int(columns["task"][row]),
        columns["task_classes"][row],
        columns["source"][row],
        None if key < 0 else key,
    )

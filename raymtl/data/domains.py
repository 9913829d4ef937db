"""Federations over several datasets, and the public set held out of them.

    data.name             the main dataset: clients of tasks without a `source` draw from it
    data.tasks[t].source  another dataset (a domain) for task t's clients; their images are
                          resized to the main dataset's height and width (same channels)
    data.public           `size` samples of one dataset (from its official test split when it
                          has one) that no client ever holds: that dataset is partitioned on
                          what is left, so every arm of a comparison sees the same private data

Each dataset is partitioned (data.partition) among its own clients only, in client order; a
shard records its dataset (`ClientShard.source`, None for the main one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from raymtl.data.partition_registry import get_partition
from raymtl.data.partitions import ClientShard, partition_clients
from raymtl.data.source_registry import Pool


@dataclass(frozen=True)
class PublicShard:
    """The public set: indices into dataset `source` (metadata only; hosts decode them)."""

    source: str
    indices: np.ndarray


def public_indices(pool: Pool, source: str, size: int, seed: int) -> np.ndarray:
    """`size` sorted indices drawn (seeded) from the pool's test split, else the whole pool."""
    start = pool.test_start if pool.test_start is not None else 0
    candidates = np.arange(start, len(pool.y))
    where = "test split" if pool.test_start is not None else "samples"
    if size > candidates.size // 2:  # the rest of the split still feeds the clients
        raise ValueError(
            f"data.public.size: {size} is more than half the {candidates.size} {where} of {source}"
        )
    rng = np.random.default_rng([seed, 0x9B1])  # its own stream: the partition's is untouched
    return np.sort(rng.choice(candidates, size, replace=False))


def clients_by_source(data_cfg) -> dict[str, list[int]]:
    """Dataset name -> the clients drawing from it (tasks dealt in file order by `clients`)."""
    n = data_cfg.num_clients
    if not any(task.source for task in data_cfg.tasks):
        return {data_cfg.name: list(range(n))}
    counts = [task.clients or n for task in data_cfg.tasks]
    task_of = [t for t, count in enumerate(counts) for _ in range(count)]
    by_source: dict[str, list[int]] = {}
    for client, task in enumerate(task_of[:n]):
        by_source.setdefault(data_cfg.source_of(task), []).append(client)
    return by_source


def check_channels(pools: dict[str, Pool], main: str) -> None:
    """Another dataset's images are resized, not recoloured: channels must match."""
    channels = pools[main].x.shape[1]
    for name, pool in pools.items():
        if pool.x.shape[1] != channels:
            raise ValueError(
                f"data.tasks.source: {name} has {pool.x.shape[1]} channel(s), data.name "
                f"{main} has {channels}"
            )


def partition_sources(
    data_cfg, seed: int, load: Callable[[str], Pool]
) -> tuple[dict[str, Pool], list[ClientShard], PublicShard | None]:
    """The pools used, every client's shard (by client id) and the public set."""
    by_source = clients_by_source(data_cfg)
    public_cfg = data_cfg.public
    names = {data_cfg.name, *by_source, *([public_cfg.name or data_cfg.name] if public_cfg else [])}
    pools = {name: load(name) for name in sorted(names)}
    check_channels({name: pools[name] for name in {data_cfg.name, *by_source}}, data_cfg.name)
    public = None
    if public_cfg is not None:
        source = public_cfg.name or data_cfg.name
        public = PublicShard(source, public_indices(pools[source], source, public_cfg.size, seed))
    shards = []
    for source, clients in by_source.items():
        held_out = public.indices if public and public.source == source else ()
        tag = None if source == data_cfg.name else source  # None: the main dataset
        part = source_shards(pools[source], clients, seed, data_cfg, held_out)
        if tag is not None:  # a copy per shard only where there is something to say
            part = [dataclasses.replace(shard, source=tag) for shard in part]
        shards += part
    return pools, sorted(shards, key=lambda shard: shard.client_id), public


def source_shards(pool: Pool, clients: list[int], seed: int, data_cfg, held_out) -> list:
    """Partition `pool` (minus the held-out samples) among `clients`."""
    options = data_cfg.partition.model_dump()
    spec = get_partition(options["kind"])
    if spec.keyed:  # the clients the data holds (natural.py)
        shards = spec.build(pool, len(clients), seed=seed, held_out=held_out, **options)
        if clients == list(range(len(clients))):  # the federation's clients are the data's
            return shards
        return [dataclasses.replace(s, client_id=clients[s.client_id]) for s in shards]
    if pool.generated is not None:
        raise ValueError(
            f"data.partition.kind: '{options['kind']}' splits a pool on the driver, but "
            f"source '{data_cfg.name}' generates each client's samples on its host: use natural"
        )
    keep = np.setdiff1d(np.arange(len(pool.y)), np.asarray(held_out, dtype=np.int64))
    shards = partition_clients(
        pool.y.numpy()[keep],
        pool.num_classes,
        num_clients=len(clients),
        seed=seed,
        **options,
    )
    return [
        dataclasses.replace(
            shard,
            client_id=clients[shard.client_id],
            train_idx=keep[shard.train_idx],
            test_idx=keep[shard.test_idx],
        )
        for shard in shards
    ]

"""The natural partition: each client holds exactly the samples the data gives it.

Sources of data already federated (a client column, a folder per client, LEAF's files, a
Hugging Face dataset partitioned by Flower Datasets, LEAF's Synthetic) key their pool by
client (`Pool.keys`, or `Pool.generated` for clients made on their host). Client i of the
federation is the data's i-th client (in the order the source gives them: sorted ids); with
`data.num_clients` below the data's count, the first num_clients take part.

    train / test   as the data gives them (`keys.test`), else each client's samples split
                   by data.partition.test_fraction (stratified by class, seeded)
    task           the data's group column (`keys.group`), else 0
    group          rotation/mask group (data.partition.rotations, mask_probs) when given,
                   else the data's group column
    cap            data.partition.max_samples_per_client (stratified, seeded)

Generated clients split their counts the same way, without any sample on the driver: the
first (1 - test_fraction) of the samples a client's host generates train, the rest test
(its samples are drawn independently, so the split is as random as a shuffled one).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from raymtl.data.partition_registry import register_partition
from raymtl.data.partitions import _cap
from raymtl.data.shards import (
    MIN_TEST,
    MIN_TRAIN,
    ClientShard,
    fail,
    group_settings,
    make_shard,
    train_test_split,
    validate_sizes,
)
from raymtl.data.source_registry import Pool


@register_partition("natural", keyed=True, assigns_tasks=True)
def natural(pool: Pool, num_clients: int, **options) -> list[ClientShard]:
    """The clients as the data keys them (a client column, folders, LEAF users, ...)."""
    seed = options.get("seed", 0)
    test_fraction = options.get("test_fraction", 0.2)
    max_samples_per_client = options.get("max_samples_per_client")
    rotations, mask_probs = options.get("rotations"), options.get("mask_probs")
    held_out = options.get("held_out", ())
    validate_sizes("equal", 1.0, 1.0, test_fraction, max_samples_per_client)
    held = pool.num_keyed_clients
    if held is None:
        raise fail(
            "kind",
            f"'natural' needs data already split by client; source '{pool.source}' is one pool "
            "(give iid, dirichlet, classes_per_client, ...)",
        )
    if num_clients > held:
        raise ValueError(
            f"data.num_clients: {num_clients}, but the data holds {held} clients ({pool.source})"
        )
    groups = group_settings(rotations, mask_probs)
    if pool.generated is not None:
        if len(held_out):
            raise ValueError(
                "data.public: generated clients hold no pool to take a public set from"
            )
        return _generated_shards(pool, num_clients, test_fraction, max_samples_per_client, groups)
    return _keyed_shards(
        pool, num_clients, seed, test_fraction, max_samples_per_client, groups, held_out
    )


def _keyed_shards(pool, num_clients, seed, test_fraction, cap, groups, held_out):
    keys, labels = pool.keys, pool.y.numpy()
    client = np.asarray(keys.client, dtype=np.int64).copy()
    client[np.asarray(held_out, dtype=np.int64)] = -1  # the public set is no client's
    order = np.argsort(client, kind="stable")
    ends = np.searchsorted(client[order], np.arange(num_clients + 1), side="left")
    test_mask = None if keys.test is None else np.asarray(keys.test, dtype=bool)
    shards = []
    for k in range(num_clients):
        idx = order[ends[k] : ends[k + 1]]
        name = keys.names[k]
        rng = np.random.default_rng([seed, k])  # a client's split is its own: any subset agrees
        if test_mask is not None:
            train, test = idx[~test_mask[idx]], idx[test_mask[idx]]
            train, test = _cap(train, labels, cap, rng), _cap(test, labels, cap, rng)
        else:
            train, test = train_test_split(_cap(idx, labels, cap, rng), labels, test_fraction, rng)
        _check_size(name, train.size, test.size, keys.where or pool.source)
        task = int(keys.group[k]) if keys.group is not None else 0
        shard = make_shard(k, np.sort(train), np.sort(test), groups, task)
        group = task if not groups and keys.group is not None else shard.group
        shards.append(dataclasses.replace(shard, group=group, key=k))
    return shards


def _generated_shards(pool, num_clients, test_fraction, cap, groups):
    counts = np.asarray(pool.generated.counts[:num_clients], dtype=np.int64)
    if cap is not None:
        counts = np.minimum(counts, cap)
    tests = np.clip(np.rint(counts * test_fraction).astype(np.int64), 1, counts - 1)
    small = np.flatnonzero((counts - tests < MIN_TRAIN) | (tests < MIN_TEST))
    if small.size:
        k = int(small[0])
        _check_size(str(k), int(counts[k] - tests[k]), int(tests[k]), pool.source)
    settings = groups or [(0, 0.0)]  # (rotation, mask_prob) of each group
    shards = []
    # ranges, not index arrays: 100,000 clients' indices would cost the driver ~400 MB; built
    # directly (a dataclasses.replace each costs more than the rest at a million clients)
    for k, (count, n_test) in enumerate(zip(counts.tolist(), tests.tolist(), strict=True)):
        group = k % len(settings)
        rotation, mask_prob = settings[group]
        train, test = range(count - n_test), range(count - n_test, count)
        shards.append(ClientShard(k, train, test, group, rotation, mask_prob, 0, None, key=k))
    return shards


def _check_size(name: str, train: int, test: int, where: str) -> None:
    if train < MIN_TRAIN or test < MIN_TEST:
        raise ValueError(
            f"data: client '{name}' of {where} holds {train} train / {test} test samples; "
            f"every client needs {MIN_TRAIN} / {MIN_TEST} (drop it, or give test_fraction)"
        )

"""The paper's majority-task splits: task sizes 5/3/2, majority and minority fractions."""

from __future__ import annotations

import numpy as np
import pytest

from raymtl.config import parse_config
from raymtl.data import PARTITIONS, partition_clients
from raymtl.data.task_splits import CIFAR10_TASKS, FASHION_MNIST_TASKS


@pytest.fixture
def labels():
    return np.random.default_rng(0).permutation(np.repeat(np.arange(10), 700))


def split(labels, kind="fmnist_tasks", **options):
    return partition_clients(
        labels,
        10,
        num_clients=options.pop("num_clients", 10),
        kind=kind,
        seed=options.pop("seed", 0),
        **options,
    )


def own_fraction(labels, shard, tasks) -> float:
    held = labels[np.concatenate([shard.train_idx, shard.test_idx])]
    return float(np.isin(held, tasks[shard.task]).mean())


def sizes(shards) -> list[int]:
    return [s.train_idx.size + s.test_idx.size for s in shards]


def test_kinds_are_registered_with_a_description():
    for kind in ("fmnist_tasks", "cifar10_tasks"):
        assert PARTITIONS[kind].__doc__.strip()


def test_fashion_mnist_split_has_5_3_2_users_with_90_percent_of_their_task(labels):
    shards = split(labels)
    assert [s.task for s in shards] == [0] * 5 + [1] * 3 + [2] * 2
    assert all(s.task_classes is None for s in shards)  # every model keeps all 10 classes
    for shard in shards:
        assert own_fraction(labels, shard, FASHION_MNIST_TASKS) == pytest.approx(0.9, abs=0.01)
        held = set(labels[shard.train_idx].tolist())
        assert held - set(FASHION_MNIST_TASKS[shard.task])  # a minority of other tasks
    every = np.concatenate([np.concatenate([s.train_idx, s.test_idx]) for s in shards])
    assert every.size == np.unique(every).size


def test_sizes_are_unbalanced_across_tasks_and_keep_their_ratio_under_a_cap(labels):
    full = sizes(split(labels))
    assert full[0] > full[5] > full[8]  # clothes > shoes > bags
    capped = sizes(split(labels, max_samples_per_client=600))
    assert max(capped) <= 600 and capped[0] > capped[5] > capped[8]
    assert capped[8] / capped[0] == pytest.approx(full[8] / full[0], rel=0.05)


@pytest.mark.parametrize("fraction", [0.0, 0.3])
def test_the_minority_fraction_is_configurable(labels, fraction):
    for shard in split(labels, minority_fraction=fraction, max_samples_per_client=800):
        own = own_fraction(labels, shard, FASHION_MNIST_TASKS)
        assert own == pytest.approx(1 - fraction, abs=0.015)


def test_cifar10_split_is_vehicles_vs_animals_five_users_each(labels):
    shards = split(labels, kind="cifar10_tasks")
    assert [s.task for s in shards] == [0] * 5 + [1] * 5
    for shard in shards:
        assert own_fraction(labels, shard, CIFAR10_TASKS) == pytest.approx(0.9, abs=0.01)


def test_custom_tasks_and_users_and_the_split_is_deterministic(labels):
    options = {"task_classes": [[0, 1], [2, 3, 4]], "task_users": [2, 4], "num_clients": 6}
    first, again = split(labels, **options), split(labels, **options)
    assert [s.task for s in first] == [0, 0, 1, 1, 1, 1]
    assert all(np.array_equal(a.train_idx, b.train_idx) for a, b in zip(first, again, strict=True))
    other = split(labels, **options, seed=1)
    assert not np.array_equal(first[0].train_idx, other[0].train_idx)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_clients": 9}, "data.num_clients"),
        ({"task_users": [5, 5]}, "partition.task_users"),
        ({"task_classes": [[0, 1], [1, 2]], "task_users": [5, 5]}, "partition.task_classes"),
        ({"minority_fraction": 1.0}, "partition.minority_fraction"),
    ],
)
def test_bad_settings_name_the_field(labels, options, field):
    with pytest.raises(ValueError, match=field):
        split(labels, **options)


def test_the_config_accepts_the_new_kinds_with_defaults():
    cfg = parse_config({"data": {"num_clients": 10, "partition": {"kind": "fmnist_tasks"}}})
    assert cfg.data.partition.minority_fraction == 0.1 and cfg.data.partition.task_users is None

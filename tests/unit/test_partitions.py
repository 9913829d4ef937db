"""Partition kinds, groups, tasks, quantity skew and validation on tiny label arrays."""

import inspect

import numpy as np
import pytest

from raymtl.data import PARTITIONS, partition_clients, register_partition

NUM_CLASSES = 10
TASKS = [[0, 1, 2], [3, 4], [5, 6, 7, 8, 9]]


@pytest.fixture
def labels():
    return np.random.default_rng(0).permutation(np.repeat(np.arange(NUM_CLASSES), 40))


def split(labels, **overrides):
    options = {"num_clients": 10, "kind": "iid", "seed": 0} | overrides
    return partition_clients(labels, NUM_CLASSES, **options)


def client_labels(labels, shard):
    return set(labels[np.concatenate([shard.train_idx, shard.test_idx])].tolist())


KIND_OPTIONS = {
    "iid": {},
    "classes_per_client": {"classes_per_client": 3},
    "dirichlet": {"alpha": 0.3},
    "task_groups": {"task_classes": TASKS},
}


def test_registry_lists_every_kind_with_a_description():
    # The majority-task splits hold part of the pool only; test_task_splits.py covers them.
    majority_splits = {"fmnist_tasks", "cifar10_tasks"}
    assert set(KIND_OPTIONS) | majority_splits <= set(PARTITIONS)
    assert all(spec.description for spec in PARTITIONS.values())
    assert {kind for kind, spec in PARTITIONS.items() if spec.shards} >= majority_splits
    assigning = {kind for kind, spec in PARTITIONS.items() if spec.assigns_tasks}
    assert assigning >= majority_splits | {"task_groups"} and "iid" not in assigning


@pytest.mark.parametrize("kind", KIND_OPTIONS)
def test_indices_are_disjoint_and_cover_the_used_classes(labels, kind):
    shards = split(labels, kind=kind, **KIND_OPTIONS[kind])
    every = np.concatenate([np.concatenate([s.train_idx, s.test_idx]) for s in shards])
    assert every.size == np.unique(every).size
    assert np.array_equal(np.sort(every), np.arange(labels.size))
    for shard in shards:
        assert shard.train_idx.size >= 2 and shard.test_idx.size >= 1
        assert not set(shard.train_idx) & set(shard.test_idx)


@pytest.mark.parametrize("kind", KIND_OPTIONS)
def test_same_seed_same_shards_other_seed_differs(labels, kind):
    first, again = (split(labels, kind=kind, **KIND_OPTIONS[kind]) for _ in range(2))
    other = split(labels, kind=kind, seed=1, **KIND_OPTIONS[kind])
    same = [np.array_equal(a.train_idx, b.train_idx) for a, b in zip(first, again, strict=True)]
    moved = [np.array_equal(a.train_idx, b.train_idx) for a, b in zip(first, other, strict=True)]
    assert all(same) and not all(moved)


@pytest.mark.parametrize("kind", KIND_OPTIONS)
def test_test_split_is_stratified(labels, kind):
    for shard in split(labels, kind=kind, **KIND_OPTIONS[kind]):
        train, test = labels[shard.train_idx], labels[shard.test_idx]
        for label in np.unique(np.concatenate([train, test])):
            total = (train == label).sum() + (test == label).sum()
            if total >= 2:
                assert (train == label).sum() >= 1 and (test == label).sum() >= 1


def test_iid_clients_see_every_class_equally(labels):
    for shard in split(labels):
        counts = np.bincount(labels[shard.train_idx], minlength=NUM_CLASSES)
        assert counts.min() >= 3 and counts.max() <= 4


def class_counts_per_client(labels, shards, num_classes):
    held = [np.concatenate([s.train_idx, s.test_idx]) for s in shards]
    return np.array([np.bincount(labels[idx], minlength=num_classes) for idx in held])


def test_iid_remainders_rotate_over_clients():
    # 3 classes x 5 samples over 4 clients: each class gives every client 1 and has 1 left.
    # Its remainder starts where the previous class's stopped (5 % 4 = 1, 10 % 4 = 2), so
    # clients 0, 1, 2 get one extra each instead of client 0 getting all three (6/3/3/3).
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(3), 5))
    shards = partition_clients(labels, 3, num_clients=4, kind="iid", seed=0)
    counts = class_counts_per_client(labels, shards, 3)
    assert counts.tolist() == [[2, 1, 1], [1, 2, 1], [1, 1, 2], [1, 1, 1]]


@pytest.mark.parametrize(
    ("class_sizes", "num_clients", "sizes"),
    [
        ([5, 5, 5], 4, [4, 4, 4, 3]),
        ([3, 4, 6], 4, [4, 3, 3, 3]),  # class 2 starts at client 7 % 4 = 3: extras to 3, 0
        ([40] * 10, 7, [58, 57, 57, 57, 57, 57, 57]),  # 400 = 7 x 57 + 1
    ],
)
def test_iid_sizes_differ_by_at_most_one(class_sizes, num_clients, sizes):
    labels = np.repeat(np.arange(len(class_sizes)), class_sizes)
    shards = partition_clients(
        labels, len(class_sizes), num_clients=num_clients, kind="iid", seed=3
    )
    assert [s.train_idx.size + s.test_idx.size for s in shards] == sizes


def test_iid_ten_thousand_clients_get_seven_samples_each():
    # Fashion-MNIST sized: 10 classes x 7,000 over 10,000 clients. Class c covers the 7,000
    # clients from 7,000 * c % 10,000 on, so every client holds 7 distinct classes.
    labels = np.repeat(np.arange(10), 7000)
    shards = partition_clients(labels, 10, num_clients=10_000, kind="iid", seed=0)
    counts = class_counts_per_client(labels, shards, 10)
    assert counts.sum(axis=1).tolist() == [7] * 10_000
    assert counts.max() == 1
    assert all(s.train_idx.size == 6 and s.test_idx.size == 1 for s in shards)


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_classes_per_client_gives_exactly_k_classes_used_evenly(labels, k):
    shards = split(labels, kind="classes_per_client", classes_per_client=k)
    assert all(len(client_labels(labels, s)) == k for s in shards)
    usage = np.zeros(NUM_CLASSES, int)
    for shard in shards:
        usage[list(client_labels(labels, shard))] += 1
    assert usage.max() - usage.min() <= 1


def test_dirichlet_small_alpha_skews_labels(labels):
    shards = split(labels, kind="dirichlet", alpha=0.1)
    histograms = np.array([np.bincount(labels[s.train_idx], minlength=NUM_CLASSES) for s in shards])
    dominant_share = histograms.max(axis=1) / histograms.sum(axis=1)
    assert dominant_share.mean() > 0.4
    assert all(s.train_idx.size + s.test_idx.size >= 10 for s in shards)


def test_task_groups_assign_round_robin_and_keep_task_classes(labels):
    shards = split(labels, kind="task_groups", task_classes=TASKS, num_clients=9)
    for shard in shards:
        assert shard.task == shard.client_id % len(TASKS)
        assert shard.task_classes == tuple(TASKS[shard.task])
        assert client_labels(labels, shard) <= set(TASKS[shard.task])


def test_task_groups_use_label_skew_inside_a_task(labels):
    tasks = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    shards = split(labels, kind="task_groups", task_classes=tasks, classes_per_client=2)
    assert all(len(client_labels(labels, s)) == 2 for s in shards)
    iid_inside = split(labels, kind="task_groups", task_classes=tasks, classes_per_client=5)
    assert all(len(client_labels(labels, s)) == 5 for s in iid_inside)


def test_task_groups_ignore_classes_outside_every_task(labels):
    shards = split(labels, kind="task_groups", task_classes=[[0, 1], [2, 3]], num_clients=4)
    used = np.concatenate([np.concatenate([s.train_idx, s.test_idx]) for s in shards])
    assert set(labels[used].tolist()) == {0, 1, 2, 3}
    assert used.size == 4 * 40


def test_rotation_and_mask_groups_cycle_over_clients(labels):
    shards = split(labels, rotations=[0, 90, 180, 270], mask_probs=[0.0, 0.1, 0.2, 0.3])
    for shard in shards:
        assert shard.group == shard.client_id % 4
        assert shard.rotation == 90 * shard.group
        assert shard.mask_prob == pytest.approx(0.1 * shard.group)


def test_mask_probs_alone_define_groups_without_rotation(labels):
    shards = split(labels, mask_probs=[0.0, 0.5])
    assert [(s.group, s.rotation, s.mask_prob) for s in shards[:3]] == [
        (0, 0, 0.0),
        (1, 0, 0.5),
        (0, 0, 0.0),
    ]


def test_no_groups_or_tasks_defaults(labels):
    shard = split(labels)[0]
    assert (shard.group, shard.rotation, shard.mask_prob, shard.task) == (0, 0, 0.0, 0)
    assert shard.task_classes is None


@pytest.mark.parametrize("quantity", ["lognormal", "powerlaw"])
def test_quantity_skew_gives_unequal_sizes(labels, quantity):
    equal = [s.train_idx.size + s.test_idx.size for s in split(labels, num_clients=8)]
    shards = split(labels, num_clients=8, quantity=quantity)
    skewed = [s.train_idx.size + s.test_idx.size for s in shards]
    assert max(equal) - min(equal) <= 10
    assert max(skewed) > 2 * min(skewed)
    assert sum(skewed) == labels.size


def test_max_samples_per_client_caps_and_keeps_classes(labels):
    shards = split(
        labels, kind="classes_per_client", classes_per_client=2, max_samples_per_client=12
    )
    for shard in shards:
        assert shard.train_idx.size + shard.test_idx.size == 12
        assert len(client_labels(labels, shard)) == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kind": "shards"}, "partition.kind"),
        ({"num_clients": 0}, "data.num_clients"),
        ({"num_clients": 401}, "data.num_clients"),
        ({"kind": "classes_per_client", "classes_per_client": 11}, "partition.classes_per_client"),
        ({"kind": "classes_per_client", "classes_per_client": 0}, "partition.classes_per_client"),
        ({"kind": "dirichlet", "alpha": 0.0}, "partition.alpha"),
        ({"quantity": "zipf"}, "partition.quantity"),
        ({"quantity": "lognormal", "quantity_sigma": 0}, "partition.quantity_sigma"),
        ({"test_fraction": 1.0}, "partition.test_fraction"),
        ({"test_fraction": 0.0}, "partition.test_fraction"),
        ({"max_samples_per_client": 2}, "partition.max_samples_per_client"),
        ({"kind": "task_groups"}, "partition.task_classes"),
        ({"task_classes": TASKS}, "partition.task_classes"),
        ({"kind": "task_groups", "task_classes": [[0, 1], [1, 2]]}, "partition.task_classes"),
        ({"kind": "task_groups", "task_classes": [[0, 10]]}, "partition.task_classes"),
        ({"kind": "task_groups", "task_classes": [[0, 1], []]}, "partition.task_classes"),
        ({"kind": "task_groups", "task_classes": [[0], [1]]}, "partition.classes_per_client"),
        (
            {"kind": "task_groups", "task_classes": [[0, 1], [2, 3]], "num_clients": 1},
            "data.num_clients",
        ),
        ({"rotations": [0, 45]}, "partition.rotations"),
        ({"rotations": []}, "partition.rotations"),
        ({"rotations": [0, 90], "mask_probs": [0.1]}, "partition.mask_probs"),
        ({"rotations": [0, 90], "mask_probs": [0.1, 1.0]}, "partition.mask_probs"),
        ({"num_clients": 200}, "data.num_clients"),
        ({"num_clients": 100, "quantity": "powerlaw"}, "partition.quantity"),
    ],
)
def test_bad_input_names_the_field(labels, overrides, field):
    with pytest.raises(ValueError, match=field) as error:
        split(labels, **overrides)
    assert "\n" not in str(error.value)


def test_task_classes_error_names_the_task(labels):
    with pytest.raises(ValueError, match="exceeds the 2 classes of task 1"):
        split(labels, kind="task_groups", task_classes=[[0, 1, 2], [3, 4]], classes_per_client=3)


def test_classes_per_client_needs_enough_samples_per_class():
    tiny = np.repeat(np.arange(NUM_CLASSES), 3)
    with pytest.raises(ValueError, match="data.num_clients"):
        partition_clients(
            tiny,
            NUM_CLASSES,
            num_clients=20,
            kind="classes_per_client",
            seed=0,
            classes_per_client=10,
        )


@pytest.fixture
def registered_kinds():
    """Kinds a test registers are gone after it."""
    before = dict(PARTITIONS)
    yield
    PARTITIONS.clear()
    PARTITIONS.update(before)


def test_a_registered_kind_of_shares_is_split_and_topped_up(labels, registered_kinds):
    @register_partition("favourite")
    def favourite(class_counts, num_clients, rng, *, weight: float):
        """Client i prefers class i % C by `weight` to one (shares, not memberships)."""
        affinity = np.ones((class_counts.size, num_clients))
        affinity[np.arange(num_clients) % class_counts.size, np.arange(num_clients)] = weight
        return affinity

    assert PARTITIONS["favourite"].params == {"weight": inspect.Parameter.empty}
    shards = split(labels, kind="favourite", params={"weight": 50.0})
    for shard in shards:
        held = labels[np.concatenate([shard.train_idx, shard.test_idx])]
        assert np.bincount(held, minlength=NUM_CLASSES).argmax() == shard.client_id % NUM_CLASSES
    with pytest.raises(ValueError, match=r"^data.partition.params.weight: required by kind"):
        split(labels, kind="favourite")
    with pytest.raises(ValueError, match=r"^data.partition.params.alpha: not a parameter of kind"):
        split(labels, kind="favourite", params={"weight": 2.0, "alpha": 1})


def test_a_registered_kind_must_return_an_affinity(labels, registered_kinds):
    @register_partition("wrong_shape")
    def wrong_shape(class_counts, num_clients, rng):
        """An affinity of the wrong shape."""
        return np.ones((num_clients, 2))

    with pytest.raises(
        ValueError, match=r"^data.partition.kind: 'wrong_shape' must return a \(10, 10\)"
    ):
        split(labels, kind="wrong_shape")
    with pytest.raises(ValueError, match="registered twice"):
        register_partition("iid")(wrong_shape)

"""Majority-task splits of the one-shot clustering paper (docs/ALGORITHMS.md, One-shot HFL).

A task is a set of classes; users 0..U_1-1 belong to task 1, the next U_2 to task 2, ...
Every model keeps all the dataset's classes (no relabelling); a user's task is the one its
majority labels come from. With P_c the pool's samples of class c, P_t = Σ_{c∈t} P_c, O_t
the classes of the other tasks, f the minority fraction and w_i the quantity weights:

    n_i      = P_t · w_i / Σ_{j∈t} w_j                         (unbalanced: tasks differ)
    D[i, c]  = (1 − f) · n_i · P_c / P_t          for c ∈ t     (majority)
    D[i, c]  = f · n_i · P_c / Σ_{c'∈O_t} P_c'     for c ∈ O_t   (minority)
    D ← round(s·D),  s = min(1, min_c P_c / Σ_i D[i, c], cap / max_i n_i)  (rows rounded
                 to their sums by largest remainders)

so every user holds exactly (1 − f) of its samples from its task (up to rounding) and the
sizes keep their ratios when `max_samples_per_client` caps the largest user.

    fmnist_tasks:  clothes {0,1,2,3,4,6} / shoes {5,7,9} / bags {8}, users 5/3/2, f = 0.1
    cifar10_tasks: vehicles {0,1,8,9} / animals {2..7}, users 5/5, f = 0.1
"""

from __future__ import annotations

import numpy as np

from raymtl.data.partition_registry import register_partition
from raymtl.data.shards import (
    ClientShard,
    check_client_size,
    fail,
    group_settings,
    make_shard,
    quantity_weights,
    train_test_split,
    validate_sizes,
)

FASHION_MNIST_TASKS = [[0, 1, 2, 3, 4, 6], [5, 7, 9], [8]]
FASHION_MNIST_USERS = [5, 3, 2]
CIFAR10_TASKS = [[0, 1, 8, 9], [2, 3, 4, 5, 6, 7]]
CIFAR10_USERS = [5, 5]


def _check(tasks, users, num_clients: int, num_classes: int, fraction: float) -> None:
    if len(users) != len(tasks) or any(u < 1 for u in users):
        raise fail("task_users", f"{users} must give >= 1 user to each of {len(tasks)} tasks")
    if sum(users) != num_clients:
        raise fail("num_clients", f"{num_clients} but task_users {users} sums to {sum(users)}")
    every = [label for classes in tasks for label in classes]
    if not all(tasks) or len(set(every)) != len(every):
        raise fail("task_classes", f"{tasks}: tasks must be non-empty and disjoint")
    if not all(0 <= label < num_classes for label in every):
        raise fail("task_classes", f"{tasks}: classes must be in 0..{num_classes - 1}")
    if not 0 <= fraction < 1:
        raise fail("minority_fraction", f"{fraction} must be in [0, 1)")


def demand(class_counts, tasks, users, fraction: float, weights) -> np.ndarray:
    """D (N, C): the samples of each class every user should hold, before scaling."""
    task_of = np.repeat(np.arange(len(tasks)), users)
    wanted = np.zeros((task_of.size, class_counts.size))
    for t, classes in enumerate(tasks):
        members = np.flatnonzero(task_of == t)
        own = class_counts[classes].astype(float)
        others = [c for s, cls in enumerate(tasks) if s != t for c in cls]
        sizes = own.sum() * weights[members] / weights[members].sum()
        share = fraction if others else 0.0
        wanted[np.ix_(members, classes)] = np.outer((1 - share) * sizes, own / own.sum())
        if others:
            foreign = class_counts[others].astype(float)
            wanted[np.ix_(members, others)] = np.outer(share * sizes, foreign / foreign.sum())
    return wanted


def round_rows(wanted: np.ndarray) -> np.ndarray:
    """Integer counts: every row keeps round(its sum), by largest remainders over classes."""
    counts = np.floor(wanted).astype(int)
    remainders = wanted - counts
    for row, missing in enumerate(np.rint(wanted.sum(axis=1)).astype(int) - counts.sum(axis=1)):
        counts[row, np.argsort(-remainders[row], kind="stable")[: max(missing, 0)]] += 1
    return counts


def scaled_counts(wanted: np.ndarray, class_counts: np.ndarray, cap: int | None) -> np.ndarray:
    """round(s·D) with the one factor s that fits every class's pool (and the cap)."""
    needed = wanted.sum(axis=0)
    used = needed > 0
    factor = min(1.0, float((class_counts[used] / needed[used]).min()))
    if cap is not None:
        factor = min(factor, cap / float(wanted.sum(axis=1).max()))
    counts = round_rows(wanted * factor)
    while (counts.sum(axis=0) > class_counts).any() or (cap and counts.sum(axis=1).max() > cap):
        factor *= 0.995  # rounding up overshot a class (or the cap): shrink a little
        counts = round_rows(wanted * factor)
    return counts


def majority_task_split(
    labels, num_classes: int, *, defaults: tuple, **options
) -> list[ClientShard]:
    """Shards of a majority-task split (see the module docstring)."""
    labels = np.asarray(labels, dtype=np.int64)
    extra = options.get("task_split") or {}
    tasks = options.get("task_classes") or defaults[0]
    users = list(extra.get("task_users") or defaults[1])
    fraction = float(extra.get("minority_fraction", 0.1))
    num_clients, cap = options["num_clients"], options.get("max_samples_per_client")
    _check(tasks, users, num_clients, num_classes, fraction)
    quantity = options.get("quantity", "equal")
    sigma = options.get("quantity_sigma", 1.0)
    exponent = options.get("quantity_exponent", 1.5)
    validate_sizes(quantity, sigma, exponent, options.get("test_fraction", 0.2), cap)
    groups = group_settings(options.get("rotations"), options.get("mask_probs"))
    rng = np.random.default_rng(options["seed"])
    weights = quantity_weights(quantity, num_clients, sigma, exponent, rng)
    class_counts = np.bincount(labels, minlength=num_classes)
    counts = scaled_counts(demand(class_counts, tasks, users, fraction, weights), class_counts, cap)
    held = [[] for _ in range(num_clients)]
    for label in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == label))
        bounds = np.cumsum(counts[:, label])[:-1]
        for client, part in enumerate(np.split(members[: counts[:, label].sum()], bounds)):
            held[client].append(part)
    task_of = np.repeat(np.arange(len(tasks)), users)
    shards = []
    for client, pieces in enumerate(held):
        idx = np.concatenate(pieces)
        train, test = train_test_split(idx, labels, options.get("test_fraction", 0.2), rng)
        check_client_size(client, train, test, "equal")
        shards.append(make_shard(client, train, test, groups, int(task_of[client])))
    return shards


@register_partition("fmnist_tasks", shards=True, assigns_tasks=True)
def fmnist_tasks(labels, num_classes, **options) -> list[ClientShard]:
    """Fashion-MNIST 3 tasks by majority labels (clothes/shoes/bags), users 5/3/2, unbalanced."""
    defaults = (FASHION_MNIST_TASKS, FASHION_MNIST_USERS)
    return majority_task_split(labels, num_classes, defaults=defaults, **options)


@register_partition("cifar10_tasks", shards=True, assigns_tasks=True)
def cifar10_tasks(labels, num_classes, **options) -> list[ClientShard]:
    """CIFAR-10 vehicles vs animals, 5 users each, a minority fraction of the other task."""
    defaults = (CIFAR10_TASKS, CIFAR10_USERS)
    return majority_task_split(labels, num_classes, defaults=defaults, **options)

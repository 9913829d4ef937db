"""Federated partitions: which pool samples each client holds, and its rotation group and task.

Every label-skew kind reduces to a (num_classes, num_clients) affinity matrix; each class's
samples are then split among its clients in proportion to affinity x quantity weight (see
partition_registry.py, which also registers kinds from plugins). The majority-task splits
(task_splits.py) build their shards themselves.
"""

from __future__ import annotations

import numpy as np

from raymtl.data.partition_registry import (
    PARTITIONS,
    REQUIRED,
    PartitionSpec,
    get_partition,
    register_partition,
)
from raymtl.data.shards import (
    MIN_TEST,
    MIN_TRAIN,
    ClientShard,
    check_client_size,
    fail,
    group_settings,
    make_shard,
    quantity_weights,
    train_test_split,
    validate_sizes,
)

__all__ = ["PARTITIONS", "ClientShard", "partition_clients", "register_partition"]

# Dirichlet clients are topped up to this many samples (the usual NIID-Bench floor) when the
# dataset is large enough, so no client is left with a handful of samples.
DIRICHLET_MIN_SAMPLES = 10


def _assign_classes(affinity: np.ndarray, class_ids, clients, k: int, rng) -> None:
    """Mark k distinct classes per client in `affinity`, every class used equally often."""
    order = rng.permutation(np.asarray(class_ids))
    for position, client in enumerate(clients):
        # Consecutive windows over a cyclic order: distinct within a client, balanced overall.
        affinity[order[(position * k + np.arange(k)) % order.size], client] = 1.0


@register_partition("iid")
def _iid(class_counts: np.ndarray, num_clients: int, rng) -> np.ndarray:
    """IID: every client draws every class in the same proportion (quantity equal: sizes +-1)."""
    return np.ones((class_counts.size, num_clients))


@register_partition("classes_per_client", holds_every_class=True)
def _classes_per_client(class_counts, num_clients, rng, *, classes_per_client) -> np.ndarray:
    """Pathological label skew: each client holds exactly classes_per_client classes."""
    k = classes_per_client
    if k is None:
        raise fail("classes_per_client", "null (all classes of the task) is for 'task_groups'")
    if k < 1:
        raise fail("classes_per_client", f"{k} must be >= 1")
    if k > class_counts.size:
        raise fail(
            "classes_per_client", f"{k} exceeds the {class_counts.size} classes of the dataset"
        )
    affinity = np.zeros((class_counts.size, num_clients))
    _assign_classes(affinity, range(class_counts.size), range(num_clients), k, rng)
    return affinity


@register_partition("dirichlet")
def _dirichlet(class_counts, num_clients, rng, *, alpha) -> np.ndarray:
    """Dirichlet label skew: per class, client shares ~ Dir(alpha); small alpha, more skew."""
    if not alpha > 0:
        raise fail("alpha", f"{alpha} must be > 0")
    return rng.dirichlet(np.full(num_clients, alpha), size=class_counts.size)


@register_partition("task_groups", assigns_tasks=True, holds_every_class=True)
def _task_groups(class_counts, num_clients, rng, *, classes_per_client, task_classes):
    """Tasks over disjoint class sets; client i solves task i % T with labels 0..C_t-1."""
    _check_task_classes(task_classes, class_counts.size, num_clients, classes_per_client)
    affinity = np.zeros((class_counts.size, num_clients))
    for task, classes in enumerate(task_classes):
        clients = np.arange(task, num_clients, len(task_classes))
        if classes_per_client is not None and classes_per_client < len(classes):
            _assign_classes(affinity, classes, clients, classes_per_client, rng)
        else:
            affinity[np.ix_(classes, clients)] = 1.0
    return affinity


def _check_task_classes(task_classes, num_classes: int, num_clients: int, k) -> None:
    if k is not None and k < 1:
        raise fail("classes_per_client", f"{k} must be >= 1")
    if not task_classes:
        raise fail("task_classes", "required (a list of class lists) for kind 'task_groups'")
    if num_clients < len(task_classes):
        raise fail("num_clients", f"{num_clients} clients cannot cover {len(task_classes)} tasks")
    every = [label for classes in task_classes for label in classes]
    for label in every:
        if not 0 <= label < num_classes:
            raise fail("task_classes", f"class {label} is not in 0..{num_classes - 1}")
        if every.count(label) > 1:
            raise fail("task_classes", f"class {label} appears in more than one task")
    for task, classes in enumerate(task_classes):
        if not classes:
            raise fail("task_classes", f"task {task} has no classes")
        if k is not None and k > len(classes):
            problem = f"{k} exceeds the {len(classes)} classes of task {task}"
            raise fail("classes_per_client", problem)


def _check_labels(labels: np.ndarray, num_classes: int, num_clients: int) -> None:
    if num_clients < 1:
        raise fail("num_clients", f"{num_clients} must be >= 1")
    if labels.ndim != 1 or labels.size == 0 or labels.min() < 0 or labels.max() >= num_classes:
        raise fail("labels", f"must be a non-empty 1-D array of class ids in 0..{num_classes - 1}")
    if num_clients > labels.size:
        raise fail("num_clients", f"{num_clients} clients exceed the {labels.size} samples")


def _kind_params(kind: str, spec: PartitionSpec, options: dict, params: dict) -> dict:
    """The values of the kind's own parameters: data.partition's field of the same name, else
    data.partition.params, else the function's default."""
    if options.get("task_classes") is not None and "task_classes" not in spec.params:
        takers = "/".join(
            name for name, other in PARTITIONS.items() if "task_classes" in other.params
        )
        raise fail("task_classes", f"only used with kind '{takers}', not {kind!r}")
    for key in params:
        if key not in spec.params:
            allowed = ", ".join(spec.params) or "none"
            raise fail(f"params.{key}", f"not a parameter of kind {kind!r} (allowed: {allowed})")
    values = {}
    for name, default in spec.params.items():
        if name in params:
            values[name] = params[name]
        elif name in options:
            values[name] = options[name]
        elif default is REQUIRED:
            raise fail(f"params.{name}", f"required by kind {kind!r}")
    return values


def _check_affinity(kind: str, affinity: object, shape: tuple[int, int]) -> np.ndarray:
    affinity = np.asarray(affinity, dtype=float)
    if affinity.shape != shape or not np.isfinite(affinity).all() or (affinity < 0).any():
        raise fail("kind", f"{kind!r} must return a {shape} affinity of finite values >= 0")
    if not (affinity.sum(axis=0) > 0).any():
        raise fail("kind", f"{kind!r} gave no client any class")
    return affinity


def _allocate(total: int, proportions: np.ndarray, min_one: bool, start: int = 0) -> np.ndarray:
    """Integer sizes summing to `total`, proportional to `proportions` (largest remainders).

    With min_one, every positive entry gets at least one item when there are enough. Tied
    remainders go to the entries from index `start` on, cyclically.
    """
    holders = proportions > 0
    enough = min_one and total >= holders.sum()
    base = holders.astype(int) if enough else np.zeros(holders.size, int)
    share = proportions / proportions.sum() * (total - base.sum())
    sizes = base + np.floor(share).astype(int)
    after_start = (np.arange(sizes.size) - start) % sizes.size
    by_remainder = np.lexsort((after_start, -(share - np.floor(share))))
    sizes[by_remainder[: total - sizes.sum()]] += 1
    return sizes


def _split_by_class(labels, affinity, weights, rng, min_one, rotate) -> list[np.ndarray]:
    pieces: list[list[np.ndarray]] = [[np.empty(0, np.int64)] for _ in weights]
    dealt = 0  # samples of the classes before this one
    for label, class_affinity in enumerate(affinity):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = class_affinity * weights
        if members.size == 0 or proportions.sum() == 0:
            continue  # class absent, or in no task
        # With `rotate` (IID), a class's remainder samples start at the client where the previous
        # class's stopped, as if the class-sorted pool were dealt round-robin, so equal clients
        # differ by at most one sample overall. Starting every class at client 0 piled all the
        # remainders on the same clients (10 classes of 7,000 over 10,000 clients: 7,000 clients
        # got 10 samples and 3,000 got none).
        start = dealt % weights.size if rotate else 0
        sizes = _allocate(members.size, proportions, min_one, start)
        dealt += members.size
        for client, part in enumerate(np.split(members, np.cumsum(sizes)[:-1])):
            pieces[client].append(part)
    return [np.concatenate(client_pieces) for client_pieces in pieces]


def _check_holders(class_counts: np.ndarray, affinity: np.ndarray) -> None:
    holders = (affinity > 0).sum(axis=1)
    if (class_counts < holders).any():
        label = int(np.argmax(class_counts < holders))
        problem = f"class {label} has {class_counts[label]} samples for {holders[label]} clients"
        raise fail("num_clients", problem)


def _top_up(client_idx: list[np.ndarray], minimum: int, rng) -> None:
    """Move random samples from the largest clients to those below `minimum` (in place)."""
    for client in np.argsort([idx.size for idx in client_idx], kind="stable"):
        need = minimum - client_idx[client].size
        donor = int(np.argmax([idx.size for idx in client_idx]))
        if need <= 0 or client_idx[donor].size - need < minimum:
            continue
        moved = rng.choice(client_idx[donor].size, need, replace=False)
        client_idx[client] = np.concatenate([client_idx[client], client_idx[donor][moved]])
        client_idx[donor] = np.delete(client_idx[donor], moved)


def _cap(idx: np.ndarray, labels: np.ndarray, cap: int | None, rng) -> np.ndarray:
    """Stratified subsample of at most `cap` indices, keeping every class when possible."""
    if cap is None or idx.size <= cap:
        return idx
    classes, counts = np.unique(labels[idx], return_counts=True)
    sizes = _allocate(cap, counts.astype(float), min_one=True)
    shuffled = rng.permutation(idx)
    kept = [shuffled[labels[shuffled] == c][:n] for c, n in zip(classes, sizes, strict=True)]
    return np.concatenate(kept)


def partition_clients(
    labels: np.ndarray,
    num_classes: int,
    *,
    num_clients: int,
    kind: str,
    seed: int,
    classes_per_client: int | None = 2,  # task_groups: None = all classes of the task
    alpha: float = 0.5,
    task_classes: list[list[int]] | None = None,
    quantity: str = "equal",
    quantity_sigma: float = 1.0,
    quantity_exponent: float = 1.5,
    rotations: list[int] | None = None,
    mask_probs: list[float] | None = None,
    test_fraction: float = 0.2,
    max_samples_per_client: int | None = None,
    params: dict | None = None,  # the kind's own parameters (data.partition.params)
    **task_split,  # task_users, minority_fraction: the majority-task splits only
) -> list[ClientShard]:
    """Split a pool's labels into per-client train/test shards; deterministic in `seed`."""
    spec = get_partition(kind)
    if spec.keyed:
        raise fail("kind", f"{kind!r} reads the clients a keyed source holds, not labels alone")
    options = {
        "num_clients": num_clients,
        "kind": kind,
        "seed": seed,
        "classes_per_client": classes_per_client,
        "alpha": alpha,
        "task_classes": task_classes,
        "quantity": quantity,
        "quantity_sigma": quantity_sigma,
        "quantity_exponent": quantity_exponent,
        "rotations": rotations,
        "mask_probs": mask_probs,
        "test_fraction": test_fraction,
        "max_samples_per_client": max_samples_per_client,
    }
    if spec.shards:
        return spec.build(
            labels, num_classes, **options, params=params or {}, task_split=task_split
        )
    labels = np.asarray(labels, dtype=np.int64)
    _check_labels(labels, num_classes, num_clients)
    kind_params = _kind_params(kind, spec, options, params or {})
    cap = max_samples_per_client
    validate_sizes(quantity, quantity_sigma, quantity_exponent, test_fraction, cap)
    groups = group_settings(rotations, mask_probs)
    rng = np.random.default_rng(seed)
    weights = quantity_weights(quantity, num_clients, quantity_sigma, quantity_exponent, rng)
    class_counts = np.bincount(labels, minlength=num_classes)
    affinity = spec.build(class_counts, num_clients, rng, **kind_params)
    affinity = _check_affinity(kind, affinity, (num_classes, num_clients))
    if spec.holds_every_class:
        _check_holders(class_counts, affinity)
    # 0/1 affinities are memberships, anything else shares (see partition_registry.py).
    membership = bool(np.isin(affinity, (0.0, 1.0)).all())
    every_class = membership and bool((affinity == 1.0).all())
    client_idx = _split_by_class(labels, affinity, weights, rng, membership, every_class)
    if not membership:
        floor = max(MIN_TRAIN + MIN_TEST, min(DIRICHLET_MIN_SAMPLES, labels.size // num_clients))
        _top_up(client_idx, floor, rng)
    shards = []
    for client, idx in enumerate(client_idx):
        train, test = train_test_split(_cap(idx, labels, cap, rng), labels, test_fraction, rng)
        check_client_size(client, train, test, quantity)
        task = client % len(task_classes) if task_classes else 0
        classes = tuple(int(label) for label in task_classes[task]) if task_classes else None
        shards.append(make_shard(client, train, test, groups, task, classes))
    return shards

"""Turn a client's shard of the pool into float tensors, inside the client's own actor."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raymtl.data.shards import ClientShard
from raymtl.data.source_registry import Pool
from raymtl.tasks.registry import compute_targets, get_target
from raymtl.tasks.spec import TaskSpec

PATCH = 2  # side of the square patches that masking drops


@dataclass
class ClientData:
    """A client's train/test tensors, already rotated, masked and relabelled."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int  # head outputs: C_t when relabelled, the task's outputs, else the pool's
    input_shape: tuple[int, int, int]
    task: TaskSpec | None = None  # decides the loss, optimiser and metrics (None: CE labels)
    public_x: torch.Tensor | None = None  # the public set (data.public), for algorithms on it


def _mask_generator(seed: int, client_id: int) -> torch.Generator:
    # SeedSequence mixes (seed, client_id) so neighbouring clients get unrelated masks.
    state = np.random.SeedSequence([seed, client_id]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def patch_mask(
    num_samples: int, height: int, width: int, drop_prob: float, generator: torch.Generator
) -> torch.Tensor:
    """(N, 1, H, W) float mask of 0/1 where each 2x2 patch is zeroed with `drop_prob`."""
    patches_h, patches_w = -(-height // PATCH), -(-width // PATCH)
    keep = torch.rand(num_samples, 1, patches_h, patches_w, generator=generator) >= drop_prob
    mask = keep.repeat_interleave(PATCH, dim=-2).repeat_interleave(PATCH, dim=-1)
    return mask[..., :height, :width].float()


def _take(tensor: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    return tensor[torch.from_numpy(np.asarray(idx, dtype=np.int64))]


def _relabel(y: torch.Tensor, task_classes: tuple[int, ...] | None, num_classes: int):
    if task_classes is None:
        return y
    lookup = torch.full((num_classes,), -1, dtype=torch.int64)
    lookup[list(task_classes)] = torch.arange(len(task_classes))
    relabelled = lookup[y]
    if (relabelled < 0).any():
        raise ValueError(f"shard.task_classes: {task_classes} misses labels present in the shard")
    return relabelled


def decode_images(pool: Pool, idx, input_shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Samples `idx` as floats in [0, 1], resized (bilinear) to `input_shape`'s height and width
    when the pool's differ (another domain, e.g. 8x8 digits beside 28x28 Fashion-MNIST)."""
    x = _take(pool.x, idx).float().div_(pool.scale)  # _take copies: the pool is untouched
    if input_shape is not None and tuple(x.shape[-2:]) != tuple(input_shape[-2:]):
        size = tuple(int(side) for side in input_shape[-2:])
        x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return x.contiguous()


def _features(
    pool: Pool, idx: np.ndarray, shard: ClientShard, generator, input_shape=None
) -> torch.Tensor:
    x = decode_images(pool, idx, input_shape)
    if shard.rotation % 360:
        x = torch.rot90(x, k=shard.rotation // 90, dims=(-2, -1))
    if shard.mask_prob > 0:
        x = x * patch_mask(x.shape[0], x.shape[-2], x.shape[-1], shard.mask_prob, generator)
    return x.contiguous()


def _from_labels(task: TaskSpec | None) -> bool:
    return task is None or get_target(task.targets).from_labels


def _targets(pool: Pool, idx: np.ndarray, shard: ClientShard, task: TaskSpec | None):
    """Labels (relabelled to the task's classes), or the task's per-sample target table."""
    if _from_labels(task):
        return _relabel(_take(pool.y, idx), shard.task_classes, pool.num_classes)
    return _take(compute_targets(task.targets, pool).values, idx)


def materialize(
    pool: Pool, shard: ClientShard, seed: int, task: TaskSpec | None = None, input_shape=None
):
    """Build a client's float32 tensors from the pool: scale, resize to `input_shape` (another
    domain's images), rotate, mask, targets."""
    # One generator for train then test: each sample's mask is drawn once and stays fixed.
    generator = _mask_generator(seed, shard.client_id)
    train_x = _features(pool, shard.train_idx, shard, generator, input_shape)
    test_x = _features(pool, shard.test_idx, shard, generator, input_shape)
    train_y = _targets(pool, shard.train_idx, shard, task)
    test_y = _targets(pool, shard.test_idx, shard, task)
    num_classes = len(shard.task_classes) if shard.task_classes else pool.num_classes
    if not _from_labels(task):
        num_classes = task.outputs
    input_shape = tuple(int(size) for size in train_x.shape[1:])
    return ClientData(train_x, train_y, test_x, test_y, num_classes, input_shape, task)


def materialize_generated(
    pool: Pool, shard: ClientShard, seed: int, task: TaskSpec | None = None, input_shape=None
) -> ClientData:
    """A generated client's tensors: its samples made here (`pool.generated`), then cut into
    its train and test indices (local to the client), rotated and masked like any shard's."""
    key = shard.client_id if shard.key is None else shard.key
    x, y = pool.generated.generate(key)
    local = Pool(x, y, pool.num_classes, pool.class_names, 1.0, pool.source)
    return materialize(local, shard, seed, task, input_shape)


def materialize_many(
    pool: Pool, shards: list[ClientShard], seed: int, task: TaskSpec | None = None, input_shape=None
) -> list[ClientData]:
    """`materialize` of every shard, bit-identical, with one decode per kind of shard.

    Shards of one rotation and relabelling, without masking, are decoded together: their
    train then test indices concatenated, indexed, scaled, resized and rotated in one call
    each, then cut back per client (every step is per sample, so the values are the ones
    `materialize` computes); each client's tensors are views of its rows of the batch.
    Masked shards draw each sample's mask from the client's own generator in order: they
    are materialised one by one.
    """
    if pool.generated is not None:  # made here, client by client, from (seed, client)
        return [materialize_generated(pool, shard, seed, task, input_shape) for shard in shards]
    datas: dict[int, ClientData] = {}
    kinds: dict[tuple, list[int]] = {}
    for position, shard in enumerate(shards):
        if shard.mask_prob > 0:
            datas[position] = materialize(pool, shard, seed, task, input_shape)
        else:
            kinds.setdefault((shard.rotation % 360, shard.task_classes), []).append(position)
    for positions in kinds.values():
        members = [shards[position] for position in positions]
        datas.update(zip(positions, _unmasked(pool, members, task, input_shape), strict=True))
    return [datas[position] for position in range(len(shards))]


def _unmasked(pool: Pool, shards: list[ClientShard], task: TaskSpec | None, input_shape):
    """ClientData of unmasked shards of one rotation and relabelling, decoded together."""
    first = shards[0]
    parts = [shard.train_idx for shard in shards] + [shard.test_idx for shard in shards]
    ends = np.cumsum([len(idx) for idx in parts]).tolist()
    idx = np.concatenate([np.asarray(part, dtype=np.int64) for part in parts])
    x, y = _features(pool, idx, first, None, input_shape), _targets(pool, idx, first, task)
    # Views, sliced one by one (Tensor.split's 20,000 views for 10,000 clients cost 4x more;
    # a copy each, 6x): nothing writes a client's samples in place.
    xs = [x[start:end] for start, end in zip([0, *ends], ends, strict=False)]
    ys = [y[start:end] for start, end in zip([0, *ends], ends, strict=False)]
    num_classes = len(first.task_classes) if first.task_classes else pool.num_classes
    if not _from_labels(task):
        num_classes = task.outputs
    shape, count = tuple(int(size) for size in x.shape[1:]), len(shards)
    return [
        ClientData(xs[k], ys[k], xs[count + k], ys[count + k], num_classes, shape, task)
        for k in range(count)
    ]

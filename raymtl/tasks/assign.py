"""Which task each client solves, and the resolved `TaskSpec` of every task.

    data.tasks empty        every partition task is a label task (relabelled to its classes
                            when the partition relabels, e.g. task_groups)
    one task                every client solves it (the partition's task ids are kept for
                            the reports, e.g. majority-task splits)
    several tasks           the partition's tasks (task_groups, *_tasks) map to them in order;
                            otherwise clients are dealt to them in file order by `clients`

Head sizes come from the targets: the classes of a label task, or the columns (classes) of
the table a registered target computes from the source (tasks/registry.py).
"""

from __future__ import annotations

import dataclasses

from raymtl.tasks.registry import get_target, target_outputs
from raymtl.tasks.spec import OptimizerSpec, TaskSpec, label_task


def _fail(index: int, field: str, problem: str) -> ValueError:
    return ValueError(f"data.tasks.{index}.{field}: {problem}")


def resolve_task(index: int, task, pool, label_classes) -> TaskSpec:
    """A `data.tasks` entry (TaskConfig) resolved against the pool."""
    target = get_target(task.targets)
    try:
        outputs = target_outputs(pool, task.targets, label_classes)
    except ValueError as error:  # the target cannot be computed on this pool
        message = str(error).splitlines()[0].removeprefix(f"targets '{task.targets}': ")
        raise _fail(index, "targets", message) from None
    if task.outputs is not None and task.outputs != outputs:
        given = f"{task.outputs}, but targets '{task.targets}' of this dataset give {outputs}"
        raise _fail(index, "outputs", given)
    optimizer = OptimizerSpec(**task.optimizer.model_dump()) if task.optimizer else None
    return TaskSpec(
        name=task.name,
        targets=task.targets,
        loss=target.loss,
        outputs=outputs,
        optimizer=optimizer,
        metrics=tuple(task.metrics or target.metrics),
        label_classes=tuple(label_classes) if label_classes else None,
    )


def partition_tasks(shards) -> dict[int, tuple | None]:
    """Task id -> its relabelled classes (None: all classes), as the partition gave them."""
    return {shard.task: shard.task_classes for shard in sorted(shards, key=lambda s: s.task)}


def assign_tasks(cfg, pools: dict, shards) -> tuple[list, list[TaskSpec]]:
    """The shards with their task ids set, and the TaskSpec of every task id.

    `pools`: dataset name -> Pool; a task is resolved on the dataset its clients draw from.
    """
    declared, by_partition = cfg.data.tasks, partition_tasks(shards)
    pool = pools[cfg.data.source_of(0 if declared else None)]
    if not declared:  # the pool's classes; a text's next character (LEAF Shakespeare)
        single = "next_character" if pool.inputs == "tokens" else "label"
        name = single if len(by_partition) == 1 else "task{}"
        specs = [
            label_task(name.format(t), target_outputs(pool, "label", classes), classes)
            for t, classes in sorted(by_partition.items())
        ]
        return shards, specs
    if len(declared) == 1:  # one kind of task; a relabelling partition still sizes each head
        specs = [
            resolve_task(0, declared[0], pool, classes)
            for _, classes in sorted(by_partition.items())
        ]
        if len(specs) > 1:
            specs = [dataclasses.replace(s, name=f"{s.name}-{t}") for t, s in enumerate(specs)]
        return shards, specs
    transformed = any(shard.rotation or shard.mask_prob for shard in shards)
    if transformed and not all(get_target(task.targets).from_labels for task in declared):
        raise ValueError(
            "data.partition.rotations: targets other than labels are computed on upright, "
            "unmasked images"
        )
    if len(by_partition) > 1:  # the partition decides who solves which task
        if len(by_partition) != len(declared):
            raise ValueError(
                f"data.tasks: {len(declared)} tasks, but partition "
                f"'{cfg.data.partition.kind}' has {len(by_partition)}"
            )
        specs = [resolve_task(t, task, pool, by_partition[t]) for t, task in enumerate(declared)]
        return shards, specs
    task_of = [t for t, task in enumerate(declared) for _ in range(task.clients)]
    shards = [dataclasses.replace(shard, task=task_of[shard.client_id]) for shard in shards]
    specs = [
        resolve_task(t, task, pools[cfg.data.source_of(t)], None) for t, task in enumerate(declared)
    ]
    return shards, specs

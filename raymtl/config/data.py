"""The data sections of the experiment: the source, its partition, the clients' tasks and
the public dataset some algorithms align on (FedMuscle).

Partition kinds and task targets are names in their registries (built-in or a plugin's),
checked here; dataset names are checked with the rest of the experiment (config/checks.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from raymtl.config.base import Section
from raymtl.data.partition_registry import PARTITIONS, REQUIRED
from raymtl.tasks.registry import TARGETS


def partition_has_tasks(partition: PartitionConfig) -> bool:
    """Partitions that assign each client a task themselves."""
    return PARTITIONS[partition.kind].assigns_tasks


class PartitionConfig(Section):
    kind: str = Field(
        "classes_per_client", description="a partition kind (`raymtl list`: partitions)"
    )
    classes_per_client: int | None = Field(
        2, ge=1, description="task_groups: null = every client holds all classes of its task"
    )
    alpha: float = Field(0.5, gt=0)
    task_classes: list[list[int]] | None = None
    quantity: Literal["equal", "lognormal", "powerlaw"] = "equal"
    quantity_sigma: float = Field(1.0, gt=0)
    quantity_exponent: float = Field(1.5, gt=0)
    rotations: list[int] | None = None
    mask_probs: list[float] | None = None
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_samples_per_client: int | None = Field(None, ge=3)
    task_users: list[int] | None = Field(None, description="*_tasks: users per task (5/3/2)")
    minority_fraction: float = Field(0.1, ge=0, lt=1, description="*_tasks: other tasks' share")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the kind's own parameters (a plugin's kind)"
    )

    @field_validator("kind")
    @classmethod
    def _kind_is_registered(cls, kind: str) -> str:
        if kind not in PARTITIONS:
            raise ValueError(PARTITIONS.unknown(kind, field=""))
        return kind

    @model_validator(mode="after")
    def _params_are_the_kinds(self) -> PartitionConfig:
        spec = PARTITIONS[self.kind]
        for key in self.params:
            if key in type(self).model_fields:
                raise ValueError(f"params.{key}: set data.partition.{key} instead")
            if key not in spec.params:
                allowed = ", ".join(spec.params) or "none"
                raise ValueError(
                    f"params.{key}: not a parameter of kind '{self.kind}' (allowed: {allowed})"
                )
        for key, default in spec.params.items():
            given = key in self.params or key in type(self).model_fields
            if default is REQUIRED and not given:
                raise ValueError(f"params.{key}: required by kind '{self.kind}'")
        return self


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(gt=0, allow_inf_nan=False)
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only")
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _momentum_is_sgd_only(self) -> OptimizerConfig:
        if self.momentum and self.name != "sgd":
            raise ValueError(f"momentum: only for sgd, not {self.name}")
        return self


class TaskConfig(Section):
    """One task of the federation: its targets decide the head, loss and metrics."""

    name: str = Field(min_length=1)
    targets: str = Field("label", description="a registered target (`raymtl list`)")
    loss: Literal["cross_entropy", "bce", "mse"] | None = Field(None, description="default: fits")
    outputs: int | None = Field(None, ge=1, description="head outputs; default: the targets'")
    optimizer: OptimizerConfig | None = Field(None, description="null: the algorithm's SGD")
    metrics: list[str] | None = Field(None, description="default: every metric of the loss")
    clients: int | None = Field(None, ge=1, description="clients of this task (in file order)")
    source: str | None = Field(
        None, description="another dataset (domain) for this task, resized to data.name's images"
    )

    @field_validator("targets")
    @classmethod
    def _targets_are_registered(cls, targets: str) -> str:
        if targets not in TARGETS:
            raise ValueError(TARGETS.unknown(targets, field=""))
        return targets

    @model_validator(mode="after")
    def _loss_and_metrics_fit(self) -> TaskConfig:
        target = TARGETS[self.targets]
        if self.loss is not None and self.loss != target.loss:
            raise ValueError(
                f"loss: '{self.loss}' does not fit targets '{self.targets}' "
                f"(allowed: {target.loss})"
            )
        allowed = target.metrics
        for metric in self.metrics or ():
            if metric not in allowed:
                raise ValueError(f"metrics: '{metric}' is not one of {', '.join(allowed)}")
        return self


class PublicConfig(Section):
    """An unlabelled public dataset held by the federation (FedMuscle aligns on it).

    Taken from `name`'s official test split when it has one (else from the whole pool) and
    never given to any client: the partition runs on what is left.
    """

    name: str | None = Field(None, description="data source; null = data.name")
    size: int = Field(1000, ge=1, description="public samples")


class DataConfig(Section):
    name: str = "digits"
    root: str | None = None
    download: bool = False
    num_clients: int = Field(
        20, ge=1, description="keyed sources: default all the data's clients (natural)"
    )
    partition: PartitionConfig = PartitionConfig()
    params: dict[str, Any] = Field(default_factory=dict, description="source parameters")
    tasks: list[TaskConfig] = Field(
        default_factory=list, description="the clients' tasks; empty = classify the labels"
    )
    public: PublicConfig | None = Field(None, description="public unlabelled data (FedMuscle)")

    @model_validator(mode="after")
    def _keyed_data_decides(self) -> DataConfig:
        """Data already split by client: its clients are the federation's (partition
        `natural`) unless the file says otherwise, and all of them unless num_clients is
        given (counted by loading the source: a missing file is refused here)."""
        from raymtl.data.source_registry import is_keyed, load_pool

        if not is_keyed(self.name):
            return self
        if "kind" not in self.partition.model_fields_set:
            self.partition = self.partition.model_copy(update={"kind": "natural"})
            self.partition.model_fields_set.add("kind")
        if "num_clients" in self.model_fields_set or not PARTITIONS[self.partition.kind].keyed:
            return self
        pool = load_pool(self.name, self.root, self.download, 0, None, **self.params)
        self.num_clients = pool.num_keyed_clients
        self.model_fields_set.add("num_clients")
        return self

    @model_validator(mode="after")
    def _tasks_cover_the_clients(self) -> DataConfig:
        names = [task.name for task in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks: names must be distinct, got {names}")
        counts = [task.clients for task in self.tasks]
        dealt = len(self.tasks) > 1 and not partition_has_tasks(self.partition)
        if dealt and (None in counts or sum(counts) != self.num_clients):
            raise ValueError(
                f"tasks: give every task 'clients' summing to num_clients ({self.num_clients})"
            )
        sourced = [t for t, task in enumerate(self.tasks) if task.source not in (None, self.name)]
        if sourced and partition_has_tasks(self.partition):
            raise ValueError(
                f"tasks.{sourced[0]}.source: partition '{self.partition.kind}' splits one "
                "dataset into tasks; tasks on other datasets need iid, classes_per_client or "
                "dirichlet"
            )
        return self

    def source_of(self, task: int | None) -> str:
        """The dataset the clients of task `task` draw from (data.name unless the task names
        another)."""
        if task is None or not self.tasks:
            return self.name
        return self.tasks[task].source or self.name

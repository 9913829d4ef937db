"""Datasets as in-memory pools, their federated partitions, and per-client tensors.

Importing the package registers the built-in sources (sources.py, user_sources.py) and
partition kinds (partitions.py, task_splits.py); plugins add theirs with
`register_dataset` and `register_partition`.
"""

from raymtl.data import partitions, sources, task_splits, user_sources  # noqa: F401  (built-ins)
from raymtl.data.client_data import ClientData, materialize, materialize_many
from raymtl.data.partition_registry import PARTITIONS, PartitionSpec, register_partition
from raymtl.data.partitions import ClientShard, partition_clients
from raymtl.data.source_registry import (
    SOURCES,
    DatasetMissing,
    Pool,
    load_pool,
    register_dataset,
)

__all__ = [
    "PARTITIONS",
    "SOURCES",
    "ClientData",
    "ClientShard",
    "DatasetMissing",
    "PartitionSpec",
    "Pool",
    "load_pool",
    "materialize",
    "materialize_many",
    "partition_clients",
    "register_dataset",
    "register_partition",
]

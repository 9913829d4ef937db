"""Datasets as in-memory pools, their federated partitions, and per-client tensors.

Importing the package registers the built-in sources (sources.py, user_sources.py,
table_source.py, client_folders.py, leaf_source.py, leaf_synthetic.py, hf_source.py) and
partition kinds (partitions.py, task_splits.py, natural.py); plugins add theirs with
`register_dataset` and `register_partition`.
"""

# The datasets first, so that they lead the list of sources (`raymtl list`, errors); then the
# keyed sources in the order they are listed (table, client_folders, leaf).
from raymtl.data import sources  # noqa: F401  # isort: skip
from raymtl.data import table_source, client_folders, leaf_source  # noqa: F401  # isort: skip
from raymtl.data import (  # noqa: F401  (the built-ins register themselves)
    hf_source,
    leaf_synthetic,
    natural,
    partitions,
    task_splits,
    user_sources,
)
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

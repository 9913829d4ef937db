"""Datasets as in-memory pools, their federated partitions, and per-client tensors."""

from raymtl.data.client_data import ClientData, materialize
from raymtl.data.partitions import PARTITIONS, ClientShard, partition_clients
from raymtl.data.sources import SOURCES, DatasetMissing, Pool, load_pool

__all__ = [
    "PARTITIONS",
    "SOURCES",
    "ClientData",
    "ClientShard",
    "DatasetMissing",
    "Pool",
    "load_pool",
    "materialize",
    "partition_clients",
]

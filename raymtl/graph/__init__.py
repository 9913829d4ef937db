"""Client communication graphs and their mixing weights."""

from raymtl.graph.topology import (
    STRUCTURED_KINDS,
    TOPOLOGIES,
    TopologySpec,
    build_topology,
    metropolis_weights,
    neighbours,
    register_topology,
)

__all__ = [
    "STRUCTURED_KINDS",
    "TOPOLOGIES",
    "TopologySpec",
    "build_topology",
    "metropolis_weights",
    "neighbours",
    "register_topology",
]

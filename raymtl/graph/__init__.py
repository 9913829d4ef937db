"""Client communication graphs and their mixing weights."""

from raymtl.graph.topology import (
    TOPOLOGIES,
    TopologySpec,
    build_topology,
    metropolis_weights,
    neighbours,
)

__all__ = ["TOPOLOGIES", "TopologySpec", "build_topology", "metropolis_weights", "neighbours"]

"""SFMTL-Graph's graph service over a cohort of S = 1,000 clients: the similarity graph
(raymtl.graph.similarity.similarity_graph), Louvain and Leiden communities and modularity,
each timed once, with this process's peak RSS.

Views as a 10-class mlp's head (K = 10, d = 200) with anchors for 3 random classes per client,
seeded random values (the costs depend on the shapes, not the values).

    .venv/bin/python benchmarks/graph_cohort.py [--clients 1000]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from raymtl.graph.communities import detect_communities, modularity
from raymtl.graph.similarity import ClientView, similarity_graph


def views(clients: int, classes: int = 10, dim: int = 200) -> dict[int, ClientView]:
    generator = torch.Generator().manual_seed(0)
    out = {}
    for i in range(clients):
        held = sorted(np.random.default_rng(i).choice(classes, 3, replace=False).tolist())
        out[i] = ClientView(
            torch.randn(classes, dim, generator=generator),
            torch.randn(classes, generator=generator),
            {c: torch.randn(dim, generator=generator) for c in held},
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    args = parser.parse_args()
    cohort = views(args.clients)
    began = time.perf_counter()
    graph = similarity_graph(cohort, 0.49)
    print(f"similarity graph over {args.clients}: {time.perf_counter() - began:.2f} s")
    for method in ("louvain", "leiden"):
        began = time.perf_counter()
        labels = detect_communities(graph.s, method, 0)
        took = time.perf_counter() - began
        quality = modularity(graph.s, labels)
        print(f"{method}: {took:.2f} s, {len(set(labels))} communities, Q = {quality:.3f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.2f} GiB")


if __name__ == "__main__":
    main()

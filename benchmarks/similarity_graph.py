"""SFMTL-Graph's similarity graph: the pairwise loop it was against the batched per-class form.

S participating clients with cnn_mnist-sized uploads: a linear head of K = 10 logits over the
backbone's d = 512 features (raymtl.models.cnn: `_CNN_FEATURE_DIM`; values: the head of a real
`build_model("cnn_mnist", (1, 28, 28), 10)` plus N(0, 0.01²) noise per client) and one
L2-normalised N(0, 1) anchor row per held class. Two class layouts over C = 10 classes:
    all     every client holds every class (the dense worst case: S²·C·(K + 1)·d work);
    2/10    2 random classes per client, as jobs/sfmtl_graph_*.yaml's classes_per_client.
Timed at α = 0.49, median of `--repeats` runs, old and new alternating so that a load change
on a shared machine hits both alike:
    old  raymtl.graph.similarity.pairwise_similarity_graph (the pre-change similarity_graph:
         `pair_similarity` for each of the S(S−1)/2 pairs), verbatim;
    new  raymtl.graph.similarity.similarity_graph (per-class float64 products).
Wall seconds and this process's CPU seconds (the steadier figure on a shared machine); max |Δ|
is the largest entry-wise gap between old and new over s, FS and AS. Sizes in `--new-only`
time the new form alone (the old loop would take minutes there) and report the process's
peak resident memory after them.

    .venv/bin/python benchmarks/similarity_graph.py [--sizes 25 50 100 400 --repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from raymtl.graph.similarity import (
    ClientView,
    SimilarityGraph,
    pairwise_similarity_graph,
    similarity_graph,
)
from raymtl.models.registry import build_model

ALPHA = 0.49
NUM_CLASSES = 10
LAYOUTS = {"all": NUM_CLASSES, "2/10": 2}


def client_views(count: int, classes_per_client: int, seed: int = 0) -> dict[int, ClientView]:
    """`count` cnn_mnist-shaped uploads: the initial head plus noise, unit anchor rows."""
    head = build_model("cnn_mnist", (1, 28, 28), NUM_CLASSES).head.fc
    weight, bias = head.weight.detach(), head.bias.detach()
    generator = torch.Generator().manual_seed(seed)
    views = {}
    for client in range(count):
        classes = torch.randperm(NUM_CLASSES, generator=generator)[:classes_per_client]
        rows = F.normalize(torch.randn(len(classes), weight.shape[1], generator=generator), dim=1)
        views[client] = ClientView(
            weight=weight + 0.01 * torch.randn(weight.shape, generator=generator),
            bias=bias + 0.01 * torch.randn(bias.shape, generator=generator),
            anchors={int(c): row for c, row in zip(classes.tolist(), rows, strict=True)},
        )
    return views


def max_gap(new: SimilarityGraph, old: SimilarityGraph) -> float:
    return max(float(np.abs(getattr(new, k) - getattr(old, k)).max()) for k in ("s", "fs", "as_"))


def timed(graph_function, views) -> tuple[SimilarityGraph, float, float]:
    """(graph, wall s, this process's CPU s)."""
    wall, cpu = time.perf_counter(), time.process_time()
    graph = graph_function(views, ALPHA)
    return graph, time.perf_counter() - wall, time.process_time() - cpu


def measure(views, repeats: int, with_old: bool = True) -> dict[str, float]:
    """Medians over `repeats` of wall and CPU seconds, old and new alternating; max |Δ|."""
    times: dict[str, list[float]] = {"old": [], "new": [], "old_cpu": [], "new_cpu": []}
    for _ in range(repeats):
        if with_old:
            old, wall, cpu = timed(pairwise_similarity_graph, views)
            times["old"].append(wall)
            times["old_cpu"].append(cpu)
        new, wall, cpu = timed(similarity_graph, views)
        times["new"].append(wall)
        times["new_cpu"].append(cpu)
    medians = {key: statistics.median(values) for key, values in times.items() if values}
    return medians | ({"gap": max_gap(new, old)} if with_old else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 400])
    parser.add_argument("--new-only", type=int, nargs="*", default=[1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# {platform.node()} {platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), C = K = {NUM_CLASSES}, d = 512, α = {ALPHA}, "
        f"median of {args.repeats}"
    )
    print(
        "| S | classes per client | old loop s | new batched s | speed-up "
        "| old CPU s | new CPU s | CPU speed-up | max \\|Δ\\| |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for count in args.sizes:
        for layout in args.layouts:
            t = measure(client_views(count, LAYOUTS[layout]), args.repeats)
            print(
                f"| {count} | {layout} | {t['old']:.3f} | {t['new']:.4f} | "
                f"{t['old'] / t['new']:.0f}x | {t['old_cpu']:.3f} | {t['new_cpu']:.4f} | "
                f"{t['old_cpu'] / t['new_cpu']:.0f}x | {t['gap']:.1e} |",
                flush=True,
            )
    before_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for count in args.new_only:
        for layout in args.layouts:
            t = measure(client_views(count, LAYOUTS[layout]), args.repeats, with_old=False)
            print(
                f"| {count} | {layout} | — | {t['new']:.3f} | — | — | {t['new_cpu']:.3f} | — | — |",
                flush=True,
            )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\npeak resident memory of the process: {before_mib:.0f} MiB before the new-only "
        f"sizes, {peak_mib:.0f} MiB after"
    )


if __name__ == "__main__":
    main()

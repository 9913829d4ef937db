"""Louvain vs Leiden for SFMTL-Graph's community step: modularity, stability, time.

A weighted planted-partition graph (default 1,000 nodes in 20 groups of 50) stands in for a
similarity graph: within-group pairs are edges with probability p_in and weight U(0.5, 1),
across groups with probability p_out and weight U(0, 0.3). Each "round" jitters every weight
by a factor 1 + N(0, noise) (clipped at 0) and re-runs detection with a fresh seed, as SFMTL-Graph
does every round. Reported per method (mean over rounds):
    modularity  Q of the partition found;
    ari_truth   adjusted Rand index vs the planted groups;
    stability   ARI between consecutive rounds' partitions (1 = identical);
    time_s      wall time of one detection (imports excluded).

    .venv/bin/python benchmarks/communities.py [--nodes 1000 --groups 20 --rounds 10]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

from raymtl.graph.communities import METHODS, detect_communities, modularity


def planted_graph(nodes: int, groups: int, p_in: float, p_out: float, seed: int):
    """Symmetric weight matrix and the planted group of every node."""
    rng = np.random.default_rng(seed)
    truth = np.arange(nodes) % groups
    same = np.equal.outer(truth, truth)
    edge = rng.uniform(size=(nodes, nodes)) < np.where(same, p_in, p_out)
    weight = np.where(
        same, rng.uniform(0.5, 1.0, (nodes, nodes)), rng.uniform(0, 0.3, (nodes, nodes))
    )
    w = np.triu(np.where(edge, weight, 0.0), k=1)
    return w + w.T, truth


def jitter(weights: np.ndarray, noise: float, rng) -> np.ndarray:
    """One round's graph: every weight scaled by 1 + N(0, noise), clipped at 0, symmetric."""
    factor = np.triu(1 + noise * rng.standard_normal(weights.shape), k=1)
    w = np.clip(np.triu(weights, k=1) * factor, 0, None)
    return w + w.T


def run(method: str, base: np.ndarray, truth: np.ndarray, rounds: int, noise: float) -> dict:
    rng = np.random.default_rng(0)
    detect_communities(np.ones((3, 3)), method)  # warm-up: library imports are not timed
    labels, scores = [], {"modularity": [], "ari_truth": [], "time_s": []}
    for round_index in range(rounds):
        weights = jitter(base, noise, rng)
        start = time.perf_counter()
        found = detect_communities(weights, method, seed=round_index)
        scores["time_s"].append(time.perf_counter() - start)
        scores["modularity"].append(modularity(weights, found))
        scores["ari_truth"].append(adjusted_rand_score(truth, found))
        labels.append(found)
    stability = [adjusted_rand_score(a, b) for a, b in zip(labels, labels[1:], strict=False)]
    result = {key: float(np.mean(values)) for key, values in scores.items()}
    result["stability"] = float(np.mean(stability)) if stability else float("nan")
    result["communities"] = float(np.mean([len(set(found)) for found in labels]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--p-in", type=float, default=0.2)
    parser.add_argument("--p-out", type=float, default=0.02)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    base, truth = planted_graph(args.nodes, args.groups, args.p_in, args.p_out, seed=0)
    print(
        f"# {args.nodes} nodes, {args.groups} groups, {int((base > 0).sum() // 2)} edges, "
        f"{args.rounds} rounds, noise {args.noise}; {platform.node()} {platform.processor()}"
    )
    print(
        "| method | modularity | ARI vs planted | stability (ARI t,t+1) | communities | time (s) |"
    )
    print("|---|---|---|---|---|---|")
    for method in METHODS:
        r = run(method, base, truth, args.rounds, args.noise)
        print(
            f"| {method} | {r['modularity']:.4f} | {r['ari_truth']:.3f} | {r['stability']:.3f} "
            f"| {r['communities']:.1f} | {r['time_s']:.3f} |"
        )


if __name__ == "__main__":
    main()

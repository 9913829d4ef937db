"""FedU's server Laplacian step: the pairwise loop it was against the batched matrix product.

S participating cnn_mnist models (1.66 M parameters: the shapes of a real
`build_model("cnn_mnist", (1, 28, 28), 10)`, values its initial weights plus N(0, 0.01²)
noise per client), FedU's full similarity over them (every k reads every l ≠ k): `ones`, and
the default `random` graph (symmetric U(0,1), entries < 0.25 zeroed, seed 0), step
η·λ·R of FedU's defaults. Timed, median of `--repeats` runs, old and new alternating so a
load change on a shared machine hits both alike:
    old  `reference_laplacian_step`, the pre-change code of raymtl.algorithms.fedu
         (a loop over pairs (k, l): three model-sized elementwise passes per pair), verbatim;
    new  raymtl.algorithms.fedu.laplacian_step (W ← (I − s·L)·W, one torch.mm per block).
Wall seconds and this process's CPU seconds (the steadier figure on a shared machine: other
processes' load stretches the wall time, not the CPU time of one thread); max |Δ| is the
largest entry-wise gap between old and new, over all models and tensors.

    .venv/bin/python benchmarks/graph_step.py [--sizes 25 50 100 --repeats 3 --threads 1 2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from raymtl.algorithms.fedu import FedUParams, laplacian_step, similarity_rows
from raymtl.algorithms.training import model_tensors
from raymtl.models.registry import build_model

Tensors = dict[str, torch.Tensor]


def reference_laplacian_step(
    models: dict[int, Tensors], weights: dict[int, dict[int, float]], step: float
) -> dict[int, Tensors]:
    """The pre-change laplacian_step of raymtl.algorithms.fedu (pairwise loop), verbatim."""
    updated, scratch = {}, {}
    for k in sorted(weights):
        own = models[k]
        new = {name: value.clone() for name, value in own.items()}
        for l_ in sorted(weights.get(k, {})):
            a = weights[k][l_]
            if l_ == k or a == 0 or l_ not in models:
                continue
            for name, value in new.items():
                buffer = scratch.setdefault(name, torch.empty_like(own[name]))
                torch.sub(own[name], models[l_][name], out=buffer)
                value.sub_(buffer.mul_(step * a))
        updated[k] = new
    return updated


def client_models(count: int) -> dict[int, Tensors]:
    """`count` cnn_mnist-shaped models: the initial weights plus N(0, 0.01²) per client."""
    base = model_tensors(build_model("cnn_mnist", (1, 28, 28), 10))
    generator = torch.Generator().manual_seed(0)
    return {
        k: {
            name: value + 0.01 * torch.randn(value.shape, generator=generator)
            for name, value in base.items()
        }
        for k in range(count)
    }


def similarity(kind: str, count: int) -> dict[int, dict[int, float]]:
    """FedU's weights when all `count` clients of a federation of `count` take part."""
    clients = list(range(count))
    return similarity_rows(FedUParams(similarity=kind), count, 0, clients, clients)


def max_gap(new: dict[int, Tensors], old: dict[int, Tensors]) -> float:
    return max(float((new[k][n] - old[k][n]).abs().max()) for k in old for n in old[k])


def timed(step_function, *args) -> tuple[dict, float, float]:
    """(result, wall s, this process's CPU s)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = step_function(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(models, weights, step: float, repeats: int) -> dict[str, float]:
    """Medians over `repeats` of wall and CPU seconds, old and new alternating; max |Δ|."""
    times: dict[str, list[float]] = {"old": [], "new": [], "old_cpu": [], "new_cpu": []}
    for _ in range(repeats):
        old, wall, cpu = timed(reference_laplacian_step, models, weights, step)
        times["old"].append(wall)
        times["old_cpu"].append(cpu)
        new, wall, cpu = timed(laplacian_step, models, weights, step)
        times["new"].append(wall)
        times["new_cpu"].append(cpu)
    medians = {key: statistics.median(values) for key, values in times.items()}
    return medians | {"gap": max_gap(new, old)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["ones", "random"])
    parser.add_argument("--threads", type=int, nargs="+", help="default: 1 and torch's default")
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    thread_counts = args.threads or sorted({1, default_threads})
    params = FedUParams()
    step = params.lr * params.lam * params.epochs
    print(
        f"# {platform.node()} {platform.machine()}, torch {torch.__version__}, "
        f"default threads {default_threads}, step {step:g}, median of {args.repeats}"
    )
    print(
        "| S | similarity | torch threads | old loop s | new matrix s | speed-up "
        "| old CPU s | new CPU s | CPU speed-up | max \\|Δ\\| |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for count in args.sizes:
            models = client_models(count)
            for kind in args.kinds:
                t = measure(models, similarity(kind, count), step, args.repeats)
                print(
                    f"| {count} | {kind} | {threads} | {t['old']:.2f} | {t['new']:.3f} | "
                    f"{t['old'] / t['new']:.1f}x | {t['old_cpu']:.2f} | {t['new_cpu']:.3f} | "
                    f"{t['old_cpu'] / t['new_cpu']:.1f}x | {t['gap']:.1e} |",
                    flush=True,
                )
            del models
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()

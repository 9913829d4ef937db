"""Sheaf-FMTL's restriction maps: drawing them, and a round's passes over them, old against new.

One client actor's work, in process, on the rotated Fashion-MNIST twin's graph
(jobs/sheaf_fmtl_rotated_fmnist.yaml: d_i = 34,826, γ = 0.01 so d_ij = 348, a 48 MB map):
the clients of `--clients` (a block like an actor's) draw their maps, then run `--rounds`
rounds of the steps after training (P_ij θ_i sent, θ-step, map step) with their neighbours'
values drawn at random. `old` is `ReferenceSheafFMTL` below, the code before this change
copied as it was (randn then a scaling pass; every gap's P_ij θ_i recomputed); `new` is
raymtl's SheafFMTL. Each variant runs in a fresh process (a map's first touch of fresh pages
is part of its cost), one torch thread as in an actor, the two alternating `--repeats`
times; the table gives medians: wall and CPU (user, system) seconds of the draw, peak
resident memory above the process's before the draw against the bytes drawn, and seconds
(wall and CPU) of the steps per round. CPU seconds hold when other work loads the machine,
wall seconds do not. A digest of every map checks both variants drew the same values.

    .venv/bin/python benchmarks/sheaf_maps.py                      # clients 20-29 of seed 0
    .venv/bin/python benchmarks/sheaf_maps.py --clients 20:40 --repeats 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from raymtl.algorithms.aggregate import by_sender
from raymtl.algorithms.base import Message, State, StepContext, client_name, index_of
from raymtl.algorithms.sheaf_fmtl import DIM, VALUE, SheafFMTL, interaction_dim
from raymtl.algorithms.training import derive_seed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "sheaf_fmtl_rotated_fmnist.yaml"


class ReferenceSheafFMTL(SheafFMTL):
    """Sheaf-FMTL's map code before this change, unchanged: the baseline `old` measures."""

    def init_maps(self, state, inbox, ctx) -> None:
        d_i = self.flat_theta(state.model).numel()
        maps = {}
        for message in by_sender(inbox):
            j = index_of(message.src)
            d_ij = interaction_dim(d_i, int(message.tensors[DIM]), self.params.gamma)
            generator = torch.Generator().manual_seed(derive_seed(ctx.seed, "map", ctx.me, j))
            maps[j] = torch.randn(d_ij, d_i, generator=generator).mul_(self.params.init_std)
        state.extras["maps"] = maps

    def projections(self, state, ctx, theta):
        maps = state.extras["maps"]
        return [
            Message(ctx.me, client_name(j), VALUE, {VALUE: maps[j] @ theta}) for j in sorted(maps)
        ]

    def disagreements(self, state, inbox, ctx, theta):
        maps, out = state.extras["maps"], {}
        for message in by_sender(inbox):
            theirs = message.tensors[VALUE]
            if torch.isfinite(theirs).all():
                j = index_of(message.src)
                out[j] = maps[j] @ theta - theirs
        return out


def thread_times() -> tuple[float, float, float]:
    """Wall, user and system seconds of this thread so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return time.perf_counter(), usage.ru_utime, usage.ru_stime


def status_bytes(key: str) -> int:
    """A /proc/self/status figure (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def federation_of(seed: int):
    """The job's federation for `seed` (its graph and every client's data shape)."""
    from raymtl.api.experiments import experiment_config
    from raymtl.runtime.executors.executor import InlineExecutor
    from raymtl.runtime.executors.planning import build_federation, partition

    cfg = experiment_config(JOB, [f"seeds=[{seed}]", "runtime.executor=inline"])
    pools, shards, specs, _ = partition(cfg, seed)
    executor = InlineExecutor(cfg.runtime)
    return cfg, build_federation(cfg, seed, executor, pools[cfg.data.name], shards, specs)


def worker(variant: str, clients: range, seed: int, rounds: int) -> dict:
    """One variant's draw and rounds for `clients`, in this (fresh) process."""
    from raymtl.models import build_model

    torch.set_num_threads(1)
    cfg, fed = federation_of(seed)
    cls = ReferenceSheafFMTL if variant == "old" else SheafFMTL
    algorithm = cls(cfg.algorithm.typed_params(), None)
    model = build_model(cfg.model.name, fed.input_shape, fed.num_classes[0])
    d = algorithm.state_size(model)
    states = {i: State(model=model, extras={}) for i in clients}

    def ctx(i: int, round_index: int) -> StepContext:
        return StepContext(client_name(i), round_index, rounds, seed, (), fed)

    before, began = status_bytes("VmRSS"), thread_times()
    for i in clients:
        announced = [
            Message(client_name(j), client_name(i), DIM, {DIM: torch.tensor([d])})
            for j in fed.neighbours(i)
        ]
        algorithm.init_maps(states[i], announced, ctx(i, 1))
    ended = thread_times()
    maps = [states[i].extras["maps"][j] for i in clients for j in sorted(fed.neighbours(i))]
    drawn = sum(m.numel() * m.element_size() for m in maps)
    digest = hashlib.blake2b(digest_size=16)
    for matrix in maps:
        digest.update(matrix.numpy().data)

    theta = algorithm.flat_theta(model)
    noise = torch.Generator().manual_seed(1)
    round_wall, round_cpu = [], []
    for round_index in range(1, rounds + 1):
        start = thread_times()
        for step in ("projections", "theta_step", "map_step"):
            for i in clients:
                inbox = neighbours_values(i, states[i].extras["maps"], noise)
                if step == "projections":
                    algorithm.projections(states[i], ctx(i, round_index), theta)
                else:
                    getattr(algorithm, step)(states[i], inbox, ctx(i, round_index))
        end = thread_times()
        round_wall.append(end[0] - start[0])
        round_cpu.append(end[1] + end[2] - start[1] - start[2])
    return {
        "maps": len(maps),
        "bytes": drawn,
        "draw_wall": ended[0] - began[0],
        "draw_user": ended[1] - began[1],
        "draw_sys": ended[2] - began[2],
        "peak_above": status_bytes("VmHWM") - before,
        "round_wall": statistics.median(round_wall),
        "round_cpu": statistics.median(round_cpu),
        "digest": digest.hexdigest(),
    }


def neighbours_values(i: int, maps: dict, noise: torch.Generator) -> list[Message]:
    """What client i's neighbours send it: random d_ij-vectors (their maps are not here)."""
    return [
        Message(
            client_name(j), client_name(i), VALUE, {VALUE: torch.randn(len(m), generator=noise)}
        )
        for j, m in sorted(maps.items())
    ]


def run_worker(variant: str, args) -> dict:
    command = [sys.executable, __file__, "--worker", variant, "--clients", args.clients]
    command += ["--seed", str(args.seed), "--rounds", str(args.rounds)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def clients_of(text: str) -> range:
    first, last = (int(x) for x in text.split(":"))
    return range(first, last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20:30", help="first:last (exclusive) clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=("old", "new"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, clients_of(args.clients), args.seed, args.rounds)
        print(json.dumps(result))
        return
    results: dict[str, list[dict]] = {"old": [], "new": []}
    for _ in range(args.repeats):
        for variant in results:
            results[variant].append(run_worker(variant, args))
    digests = {r["digest"] for rows in results.values() for r in rows}
    first = results["old"][0]
    print(
        f"clients {args.clients} of seed {args.seed}: {first['maps']} maps, "
        f"{first['bytes'] / 1e9:.2f} GB; medians of {args.repeats} fresh processes each; "
        f"same maps in every run: {len(digests) == 1}"
    )
    rows = []
    for variant, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "digest"}
        rows.append(
            f"| {variant} | {med['draw_wall']:.2f} | {med['draw_user']:.2f} | "
            f"{med['draw_sys']:.2f} | {1e3 * med['draw_wall'] / med['maps']:.0f} | "
            f"{med['peak_above'] / 1e9:.2f} / {med['bytes'] / 1e9:.2f} | "
            f"{med['round_wall']:.2f} / {med['round_cpu']:.2f} |"
        )
    print(
        "| variant | draw wall s | draw user s | draw sys s | ms per map (wall) | "
        "peak RSS above start / maps GB | steps s per round (wall / CPU) |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

"""What a user waits for: whole processes, from the command to its end.

(a) raymtl: the overhead workload (benchmarks/overhead.py: FedAvg, Fashion-MNIST, 20
    clients, cnn_mnist, 5 rounds) run by `raymtl.run` in a fresh process with raymtl's
    defaults (a local Ray of its own), in fp32 and in bf16-mixed: the whole process, and the
    seconds from the process's start to its first round's start.
(b) the plain loop: the same FedAvg client updates in one fresh process, fp32
    (overhead.py's `run_plain`: data, model, rounds, evaluation).
(c) a 4-arm comparison (FedAvg, FedProx, Local, Ditto on rotated digits, 2 seeds, 3 rounds)
    by `raymtl.compare` in a fresh process, with runtime.reuse_actors on and off.

(d) = (a) with `raymtl up` running (`--only up`): the service is started once, before the
    repeats (not timed), and each fresh process joins its Ray and warm actors.
(e) = (d) as a user types it (`--only cli`): the `raymtl run` command on the experiment's
    YAML, which the service's preloaded process forks (raymtl/runtime/warm/preload.py): the
    command imports nothing heavy itself. Its first round is startup.parquet's `process_s`
    (counted from the command's start).
*To first round's end* is from the process's (or command's) start to its first round's end,
the plain loop's included: where a process pays torch's one-time costs, before its first
round or inside it, it counts either way.
Each process runs with a RAYMTL_HOME of the benchmark's own whose decoded-pool cache
(raymtl/data/pool_cache.py) holds Fashion-MNIST already, as after a user's first run.

`--code DIR` runs (a) and (c) against another checkout of raymtl (PYTHONPATH=DIR; e.g.
`git archive <commit> | tar -x -C DIR`), for the old code in the same sitting. Medians of
--repeats runs.

    .venv/bin/python benchmarks/whole_process.py                       # this checkout
    .venv/bin/python benchmarks/whole_process.py --code /tmp/old --only raymtl,compare
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def since_process_start() -> float:
    """Seconds since this process started (Linux /proc), so interpreter and imports count."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return float(Path("/proc/uptime").read_text().split()[0]) - started


def overhead_experiment(out: Path, precision: str) -> dict:
    """overhead.py's experiment with raymtl's own runtime defaults (dashboard included)."""
    sys.path.insert(0, str(HERE))
    from overhead import experiment

    args = argparse.Namespace(
        dataset="fashion_mnist",
        clients=20,
        rounds=5,
        epochs=1,
        max_samples=500,
        precision=precision,
    )
    raw = experiment(args, out)
    raw["runtime"] = {"executor": "ray"} | ({"precision": precision} if precision != "fp32" else {})
    return raw


def child_raymtl(precision: str, out: Path) -> dict:
    import raymtl

    first_round = {}

    class FirstRound(raymtl.Callback):
        def on_round_end(self, event) -> None:
            if event.round == 1 and not first_round:  # the round's own seconds taken off
                first_round["end"] = since_process_start()
                first_round["s"] = first_round["end"] - float(event.row["wall_time"])

    results = raymtl.run(overhead_experiment(out, precision), callbacks=[FirstRound()])
    rounds = results.rounds
    return {
        # (older code has no such column: it never joins)
        "joined_up": float(
            results.tables["startup"].get("joined_up", False) is not False
            and results.tables["startup"]["joined_up"].all()
        ),
        "first_round_s": first_round["s"],
        "first_round_end_s": first_round["end"],
        "rounds_s": float(rounds["wall_time"].max()),
        "accuracy": float(rounds["mean_accuracy"].dropna().iloc[-1]),
    }


def child_plain(out: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from overhead import run_plain

    from raymtl.config import parse_config

    result = run_plain(parse_config(overhead_experiment(out, "fp32")))
    first_round_end = since_process_start() - (time.perf_counter() - result["first_round_end"])
    return {
        "first_round_end_s": first_round_end,
        "rounds_s": result["rounds_s"],
        "accuracy": result["accuracy"],
    }


def child_compare(reuse: str, out: Path) -> dict:
    import raymtl

    overrides = ["algorithm.name=fedavg,fedprox,local,ditto", "rounds=3", "seeds=[0,1]"]
    overrides += ["output.plots=false", f"output.dir={out}"]
    if reuse != "default":
        overrides.append(f"runtime.reuse_actors={reuse}")
    comparison = raymtl.compare([str(HERE.parent / "jobs/fedavg_digits.yaml")], overrides, out=out)
    return {"accuracy": float(comparison.table["mean_accuracy_mean"].iloc[0])}


def run_child(kind: str, option: str, code: str | None, home: str) -> dict:
    """One fresh process; its whole wall time and what it reported. `home` is its
    RAYMTL_HOME: a `raymtl up` service there is joined, none elsewhere (a service the user
    left running is never measured by accident)."""
    env = dict(os.environ, RAYMTL_HOME=home)
    if code:
        env["PYTHONPATH"] = code
    with tempfile.TemporaryDirectory(prefix="raymtl-whole-") as out:
        command = [sys.executable, __file__, "--child", kind, option, out]
        began = time.perf_counter()
        done = subprocess.run(
            command, env=env, cwd=out, capture_output=True, text=True, check=False
        )
        whole = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{kind} {option} failed:\n{done.stderr[-3000:]}")
    return {"whole_s": whole, **json.loads(done.stdout.strip().splitlines()[-1])}


def run_cli(precision: str, home: str) -> dict:
    """(e): the `raymtl run` command of this Python's environment, in a fresh process."""
    import pandas as pd
    import yaml

    with tempfile.TemporaryDirectory(prefix="raymtl-whole-") as out:
        experiment = Path(out) / "experiment.yaml"
        experiment.write_text(yaml.safe_dump(overhead_experiment(Path(out), precision)))
        command = [str(Path(sys.executable).with_name("raymtl")), "run", str(experiment)]
        began = time.perf_counter()
        done = subprocess.run(
            command,
            env=dict(os.environ, RAYMTL_HOME=home),
            cwd=out,
            capture_output=True,
            text=True,
            check=False,
        )
        whole = time.perf_counter() - began
        if done.returncode:
            raise SystemExit(f"raymtl run failed:\n{done.stderr[-3000:]}")
        run_dir = next(Path(out).glob("*/startup.parquet")).parent
        startup = pd.read_parquet(run_dir / "startup.parquet")
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
    return {
        "whole_s": whole,
        "joined_up": float(startup["joined_up"].all() and startup["preloaded"].all()),
        "first_round_s": float(startup["process_s"].iloc[0]),
        "first_round_end_s": float(startup["process_s"].iloc[0] + rounds["wall_time"].min()),
        "rounds_s": float(rounds["wall_time"].max()),
        "accuracy": float(rounds["mean_accuracy"].dropna().iloc[-1]),
    }


def median_of(results: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default=None, help="run (a) and (c) against this checkout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="raymtl,plain,compare,up,cli")
    parser.add_argument(
        "--precisions",
        default="fp32,bf16-mixed",
        help="of (a) and (d); bf16-mixed is emulated, and slow, on CPUs without bf16 units",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, option, out = args.child
        runners = {
            "raymtl": lambda: child_raymtl(option, Path(out)),
            "up": lambda: child_raymtl(option, Path(out)),  # RAYMTL_HOME names the service
            "plain": lambda: child_plain(Path(out)),
            "compare": lambda: child_compare(option, Path(out)),
        }
        print(json.dumps(runners[kind]()))
        return
    wanted, precisions = args.only.split(","), args.precisions.split(",")
    code = f" (code: {args.code})" if args.code else ""
    print(f"load average before: {os.getloadavg()}{code}")
    cases = []
    if "plain" in wanted:
        cases.append(("plain", "fp32"))
    if "raymtl" in wanted:
        cases += [("raymtl", precision) for precision in precisions]
    if "up" in wanted:
        cases += [("up", precision) for precision in precisions]
    if "cli" in wanted:
        cases += [("cli", precision) for precision in precisions]
    if "compare" in wanted:
        # runtime.reuse_actors off and on, where the code has it (older code: its default)
        root = Path(args.code) if args.code else HERE.parent
        reuses = (root / "raymtl/runtime/actors/pool.py").is_file()
        options = ["false", "true"] if reuses else ["default"]
        cases += [("compare", option) for option in options]
    print(
        "| run | option | whole process s | to first round s | to first round's end s | "
        "rounds s | accuracy |"
    )
    print("|---|---|---|---|---|---|---|")
    cold_home = tempfile.mkdtemp(prefix="raymtl-home-")  # no service there
    up_home = tempfile.mkdtemp(prefix="raymtl-up-")
    for home in (cold_home, up_home):  # as after a user's first run (older code: no cache)
        prime_pool_cache(home)
    try:
        for kind, option in cases:
            code_dir = None if kind == "plain" else args.code
            home = up_home if kind in ("up", "cli") else cold_home
            if kind in ("up", "cli"):
                start_service(up_home)
            if kind == "cli":
                runs = [run_cli(option, home) for _ in range(args.repeats)]
            else:
                runs = [run_child(kind, option, code_dir, home) for _ in range(args.repeats)]
            result = median_of(runs)
            first = f"{result['first_round_s']:.1f}" if "first_round_s" in result else "–"
            end = f"{result['first_round_end_s']:.1f}"
            rounds = f"{result['rounds_s']:.1f}" if "rounds_s" in result else "–"
            if kind in ("up", "cli") and result["joined_up"] < 1:
                raise SystemExit("a process did not join (or fork from) raymtl up: see up.log")
            print(
                f"| {kind} | {option} | {result['whole_s']:.1f} | {first} | {end} | {rounds} | "
                f"{result['accuracy']:.3f} |",
                flush=True,
            )
    finally:
        if "up" in wanted or "cli" in wanted:  # also when a case failed
            os.environ["RAYMTL_HOME"] = up_home
            from raymtl.runtime.warm.service import down

            down()
    print(f"load average after: {os.getloadavg()}")


def prime_pool_cache(home: str) -> None:
    """Decode Fashion-MNIST once into `home`'s pool cache (raymtl/data/pool_cache.py)."""
    code = "from raymtl.data import load_pool; load_pool('fashion_mnist')"
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RAYMTL_HOME=home), check=True)


def start_service(home: str) -> None:
    """`raymtl up` with its state in `home` (once; later calls find it running)."""
    os.environ["RAYMTL_HOME"] = home
    from raymtl.runtime.warm.service import up

    service, started = up()
    if started:
        print(f"raymtl up: pid {service.pid}, {service.actors}", flush=True)


if __name__ == "__main__":
    main()

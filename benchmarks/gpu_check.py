"""One command that checks raymtl's GPU path on a lent GPU machine and records its figures.

Parts, in order, each with its own time budget (seconds on one GPU, `BUDGETS`). A part that
would end past --limit-s (6 minutes) is skipped and recorded so; a failure is recorded with
the error's first line (the whole traceback in errors.log) and the next part runs; the exit
code is 0 only when every part ran and nothing failed.

  environment        Python, torch, CUDA and the device; Ray, igraph, leidenalg, pydantic
  algorithms_inline  every registered algorithm (the example plugins' too), 2 rounds on
                     digits as tests/integration/test_all_algorithms.py runs them, inline
  algorithms_ray     the same on Ray: client actors sharing the GPU (0.25 each), auto layout
  determinism        one run twice gives the same clients.parquet (timings aside), inline
                     and on Ray; inline equals Ray
  resume_and_fault   stopped after round 1 and resumed; a host killed by
                     runtime.inject_faults and recovered: each equal to the uninterrupted run
  batched            batched against serial training for cnn_mnist (dropout) and resnet8
                     (batch norm): batched.py's batched_equals_serial where it has it, and
                     runtime.batch_clients 4 against 1, 2 rounds (clients.parquet within
                     batched.rounding_tolerance: float32 rounding over the run's steps;
                     TF32 off on the GPU)
  overhead           benchmarks/overhead.py's FedAvg workload (Fashion-MNIST-sized synthetic
                     images) on Ray with 1, 2, 4, 8 client actors sharing the GPU, fp32 and
                     bf16-mixed, against its plain PyTorch loop on the same GPU (a
                     benchmark, not a test: the target is rounds <= 0.5x the plain loop's)
  deterministic      runtime.deterministic on and off: the fp32 workload's rounds

On a GPU the report goes to benchmarks/RESULTS.md (appended under the device's name) and to
--out (report.md, rows.jsonl, errors.log); `--device cpu` (cuda -> cpu, GPU shares -> CPU
shares) and `--dry-run` write to --out only.

    python3 benchmarks/gpu_check.py --out $OUT              # on the GPU machine: make gpu-check
    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpucheck
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
# Ray's workers are new processes: they find raymtl (not pip-installed on the GPU machine)
# and the carried wheels through PYTHONPATH, made absolute (their working folder differs).
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys(
        [str(ROOT)]
        + [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
)
# Never join a `raymtl up` left running on this machine: the check starts its own Ray.
os.environ["RAYMTL_HOME"] = tempfile.mkdtemp(prefix="gpu-check-home-")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

import raymtl  # noqa: E402
from raymtl.algorithms import all_algorithms  # noqa: E402
from raymtl.config import RuntimeConfig, parse_config  # noqa: E402
from raymtl.config.overrides import set_setting  # noqa: E402
from raymtl.plugins import load_plugins, resolve_entry  # noqa: E402

LIMIT_S = 360.0  # the whole check on one GPU
# Seconds each part may take on one GPU; scaled by --limit-s / LIMIT_S.
BUDGETS = {
    "environment": 15,
    "algorithms_inline": 35,
    "algorithms_ray": 70,
    "determinism": 30,
    "resume_and_fault": 35,
    "batched": 25,
    "overhead": 120,
    "deterministic": 30,
}
CPU_LIMIT_S = 3600.0  # --device cpu on a 2-core machine shared with others
# Figures that measure the machine, not the learning (tests/conftest.py's TIMING).
TIMING = ("wall_time", "client_updates_per_second", "peak_memory", "seconds")
BATCHED_ATOL = 1e-5  # where raymtl's batched.py has no rounding_tolerance
DIGITS_SHAPE, DIGITS_CLASSES = (1, 8, 8), 10  # the digits experiment's inputs and classes
BATCHED = ("cnn_mnist", "resnet8")  # dropout; batch norm
OVERHEAD_TARGET = 0.5  # raymtl's rounds over the plain loop's, on one GPU
EXAMPLES = ROOT / "examples"
# --quick on Ray: one algorithm of each shape (star, plugin, peer, hierarchical, task groups
# with leaders, the graph service, public data); inline, --quick still runs them all.
QUICK_ON_RAY = ("fedavg", "fedavgm", "dpsgd", "hfedavg", "colnet", "sfmtl_graph", "fedmuscle")

# Per-algorithm settings of tests/integration/test_all_algorithms.py (N = 6 clients, 2
# rounds, the MLP): the topology, tasks and public data each algorithm needs.
N = 6
TWO_TASKS = {
    "data.partition": {"kind": "iid", "max_samples_per_client": 60},
    "data.tasks": [
        {"name": "low", "targets": "label", "clients": N // 2},
        {"name": "high", "targets": "label", "clients": N // 2},
    ],
}
HIERARCHICAL = {"topology.kind": "hierarchical", "topology.num_lps": 2}
RING = {"topology.kind": "ring"}
PUBLIC = {
    "data.public": {"size": 60},
    "algorithm.params": {"epochs": 1, "contrastive_steps": 2, "public_batch": 8, "dim": 16},
}
ALGORITHM_SETTINGS = {
    "dpsgd": RING,
    "fedbn": {"model.name": "cnn_bn"},  # FedBN refuses a model without batch norm
    "dfedu": RING,
    "sheaf_fmtl": RING,
    "hfedavg": HIERARCHICAL,
    "oneshot_hfl": HIERARCHICAL,
    "colnet": TWO_TASKS,
    "intra_group": TWO_TASKS,
    "fedper_ic": TWO_TASKS,
    "fedmuscle": {**PUBLIC, "algorithm.params": {**PUBLIC["algorithm.params"], "partners": 2}},
    "pairwise_infonce": PUBLIC,
}


class OutOfTime(BaseException):
    """A part ran past its hard limit (never caught as an ordinary error)."""


@dataclass
class Check:
    """One run of the check: its settings, the rows so far, run folders parts share."""

    device: str  # "cuda" or "cpu"
    quick: bool
    work: Path
    limit_s: float
    began: float = field(default_factory=time.perf_counter)
    rows: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    shared: dict = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.limit_s / LIMIT_S

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def quiet(self) -> dict:
        """Settings of every run: no dashboard, a Ray of the check's own; on the CPU, actors
        of a 2-core machine shared with others are slow to start."""
        wait = 60 if self.device == "cuda" else 300
        return {"dashboard": False, "join_up": False, "placement_timeout_s": wait}

    def inline(self) -> dict:
        """runtime settings of an inline run on the device (cuda needs a GPU share > 0)."""
        on_gpu = {"num_gpus_per_actor": 1} if self.device == "cuda" else {}
        return {**self.quiet(), "executor": "inline", "device": self.device, **on_gpu}

    def on_ray(self, share: float, clients_per_actor: int | str = "auto") -> dict:
        """runtime settings of client actors taking `share` of the GPU (of a CPU on cpu)."""
        unit = "num_gpus_per_actor" if self.device == "cuda" else "num_cpus_per_actor"
        return {
            **self.quiet(),
            "executor": "ray",
            "device": self.device,
            unit: share,
            "clients_per_actor": clients_per_actor,
        }

    def add(self, part: str, name: str, status: str, began: float, **figures) -> dict:
        row = {"part": part, "name": name, "status": status}
        row["seconds"] = round(time.perf_counter() - began, 1) if began else None
        row.update(figures)
        self.rows.append(row)
        shown = f" ({row['detail']})" if row.get("detail") else ""
        log(self, f"{part} / {name}: {status}{shown}")
        return row

    def failed(self, part: str, name: str, began: float, error: BaseException, **figures):
        self.errors.append(f"{part} / {name}:\n{traceback.format_exc()}")
        return self.add(part, name, "fail", began, detail=first_line(error), **figures)


def log(check: Check, message: str) -> None:
    print(f"[{check.elapsed():6.1f} s] {message}", flush=True)


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 200 else text[:197] + "..."


def digits(out: Path, **overrides) -> dict:
    """tests/conftest.py's digits experiment (6 clients, rotated digits, cnn_mnist, FedAvg,
    2 rounds, a checkpoint every round) with dotted overrides."""
    raw = {
        "name": "check",
        "data": {
            "name": "digits",
            "num_clients": N,
            "partition": {
                "kind": "classes_per_client",
                "classes_per_client": 2,
                "rotations": [0, 90, 180],
                "max_samples_per_client": 60,
            },
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {"name": "fedavg", "params": {"epochs": 1, "lr": 0.1}},
        "rounds": 2,
        "checkpoint_every": 1,
        "seeds": [0],
        "runtime": {"executor": "inline", "dashboard": False},
        "output": {"dir": str(out), "plots": False},
    }
    for key, value in overrides.items():
        set_setting(raw, key, value)
    return raw


def learned(run_dir: Path, table: str = "clients") -> pd.DataFrame:
    """A run's table without its timing columns, in a fixed row order."""
    frame = pd.read_parquet(Path(run_dir) / f"{table}.parquet")
    frame = frame.drop(columns=[c for c in frame.columns if c.startswith(TIMING)])
    keys = [c for c in ("seed", "round", "client") if c in frame.columns]
    return frame.sort_values(keys).reset_index(drop=True)


def same_clients(a: Path, b: Path) -> str | None:
    """None when the two runs' clients.parquet are bitwise equal (timings aside), else what
    differs."""
    x, y = learned(a), learned(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return f"different shapes: {x.shape} against {y.shape}"
    for column in x.columns:
        if not x[column].equals(y[column]):
            return f"{column} differs{largest_gap(x[column], y[column])}"
    return None


def close_clients(a: Path, b: Path, atol: float) -> str | None:
    """None when the two runs' clients.parquet agree within `atol` (floats) and exactly
    (the rest), else what differs."""
    x, y = learned(a), learned(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return f"different shapes: {x.shape} against {y.shape}"
    for column in x.columns:
        if pd.api.types.is_float_dtype(x[column]):
            if not np.allclose(x[column], y[column], rtol=0, atol=atol, equal_nan=True):
                return f"{column} differs{largest_gap(x[column], y[column])}"
        elif not x[column].equals(y[column]):
            return f"{column} differs"
    return None


def largest_gap(x: pd.Series, y: pd.Series) -> str:
    if not (pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y)):
        return ""
    gap = np.nanmax(np.abs(x.to_numpy(float) - y.to_numpy(float)))
    return f" by up to {gap:.3g}"


def final_accuracy(results) -> float:
    return float(results.rounds["mean_accuracy"].iloc[-1])


def client_devices(run_dir: Path) -> set[str]:
    """The devices the run's client hosts trained on (hosts.parquet)."""
    hosts = pd.read_parquet(Path(run_dir) / "hosts.parquet")
    return set(hosts.loc[hosts["host"].str.startswith("clients"), "device"])


def expect_device(check: Check, run_dir: Path) -> None:
    devices = client_devices(run_dir)
    if devices != {check.device}:
        raise RuntimeError(f"clients trained on {sorted(devices)}, not {check.device}")


def shut_ray() -> None:
    """Stop this process's Ray (if any): a part leaves none behind."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """OutOfTime in this (the main) thread once `seconds` have passed."""

    def expire(signum, frame):
        raise OutOfTime(f"hard limit of {seconds:.0f} s reached")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def within(check: Check, part: str, began: float, items: list[str]) -> Iterator[str]:
    """The items of a part while its budget lasts; those left are recorded as skipped."""
    budget = BUDGETS[part] * check.scale
    for index, item in enumerate(items):
        if time.perf_counter() - began > budget:
            for left in items[index:]:
                check.add(part, left, "skipped", 0.0, detail=f"part's {budget:.0f} s spent")
            return
        yield item


# ---------------------------------------------------------------- the parts


def environment(check: Check) -> None:
    began = time.perf_counter()
    import igraph
    import leidenalg
    import pydantic
    import ray

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "cudnn": str(torch.backends.cudnn.version()),
        "ray": f"{ray.__version__} ({Path(ray.__file__).parent.parent})",
        "igraph": igraph.__version__,
        "leidenalg": leidenalg.version,
        "pydantic": pydantic.VERSION,
        "numpy": np.__version__,
        "raymtl": git_commit(),
    }
    if check.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        name = torch.cuda.get_device_name(0)
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        versions["device"] = f"{name}, {memory:.0f} GiB, {torch.cuda.device_count()} visible"
        seen = ray_gpus()
        versions["ray sees"] = f"{seen} GPU(s)"
        if seen == 0:
            raise RuntimeError("Ray detects no GPU on this node: actors asking for one never start")
    else:
        name = f"{platform.machine()} CPU, {os.cpu_count()} cores"
        versions["device"] = name
    x = torch.randn(256, 256, device=check.device)
    if not torch.isfinite(x @ x).all():
        raise RuntimeError(f"a matrix product on {check.device} is not finite")
    check.shared["device_name"], check.shared["versions"] = name, versions
    detail = ", ".join(f"{key} {value}" for key, value in versions.items())
    check.add("environment", "versions", "pass", began, detail=detail)


def ray_gpus() -> int | str:
    """The GPUs a local Ray started here would declare (its own detection, a private API:
    'unknown' where it moved)."""
    try:
        from ray._private.accelerators import NvidiaGPUAcceleratorManager

        return NvidiaGPUAcceleratorManager.get_current_node_num_accelerators()
    except Exception as error:
        return f"unknown ({first_line(error)})"


def git_commit() -> str:
    """The commit checked (the device's copy of the tree may have no git, or no .git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True)
    except OSError:
        return "unknown (no git)"
    if done.returncode != 0:
        return "unknown (no .git)"
    return done.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")


def load_example_plugins() -> None:
    """Import the plugins the example experiments name: their algorithms register too."""
    for path in sorted(EXAMPLES.rglob("*.yaml")) if EXAMPLES.is_dir() else []:
        entries = (yaml.safe_load(path.read_text()) or {}).get("plugins") or []
        load_plugins([resolve_entry(entry, [path.parent]) for entry in entries])


def algorithm_experiment(check: Check, name: str, out: Path, runtime: dict) -> dict:
    cls = all_algorithms()[name]
    settings = {
        "model.name": "mlp",
        "algorithm.name": name,
        "algorithm.params": {"epochs": 1},
        **ALGORITHM_SETTINGS.get(name, {}),
    }
    if not cls.__module__.startswith("raymtl."):  # a plugin: the run imports its module
        settings["plugins"] = [sys.modules[cls.__module__].__file__]
    raw = digits(out, **settings)
    raw["runtime"] = runtime
    return raw


def algorithms(check: Check, part: str, runtime: dict) -> None:
    load_example_plugins()
    names = sorted(all_algorithms())
    if check.quick and runtime["executor"] == "ray":
        names = [name for name in names if name in QUICK_ON_RAY]
    for name in within(check, part, time.perf_counter(), names):
        began = time.perf_counter()
        try:
            raw = algorithm_experiment(check, name, check.work / part / name, runtime)
            results = raymtl.run(raw)
            expect_device(check, results.run_dir)
            accuracy = final_accuracy(results)
            if not math.isfinite(accuracy):
                raise RuntimeError(f"final mean accuracy {accuracy}")
            check.add(part, name, "pass", began, accuracy=round(accuracy, 3))
        except Exception as error:
            check.failed(part, name, began, error)


def algorithms_inline(check: Check) -> None:
    algorithms(check, "algorithms_inline", check.inline())


def algorithms_ray(check: Check) -> None:
    from raymtl.runtime.actors.pool import reusing_actors

    try:
        with reusing_actors():  # one set of actors handed from algorithm to algorithm
            algorithms(check, "algorithms_ray", check.on_ray(0.25))
    finally:
        shut_ray()


def reference_runs(check: Check) -> dict:
    """The determinism part's experiments: FedAvg, cnn_mnist (dropout), 3 rounds."""
    base = digits(check.work, rounds=3)
    inline = {**base, "runtime": check.inline()}
    # Two client actors: the fault part kills clients-0 and the federation goes on.
    on_ray = {**base, "runtime": check.on_ray(0.25, clients_per_actor=3)}
    return {"inline": inline, "ray": on_ray}


def run_into(raw: dict, run_dir: Path) -> Path:
    from raymtl.runtime import run_experiment

    return Path(run_experiment(parse_config(raw), run_dir))


def compare(check: Check, part: str, name: str, began: float, a: Path, b: Path) -> None:
    difference = same_clients(a, b)
    if difference is None:
        check.add(part, name, "pass", began, detail="clients.parquet bitwise equal")
    else:
        check.add(part, name, "fail", began, detail=difference)


def determinism(check: Check) -> None:
    part, experiments = "determinism", reference_runs(check)
    try:
        for kind in ("inline", "ray"):
            began = time.perf_counter()
            try:
                first = run_into(experiments[kind], check.work / part / f"{kind}-1")
                expect_device(check, first)
                second = run_into(experiments[kind], check.work / part / f"{kind}-2")
                check.shared[kind] = first  # the uninterrupted run for resume_and_fault
                compare(check, part, f"{kind} twice", began, first, second)
            except Exception as error:
                check.failed(part, f"{kind} twice", began, error)
        if "inline" in check.shared and "ray" in check.shared:
            began = time.perf_counter()
            a, b = check.shared["inline"], check.shared["ray"]
            compare(check, part, "inline equals ray", began, a, b)
    finally:
        shut_ray()


def reference(check: Check, kind: str) -> Path:
    """The uninterrupted run of `kind` (the determinism part's, or one run now)."""
    if kind not in check.shared:
        check.shared[kind] = run_into(reference_runs(check)[kind], check.work / f"ref-{kind}")
    return check.shared[kind]


def resume_and_fault(check: Check) -> None:
    from raymtl.runtime import run_experiment

    part, experiments = "resume_and_fault", reference_runs(check)
    began = time.perf_counter()
    try:
        whole = reference(check, "inline")
        run_dir = check.work / part / "resumed"
        run_experiment(parse_config(experiments["inline"]), run_dir, stop_after=1)
        raymtl.resume(run_dir)
        compare(check, part, "stopped after round 1, resumed", began, whole, run_dir)
    except Exception as error:
        check.failed(part, "stopped after round 1, resumed", began, error)
    began = time.perf_counter()
    name = "clients-0 killed in round 2, recovered"
    try:
        whole = reference(check, "ray")
        faulty = experiments["ray"]
        kill = [{"kill": "host", "host": "clients-0", "round": 2}]
        faulty["runtime"] = {**faulty["runtime"], "inject_faults": kill, "max_restarts": 1}
        run_dir = run_into(faulty, check.work / part / "faulty")
        faults = pd.read_parquet(run_dir / "faults.parquet")
        if not (faults["injected"].tolist() == [True] and faults["host"][0] == "clients-0"):
            raise RuntimeError(f"faults.parquet: {faults.to_dict('records')}")
        compare(check, part, name, began, whole, run_dir)
    except Exception as error:
        check.failed(part, name, began, error)
    finally:
        shut_ray()


def batching_note(model: str) -> str | None:
    """Why the batched path would not batch `model` (batch_refusal, or can_batch where
    batched.py has no reasons), or None when it batches it."""
    from raymtl.algorithms import batched as batched_path
    from raymtl.algorithms.base import LocalTrainingParams
    from raymtl.models import build_model

    models = [build_model(model, (1, 8, 8), 10) for _ in range(2)]
    data = SimpleNamespace(train_x=torch.zeros(4, 1, 8, 8), train_y=torch.zeros(4).long())
    settings = (models, [data, data], LocalTrainingParams(), [None, None])
    refusal = getattr(batched_path, "batch_refusal", None)
    why = refusal(*settings) if refusal else (None if batched_path.can_batch(*settings) else "")
    if why is None:
        return None
    return f"not batched ({why or 'can_batch is False'}): both runs trained one client at a time"


def batched(check: Check) -> None:
    """batched.py's own check where it has one (`batched_equals_serial`: the largest gap
    between local_sgd and local_sgd_batched, on the device), and runs with batch_clients 4
    against 1 through the runtime: 8 clients, FedAvg, 2 rounds, clients.parquet within
    `e2e_tolerance`. On a GPU, float32 convolutions and matmuls run without TF32 here (TF32
    rounds to 10 bits: ε 2^-10, not float32's 2^-23)."""
    from raymtl.algorithms import batched as batched_path

    part = "batched"
    equals_serial = getattr(batched_path, "batched_equals_serial", None)
    tolerance = getattr(batched_path, "TOLERANCE", BATCHED_ATOL)
    kinds = (["batched_equals_serial"] if equals_serial else []) + ["batch_clients 4 = 1"]
    items = {f"{model}, {kind}": (model, kind) for model in BATCHED for kind in kinds}
    with ieee_float32():
        for name in within(check, part, time.perf_counter(), list(items)):
            model, kind = items[name]
            began = time.perf_counter()
            try:
                if kind == "batched_equals_serial":
                    gap = equals_serial(model, check.device)
                    status = "pass" if gap <= tolerance else "fail"
                    detail = f"largest gap {gap:.3g} (tolerance {tolerance:g})"
                    check.add(part, name, status, began, detail=detail)
                    continue
                batch_clients_equal(check, part, name, model, began)
            except Exception as error:
                check.failed(part, name, began, error)


def batch_clients_equal(check: Check, part: str, name: str, model: str, began: float) -> None:
    """`model` trained with runtime.batch_clients 4 and 1, inline: the same clients.parquet
    within `e2e_tolerance` (or n/a where the batched path would not batch the model)."""
    runs, raws = {}, {}
    for clients in (1, 4):
        raw = digits(
            check.work,
            **{
                "model.name": model,
                "data.num_clients": 8,
                "data.partition": {"kind": "iid", "max_samples_per_client": 60},
                "algorithm.params": {"epochs": 1, "lr": 0.05},
            },
        )
        raw["runtime"] = {**check.inline(), "batch_clients": clients}
        raws[clients] = raw
        runs[clients] = run_into(raw, check.work / part / f"{model}-{clients}")
    expect_device(check, runs[4])
    atol, how = e2e_tolerance(raws[1], runs[1])
    difference = close_clients(runs[1], runs[4], atol)
    gap = float_gap(runs[1], runs[4])
    note = batching_note(model)
    if difference is not None:
        check.add(part, name, "fail", began, detail=f"{difference} (tolerance {how})")
    elif note is not None:
        check.add(part, name, "n/a", began, detail=note)
    else:
        detail = f"clients.parquet within {gap:.3g} (tolerance {how})"
        check.add(part, name, "pass", began, detail=detail)


def e2e_tolerance(raw: dict, run_dir: Path) -> tuple[float, str]:
    """The absolute tolerance of the batch_clients comparison and how it was found: float32
    rounding over the run's SGD steps (raymtl.algorithms.batched.rounding_tolerance:
    2·ε·|ℓ|·S·Σ√n, ε = 2^-23, |ℓ| the largest loss of the serial run, S = rounds × epochs ×
    batches an epoch, n the length of each sum a step makes), where raymtl has it."""
    from raymtl.algorithms import batched as batched_path
    from raymtl.algorithms.base import LocalTrainingParams
    from raymtl.models import build_model

    derive = getattr(batched_path, "rounding_tolerance", None)
    if derive is None:
        return BATCHED_ATOL, f"{BATCHED_ATOL:g}"
    clients = pd.read_parquet(Path(run_dir) / "clients.parquet")
    params = raw["algorithm"]["params"]
    batch = params.get("batch_size", LocalTrainingParams().batch_size)
    samples = int(clients["samples"].max())
    steps = raw["rounds"] * params.get("epochs", 1) * math.ceil(samples / batch)
    scale = float(np.nanmax(np.abs(clients["loss"].to_numpy(float))))
    model = build_model(raw["model"]["name"], DIGITS_SHAPE, DIGITS_CLASSES)
    x = torch.zeros(min(batch, samples), *DIGITS_SHAPE)
    # The tolerance: 2·ε·ℓ·S·Σ√n. Each float32 run errs by about √n·ε (relative) in each
    # sum of n terms a step makes (forward, input and weight gradients, batch norms'
    # statistics), summed over a step's sums and its S steps, times the loss ℓ; the batched
    # and the serial run may err in opposite directions: twice that. For resnet8 here:
    # 2 · 2^-23 · 2.31 · 4 · 1443 = 3.2e-3, against float32 runs measured up to 1.3e-4
    # apart (5.6e-5 on an AVX-512 CPU) and equal in float64.
    atol = derive(model, x, steps, scale)
    depth = atol / (2 * torch.finfo(torch.float32).eps * max(1.0, scale) * steps)
    how = (
        f"{atol:.3g} = 2·ε·ℓ·S·Σ√n: float32 ε 2^-23, ℓ {scale:.3g} (largest loss), "
        f"S {steps} SGD steps, Σ√n {depth:.0f} over a step's sums"
    )
    return atol, how


def float_gap(a: Path, b: Path) -> float:
    """The largest absolute difference between the two runs' float columns of
    clients.parquet (timings aside)."""
    x, y = learned(a), learned(b)
    gaps = [
        np.nanmax(np.abs(x[c].to_numpy(float) - y[c].to_numpy(float)), initial=0.0)
        for c in x.columns
        if pd.api.types.is_float_dtype(x[c]) and x[c].notna().any()
    ]
    return float(max(gaps, default=0.0))


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """float32 convolutions and matmuls in IEEE float32 on CUDA, not TF32 (cuDNN's
    convolutions default to TF32 on Ampere and later); restored afterwards."""
    settings = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = settings


def overhead_module():
    """benchmarks/overhead.py, imported (its workload and plain loop are reused)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import overhead

    return overhead


def overhead_workload(check: Check) -> SimpleNamespace:
    """overhead.py's command-line settings, on synthetic images of Fashion-MNIST's size
    (1x28x28, 10 classes: the GPU machine has no network to fetch Fashion-MNIST), 24 clients
    of up to 500 samples (1, 2, 4 and 8 actors hold equal shares), 3 rounds."""
    if check.quick:
        return SimpleNamespace(dataset="synthetic", clients=8, rounds=2, epochs=1, max_samples=60)
    return SimpleNamespace(dataset="synthetic", clients=24, rounds=3, epochs=1, max_samples=500)


def overhead_config(check: Check, precision: str, actors: int, **runtime):
    overhead, workload = overhead_module(), overhead_workload(check)
    args = SimpleNamespace(**vars(workload), precision=precision)
    raw = overhead.experiment(args, check.work / "overhead" / f"{precision}-{actors}")
    # A pool as large as the clients take in all (each takes max_samples of it).
    samples = workload.clients * workload.max_samples
    raw["data"]["params"] = {"num_samples": samples, "shape": [1, 28, 28]}
    per_actor = math.ceil(workload.clients / actors)
    raw["runtime"] = {**raw["runtime"], **check.on_ray(1 / actors, per_actor), **runtime}
    return parse_config(raw)


def plain_defaults() -> None:
    """torch's default (non-deterministic) settings for the plain loop: inline runs earlier
    in this process may have switched runtime.deterministic's on."""
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def overhead(check: Check) -> None:
    part, overhead = "overhead", overhead_module()
    began = time.perf_counter()
    try:
        plain_defaults()
        plain = overhead.run_plain(overhead_config(check, "fp32", 1), check.device)
        check.shared["plain"] = plain
        figures = {"rounds_s": round(plain["rounds_s"], 2), "accuracy": round(plain["accuracy"], 3)}
        check.add(part, "plain loop, fp32", "pass", began, **figures)
    except Exception as error:
        check.failed(part, "plain loop, fp32", began, error)
        return
    actor_counts = (1, 2) if check.quick else (1, 2, 4, 8)
    runs = [(p, a) for p in ("fp32", "bf16-mixed") for a in actor_counts]
    names = {f"{p}, {a} actor{'s' if a > 1 else ''}": (p, a) for p, a in runs}
    shut_ray()  # overhead.run_on_ray starts one, then each run uses it
    try:
        for name in within(check, part, began, list(names)):
            precision, actors = names[name]
            run_began = time.perf_counter()
            try:
                result = overhead.run_on_ray(overhead_config(check, precision, actors))
                figures = workload_figures(result, plain, actors)
                check.add(part, name, "pass", run_began, **figures)
            except Exception as error:
                check.failed(part, name, run_began, error)
                shut_ray()  # the next run starts a fresh one
    finally:
        shut_ray()


def workload_figures(result: dict, plain: dict, actors: int) -> dict:
    ratio = result["rounds_s"] / plain["rounds_s"]
    return {
        "actors": actors,
        "rounds_s": round(result["rounds_s"], 2),
        "plain_rounds_s": round(plain["rounds_s"], 2),
        "ratio": round(ratio, 3),
        "meets_target": ratio <= OVERHEAD_TARGET,
        "ray_start_s": round(result["ray_start_s"], 1),
        "setup_s": round(result["setup_s"], 1),
        "accuracy": round(result["accuracy"], 3),
        "plain_accuracy": round(plain["accuracy"], 3),
    }


def deterministic(check: Check) -> None:
    part, overhead = "deterministic", overhead_module()
    began = time.perf_counter()
    if "deterministic" not in RuntimeConfig.model_fields:
        detail = "runtime.deterministic is not a config field of this raymtl"
        check.add(part, "on and off", "n/a", began, detail=detail)
        return
    actors = 1 if check.quick else 4
    plain = check.shared.get("plain") or {"rounds_s": math.nan, "accuracy": math.nan}
    shut_ray()
    try:
        for setting in within(check, part, began, ["on", "off"]):
            run_began = time.perf_counter()
            try:
                cfg = overhead_config(check, "fp32", actors, deterministic=setting == "on")
                result = overhead.run_on_ray(cfg)
                figures = workload_figures(result, plain, actors)
                check.add(part, f"deterministic {setting}", "pass", run_began, **figures)
            except Exception as error:
                check.failed(part, f"deterministic {setting}", run_began, error)
                shut_ray()
    finally:
        shut_ray()


PARTS: dict[str, Callable[[Check], None]] = {
    "environment": environment,
    "algorithms_inline": algorithms_inline,
    "algorithms_ray": algorithms_ray,
    "determinism": determinism,
    "resume_and_fault": resume_and_fault,
    "batched": batched,
    "overhead": overhead,
    "deterministic": deterministic,
}


def run_part(check: Check, name: str) -> None:
    budget = BUDGETS[name] * check.scale
    began = time.perf_counter()
    if check.elapsed() + budget > check.limit_s:
        detail = f"{check.elapsed():.0f} s + its {budget:.0f} s would pass {check.limit_s:.0f} s"
        check.add(name, "(part)", "skipped", 0.0, detail=detail)
        return
    log(check, f"{name}: budget {budget:.0f} s")
    # Hard stop at twice its budget, never past the whole check's limit.
    hard = min(2 * budget, check.limit_s - check.elapsed())
    try:
        with hard_limit(hard):
            PARTS[name](check)
    except OutOfTime as error:
        check.failed(name, "(part)", began, error)
        with contextlib.suppress(Exception):
            shut_ray()
    except Exception as error:
        check.failed(name, "(part)", began, error)


# ---------------------------------------------------------------- the report


def cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"  # rounded where the row is made
    return str(value).replace("|", "/")


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def part_status(rows: list[dict]) -> str:
    statuses = {row["status"] for row in rows}
    for status in ("fail", "skipped"):
        if status in statuses:
            return status
    return "pass" if "pass" in statuses else "n/a"


def report(check: Check, command: str) -> str:
    rows, versions = check.rows, check.shared.get("versions", {})
    device = check.shared.get("device_name", check.device)
    lines = [
        f"## GPU check: {device}, {date.today()} (`benchmarks/gpu_check.py`)",
        "",
        f"Command: `{command}`.  ",
        "Versions: "
        + (", ".join(f"{k} {v}" for k, v in versions.items() if k != "device") or "—")
        + ".  ",
        f"Total {check.elapsed():.0f} s of a {check.limit_s:.0f} s limit; "
        f"{'everything passed' if passed(check) else 'NOT everything passed'}.",
        "",
    ]
    summary = []
    for part in PARTS:
        mine = [r for r in rows if r["part"] == part]
        ran = [r for r in mine if r["status"] in ("pass", "fail")]
        seconds = round(sum(r["seconds"] or 0 for r in mine), 1)
        count = f"{sum(r['status'] == 'pass' for r in ran)}/{len(ran)}"
        summary.append([part, part_status(mine) if mine else "not run", seconds, count])
    lines += table(["part", "status", "seconds", "passed"], summary)
    names = sorted({r["name"] for r in rows if r["part"].startswith("algorithms_")} - {"(part)"})
    if names:
        lines.append("Every algorithm, 2 rounds on digits (inline; on Ray, 0.25 GPU an actor):")
        lines.append("")
        by = {(r["part"], r["name"]): r for r in rows}
        body = []
        for name in names:
            inline = by.get(("algorithms_inline", name), {})
            ray = by.get(("algorithms_ray", name), {})
            error = inline.get("detail") or ray.get("detail")
            body.append(
                [name, inline.get("status"), inline.get("seconds"), inline.get("accuracy")]
                + [ray.get("status"), ray.get("seconds"), ray.get("accuracy"), error]
            )
        header = ["algorithm", "inline", "s", "accuracy", "Ray", "s", "accuracy", "error"]
        lines += table(header, body)
    checks = [
        r
        for r in rows
        if r["part"] in ("environment", "determinism", "resume_and_fault", "batched")
        or r["name"] == "(part)"
    ]
    if checks:
        body = [[r["part"], r["name"], r["status"], r["seconds"], r.get("detail")] for r in checks]
        lines += table(["part", "check", "status", "seconds", "detail"], body)
    bench = [r for r in rows if r["part"] in ("overhead", "deterministic") and "ratio" in r]
    if bench:
        lines.append(
            "FedAvg workload of `benchmarks/overhead.py` (cnn_mnist; synthetic 1x28x28 images, "
            "10 classes), rounds only; the plain "
            f"loop is fp32 on the same device; target ratio <= {OVERHEAD_TARGET}:"
        )
        lines.append("")
        body = [
            [r["part"], r["name"], r["actors"], r["rounds_s"], r["plain_rounds_s"], r["ratio"]]
            + [r["meets_target"], r["ray_start_s"], r["setup_s"], r["accuracy"]]
            + [r["plain_accuracy"]]
            for r in bench
        ]
        header = ["part", "run", "actors", "raymtl s", "plain s", "ratio", "<= target"]
        header += ["Ray start s", "actors' set-up s", "accuracy", "plain accuracy"]
        lines += table(header, body)
    switch = {r["name"]: r for r in bench if r["part"] == "deterministic"}
    if {"deterministic on", "deterministic off"} <= set(switch):
        on, off = switch["deterministic on"]["rounds_s"], switch["deterministic off"]["rounds_s"]
        lines += [
            f"runtime.deterministic: true takes {on / off:.2f}x the rounds' time of false.",
            "",
        ]
    return "\n".join(lines)


def passed(check: Check) -> bool:
    return all(r["status"] in ("pass", "n/a") for r in check.rows) and all(
        any(r["part"] == part for r in check.rows) for part in check.shared["parts"]
    )


def write_out(check: Check, out: Path, command: str) -> str:
    """The report, the rows and the tracebacks into `out` (rewritten after every part)."""
    text = report(check, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text + "\n")
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in check.rows))
    (out / "errors.log").write_text("\n".join(check.errors))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for report.md, rows.jsonl")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny settings (a dry run)")
    parser.add_argument("--dry-run", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument("--limit-s", type=float, help="whole check (360 on cuda, 1800 on cpu)")
    parser.add_argument("--only", help="comma-separated parts (default: all)")
    parser.add_argument("--keep-runs", action="store_true", help="keep the run folders")
    args = parser.parse_args()
    parts = list(PARTS) if args.only is None else args.only.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--only: {unknown[0]!r} is not a part; give some of {', '.join(PARTS)}")
    limit = args.limit_s or (LIMIT_S if args.device == "cuda" else CPU_LIMIT_S)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    check = Check(args.device, args.quick, work, limit)
    check.shared["parts"] = parts
    out = Path(args.out).resolve()
    command = shlex.join(["python3", "benchmarks/gpu_check.py", *sys.argv[1:]])
    try:
        for name in parts:
            run_part(check, name)
            text = write_out(check, out, command)
    finally:
        if not args.keep_runs:
            shutil.rmtree(work, ignore_errors=True)
    print(text, flush=True)
    if args.device == "cuda" and not args.dry_run:
        with RESULTS.open("a") as results:
            results.write("\n" + text + "\n")
        print(f"appended to {RESULTS}", flush=True)
    sys.exit(0 if passed(check) else 1)


if __name__ == "__main__":
    main()

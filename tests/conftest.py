"""Shared fixtures: one local Ray per test session, experiment builders."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time

import pytest

from raymtl.config import parse_config
from raymtl.config.overrides import set_setting
from raymtl.runtime.actors.pool import reusing_actors


class SharedActors:
    """The test session's actor reuse session (runtime/actors/pool.py): a federation that
    finishes cleanly on the shared Ray hands its actors on to the next test's, as the seeds
    of one `raymtl run` hand them on. A fresh host actor costs 5–7 CPU-seconds (a
    process, torch's imports, its warm-up): on 2 cores, most of a short integration test.
    Every federation still starts from fresh state (`attach`; test_actor_reuse.py), and
    one that failed keeps none of its actors. Tests that count actors take `fresh_actors`."""

    def __init__(self) -> None:
        self._session: contextlib.ExitStack | None = None

    def open(self) -> None:
        if self._session is None:
            self._session = contextlib.ExitStack()
            self._session.enter_context(reusing_actors())

    def close(self) -> None:
        """End the reuse session: its idle actors are killed."""
        if self._session is not None:
            session, self._session = self._session, None
            session.close()


SHARED_ACTORS = SharedActors()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marks added here
def pytest_collection_modifyitems(config, items):
    """A test that takes the session's Ray is marked `ray` (what `make test-fast` leaves
    out). Under pytest-xdist (`make test`: `-n 2 --dist loadgroup`) every test that uses
    Ray runs on one worker, in order, so the session still has one local Ray (and one set
    of shared actors), and no cluster scenario's Ray runs beside it; the other worker takes
    the tests that need no Ray."""
    for item in items:
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("ray") or item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """One local Ray (2 CPUs, and one GPU that this machine need not have: a resource count
    to Ray, for the GPU-share layouts) for every integration test of the session, with its
    actors reused from test to test (SharedActors).

    Ray's temp files go to a fresh directory, so nothing from an earlier run (or
    from ~/.ray) is reused.
    """
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            num_gpus=1,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=str(tmp_path_factory.mktemp("ray")),
        )
    SHARED_ACTORS.open()
    yield ray
    SHARED_ACTORS.close()
    ray.shutdown()


@pytest.fixture
def fresh_actors(ray_session):
    """The shared Ray with no actor kept from earlier tests and none kept for later ones:
    every federation of the test starts its own (unless it opens a reuse session)."""
    SHARED_ACTORS.close()
    yield ray_session
    SHARED_ACTORS.open()


def as_typed_at_a_terminal() -> None:
    """`preexec_fn` of a command the tests start: Ctrl-C and Ctrl-\\ at their defaults, as in
    a command typed at a terminal, even when the tests themselves run in the background (a
    shell's `&` ignores both, and its children inherit that: a Ctrl-C test would hang)."""
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def actor_serving(ray, host: str):
    """The handle of the raymtl actor that serves host `host` now. Found by asking each
    actor (`serving`), not by its name: a kept actor's name is the run's that started it."""
    listed = ray.util.list_named_actors(all_namespaces=True)
    handles = [
        ray.get_actor(a["name"], namespace=a["namespace"])
        for a in listed
        if a["name"].startswith("raymtl-")
    ]
    serving = ray.get([handle.serving.remote() for handle in handles])
    (actor,) = [handle for handle, name in zip(handles, serving, strict=True) if name == host]
    return actor


def digits_experiment(tmp_path, **overrides) -> dict:
    """A small, fast experiment on rotated digits as a raw mapping."""
    raw = {
        "name": "test",
        "data": {
            "name": "digits",
            "num_clients": 6,
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
        "output": {"dir": str(tmp_path), "plots": False},
    }
    for key, value in overrides.items():
        set_setting(raw, key, value)
    return raw


def write_experiment(tmp_path, filename="experiment.yaml", **overrides):
    """digits_experiment(...) written as a YAML file for the CLI; returns its path."""
    import yaml

    path = tmp_path / filename
    path.write_text(yaml.safe_dump(digits_experiment(tmp_path, **overrides)))
    return path


def kill_host_after_round(ray, host: str, after_round: int, restart: bool, killed: list):
    """A progress callback that kills the actor of raymtl host `host` (e.g. 'clients-0',
    'leader-0') once round `after_round` is complete; the host's name goes to `killed`."""

    def kill(seed, round_index, row):
        if round_index != after_round:
            return
        ray.kill(actor_serving(ray, host), no_restart=not restart)
        killed.append(host)

    return kill


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """`reference_run(**settings)`: the run directory of `digits_experiment(**settings)`, run
    once per test session and shared by every test that compares a recovered, resumed or
    faulty run with it (keyed by the validated experiment, output folder aside)."""
    from raymtl.runtime import run_experiment

    runs: dict[str, object] = {}

    def run(**settings):
        out = tmp_path_factory.mktemp("reference")
        cfg = parse_config(digits_experiment(out, **settings))
        key = cfg.model_copy(update={"output": None}).model_dump_json()
        if key not in runs:
            runs[key] = run_experiment(cfg, out / "run")
        return runs[key]

    return run


@pytest.fixture
def make_config(tmp_path):
    """Build a validated ExperimentConfig from dotted overrides."""

    def build(**overrides):
        return parse_config(digits_experiment(tmp_path, **overrides))

    return build


os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A `raymtl up` service left running on this machine is never joined by a test's runs (nor
# by the CLI processes they start): the tests' own state folder has none.
os.environ["RAYMTL_HOME"] = tempfile.mkdtemp(prefix="raymtl-home-")


# Figures that measure the machine, not the learning: they differ between any two runs.
TIMING = ("wall_time", "client_updates_per_second", "peak_memory", "seconds")


def layout_refused_at_once(cfg, run_dir) -> str:
    """The one line a layout that cannot fit is refused with, within 2 s of the run's start
    (the data's one-time imports, scikit-learn's 3 s cold, made before the clock starts)."""
    from raymtl.config import ConfigError
    from raymtl.runtime import run_experiment
    from raymtl.runtime.executors.planning import check_federation

    check_federation(cfg)
    began = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        run_experiment(cfg, run_dir)
    assert time.perf_counter() - began < 2
    (line,) = str(refused.value).splitlines()
    return line


def learned(frame):
    """A results frame without its TIMING columns: what two runs of one experiment share."""
    return frame.drop(columns=[c for c in frame.columns if c.startswith(TIMING)])

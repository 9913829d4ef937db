"""`raymtl up` as a user meets it: a service started by the command, runs in fresh processes
joining it (its Ray, its warm actors: the same actors serve one command after another),
results equal to a run on a Ray of its own, and `raymtl down` stopping it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from raymtl.runtime.warm.service import process_alive
from tests.conftest import learned
from tests.conftest import write_experiment as write

pytestmark = [pytest.mark.ray, pytest.mark.cluster]


def raymtl(env, *args, timeout=300):
    done = subprocess.run(
        [sys.executable, "-m", "raymtl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def table(run_dir, name):
    return pq.read_table(run_dir / f"{name}.parquet").to_pandas()


def test_runs_join_the_warm_actors_of_raymtl_up_and_down_stops_them(tmp_path):
    env = dict(os.environ, RAYMTL_HOME=str(tmp_path / "home"))
    experiment = write(
        tmp_path,
        **{"runtime.executor": "ray", "runtime.clients_per_actor": 3, "output.dir": "runs"},
    )
    started = raymtl(env, "up", "--num-cpus", "2").stdout
    assert "started" in started and "2 client" in started
    service = json.loads((tmp_path / "home" / "up.json").read_text())
    try:
        assert "already running" in raymtl(env, "up").stdout  # a second `up` starts nothing
        for out in ("joined-1", "joined-2"):
            raymtl(env, "run", str(experiment), f"output.dir={tmp_path / out}")
        own_env = dict(env, RAYMTL_PRELOAD="0")  # not forked either: a process of its own
        raymtl(
            own_env,
            "run",
            str(experiment),
            "runtime.join_up=false",
            f"output.dir={tmp_path / 'own'}",
        )
    finally:
        stopped = raymtl(env, "down").stdout
    assert f"stopped (pid {service['pid']})" in stopped
    assert not process_alive(service["pid"]) and not (tmp_path / "home" / "up.json").exists()
    assert "no service running" in raymtl(env, "down").stdout

    [first], [second], [own] = (
        list((tmp_path / out).glob("test-*")) for out in ("joined-1", "joined-2", "own")
    )
    # Both joined runs ran on the service's actors: the same ones, one command after the
    # other; the run on a Ray of its own started its own.
    first_hosts, second_hosts = table(first, "hosts"), table(second, "hosts")
    assert set(first_hosts["actor"]) == set(second_hosts["actor"])
    assert len(set(first_hosts["actor"])) == len(first_hosts)  # 2 client actors, a server
    assert not set(first_hosts["actor"]) & set(table(own, "hosts")["actor"])
    assert table(first, "startup")["joined_up"].all()
    assert not table(own, "startup")["joined_up"].any()
    # The joined commands were forked from the service's preloaded process (preload.py)
    assert all(table(run, "startup")["preloaded"].all() for run in (first, second))
    assert not table(own, "startup")["preloaded"].any()
    assert service["preloaded"] and not process_alive(service["preloaded"])
    assert table(second, "startup")["ray_s"].iloc[0] < table(own, "startup")["ray_s"].iloc[0]
    # Fresh state on warm actors: the results of a run on a Ray of its own.
    for name in ("clients", "rounds", "messages"):
        pd.testing.assert_frame_equal(learned(table(first, name)), learned(table(own, name)))
        pd.testing.assert_frame_equal(learned(table(second, name)), learned(table(own, name)))


PLUGIN = """
from raymtl.algorithms.fedavg import FedAvg
from raymtl.extend import register_algorithm


@register_algorithm
class Versioned(FedAvg):
    name = "versioned"

    def aggregate(self, state, inbox, ctx):
        ctx.report(version={version})
        return super().aggregate(state, inbox, ctx)
"""


def test_runs_with_a_plugin_keep_the_warm_actors_and_an_edited_plugin_is_run_again(tmp_path):
    """Two runs with the same plugin start no actor of their own; after the plugin's file is
    edited, the third runs on the same actors with the new code."""
    env = dict(os.environ, RAYMTL_HOME=str(tmp_path / "home"))
    plugin = tmp_path / "versioned.py"
    plugin.write_text(PLUGIN.format(version=1))
    experiment = write(
        tmp_path,
        **{
            "runtime.executor": "ray",
            "runtime.clients_per_actor": 3,
            "algorithm.name": "versioned",
            "plugins": [str(plugin)],
        },
    )
    raymtl(env, "up", "--num-cpus", "2")
    try:
        for out in ("first", "second"):
            raymtl(env, "run", str(experiment), f"output.dir={tmp_path / out}")
        plugin.write_text(PLUGIN.format(version=2))
        raymtl(env, "run", str(experiment), f"output.dir={tmp_path / 'edited'}")
    finally:
        raymtl(env, "down")
    runs = [next((tmp_path / out).glob("*-*")) for out in ("first", "second", "edited")]
    actors = [set(table(run, "hosts")["actor"]) for run in runs]
    assert actors[0] == actors[1] == actors[2]  # the same warm actors served all three
    assert all(table(run, "startup")["joined_up"].all() for run in runs)
    versions = [set(table(run, "step_metrics")["version"]) for run in runs]
    assert versions == [{1}, {1}, {2}]

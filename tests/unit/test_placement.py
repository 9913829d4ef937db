"""Laying client actors out on the nodes left after a node is lost, and the exit code of a
run that cannot go on (no Ray: the arithmetic and the CLI's mapping)."""

from __future__ import annotations

import pytest
import typer

from raymtl.cli import RUN_STOPPED, user_errors
from raymtl.runtime.faults import RunStopped, replan_row
from raymtl.runtime.ray_executor import (
    actors_that_fit,
    auto_clients_per_actor,
    fitted_clients_per_actor,
    nodes_have,
)

HEAD = {"CPU": 2.0, "memory": 8e9}
GPU_NODE = {"CPU": 8.0, "GPU": 1.0}


def test_actors_fit_node_by_node():
    # 3 CPUs on two nodes hold one actor of 1.5 CPUs each, not two on the total.
    assert actors_that_fit({"a": {"CPU": 1.5}, "b": {"CPU": 1.5}}, 1.5, 0.0) == 2
    assert actors_that_fit({"a": {"CPU": 2.0}, "b": {"CPU": 1.0}}, 1.5, 0.0) == 1
    assert actors_that_fit({"a": {"CPU": 0.9}}, 0.3, 0.0) == 3  # not 2 by rounding
    assert actors_that_fit({"head": HEAD}, 2.5, 0.0) == 0
    # GPUs bound too: 8 CPUs but one GPU for actors of a quarter GPU each.
    assert actors_that_fit({"gpu": GPU_NODE, "head": HEAD}, 1.0, 0.25) == 4


def test_clients_per_actor_rises_only_when_the_actors_do_not_fit():
    assert fitted_clients_per_actor(4, 1, capacity=4) == 1  # they fit: unchanged
    assert fitted_clients_per_actor(4, 1, capacity=2) == 2  # 4 actors on 2 slots
    assert fitted_clients_per_actor(6, 2, capacity=2) == 3  # 3 actors on 2 slots
    assert fitted_clients_per_actor(7, 1, capacity=3) == 3  # 3 actors of 3, 3 and 1
    assert fitted_clients_per_actor(5, 2, capacity=1) == 5  # all in one actor
    assert auto_clients_per_actor(6, cpus=2.0, cpus_per_actor=1.0) == 3


def test_what_the_nodes_have_reads_as_a_line():
    assert nodes_have({"head": HEAD}, gpus=False) == "2 CPUs"
    assert nodes_have({"a": {"CPU": 1.0}, "gpu": GPU_NODE}, gpus=True) == "9 CPUs and 1 GPU"


def test_a_replan_row_says_what_changed():
    row = replan_row(0, 3, "runtime.clients_per_actor: 1 -> 2: ...", ["n1"], 1)
    assert row["action"] == "re-planned: runtime.clients_per_actor: 1 -> 2: ..."
    assert row["host"] == "client actors" and row["node"] == "n1" and row["round"] == 3
    assert row["rolled_back_to"] == -1 and row["recovery"] == 1  # no rollback of its own


def test_a_stopped_run_is_one_line_and_exit_code_3(capsys):
    with pytest.raises(typer.Exit) as exited, user_errors():
        raise RunStopped("runtime.max_restarts: 0 recoveries used up; seed 0 round 2: x")
    assert exited.value.exit_code == RUN_STOPPED == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "error: runtime.max_restarts: 0 recoveries used up; seed 0 round 2: x"

"""Laying client actors out by CPUs and GPUs, node by node: `auto`, a layout that cannot fit
(one line saying what is missing), the nodes left after a node is lost, and the exit code of
a run that cannot go on (no Ray: the arithmetic and the CLI's mapping)."""

from __future__ import annotations

import pytest
import typer

from raymtl.cli import RUN_STOPPED, UserErrors
from raymtl.runtime.executors.placement import (
    actors_that_fit,
    auto_clients_per_actor,
    fitted_clients_per_actor,
    layout_refusal,
    missing,
    nodes_have,
)
from raymtl.runtime.faults import RunStopped, replan_row

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
    assert auto_clients_per_actor(6, capacity=2) == 3
    assert auto_clients_per_actor(3, capacity=8) == 1  # never fewer than one client an actor


def test_auto_counts_gpus_as_well_as_cpus():
    """16 CPUs and one GPU: a quarter GPU an actor makes room for 4 actors, not 16."""
    node = {"n": {"CPU": 16.0, "GPU": 1.0}}
    assert actors_that_fit(node, 1.0, 0.25) == 4
    assert auto_clients_per_actor(6, actors_that_fit(node, 1.0, 0.25)) == 2  # 3 actors
    assert actors_that_fit(node, 1.0, 0.3) == 3  # 0.9 of the GPU
    assert auto_clients_per_actor(8, actors_that_fit(node, 1.0, 0.3)) == 3  # 3 actors
    assert layout_refusal(node, "this machine's Ray", 6, "auto", 1.0, 0.25) is None
    assert layout_refusal(node, "this machine's Ray", 8, "auto", 1.0, 0.3) is None


def test_a_layout_that_cannot_fit_is_one_line_naming_what_is_missing():
    node = {"n": {"CPU": 16.0, "GPU": 1.0}}
    assert layout_refusal(node, "this machine's Ray", 6, 1, 1.0, 0.25) == (
        "runtime.clients_per_actor: 1 makes 6 client actors of 1 CPU and 0.25 GPU for 6 "
        "clients; this machine's Ray has 16 CPUs and 1 GPU, room for 4 (0.5 GPU missing); "
        "give clients_per_actor: 2 or auto, or ask less of each actor "
        "(runtime.num_cpus_per_actor, num_gpus_per_actor)"
    )
    assert layout_refusal(node, "this machine's Ray", 6, 2, 1.0, 0.25) is None  # 3 actors
    two_cpus = {"n": {"CPU": 2.0}}
    assert layout_refusal(two_cpus, "this machine's Ray", 6, 2, 1.0, 0.0) == (
        "runtime.clients_per_actor: 2 makes 3 client actors of 1 CPU for 6 clients; this "
        "machine's Ray has 2 CPUs, room for 2 (1 CPU missing); give clients_per_actor: 3 or "
        "auto, or ask less of each actor (runtime.num_cpus_per_actor, num_gpus_per_actor)"
    )
    assert layout_refusal(two_cpus, "this machine's Ray", 6, "auto", 0.5, 0.25) == (
        "runtime: not one client actor of 0.5 CPU and 0.25 GPU fits: this machine's Ray has "
        "2 CPUs and 0 GPUs (0.25 GPU missing); give runtime.num_gpus_per_actor: 0 to train "
        "on CPUs"
    )
    assert layout_refusal(two_cpus, "the cluster", 6, "auto", 3.0, 0.0) == (
        "runtime: not one client actor of 3 CPUs fits: the cluster has 2 CPUs (1 CPU "
        "missing); give a smaller runtime.num_cpus_per_actor or num_gpus_per_actor"
    )


def test_what_is_missing_is_counted_node_by_node():
    # 2 actors of 1.5 CPUs need 3 CPUs; two nodes of 1 and 2 have 3 but hold only one.
    split = {"a": {"CPU": 1.0}, "b": {"CPU": 2.0}}
    assert missing(split, 2, 1.5, 0.0) == "enough in all, but not on any one node for each actor"
    assert missing(split, 3, 1.5, 0.0) == "1.5 CPUs missing"


def test_what_the_nodes_have_reads_as_a_line():
    assert nodes_have({"head": HEAD}, gpus=False) == "2 CPUs"
    assert nodes_have({"a": {"CPU": 1.0}, "gpu": GPU_NODE}, gpus=True) == "9 CPUs and 1 GPU"


def test_a_replan_row_says_what_changed():
    row = replan_row(0, 3, "runtime.clients_per_actor: 1 -> 2: ...", ["n1"], 1)
    assert row["action"] == "re-planned: runtime.clients_per_actor: 1 -> 2: ..."
    assert row["host"] == "client actors" and row["node"] == "n1" and row["round"] == 3
    assert row["rolled_back_to"] == -1 and row["recovery"] == 1  # no rollback of its own


def test_a_stopped_run_is_one_line_and_exit_code_3(capsys):
    with pytest.raises(typer.Exit) as exited, UserErrors():
        raise RunStopped("runtime.max_restarts: 0 recoveries used up; seed 0 round 2: x")
    assert exited.value.exit_code == RUN_STOPPED == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "error: runtime.max_restarts: 0 recoveries used up; seed 0 round 2: x"

"""The executor is the small surface the round loop needs, and a seed is planned once: the
pre-flight check's plan of the first seed is the one its federation lays out, a recovery
lays the same plan out again, and the algorithm's params are validated by the plan (inline
executor: the hosts in this process validate their own copy)."""

from __future__ import annotations

import ast
import inspect

import pandas as pd

from raymtl.runtime import run_experiment
from raymtl.runtime.executors import executor, planning
from raymtl.runtime.executors.executor import HostsLost, InlineExecutor
from raymtl.runtime.loop.federation import Federation


def test_the_executor_abc_has_at_most_a_dozen_methods():
    (cls,) = [
        node
        for node in ast.parse(inspect.getsource(executor)).body
        if isinstance(node, ast.ClassDef) and node.name == "Executor"
    ]
    methods = [node.name for node in cls.body if isinstance(node, ast.FunctionDef)]
    assert len(methods) <= 12, methods


def counting(monkeypatch) -> tuple[list, list]:
    """The seeds planned (`plan_seed`, wherever called) and partitioned, in order."""
    import raymtl.runtime.loop.federation as federation

    planned, partitioned = [], []
    plan_seed, partition = planning.plan_seed, planning.partition

    def counting_plan(cfg, seed, executor=None):
        planned.append(seed)
        return plan_seed(cfg, seed, executor)

    def counting_partition(cfg, seed):
        partitioned.append(seed)
        return partition(cfg, seed)

    monkeypatch.setattr(planning, "plan_seed", counting_plan)
    monkeypatch.setattr(planning, "partition", counting_partition)
    monkeypatch.setattr(federation, "plan_seed", counting_plan)
    return planned, partitioned


def test_each_seed_is_planned_once(make_config, tmp_path, monkeypatch):
    planned, partitioned = counting(monkeypatch)
    run_experiment(make_config(seeds=[0, 1]), tmp_path / "run")
    assert planned == partitioned == [0, 1]  # seed 0: the pre-flight check's plan


class LostOnce(InlineExecutor):
    """Inline hosts; host clients-0 is lost (a rollback) in round 2's first phase, once."""

    def __init__(self, runtime, lost: list):
        super().__init__(runtime)
        self.lost_before = lost

    def _call(self, method, calls):
        if method == "run_phase" and next(iter(calls.values()))[0] == 2 and not self.lost_before:
            self.lost_before.append("clients-0")
            raise HostsLost(method, ["clients-0"], {"clients-0": "?"}, "lost by the test")
        return super()._call(method, calls)


def test_a_recovery_lays_the_same_plan_out_again(make_config, monkeypatch):
    planned, partitioned = counting(monkeypatch)
    cfg = make_config(**{"rounds": 3, "runtime.max_restarts": 1})
    lost: list = []
    with Federation(cfg, make_executor=lambda: LostOnce(cfg.runtime, lost)) as fed:
        while not fed.done:
            fed.run_round()
    (fault,) = pd.read_parquet(fed.run_dir / "faults.parquet").to_dict("records")
    assert fault["action"] == "rolled back to round 1, replaying"
    assert planned == partitioned == [0]  # by the pre-flight check, for both starts

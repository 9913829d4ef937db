"""How a seed gets through what goes wrong while it runs, and the faults injected on purpose.

    federation.recovery.run(federation, target)   # rounds up to `target`, recovering

`Recovery.run` is the loop every call of a `Federation` (loop/federation.py) goes through:
its start, each round, a state fetch, its close. When no hosts run, they are started from
the seed's last complete checkpoint (`start`); then rounds run until round `target` has, then
the call's own work. A lost host (`HostsLost`) rolls the whole federation back to that
checkpoint and the lost rounds are replayed (at most runtime.max_restarts times a seed), so
the results equal the fault-free run's: a lost node is waited for until Ray declares it dead
(at most runtime.placement_timeout_s), and client actors that no longer fit the nodes left
are laid out anew (more clients an actor: the same results; a "re-planned" row). A damaged
checkpoint is marked DAMAGED and the one before it is started from. A run that cannot go on
raises `RunStopped` (exit 3 on the command line); an algorithm's step that raised is no
fault to recover: the run is marked FAILED. Every fault is a row of faults.parquet
(runtime/faults.py).

`Injections`: runtime.inject_faults kills hosts' actors at the start of the rounds it names;
the recovery is a real fault's, and each (round, host) is killed once, never again on the
replay of its round (nor after the seed is resumed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from raymtl.config import ConfigError, ExperimentConfig
from raymtl.errors import StepFailed
from raymtl.metrics import Recorder
from raymtl.runtime.executors.executor import Executor, HostsLost
from raymtl.runtime.faults import (
    RunStopped,
    fault_rows,
    injection_schedule,
    kill_host,
    replan_row,
)
from raymtl.runtime.loop.events import RoundEvent
from raymtl.runtime.storage.checkpoints import (
    DamagedCheckpoint,
    checkpoint_dir,
    damaged_cause,
    latest_checkpoint,
    mark_damaged,
)
from raymtl.runtime.storage.location import Location
from raymtl.runtime.storage.run_dirs import mark_failed

log = logging.getLogger(__name__)


class Hosts(Protocol):
    """What `Recovery` drives: a seed's federation (loop/federation.py `Federation`)."""

    seed_dir: Location  # checkpoints/seed<k> of the run
    round: int  # the last finished round
    executor: Executor | None  # None: no hosts run

    def start_from(self, start: int) -> None:
        """Start the hosts from the checkpoint of round `start` (0: the seed's start)."""

    def advance(self) -> RoundEvent:
        """Run, record and checkpoint (when due) the next round."""

    def shutdown(self, keep: bool = False) -> None:
        """Stop the hosts (`keep`: the ones that still answer may serve the replay)."""


class Recovery:
    """One seed's recoveries: the retry loop (`run`), its roll-backs, the damaged checkpoints
    it falls back past, and runtime.inject_faults' kills (`injections`)."""

    def __init__(
        self, cfg: ExperimentConfig, seed: int, recorder: Recorder, run_dir: Path, store: Location
    ):
        self.cfg, self.seed, self.recorder = cfg, seed, recorder
        self.run_dir, self.store = run_dir, store
        self.count = 0  # recoveries so far (runtime.max_restarts)
        self.current = 0  # the round in progress (faults name it)
        self.began = 0.0  # when the hosts last started: the seconds a fault loses
        self.injections = Injections(cfg, seed, recorder)

    def run(self, hosts: Hosts, target: int, then: Callable | None = None):
        """Run rounds until round `target` has run (the hosts started, or restarted from the
        last complete checkpoint, first when none run), then `then()`; its value, or the
        last round's event. A lost host rolls back to that checkpoint and replays."""
        while True:
            try:
                if hosts.executor is None:
                    self.start(hosts)
                event = None
                while hosts.round < target:
                    self.current = hosts.round + 1
                    self.injections.inject(hosts.executor, self.current)
                    event = hosts.advance()
                return then() if then is not None else event
            except HostsLost as fault:
                self.roll_back(hosts, fault)
            except StepFailed as error:  # the algorithm's code raised: no fault to recover
                raise self.failed(error) from error

    def start(self, hosts: Hosts) -> None:
        """Start the hosts from the seed's last complete checkpoint (round 0: the start). A
        checkpoint found damaged (a host checks every file against the manifest) is marked
        DAMAGED and the one before it is started from: a damaged file is no lost host."""
        while True:
            start = latest_checkpoint(hosts.seed_dir)
            self.current, self.began = start, time.perf_counter()
            try:
                hosts.start_from(start)
                break
            except (ConfigError, DamagedCheckpoint) as error:
                damaged = damaged_cause(error)
                if damaged is None:
                    raise
                hosts.shutdown()
                self.fall_back(hosts.seed_dir, start, damaged)
        self.record_replan(hosts.executor, hosts.round + 1)

    def fall_back(self, seed_dir: Location, start: int, damaged: DamagedCheckpoint) -> None:
        """Mark checkpoint `start` damaged, so the next start is from the one before; with
        none before it, refuse in one line (starting over is the user's decision)."""
        earlier = latest_checkpoint(seed_dir, before=start)
        if not earlier:
            raise ConfigError(
                f"{damaged}; seed {self.seed} has no earlier complete checkpoint to fall back "
                f"to (move checkpoints/seed{self.seed} aside to run the seed from its start)"
            ) from None
        mark_damaged(checkpoint_dir(seed_dir, start), str(damaged))
        log.warning("seed %d: %s; falling back to round %d", self.seed, damaged, earlier)

    def roll_back(self, hosts: Hosts, fault: HostsLost) -> None:
        """Record a lost host and roll back: the next `run` restarts from the last complete
        checkpoint, once Ray has declared the lost hosts' nodes dead (actors placed on a node
        Ray still counts as alive would be lost with it: two recoveries for one lost node).
        With no recovery left, stop the run in one line (RunStopped). The hosts that still
        answer keep their actors for the replay (a reuse session's pool,
        runtime/actors/pool.py): it starts new actors only for the lost hosts."""
        executor = hosts.executor
        start, self.count = latest_checkpoint(hosts.seed_dir), self.count + 1
        recover = self.count <= self.cfg.runtime.max_restarts
        hosts.shutdown(keep=recover)
        seconds = time.perf_counter() - self.began
        injected = executor.injected if executor is not None else set()
        rows = fault_rows(
            self.seed, self.current, fault, start, self.count, recover, seconds, injected
        )
        self.recorder.add_rows("faults", rows)
        self.recorder.flush()
        if not recover:
            nodes = ", ".join(sorted(set(fault.nodes.values())))
            raise RunStopped(
                f"runtime.max_restarts: {self.cfg.runtime.max_restarts} recoveries used up; "
                f"seed {self.seed} round {self.current}: hosts lost during {fault.method}: "
                f"{', '.join(fault.hosts)} (node {nodes}; faults.parquet has every fault)"
            ) from None
        log.warning("seed %d round %d: %s; %s", self.seed, self.current, fault, rows[0]["action"])
        if executor is not None:
            timeout = self.cfg.runtime.placement_timeout_s
            executor.placement.settle_nodes(fault.nodes.values(), timeout)

    def record_replan(self, executor: Executor | None, round_index: int) -> None:
        """faults.parquet and the log, in one line: the client actors were laid out anew
        (from round `round_index`) because a node was lost and they no longer fit the nodes
        left."""
        placement = None if executor is None else executor.placement
        if placement is None or not placement.replanned:
            return
        row = replan_row(
            self.seed, round_index, placement.replanned, placement.replanned_nodes, self.count
        )
        self.recorder.add_rows("faults", [row])
        log.warning("seed %d from round %d: %s", self.seed, round_index, placement.replanned)

    def failed(self, error: StepFailed) -> StepFailed:
        """An algorithm's step raised: the run is marked failed (FAILED with the line, the
        step's traceback in run.log), so it never looks like an interrupted run; the error
        goes on naming where the traceback is (one line and exit 1 from the command)."""
        self.recorder.flush()
        log_file = mark_failed(self.run_dir, self.store, error.line, error.details)
        return StepFailed(f"{error.line}; the traceback is in {log_file}", error.details)


class Injections:
    """runtime.inject_faults of one seed: round -> the hosts killed at its start (drawn once
    the hosts are first laid out), and the (round, host) pairs killed already."""

    def __init__(self, cfg: ExperimentConfig, seed: int, recorder: Recorder):
        self.faults, self.rounds = cfg.runtime.inject_faults, cfg.rounds
        self.seed, self.recorder = seed, recorder
        self.schedule: dict[int, list[str]] | None = None
        self.killed: set[tuple[int, str]] = set()

    def inject(self, executor: Executor | None, round_index: int) -> None:
        """Kill the hosts due at the start of round `round_index` (each once: not again
        when the round is replayed after the recovery)."""
        if not self.faults or executor is None:
            return
        if self.schedule is None:  # drawn from the hosts as first laid out
            self.schedule = injection_schedule(self.faults, list(executor.hosts), self.rounds)
            self.killed |= self.killed_before()
        for host in self.schedule.get(round_index, []):
            if (round_index, host) in self.killed:
                continue
            self.killed.add((round_index, host))
            if host not in executor.hosts:  # gone for good, or laid out anew
                log.warning("seed %d round %d: no host %s to kill", self.seed, round_index, host)
                continue
            log.warning(
                "seed %d round %d: killing host %s (runtime.inject_faults)",
                self.seed,
                round_index,
                host,
            )
            kill_host(executor, host)

    def killed_before(self) -> set[tuple[int, str]]:
        """(round, host) of the faults injected into this seed before it was resumed."""
        faults = self.recorder.arrow_table("faults").to_pylist()
        return {
            (row["round"], row["host"])
            for row in faults
            if row.get("injected") and row.get("seed") == self.seed
        }

"""The one round loop: set up a federation, run its phases, record, checkpoint.

    for seed in seeds:
        federation ← partition + topology (graph service) + placement of hosts
        for round t:
            S_t ← sampled clients (seeded by (seed, t))
            for phase in algorithm.phases(t):
                inboxes ← router.take(participants of the phase)
                router.deliver(executor.run_phase(phase, inboxes))
            evaluate every eval_every rounds; checkpoint every checkpoint_every rounds

The driver handles metadata only: envelopes, metrics and bit counts.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from raymtl.algorithms.base import HOLDER_TABLE, client_name, role_of
from raymtl.algorithms.registry import get_algorithm
from raymtl.algorithms.training import derive_seed
from raymtl.config import ExperimentConfig
from raymtl.metrics import Recorder, fairness_stats
from raymtl.runtime.accounting import charge, link_direction, resumed_totals, round_bits
from raymtl.runtime.checkpoints import (
    check_shared,
    checkpoint_dir,
    latest_checkpoint,
    lost_at,
    verify_checkpoint,
)
from raymtl.runtime.executor import Executor, HostsLost
from raymtl.runtime.faults import dropped_rows, fault_rows
from raymtl.runtime.router import Router
from raymtl.runtime.setup import build_setup
from raymtl.runtime.storage import Location, publish

log = logging.getLogger(__name__)


# rounds.parquet's seconds by kind of phase: a client's "train" step, the coordinators'
# steps (server, LPS, graph service, task leaders), the clients' other steps (receiving,
# aligning), and the evaluation of every client.
PHASE_KINDS = ("seconds_train", "seconds_aggregate", "seconds_receive")


def phase_kind(phase) -> str:
    """Which of PHASE_KINDS a phase's seconds count towards."""
    if phase.role != "client":
        return "seconds_aggregate"
    return "seconds_train" if phase.step == "train" else "seconds_receive"


def sample_clients(seed: int, round_index: int, num_clients: int, fraction: float) -> tuple:
    """⌈m·N⌉ clients uniformly without replacement, seeded by (seed, round)."""
    count = max(1, math.ceil(fraction * num_clients))
    rng = np.random.default_rng(derive_seed(seed, round_index, "sample"))
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False)))


class Driver:
    """Runs one experiment (all seeds) into a run directory."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        make_executor: Callable[[], Executor],
        progress=None,
        store: Location | None = None,
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)  # the driver's outputs, written here first
        # Where the run lives (checkpoints written there by the hosts, outputs copied there):
        # the run directory itself, or a URI.
        self.store = store or Location.of(self.run_dir)
        self.make_executor = make_executor
        self.progress = progress  # callable(seed, round, row) or None
        self.algorithm_cls = get_algorithm(cfg.algorithm.name)
        self.params = cfg.algorithm.typed_params()
        # The driver only asks the algorithm for its phases; it never builds models.
        self._algorithm = self.algorithm_cls(self.params, model_factory=None)
        self.recorder = Recorder.load(self.run_dir)
        self.current_round = 0  # the round in progress (faults name it)

    def run(self, stop_after: int | None = None) -> None:
        """Run (or resume) every seed; `stop_after` simulates a crash after that round."""
        for seed in self.cfg.seeds:
            seed_dir = self.store.child("checkpoints", f"seed{seed}")
            if seed_dir.child("DONE").is_file():
                continue
            self.run_seed(seed, seed_dir, stop_after)
            if stop_after is not None:
                return
        self.recorder.flush()
        publish(self.run_dir, self.store)

    def run_seed(self, seed: int, seed_dir: Location, stop_after: int | None) -> None:
        """Run a seed; a lost host rolls the whole federation back to its last complete
        checkpoint and the lost rounds are replayed (at most runtime.max_restarts times), so
        the results equal the fault-free run's. Every fault is a row of faults.parquet."""
        recoveries = 0
        while True:
            began = time.perf_counter()
            try:
                return self.run_from_checkpoint(seed, seed_dir, stop_after)
            except HostsLost as fault:
                start, recoveries = latest_checkpoint(seed_dir), recoveries + 1
                recover = recoveries <= self.cfg.runtime.max_restarts
                rows = fault_rows(seed, self.current_round, fault, start, recoveries, recover,
                                  time.perf_counter() - began)  # fmt: skip
                self.recorder.add_rows("faults", rows)
                self.recorder.flush()
                log.warning("seed %d round %d: %s; %s", seed, self.current_round, fault,
                            rows[0]["action"])  # fmt: skip
                if not recover:
                    raise RuntimeError(
                        f"runtime.max_restarts: {self.cfg.runtime.max_restarts} recoveries used "
                        f"up; {fault} (faults.parquet has every fault)"
                    ) from None

    def run_from_checkpoint(self, seed: int, seed_dir: Location, stop_after: int | None) -> None:
        start = latest_checkpoint(seed_dir)
        self.recorder.truncate_after(seed, start)
        self.current_round = start
        executor = self.make_executor()
        try:
            lost = lost_at(seed_dir, start)  # the federation as that checkpoint holds it
            setup = build_setup(self.cfg, seed, executor, seed_dir, start, lost)
            executor.lost = set(lost)
            executor.start(setup.specs)
            check_shared(seed_dir.child(".probe"), executor)
            wall_before, cumulative = resumed_totals(self.recorder.rounds(), seed, start)
            wall_start = time.perf_counter() - wall_before
            for round_index in range(start + 1, self.cfg.rounds + 1):
                self.current_round = round_index
                row = self.run_round(executor, setup, seed, round_index, cumulative)
                cumulative = [row["cum_bits_up"], row["cum_bits_down"]]
                self._finish_round(row, wall_start)
                if self._checkpoint_due(round_index):
                    self.checkpoint(executor, seed_dir, round_index)
                if self.progress is not None:  # the round is complete, checkpoint included
                    self.progress(seed, round_index, row)
                if stop_after is not None and round_index >= stop_after:
                    return
            self.record_host_memory(executor, seed)
            self.recorder.flush()
            publish(self.run_dir, self.store)
            seed_dir.child("DONE").write_text("done\n")
        finally:
            executor.shutdown()

    def record_host_memory(self, executor: Executor, seed: int) -> None:
        """hosts.parquet: each host's peak resident memory over the seed (bytes)."""
        rows = [
            {"seed": seed, "round": self.cfg.rounds, "host": host, "peak_rss": int(peak)}
            for host, peak in sorted(executor.peak_memory().items())
        ]
        self.recorder.add_rows("hosts", rows)

    def run_round(self, executor, setup, seed, round_index, cumulative) -> dict:
        """All phases of one round, then evaluation; returns the round's row."""
        n = setup.federation.num_clients
        sampled = sample_clients(seed, round_index, n, self.params.sample_fraction)
        router, holders, seconds = self.run_phases(executor, seed, round_index, sampled)
        ledger = charge(router.drain_ledger(), holders)
        self.recorder.add_messages(ledger)
        up = sum(r["bits"] for r in ledger if link_direction(r) == "up")
        down = sum(r["bits"] for r in ledger if link_direction(r) == "down")
        cumulative = [cumulative[0] + up, cumulative[1] + down]
        row = {
            "seed": seed,
            "round": round_index,
            "bits_up": up,
            "bits_down": down,
            "cum_bits_up": cumulative[0],
            "cum_bits_down": cumulative[1],
            "cum_bits": cumulative[0] + cumulative[1],
        }
        row.update(seconds)
        if self._eval_due(round_index):
            began = time.perf_counter()
            row.update(self._evaluate(executor, setup, seed, round_index, ledger))
            row["seconds_evaluate"] = time.perf_counter() - began
            self.recorder.add_rows(
                "faults", dropped_rows(seed, self.current_round, executor, router)
            )
        row.update(executor.state_report())
        lost_clients = sum(role_of(p) == "client" for p in executor.lost)
        row.update(clients_lost=lost_clients, clients_answered=n - lost_clients)
        return row

    def run_phases(self, executor, seed: int, round_index: int, sampled) -> tuple:
        """The round's phases in order: the router (its ledger), the roles' holders, and the
        seconds by kind of phase (phases.parquet keeps each phase's)."""
        router, holders, warned = Router(), {}, Counter()
        seconds = dict.fromkeys(PHASE_KINDS, 0.0) | {"clients_trained": 0}
        for index, phase in enumerate(self._algorithm.phases(round_index, self.cfg.rounds)):
            inboxes = router.take(self._participants(phase, executor, sampled, router))
            began = time.perf_counter()
            envelopes, records = executor.run_phase(round_index, phase, inboxes, sampled)
            took, kind = time.perf_counter() - began, phase_kind(phase)
            seconds[kind] += took
            seconds["clients_trained"] += len(inboxes) if kind == "seconds_train" else 0
            self.recorder.add_rows("phases", [{"seed": seed, "round": round_index,
                                   "index": index, "role": phase.role, "step": phase.step,
                                   "participants": len(inboxes), "seconds": took}])  # fmt: skip
            self.recorder.add_rows(
                "faults", dropped_rows(seed, self.current_round, executor, router)
            )
            router.deliver(seed, round_index, envelopes, executor.lost)
            for table, row in records:
                if table == HOLDER_TABLE:  # who holds a role (a task leader) this round
                    holders[row["participant"]] = row["client"]
                else:
                    self.recorder.add_rows(table, [{"seed": seed, "round": round_index, **row}])
                if table == "warnings":
                    warned[(row["participant"], row["message"])] += 1
        for (participant, message), count in sorted(warned.items()):  # on the console too
            log.warning("seed %d round %d, %s: %s (x%d)", seed, round_index, participant,
                        message, count)  # fmt: skip
        executor.hold_for_evaluation(router.take_evaluation())
        if router.undelivered():
            raise RuntimeError(f"round {round_index}: messages left undelivered")
        return router, holders, seconds

    def _participants(self, phase, executor, sampled, router) -> list[str]:
        members = executor.participants()  # the survivors, when the run goes on without some
        of_role = [p for p in members if role_of(p) == phase.role]
        if phase.who == "sampled":
            chosen = {client_name(i) for i in sampled}
            return [p for p in of_role if p in chosen]
        if phase.who == "inbox":
            waiting = router.waiting()
            return [p for p in of_role if p in waiting]
        return of_role

    def _evaluate(self, executor, setup, seed, round_index, ledger) -> dict:
        """Every client on its own test split; per-client rows and the round's fairness."""
        up, down = round_bits(ledger, setup.federation.num_clients)
        clients = executor.evaluate()
        for client_row in clients:
            i = client_row["client"]
            client_row.update(seed=seed, round=round_index, bits_up=up[i], bits_down=down[i])
        self.recorder.add_clients(clients)
        # Accuracy is over the clients whose task has it (classification); NaN when none.
        stats = fairness_stats([r["accuracy"] for r in clients if "accuracy" in r])
        return {
            "mean_accuracy": stats["mean"],
            "worst10_accuracy": stats["worst10"],
            "worst20_accuracy": stats["worst20"],
            "std_accuracy": stats["std"],
            "mean_loss": float(np.mean([r["loss"] for r in clients])),
        }

    def _finish_round(self, row: dict, wall_start: float) -> None:
        row["wall_time"] = time.perf_counter() - wall_start
        for key in (
            "mean_accuracy",
            "worst10_accuracy",
            "worst20_accuracy",
            "std_accuracy",
            "mean_loss",
        ):
            row.setdefault(key, float("nan"))
        self.recorder.add_round(row)

    def _eval_due(self, round_index: int) -> bool:
        return round_index % self.cfg.eval_every == 0 or round_index == self.cfg.rounds

    def _checkpoint_due(self, round_index: int) -> bool:
        return round_index % self.cfg.checkpoint_every == 0 and round_index < self.cfg.rounds

    def checkpoint(self, executor: Executor, seed_dir: Location, round_index: int) -> None:
        """Hosts save their own states; then metrics; then the COMPLETE marker."""
        directory = checkpoint_dir(seed_dir, round_index)
        executor.save(directory.uri)
        verify_checkpoint(directory, executor.members)
        self.recorder.flush()
        publish(self.run_dir, self.store)
        # The federation it holds: without the clients the run went on without.
        complete = {"round": round_index, "lost": sorted(executor.lost)}
        directory.child("COMPLETE").write_text(json.dumps(complete))

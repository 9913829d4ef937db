"""One round of a seed's federation, on hosts already started:

    S_t ← sampled clients (seeded by (seed, t))
    for phase in algorithm.phases(t):
        inboxes ← router.take(participants of the phase)
        router.deliver(executor.run_phase(phase, inboxes).envelopes)
    evaluate every eval_every rounds

and what it records: the round's row (bits, seconds by kind of phase, metrics), its phases,
messages, clients' rows, the rows the steps logged, their warnings, and every host lost in it.
The driver handles metadata only: envelopes, metrics and bit counts.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np

from raymtl.algorithms.base import EVERY_CLIENT, Algorithm, FederationInfo, client_name, role_of
from raymtl.config import ExperimentConfig
from raymtl.metrics import Recorder, fairness_stats
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.probes import state_report
from raymtl.runtime.faults import dropped_rows
from raymtl.runtime.hosts.host import evaluation_due
from raymtl.runtime.loop.accounting import charge, link_direction, round_bits
from raymtl.runtime.loop.privacy import PrivacyLedger
from raymtl.runtime.loop.sampling import evaluation_sample, sample_clients
from raymtl.runtime.router import Envelope, Router

log = logging.getLogger(__name__)

# rounds.parquet's seconds by kind of phase: the clients' training (`Phase.trains`), the
# coordinators' steps (server, LPS, graph service, task leaders), the clients' other steps
# (receiving, aligning), and the evaluation of every client.
PHASE_KINDS = ("seconds_train", "seconds_aggregate", "seconds_receive")
# The same kinds' floating-point operations (flops_train, ...; flops_evaluate), their sum
# `flops` and the running total `cum_flops` (raymtl/flops.py says what is counted).
# The evaluation's columns of rounds.parquet (NaN in a round without evaluation).
EVALUATION_COLUMNS = (
    "mean_accuracy",
    "worst10_accuracy",
    "worst20_accuracy",
    "std_accuracy",
    "mean_loss",
    "clients_evaluated",  # how many clients the figures cover (eval_fraction)
)


def flops_column(kind: str) -> str:
    """rounds.parquet's FLOPs column of a kind of phase: seconds_train -> flops_train."""
    return kind.replace("seconds_", "flops_")


def phase_kind(phase) -> str:
    """Which of PHASE_KINDS a phase's seconds count towards."""
    if phase.role != "client":
        return "seconds_aggregate"
    return "seconds_train" if phase.trains else "seconds_receive"


class RoundLoop:
    """Runs the rounds of one seed on one executor's hosts, recording as it goes."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        algorithm: Algorithm,
        recorder: Recorder,
        executor: Executor,
        federation: FederationInfo,
        seed: int,
    ):
        self.cfg, self.algorithm, self.recorder = cfg, algorithm, recorder
        self.executor, self.federation, self.seed = executor, federation, seed
        self.privacy = PrivacyLedger(cfg, seed, algorithm.params.sample_fraction)
        self.printed: set[str] = set()  # the steps' warnings already on the console
        # Evaluation copies not yet handed to the hosts (their next evaluation uses them).
        self.evaluation_copies: dict[str, Envelope] = {}

    def record_attackers(self) -> None:
        """attackers.parquet: the seed's malicious clients (attack.fraction, §9.5), drawn as
        every host draws them."""
        attack = self.cfg.attack
        if attack.is_default():
            return
        from raymtl.toolbox.attacks import malicious_clients

        drawn = malicious_clients(self.federation.num_clients, attack.fraction, self.seed)
        rows = [{"client": k, "kind": attack.kind, "scale": attack.strength} for k in drawn]
        self.add_rows("attackers", 1, rows)

    def run(self, round_index: int, previous: dict) -> tuple[dict, list[dict]]:
        """All phases of one round, then its evaluation when due: the round's row of
        rounds.parquet (without wall_time) and its clients' rows (evaluated rounds).
        `previous`: the running totals (accounting.CUMULATIVE) the round adds to."""
        n = self.federation.num_clients
        fraction = self.algorithm.params.sample_fraction
        sampled = sample_clients(self.seed, round_index, n, fraction, self.cfg.sampling)
        if round_index == 1:
            self.record_attackers()
        router, holders, seconds, flops = self.run_phases(round_index, sampled)
        ledger = charge(router.drain_ledger(), holders)
        self.recorder.add_messages(ledger)
        up = sum(r["bits"] for r in ledger if link_direction(r) == "up")
        down = sum(r["bits"] for r in ledger if link_direction(r) == "down")
        row = {
            "seed": self.seed,
            "round": round_index,
            "bits_up": up,
            "bits_down": down,
            "cum_bits_up": previous["cum_bits_up"] + up,
            "cum_bits_down": previous["cum_bits_down"] + down,
            "cum_bits": previous["cum_bits_up"] + previous["cum_bits_down"] + up + down,
        }
        row.update(seconds)
        clients = []
        flops["flops_evaluate"] = 0.0
        if self.eval_due(round_index):
            began = time.perf_counter()
            metrics, clients = self.evaluate(round_index, ledger)
            row.update(metrics)
            row["seconds_evaluate"] = time.perf_counter() - began
            flops["flops_evaluate"] = sum(client.pop("flops", 0.0) for client in clients)
        row.update(flops)
        row["flops"] = sum(flops.values())
        row["cum_flops"] = previous["cum_flops"] + row["flops"]
        report = state_report(self.executor)
        self.record_lost(round_index, report.lost)
        row.update(report.value)
        lost_clients = sum(role_of(p) == "client" for p in self.executor.lost)
        row.update(clients_lost=lost_clients, clients_answered=n - lost_clients)
        for column in EVALUATION_COLUMNS:
            row.setdefault(column, float("nan"))
        row["epsilon"] = self.privacy.epsilon(round_index)
        return row, clients

    def run_phases(self, round_index: int, sampled) -> tuple:
        """The round's phases in order: the router (its ledger), the roles' holders, and the
        seconds and FLOPs by kind of phase (phases.parquet keeps each phase's)."""
        executor, router, holders, warned = self.executor, Router(), {}, Counter()
        seconds = dict.fromkeys(PHASE_KINDS, 0.0) | {"clients_trained": 0}
        flops = {flops_column(kind): 0.0 for kind in PHASE_KINDS}
        for index, phase in enumerate(self.algorithm.phases(round_index, self.cfg.rounds)):
            inboxes = router.take(self.participants(phase, sampled, router))
            began = time.perf_counter()
            result = executor.run_phase(round_index, phase, inboxes, sampled)
            took, kind = time.perf_counter() - began, phase_kind(phase)
            seconds[kind] += took
            flops[flops_column(kind)] += result.flops
            seconds["clients_trained"] += len(inboxes) if kind == "seconds_train" else 0
            phase_row = {"index": index, "role": phase.role, "step": phase.step}
            phase_row |= {"participants": len(inboxes), "seconds": took, "flops": result.flops}
            self.add_rows("phases", round_index, [phase_row])
            # What was handed to the hosts lost in this phase was never processed: it is not
            # delivered, and its bits are not counted.
            for drop in result.lost:
                router.retract(set(drop["participants"]))
            self.record_lost(round_index, result.lost)
            router.deliver(self.seed, round_index, result.envelopes, executor.lost)
            holders.update(result.holders)  # who holds a role (a task leader) this round
            rows_by_table: dict[str, list[dict]] = {}
            for table, row in result.tables:  # one Arrow chunk per table and phase, not per row
                rows_by_table.setdefault(table, []).append(row)
            for table, rows in rows_by_table.items():
                self.add_rows(table, round_index, rows)
            self.add_rows("warnings", round_index, result.warnings)
            warned.update((w["participant"], w["message"]) for w in result.warnings)
        self.print_warnings(round_index, warned)
        self.keep_evaluation_copies(router.take_evaluation())
        if self.eval_due(round_index):  # the hosts get the copies when they are used only
            held = executor.hold_for_evaluation(list(self.evaluation_copies.values()))
            self.evaluation_copies = {}
            self.record_lost(round_index, held.lost)
        if router.undelivered():
            raise RuntimeError(f"round {round_index}: messages left undelivered")
        return router, holders, seconds, flops

    def keep_evaluation_copies(self, copies) -> None:
        """The latest evaluation copy of every client, by destination: one to EVERY_CLIENT
        replaces all earlier ones; a later one to a client replaces it for that client."""
        for envelope in copies:
            if envelope.dst == EVERY_CLIENT:
                self.evaluation_copies = {}
            self.evaluation_copies[envelope.dst] = envelope

    def print_warnings(self, round_index: int, warned: Counter) -> None:
        """The steps' warnings on the console: one line per message, the first round it
        comes in, with who gave it and how often; the seed's later rounds only add rows to
        warnings.parquet (a diverged run would repeat it every round)."""
        by_message: dict[str, Counter] = {}
        for (participant, message), count in warned.items():
            by_message.setdefault(message, Counter())[participant] += count
        for message, counts in sorted(by_message.items()):
            if message in self.printed:
                continue
            self.printed.add(message)
            who = sorted(counts)
            shown = ", ".join(who[:3]) + (f" and {len(who) - 3} more" if len(who) > 3 else "")
            log.warning(
                "%s seed %d round %d, %s: %s (x%d; this seed's later ones only in "
                "warnings.parquet)",
                self.cfg.name,
                self.seed,
                round_index,
                shown,
                message,
                sum(counts.values()),
            )

    def participants(self, phase, sampled, router) -> list[str]:
        """The participants that run `phase`, among the hosts' survivors: the cohort's or
        the inbox's without going over every client (a round costs its cohort)."""
        if phase.who == "sampled":
            chosen = [client_name(i) for i in sampled]
        elif phase.who == "inbox":
            chosen = sorted(router.waiting(), key=self.executor.members.order_of)
        else:
            return list(self.executor.members.participants_of(phase.role))
        return [p for p in chosen if role_of(p) == phase.role and self.executor.members.holds(p)]

    def evaluate(self, round_index: int, ledger) -> tuple[dict, list[dict]]:
        """Every client (a seeded `eval_fraction` of them) on its own test split: the round's
        fairness metrics and the clients' rows (recorded in clients.parquet)."""
        up, down = round_bits(ledger, self.federation.num_clients)
        cfg = self.cfg
        fraction = 1.0 if cfg.eval_all_at_end and round_index == cfg.rounds else cfg.eval_fraction
        chosen = evaluation_sample(self.seed, round_index, self.federation.num_clients, fraction)
        answer = self.executor.evaluate(None if chosen is None else map(client_name, chosen))
        self.record_lost(round_index, answer.lost)
        clients = answer.value
        for client_row in clients:
            i = client_row["client"]
            client_row.update(seed=self.seed, round=round_index, bits_up=up[i], bits_down=down[i])
        self.recorder.add_clients(clients)
        # Accuracy is over the clients whose task has it (classification); NaN when none.
        stats = fairness_stats([r["accuracy"] for r in clients if "accuracy" in r])
        metrics = {
            "mean_accuracy": stats["mean"],
            "worst10_accuracy": stats["worst10"],
            "worst20_accuracy": stats["worst20"],
            "std_accuracy": stats["std"],
            "mean_loss": float(np.mean([r["loss"] for r in clients])),
            "clients_evaluated": len(clients),
        }
        return metrics, clients

    def eval_due(self, round_index: int) -> bool:
        return evaluation_due(round_index, self.cfg)

    def add_rows(self, table: str, round_index: int, rows: list[dict]) -> None:
        if rows:
            self.recorder.add_rows(
                table, [{"seed": self.seed, "round": round_index, **row} for row in rows]
            )

    def record_lost(self, round_index: int, lost: list[dict]) -> None:
        """Client hosts lost during a call of round `round_index`: faults.parquet rows."""
        if lost:
            self.recorder.add_rows("faults", dropped_rows(self.seed, round_index, lost))

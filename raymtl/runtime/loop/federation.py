"""The live federation of one seed: its hosts started from the seed's plan, driven round by
round, recovered when hosts are lost.

    with Federation(cfg, seed, run_dir, store=store) as fed:   # hosts started
        while not fed.done:
            event = fed.run_round()       # phases, evaluation when due, rows, checkpoint
        weights = fed.state(3)["model"]   # client 3's kept tensors, fetched from its host

The Driver (every seed of a run, loop/driver.py) and `raymtl.Federation` (the user's, which
opens its run folder, calls the callbacks' on_run_start and writes the run's summary:
raymtl/api/federation.py) are built on this object. It starts from the seed's last complete
checkpoint when there is one and checkpoints every checkpoint_every rounds. Every call goes
through the seed's `Recovery` (loop/recovery.py): a lost host rolls the whole federation back
to its last complete checkpoint and the lost rounds are replayed, so the results equal the
fault-free run's; runtime.inject_faults' kills happen there too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from raymtl.algorithms.base import client_name
from raymtl.config import ExperimentConfig
from raymtl.metrics import Recorder
from raymtl.runtime.executors.executor import Executor, participant_state
from raymtl.runtime.executors.launch import ExecutorMaker, executor_factory
from raymtl.runtime.executors.layout import lay_out
from raymtl.runtime.executors.planning import Plan, plan_seed, start_checked_run
from raymtl.runtime.loop.accounting import CUMULATIVE, resumed_totals
from raymtl.runtime.loop.events import RoundEvent
from raymtl.runtime.loop.recovery import Recovery
from raymtl.runtime.loop.round_loop import RoundLoop
from raymtl.runtime.loop.startup_records import host_memory_rows, startup_row
from raymtl.runtime.storage.checkpoints import (
    check_shared,
    checkpoint_checksums,
    checkpoint_dir,
    latest_checkpoint,
    read_manifest,
    verify_checkpoint,
    write_manifest,
)
from raymtl.runtime.storage.location import Location, publish
from raymtl.runtime.storage.run_dirs import bound_config, check_bound, clear_failed

log = logging.getLogger(__name__)


class Federation:
    """One seed's federation: `run_round()`, `state(participant)`, `close()` (or a `with`
    block); its hosts start when it is made.

    `cfg`: the validated experiment; `seed`: one of its seeds (default: the first).
    `run_dir`: the run folder it records into, and `store`: where the run lives (a URI, or by
    default the folder itself); with neither, a new run folder is made as `raymtl run` makes
    it (the pre-flight check's plan kept). Callbacks' `on_round_end` run after every round;
    one returning True stops the seed there (`done`). `recorder`, `make_executor` and `plan`:
    the run's recorder and executors, shared by its seeds, and the seed's plan when the
    run's pre-flight check made it."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        seed: int | None = None,
        run_dir: str | Path | None = None,
        callbacks=(),
        *,
        store: Location | None = None,
        recorder: Recorder | None = None,
        make_executor: Callable[[], Executor] | None = None,
        plan: Plan | None = None,
    ):
        self.cfg = cfg
        self.seed = cfg.seeds[0] if seed is None else int(seed)
        self.callbacks = tuple(callbacks)
        if run_dir is None:
            run_dir, store, plan = start_checked_run(cfg)
        self.run_dir = Path(run_dir)
        self.store = store or Location.of(self.run_dir)
        self.recorder = recorder or Recorder.load(self.run_dir)
        self.make_executor = ExecutorMaker.of(make_executor or executor_factory(cfg))
        # The seed's plan (planning.py), made once: by the pre-flight check, or at the start.
        self.plan = plan if plan is not None and plan.seed == self.seed else None
        self.seed_dir = self.store.child("checkpoints", f"seed{self.seed}")
        self.round = 0  # the last finished round
        self.stopped = False  # a callback stopped the seed
        self.executor: Executor | None = None  # None: no hosts run
        self.closed = False
        self.recovery = Recovery(cfg, self.seed, self.recorder, self.run_dir, self.store)
        failed_before = clear_failed(self.run_dir, self.store)  # it goes on: no longer failed
        if failed_before is not None:
            log.warning("%s failed before (%s); going on", self.store.uri, failed_before)
        try:
            self.recovery.run(self, 0)  # start the hosts, from the last complete checkpoint
        except BaseException:
            self.shutdown()
            raise

    @property
    def done(self) -> bool:
        """Every round has run, or a callback stopped the seed."""
        return self.stopped or self.round >= self.cfg.rounds

    def run_round(self) -> RoundEvent:
        """Run the next round (a lost host is recovered from inside it); its event, after
        the callbacks' on_round_end."""
        if self.closed:
            raise RuntimeError("federation: closed")
        if self.done:
            raise RuntimeError(f"federation: seed {self.seed} is done after round {self.round}")
        event = self.recovery.run(self, self.round + 1)
        stops = [callback.on_round_end(event) for callback in self.callbacks]
        self.stopped = any(stop is True for stop in stops)
        return event

    def state(self, participant: int | str) -> dict:
        """What a participant (a client's index, or a name like "server") keeps between
        rounds: `{"model": its state_dict, or None, "extras": its extras}` (CPU tensors),
        fetched from its host."""
        name = client_name(participant) if isinstance(participant, int) else participant
        answer = self.recovery.run(self, self.round, lambda: participant_state(self.executor, name))
        self._loop.record_lost(self.round, answer.lost)
        if answer.value is None:
            raise KeyError(f"{name}: not a participant of this federation's hosts")
        return answer.value

    def close(self, finish: bool = True) -> bool:
        """Stop the hosts. A seed that is `done` is finished first (with `finish`): its last
        checkpoint, hosts.parquet, DONE. Returns whether it was finished now."""
        if self.closed:
            return False
        finished = False  # the seed finished cleanly: its actors may serve the next one
        try:
            if finish and self.done and self.executor is not None:
                if latest_checkpoint(self.seed_dir) != self.round:  # a callback stopped it
                    self.recovery.run(self, self.round, lambda: self._checkpoint(self.round))
                memory = self.recovery.run(
                    self, self.round, lambda: host_memory_rows(self.executor, self.seed, self.round)
                )
                self._loop.record_lost(self.round, memory.lost)
                self.recorder.add_rows("hosts", memory.value)
                self.recorder.flush()
                publish(self.run_dir, self.store)
                self.seed_dir.child("DONE").write_text("done\n")
                finished = True
            else:
                self.recorder.flush()
        finally:
            self.shutdown(keep=finished)
            self.closed = True
        return finished

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc) -> None:
        self.close(finish=exc[0] is None)

    # -- what `Recovery` drives (loop/recovery.py `Hosts`)
    def start_from(self, start: int) -> None:
        """Start the hosts from the checkpoint of round `start` (0: the seed's start), laid
        out from the seed's plan (made here once, unless given)."""
        manifest = read_manifest(checkpoint_dir(self.seed_dir, start)) if start else {}
        check_bound(self.cfg, manifest, f"checkpoints/seed{self.seed}/round{start:05d}")
        self.recorder.truncate_after(self.seed, start)
        self.round = start
        began = time.perf_counter()
        self.executor = executor = self.make_executor()
        lost = list(manifest.get("lost", []))  # the federation as that checkpoint holds it
        if self.plan is None:  # once per seed: a recovery lays the same plan out again
            self.plan = plan_seed(self.cfg, self.seed, executor)
        specs = lay_out(self.plan, executor, self.seed_dir, start, lost)
        planned = time.perf_counter()
        executor.lost = set(lost)
        hosts = executor.start(specs) or {}
        check_shared(self.seed_dir.child(".probe"), executor)
        row = startup_row(self.seed, start, began, planned, hosts, self.make_executor)
        self.recorder.add_rows("startup", [row])
        self._wall, self._cumulative = resumed_totals(self.recorder.rounds(), self.seed, start)
        self._loop = RoundLoop(
            self.cfg, self.plan.algorithm, self.recorder, executor, self.plan.federation, self.seed
        )

    def advance(self) -> RoundEvent:
        """Run round `self.round + 1`, record it, checkpoint when due (and after the last
        round, so a longer run goes on from where this one ended)."""
        round_index = self.round + 1
        began = time.perf_counter()
        row, clients = self._loop.run(round_index, self._cumulative)
        self._cumulative = {column: row[column] for column in CUMULATIVE}
        # Seconds inside the federation's rounds: a checkpoint counts towards the next round,
        # time spent outside run_round (callbacks, a notebook's pauses) towards none.
        row["wall_time"] = self._wall + time.perf_counter() - began
        self.recorder.add_round(row)
        if round_index % self.cfg.checkpoint_every == 0 or round_index == self.cfg.rounds:
            self._checkpoint(round_index)
        self._wall += time.perf_counter() - began
        self.round = round_index
        return RoundEvent(self.seed, round_index, self.cfg.rounds, row, clients)

    def shutdown(self, keep: bool = False) -> None:
        """Stop the hosts; `keep` (a seed that finished cleanly, or a rollback about to
        replay) lets a reuse session keep the actors that still answer for the next
        federation (runtime/actors/pool.py); a federation that ended on an error keeps none."""
        if self.executor is not None:
            executor, self.executor = self.executor, None
            executor.shutdown(keep=keep)

    # -- the seed's files
    def _checkpoint(self, round_index: int) -> None:
        """Hosts save their own states (each reports its files' sha256); then metrics; then
        the manifest COMPLETE: the federation it holds (without the clients the run went on
        without), every file's checksum, and the settings it was written with."""
        directory = checkpoint_dir(self.seed_dir, round_index)
        saved = self.executor.save(directory.uri)
        self._loop.record_lost(round_index, saved.lost)
        files = verify_checkpoint(directory, self.executor.members)
        reported = {}  # file -> sha256 as its host wrote it: only the others are read back
        if isinstance(saved.value, dict):
            for host_checksums in saved.value.values():
                reported.update(host_checksums or {})
        checksums = checkpoint_checksums(directory, files, reported)
        self.recorder.flush()
        publish(self.run_dir, self.store)
        write_manifest(
            directory, round_index, self.executor.lost, checksums, bound_config(self.cfg)
        )
        directory.child("DAMAGED").delete()  # this round, written again after a fall-back

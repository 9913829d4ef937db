"""The live federation of one seed: its hosts started, driven round by round.

    with Federation(cfg) as fed:          # hosts started (Ray too, for runtime.executor: ray)
        while fed.round < cfg.rounds:
            event = fed.run_round()       # phases, evaluation when due, rows, checkpoint
            print(event.row["mean_accuracy"])
        weights = fed.state(3)["model"]   # client 3's kept tensors, fetched from its host

The CLI, `raymtl.run` and the Driver (every seed of a run) are built on this object. It
starts from the seed's last complete checkpoint when there is one, checkpoints every
checkpoint_every rounds, and recovers from lost hosts: the whole federation is rolled back
to its last complete checkpoint and the lost rounds are replayed (at most
runtime.max_restarts times a seed), so the results equal the fault-free run's. Every fault
is a row of faults.parquet. A lost node is waited for until Ray declares it dead (at most
runtime.placement_timeout_s), and client actors that no longer fit the nodes left are laid
out anew (more clients an actor: the same results). A damaged checkpoint is skipped for the
one before it. A run that cannot go on raises `RunStopped` (exit 3 on the command line).

runtime.inject_faults kills hosts' actors on purpose at the start of the rounds it names
(`_inject`): the recovery is a real fault's, and each (round, host) is killed once, never
again on the replay of its round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from raymtl.algorithms.base import client_name
from raymtl.algorithms.registry import build_algorithm
from raymtl.config import ConfigError, ExperimentConfig
from raymtl.errors import StepFailed
from raymtl.metrics import Recorder
from raymtl.runtime.executors.executor import Executor, HostsLost
from raymtl.runtime.executors.launch import ExecutorMaker, executor_factory
from raymtl.runtime.executors.planning import build_setup, start_checked_run
from raymtl.runtime.faults import RunStopped, fault_rows, injection_schedule, replan_row
from raymtl.runtime.loop.accounting import CUMULATIVE, resumed_totals
from raymtl.runtime.loop.events import RoundEvent
from raymtl.runtime.loop.round_loop import RoundLoop
from raymtl.runtime.storage.checkpoints import (
    DamagedCheckpoint,
    check_shared,
    checkpoint_checksums,
    checkpoint_dir,
    damaged_cause,
    latest_checkpoint,
    mark_damaged,
    read_manifest,
    verify_checkpoint,
    write_manifest,
)
from raymtl.runtime.storage.location import Location, publish
from raymtl.runtime.storage.run_dirs import (
    bound_config,
    check_bound,
    clear_failed,
    finish_run,
    mark_failed,
    reopen_run,
)
from raymtl.runtime.warm import preload

log = logging.getLogger(__name__)


class Federation:
    """One seed's federation: `run_round()`, `state(client)`, `close()` (or a `with` block).

    `cfg`: the validated experiment (`raymtl.Federation`, raymtl/api/federation.py, also
    takes a mapping or a file, with overrides). `run_dir`: the run directory (a path or a
    URI) it records into; by default a new one under output.dir, as `raymtl run` makes it;
    a run directory with a config.yaml already is resumed (its config may only change as
    --resume allows). Callbacks' `on_round_end` run after every round; one returning True
    stops the seed there (`done`). A federation of its own also calls `on_run_start`, and
    `on_run_end` once its seed is done. The
    keyword-only arguments are the Driver's: the run's store, recorder and executors,
    shared by its seeds.
    """

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
    ):
        self.cfg = cfg
        self.seed = cfg.seeds[0] if seed is None else int(seed)
        self.callbacks = tuple(callbacks)
        # A federation of its own (not one seed of a Driver's run) makes and ends its run.
        self._own_run = store is None
        if self._own_run:
            reopen = run_dir is not None and Location.of(run_dir).child("config.yaml").is_file()
            local, store = reopen_run(cfg, run_dir) if reopen else start_checked_run(cfg, run_dir)
            run_dir = local
        self.run_dir, self.store = Path(run_dir), store
        self.recorder = recorder or Recorder.load(self.run_dir)
        self.make_executor = ExecutorMaker.of(make_executor or executor_factory(cfg))
        # The driver only asks the algorithm for its phases; it never builds models.
        self.algorithm = build_algorithm(cfg.algorithm.name, cfg.algorithm.typed_params())
        self.seed_dir = store.child("checkpoints", f"seed{self.seed}")
        if self.seed_dir.child("DONE").is_file():
            raise ConfigError(
                f"seed: {self.seed} of {store.uri} has finished (checkpoints/seed{self.seed}/"
                "DONE); resume the run with more rounds to go on"
            )
        self.round = 0  # the last finished round
        self.stopped = False  # a callback stopped the seed
        self.recoveries = 0
        self._executor, self._closed = None, False
        self._current = 0  # the round in progress (faults name it)
        # runtime.inject_faults: round -> hosts to kill (drawn once the hosts are laid out),
        # and the (round, host) pairs killed already: a replayed round kills nobody again.
        self._injections: dict[int, list[str]] | None = None
        self._injected: set[tuple[int, str]] = set()
        failed_before = clear_failed(self.run_dir, store)  # it goes on: no longer failed
        if failed_before is not None:
            log.warning("%s failed before (%s); going on", store.uri, failed_before)
        if self._own_run:
            for callback in self.callbacks:
                callback.on_run_start(cfg, self.run_dir)
        try:
            self._until(0)  # start the hosts, from the last complete checkpoint
        except BaseException:
            self._shutdown()
            raise

    # -- the public face
    @property
    def done(self) -> bool:
        """Every round has run, or a callback stopped the seed."""
        return self.stopped or self.round >= self.cfg.rounds

    def run_round(self) -> RoundEvent:
        """Run the next round (a lost host is recovered from inside it); its event, after
        the callbacks' on_round_end."""
        if self._closed:
            raise RuntimeError("federation: closed")
        if self.done:
            raise RuntimeError(f"federation: seed {self.seed} is done after round {self.round}")
        event = self._until(self.round + 1)
        stops = [callback.on_round_end(event) for callback in self.callbacks]
        self.stopped = any(stop is True for stop in stops)
        return event

    def state(self, client: int | str) -> dict:
        """What a participant (a client's index, or a name like "server") keeps between
        rounds: `{"model": its state_dict, or None, "extras": its extras}` (CPU tensors),
        fetched from its host."""
        participant = client_name(client) if isinstance(client, int) else client
        answer = self._until(self.round, lambda: self._executor.state(participant))
        self._loop.record_lost(self.round, answer.lost)
        if answer.value is None:
            raise KeyError(f"{participant}: not a participant of this federation's hosts")
        return answer.value

    def close(self, finish: bool = True) -> None:
        """Stop the hosts. A seed that is `done` is finished first (hosts.parquet, DONE;
        with `finish`); a federation of its own then writes its run's summary."""
        if self._closed:
            return
        finished = False  # the seed finished cleanly: its actors may serve the next one
        try:
            if finish and self.done and self._executor is not None:
                if latest_checkpoint(self.seed_dir) != self.round:  # a callback stopped it
                    self._until(self.round, lambda: self._checkpoint(self.round))
                self._until(self.round, self._record_host_memory)
                self.recorder.flush()
                publish(self.run_dir, self.store)
                self.seed_dir.child("DONE").write_text("done\n")
                finished = True
                if self._own_run:
                    finish_run(self.cfg, self.run_dir, self.store, self.callbacks)
            else:
                self.recorder.flush()
        finally:
            self._shutdown(keep=finished)
            self._closed = True

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc) -> None:
        self.close(finish=exc[0] is None)

    # -- hosts, rounds and recovery
    def _until(self, target: int, then=None):
        """Run rounds until round `target` has run (hosts started or restarted from the last
        complete checkpoint first, when none run), then `then()`. A lost host rolls back to
        that checkpoint and replays (HostsLost, runtime.max_restarts)."""
        while True:
            try:
                if self._executor is None:
                    self._open()
                    self._record_replan()
                event = None
                while self.round < target:
                    self._inject(self.round + 1)
                    event = self._advance()
                return then() if then is not None else event
            except HostsLost as fault:
                self._recover(fault)
            except StepFailed as error:  # the algorithm's code raised: no fault to recover
                raise self._failed(error) from error

    def _failed(self, error: StepFailed) -> StepFailed:
        """An algorithm's step raised: the run is marked failed (FAILED with the line, the
        step's traceback in run.log), so it never looks like an interrupted run; the error
        goes on naming where the traceback is (one line and exit 1 from the command)."""
        self.recorder.flush()
        log_file = mark_failed(self.run_dir, self.store, error.line, error.details)
        return StepFailed(f"{error.line}; the traceback is in {log_file}", error.details)

    def _open(self) -> None:
        """Start the hosts from the seed's last complete checkpoint (round 0: the start). A
        checkpoint found damaged (a host checks every file against the manifest) is marked
        DAMAGED and the one before it is started from: a damaged file is no lost host."""
        while True:
            start = latest_checkpoint(self.seed_dir)
            try:
                return self._start_from(start)
            except (ConfigError, DamagedCheckpoint) as error:
                damaged = damaged_cause(error)
                if damaged is None:
                    raise
                self._shutdown()
                self._fall_back(start, damaged)

    def _start_from(self, start: int) -> None:
        """Start the hosts from the checkpoint of round `start`."""
        manifest = read_manifest(checkpoint_dir(self.seed_dir, start)) if start else {}
        check_bound(self.cfg, manifest, f"checkpoints/seed{self.seed}/round{start:05d}")
        self.recorder.truncate_after(self.seed, start)
        self.round = self._current = start
        self._attempt = began = time.perf_counter()
        self._executor = executor = self.make_executor()
        lost = list(manifest.get("lost", []))  # the federation as that checkpoint holds it
        setup = build_setup(self.cfg, self.seed, executor, self.seed_dir, start, lost)
        planned = time.perf_counter()
        executor.lost = set(lost)
        hosts = executor.start(setup.specs) or {}
        check_shared(self.seed_dir.child(".probe"), executor)
        startup = {"round": start, "plan_s": planned - began, **hosts}
        # Ray started (or joined) for this run: charged to the first federation that starts
        ray_start = self.make_executor.take_ray_start_s()
        startup |= {
            "ray_s": ray_start,
            # Ray and warm actors of `raymtl up` joined (warm.py) rather than started
            "joined_up": self.make_executor.joined_up,
            "total_s": time.perf_counter() - began + ray_start,
            # from the command's start: its process's, or the `raymtl` that a preloaded
            # process forked this one for (preload.py)
            "process_s": preload.seconds_since_command_start(),
            "preloaded": preload.COMMAND_STARTED is not None,
        }
        self.recorder.add_rows("startup", [{"seed": self.seed, **startup}])
        self._wall, self._cumulative = resumed_totals(self.recorder.rounds(), self.seed, start)
        self._loop = RoundLoop(
            self.cfg, self.algorithm, self.recorder, executor, setup.federation, self.seed
        )

    def _fall_back(self, start: int, damaged: DamagedCheckpoint) -> None:
        """Mark checkpoint `start` damaged, so the next `_open` starts from the one before;
        with none before it, refuse in one line (starting over is the user's decision)."""
        earlier = latest_checkpoint(self.seed_dir, before=start)
        if not earlier:
            raise ConfigError(
                f"{damaged}; seed {self.seed} has no earlier complete checkpoint to fall back "
                f"to (move checkpoints/seed{self.seed} aside to run the seed from its start)"
            ) from None
        mark_damaged(checkpoint_dir(self.seed_dir, start), str(damaged))
        log.warning("seed %d: %s; falling back to round %d", self.seed, damaged, earlier)

    def _advance(self) -> RoundEvent:
        """Run round `self.round + 1`, record it, checkpoint when due (and after the last
        round, so a longer run goes on from where this one ended)."""
        round_index = self._current = self.round + 1
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

    def _checkpoint(self, round_index: int) -> None:
        """Hosts save their own states (each reports its files' sha256); then metrics; then
        the manifest COMPLETE: the federation it holds (without the clients the run went on
        without), every file's checksum, and the settings it was written with."""
        directory = checkpoint_dir(self.seed_dir, round_index)
        saved = self._executor.save(directory.uri)
        self._loop.record_lost(round_index, saved.lost)
        files = verify_checkpoint(directory, self._executor.members)
        reported = {}  # file -> sha256 as its host wrote it: only the others are read back
        if isinstance(saved.value, dict):
            for host_checksums in saved.value.values():
                reported.update(host_checksums or {})
        checksums = checkpoint_checksums(directory, files, reported)
        self.recorder.flush()
        publish(self.run_dir, self.store)
        write_manifest(
            directory, round_index, self._executor.lost, checksums, bound_config(self.cfg)
        )
        directory.child("DAMAGED").delete()  # this round, written again after a fall-back

    def _recover(self, fault: HostsLost) -> None:
        """Record a lost host and roll back: the next `_until` restarts from the last complete
        checkpoint, once Ray has declared the lost hosts' nodes dead (actors placed on a node
        Ray still counts as alive would be lost with it: two recoveries for one lost node).
        With no recovery left, stop the run in one line (RunStopped). The hosts that still
        answer keep their actors for the replay (a reuse session's pool, actor_pool.py): it
        starts new actors only for the lost hosts."""
        executor = self._executor
        start, self.recoveries = latest_checkpoint(self.seed_dir), self.recoveries + 1
        recover = self.recoveries <= self.cfg.runtime.max_restarts
        self._shutdown(keep=recover)
        seconds = time.perf_counter() - self._attempt
        injected = executor.injected
        rows = fault_rows(
            self.seed, self._current, fault, start, self.recoveries, recover, seconds, injected
        )
        self.recorder.add_rows("faults", rows)
        self.recorder.flush()
        if not recover:
            nodes = ", ".join(sorted(set(fault.nodes.values())))
            raise RunStopped(
                f"runtime.max_restarts: {self.cfg.runtime.max_restarts} recoveries used up; "
                f"seed {self.seed} round {self._current}: hosts lost during {fault.method}: "
                f"{', '.join(fault.hosts)} (node {nodes}; faults.parquet has every fault)"
            ) from None
        log.warning("seed %d round %d: %s; %s", self.seed, self._current, fault, rows[0]["action"])
        if executor is not None:
            executor.settle_nodes(fault.nodes.values(), self.cfg.runtime.placement_timeout_s)

    def _record_replan(self) -> None:
        """faults.parquet and the log, in one line: the client actors were laid out anew
        because a node was lost and they no longer fit the nodes left."""
        executor = self._executor
        if executor is None or not executor.replanned:
            return
        row = replan_row(
            self.seed,
            self.round + 1,
            executor.replanned,
            executor.replanned_nodes,
            self.recoveries,
        )
        self.recorder.add_rows("faults", [row])
        log.warning("seed %d from round %d: %s", self.seed, self.round + 1, executor.replanned)

    def _inject(self, round_index: int) -> None:
        """runtime.inject_faults: kill the hosts due at the start of round `round_index`
        (each once: not again when the round is replayed after the recovery)."""
        faults = self.cfg.runtime.inject_faults
        if not faults or self._executor is None:
            return
        if self._injections is None:  # drawn from the hosts as first laid out
            hosts = list(self._executor.hosts)
            self._injections = injection_schedule(faults, hosts, self.cfg.rounds)
            self._injected |= self._killed_before()
        for host in self._injections.get(round_index, []):
            if (round_index, host) in self._injected:
                continue
            self._injected.add((round_index, host))
            if host not in self._executor.hosts:  # gone for good, or laid out anew
                log.warning("seed %d round %d: no host %s to kill", self.seed, round_index, host)
                continue
            log.warning(
                "seed %d round %d: killing host %s (runtime.inject_faults)",
                self.seed,
                round_index,
                host,
            )
            self._executor.kill_host(host)

    def _killed_before(self) -> set[tuple[int, str]]:
        """(round, host) of the faults injected into this seed before it was resumed."""
        faults = self.recorder.arrow_table("faults").to_pylist()
        return {
            (row["round"], row["host"])
            for row in faults
            if row.get("injected") and row.get("seed") == self.seed
        }

    def _record_host_memory(self) -> None:
        """hosts.parquet: each host's peak resident memory over the seed (bytes), and where
        it ran: its node, the CPUs and GPUs its actor asked for, the device its clients
        trained on (inline: the driver's process, no actor)."""
        answer = self._executor.peak_memory()
        self._loop.record_lost(self.round, answer.lost)
        placed = self._executor.layout()
        rows = []
        for host, peak in sorted(answer.value.items()):
            where = placed[host]
            row = {"seed": self.seed, "round": self.round, "host": host, "peak_rss": int(peak)}
            rows.append(row | where)
        self.recorder.add_rows("hosts", rows)

    def _shutdown(self, keep: bool = False) -> None:
        """Stop the hosts; `keep` (a seed that finished cleanly, or a rollback about to
        replay) lets a reuse session keep the actors that still answer for the next
        federation (actor_pool.py); a federation that ended on an error keeps none."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(keep=keep)

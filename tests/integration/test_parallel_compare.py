"""`raymtl compare --parallel`: every (experiment, seed) a Ray Tune trial in a placement
group of its own, with the sequential comparison's results and files; a failed trial
retried by Tune from its checkpoint, to the results of a run that never failed."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

import raymtl
from raymtl.api.callbacks import Callback
from raymtl.config import dump_config, parse_config
from tests.conftest import digits_experiment, learned

pytestmark = [pytest.mark.ray, pytest.mark.cluster]


class Rounds(Callback):
    """Records (experiment, seed, round) of every round it sees."""

    def __init__(self, seen: list):
        self.seen, self.name = seen, ""

    def on_run_start(self, config, run_dir) -> None:
        self.name = config.name

    def on_round_end(self, event) -> None:
        self.seen.append((self.name, event.seed, event.round))


@pytest.mark.slow
def test_parallel_compare_equals_the_sequential_one(ray_session, tmp_path):
    # The sequential reference in this process (the executors give identical results: a
    # shorter test); the trials on Ray actors, inside their placement groups: one client
    # actor of 1 CPU a trial, two trials at once on the session's 2 CPUs.
    raw = digits_experiment(tmp_path, seeds=[0, 1], **{"runtime.clients_per_actor": 6})
    arms = ["algorithm.name=fedavg,local"]
    sequential = raymtl.compare([raw], arms, out=tmp_path / "sequential")
    seen: list = []
    on_ray = ["runtime.executor=ray", *arms]
    parallel = raymtl.compare(
        [raw], on_ray, out=tmp_path / "parallel", parallel=2, callbacks=[Rounds(seen)]
    )

    pd.testing.assert_frame_equal(learned(parallel.table), learned(sequential.table))
    assert (
        parallel.table["total_bits_mean"].tolist() == sequential.table["total_bits_mean"].tolist()
    )
    files = {p.relative_to(sequential.out_dir) for p in sequential.out_dir.rglob("*")}
    assert {p.relative_to(parallel.out_dir) for p in parallel.out_dir.rglob("*")} == files
    for name in ("test-fedavg", "test-local"):
        ours, theirs = parallel.out_dir / name, sequential.out_dir / name
        ran_on = (ours / "config.yaml").read_text().replace("executor: ray", "executor: inline")
        assert ran_on == (theirs / "config.yaml").read_text()
        for table in ("rounds", "clients", "messages"):
            pd.testing.assert_frame_equal(
                learned(pq.read_table(ours / f"{table}.parquet").to_pandas()),
                learned(pq.read_table(theirs / f"{table}.parquet").to_pandas()),
            )
    # Every round of every trial reached the callbacks on this process.
    assert sorted(seen) == [
        (name, seed, r) for name in ("test-fedavg", "test-local") for seed in (0, 1) for r in (1, 2)
    ]


def test_a_retried_trial_goes_on_from_its_checkpoint(ray_session, tmp_path):
    """What Tune's retry of a failed trial meets: its staging run, one round in."""
    from raymtl.runtime.executors.launch import executor_factory
    from raymtl.runtime.loop.driver import Driver
    from raymtl.runtime.trials.runs import STAGING, run_seed_trials

    cfg = parse_config(digits_experiment(tmp_path, rounds=3, name="retry"))
    reference = raymtl.run(cfg, run_dir=tmp_path / "reference")
    stage = tmp_path / "cmp" / STAGING / "retry-seed0"
    stage.mkdir(parents=True)
    (stage / "config.yaml").write_text(dump_config(cfg))
    Driver(cfg, stage, executor_factory(cfg)).run_seed(0, stop_after=1)  # as a crash would

    seen: list = []
    run_dirs = run_seed_trials([cfg], tmp_path / "cmp", parallel=1, callbacks=[Rounds(seen)])
    # Rounds 2 and 3 ran in the trial; round 1 came from the checkpoint.
    assert seen == [("retry", 0, 2), ("retry", 0, 3)]
    rounds = pq.read_table(run_dirs["retry"] / "rounds.parquet").to_pandas()
    assert rounds["round"].tolist() == [1, 2, 3]
    pd.testing.assert_frame_equal(learned(rounds), learned(reference.rounds))
    assert (run_dirs["retry"] / "checkpoints" / "seed0" / "DONE").is_file()
    assert not (tmp_path / "cmp" / STAGING).exists()


class KillClientsOnce(Callback):
    """Kills the trial's client actor once, when round `after` of seed 0 is reported: with
    runtime.max_restarts 0 the seed stops (RunStopped), and the trial fails."""

    def __init__(self, after: int, killed: list):
        self.after, self.killed = after, killed

    def on_round_end(self, event) -> None:
        import ray

        if self.killed or event.round != self.after:
            return
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        (victim,) = [n for n in names if n.startswith("raymtl-") and n.endswith("-clients-0")]
        ray.kill(ray.get_actor(victim), no_restart=True)
        self.killed.append(victim)


@pytest.mark.slow
def test_tune_retries_a_failed_trial_from_its_checkpoint(ray_session, tmp_path):
    """Tune's FailureConfig: the trial whose actor died goes on from round 1's checkpoint
    in a new attempt, to the results of a run that never failed."""
    from raymtl.runtime.trials.runs import run_seed_trials

    raw = digits_experiment(
        tmp_path,
        rounds=3,
        name="retried",
        **{"runtime.executor": "ray", "runtime.clients_per_actor": 6},
    )
    cfg = parse_config(raw)
    reference = raymtl.run(
        parse_config({**raw, "runtime": {"executor": "inline"}}), run_dir=tmp_path / "reference"
    )
    seen, killed = [], []
    run_dirs = run_seed_trials(
        [cfg], tmp_path / "cmp", parallel=1, callbacks=[Rounds(seen), KillClientsOnce(1, killed)]
    )
    assert len(killed) == 1
    # Tune holds a trial at each report until its callbacks ran: the kill lands before
    # round 2, which fails; the retry runs rounds 2 and 3 from round 1's checkpoint.
    assert seen == [("retried", 0, 1), ("retried", 0, 2), ("retried", 0, 3)]
    faults = pq.read_table(run_dirs["retried"] / "faults.parquet").to_pandas()
    assert faults["round"].tolist() == [2] and "stopped" in faults["action"].iloc[0]
    rounds = pq.read_table(run_dirs["retried"] / "rounds.parquet").to_pandas()
    assert rounds["round"].tolist() == [1, 2, 3]
    pd.testing.assert_frame_equal(learned(rounds), learned(reference.rounds))

"""Actors reused across the seeds and experiments of a comparison (runtime.reuse_actors):
the results equal separate runs' (fresh actors for every federation), the seeds after the
first start on the actors of the one before, and nothing is left running afterwards. A
federation that did not finish cleanly never hands its actors on."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

import raymtl
from raymtl.config import parse_config
from raymtl.runtime.actors.pool import POOL, reusing_actors
from raymtl.runtime.loop.experiment import run_experiment
from tests.conftest import digits_experiment, learned

pytestmark = pytest.mark.ray


def raymtl_actors(ray) -> list[str]:
    """The names of raymtl's actors alive now."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [name for name in names if name.startswith("raymtl-")]


@pytest.mark.slow
@pytest.mark.cluster
def test_reused_actors_give_the_results_of_fresh_ones(fresh_actors, tmp_path):
    # FedAvg (server + clients) and SFMTL-Graph (graph service + server + clients): two
    # layouts, two seeds each, one after another on the session's 2 CPUs.
    raw = digits_experiment(
        tmp_path, seeds=[0, 1], **{"runtime.executor": "ray", "runtime.clients_per_actor": 3}
    )
    arms = ["algorithm.name=fedavg,sfmtl_graph"]
    before = POOL.reused
    reused = raymtl.compare([raw], arms, out=tmp_path / "reused")
    assert POOL.reused > before and not POOL.idle  # reused, and none left idle
    assert not raymtl_actors(fresh_actors)  # the session's end killed them
    fresh = raymtl.compare([raw], [*arms, "runtime.reuse_actors=false"], out=tmp_path / "fresh")

    pd.testing.assert_frame_equal(learned(reused.table), learned(fresh.table))
    for name in ("test-fedavg", "test-sfmtl_graph"):
        for table in ("clients", "rounds", "messages"):
            ours = pq.read_table(reused.out_dir / name / f"{table}.parquet").to_pandas()
            theirs = pq.read_table(fresh.out_dir / name / f"{table}.parquet").to_pandas()
            pd.testing.assert_frame_equal(learned(ours), learned(theirs))

    # Every seed and experiment after the first ran its clients on the first's actors; the
    # separate runs started new ones every time.
    def client_actors(out) -> set[str]:
        hosts = pd.concat(
            pq.read_table(out / name / "hosts.parquet").to_pandas()
            for name in ("test-fedavg", "test-sfmtl_graph")
        )
        return set(hosts[hosts["host"].str.startswith("clients")]["actor"])

    assert len(client_actors(reused.out_dir)) == 2  # 6 clients, 3 an actor
    assert len(client_actors(fresh.out_dir)) == 8  # 2 actors x 2 seeds x 2 experiments
    startup = pq.read_table(reused.out_dir / "test-fedavg" / "startup.parquet").to_pandas()
    fresh_startup = pq.read_table(fresh.out_dir / "test-fedavg" / "startup.parquet").to_pandas()
    # The second seed's hosts did not start processes: a fraction of a fresh start.
    assert startup["hosts_up_s"].iloc[1] < fresh_startup["hosts_up_s"].iloc[1]


@pytest.mark.cluster
def test_a_federation_that_did_not_finish_keeps_nothing(fresh_actors, tmp_path):
    # stop_after: the first seed stops as a crash would (the seed stays open): its actors
    # are killed, not kept, even inside a reuse session.
    cfg = parse_config(digits_experiment(tmp_path, **{"runtime.executor": "ray"}))
    with reusing_actors():
        run_experiment(cfg, tmp_path / "crashed", stop_after=1)
        assert not POOL.idle
    assert not raymtl_actors(fresh_actors)


@pytest.mark.cluster
def test_a_run_starting_actors_of_its_own_first_kills_the_idle_ones(fresh_actors, tmp_path):
    # Two client actors of 1 CPU kept idle hold both of the session's CPUs: a run with
    # runtime.reuse_actors false inside the same reuse session (an arm of a comparison)
    # must not wait for them until runtime.placement_timeout_s.
    settings = {"runtime.executor": "ray", "runtime.clients_per_actor": 3}
    kept = parse_config(digits_experiment(tmp_path, **settings))
    own = {"runtime.reuse_actors": False, "runtime.placement_timeout_s": 20}
    own = parse_config(digits_experiment(tmp_path, **settings, **own))
    with reusing_actors():
        run_experiment(kept, tmp_path / "kept")
        assert sorted(idle.kind.role for idle in POOL.idle) == ["client", "client", "server"]
        run_dir = run_experiment(own, tmp_path / "own")
        assert not POOL.idle
    assert pq.read_table(run_dir / "rounds.parquet").num_rows == 2
    assert not raymtl_actors(fresh_actors)

"""The live federation (`raymtl.runtime.loop.federation.Federation`), driven round by round, and
the callbacks of a run: what a notebook or a tracker sees equals what the run records.
Inline executor, except the hosts' build errors, which are the Ray executor's business."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from raymtl.api.callbacks import Callback
from raymtl.api.federation import Federation
from raymtl.config import ConfigError
from raymtl.runtime import resume_experiment, run_experiment
from raymtl.runtime.loop.federation import Federation as LiveFederation
from tests.conftest import digits_experiment, write_experiment


def test_a_federation_runs_round_by_round_and_fetches_kept_state(make_config):
    cfg = make_config(**{"algorithm.name": "fedavg", "rounds": 3})
    with Federation(cfg) as fed:
        assert fed.round == 0 and (fed.run_dir / "config.yaml").is_file()
        events = []
        while fed.round < cfg.rounds:
            events.append(fed.run_round())
        server = fed.state("server")
        client = fed.state(2)
        with pytest.raises(KeyError, match="client/9"):
            fed.state(9)
        with pytest.raises(RuntimeError, match="done after round 3"):
            fed.run_round()
    assert [e.round for e in events] == [1, 2, 3] and fed.done
    # FedAvg's clients keep nothing between rounds; its server keeps the global model.
    assert client == {"model": None, "extras": {}}
    weights = server["model"]
    assert weights and all(isinstance(t, torch.Tensor) for t in weights.values())
    assert sum(t.numel() for t in weights.values()) == events[0].clients[0]["model_params"]
    rounds = pd.read_parquet(fed.run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == [1, 2, 3]
    assert rounds["mean_accuracy"].tolist() == [e.row["mean_accuracy"] for e in events]
    # Closed at its end: the seed is finished and its run has a summary.
    assert (fed.run_dir / "checkpoints" / "seed0" / "DONE").is_file()
    assert (fed.run_dir / "summary.json").is_file()


def test_the_servers_model_is_read_after_a_round_of_fedavg(make_config):
    """`fed.state("server")["model"]`: the global model as the round left it, the state
    the round's checkpoint saved, not the one the federation started from."""
    cfg = make_config(**{"algorithm.name": "fedavg", "rounds": 2, "checkpoint_every": 1})
    with Federation(cfg) as fed:
        start = fed.state("server")["model"]
        fed.run_round()
        after = fed.state("server")["model"]
    saved = torch.load(
        fed.run_dir / "checkpoints" / "seed0" / "round00001" / "server.pt", weights_only=True
    )["model"]
    assert after.keys() == start.keys() == saved.keys()
    assert all(torch.equal(after[name], saved[name]) for name in after)
    assert any(not torch.equal(after[name], start[name]) for name in after)
    assert all(t.device.type == "cpu" for t in after.values())


def test_a_federation_takes_a_file_with_overrides_as_raymtl_run_does(tmp_path):
    path = write_experiment(tmp_path, rounds=5)
    with Federation(path, overrides=["rounds=1", "algorithm.params.lr=0.05"]) as fed:
        assert fed.cfg.rounds == 1 and fed.cfg.algorithm.params["lr"] == 0.05
        assert fed.run_round().round == 1
    assert fed.done
    with pytest.raises(ConfigError, match=r"^rounds: Input should be greater than or equal to 1$"):
        Federation(path, overrides=["rounds=0"])
    cfg = fed.cfg  # an ExperimentConfig with overrides is validated again
    with Federation(cfg, overrides=["rounds=2"]) as longer:
        assert longer.cfg.rounds == 2 and cfg.rounds == 1


def test_a_federation_closed_early_stays_open_to_go_on_from(tmp_path):
    raw = digits_experiment(tmp_path, rounds=3)  # a mapping is an experiment too
    fed = Federation(raw)
    fed.run_round()
    fed.close()  # round 1 of 3: nothing finished
    assert not (fed.run_dir / "checkpoints" / "seed0" / "DONE").exists()
    assert pd.read_parquet(fed.run_dir / "rounds.parquet")["round"].tolist() == [1]
    with Federation(raw, run_dir=fed.run_dir) as again:
        assert again.round == 1  # from round 1's checkpoint
        assert again.run_round().round == 2
    with pytest.raises(ConfigError, match=r"^algorithm.params.lr: 0.1 in the run, 0.5 now"):
        changed = digits_experiment(tmp_path, rounds=3, **{"algorithm.params.lr": 0.5})
        Federation(changed, run_dir=fed.run_dir)


def final_clients(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    columns = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]
    return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)[columns]


def test_a_federation_resumes_its_seed_from_the_last_complete_checkpoint(make_config, tmp_path):
    cfg = make_config(**{"algorithm.name": "local", "rounds": 4, "checkpoint_every": 2})
    whole = run_experiment(cfg, tmp_path / "whole")
    broken = run_experiment(cfg, tmp_path / "broken", stop_after=3)
    with Federation(cfg, run_dir=broken) as fed:
        assert fed.round == 2  # round 3 was not checkpointed: it runs again
        kept = fed.state(0)["model"]  # Local's clients keep their own model
        while not fed.done:
            fed.run_round()
        later = fed.state(0)["model"]
    assert kept.keys() == later.keys()
    assert any(not torch.equal(kept[name], later[name]) for name in kept)  # it trained on
    pd.testing.assert_frame_equal(final_clients(whole), final_clients(broken))
    with pytest.raises(ConfigError, match=r"^seed: 0 of .* has finished"):
        Federation(cfg, run_dir=broken)
    with Federation(cfg, run_dir=broken, overrides=["rounds=5"]) as longer:  # as --resume
        assert (longer.round, longer.cfg.rounds) == (4, 5)
        assert longer.run_round().round == 5
    assert pd.read_parquet(broken / "rounds.parquet")["round"].max() == 5


class StopAt(Callback):
    """Stops every seed after round `at`; counts the run's start and end."""

    def __init__(self, at: int):
        self.at, self.calls = at, []

    def on_run_start(self, config, run_dir):
        self.calls.append(("start", config.rounds))

    def on_round_end(self, event):
        return event.round >= self.at

    def on_run_end(self, run_dir):
        self.calls.append(("end", (run_dir / "summary.json").is_file()))


class Collect(Callback):
    def __init__(self):
        self.rows, self.clients = [], []

    def on_round_end(self, event):
        self.rows.append(dict(event.row))
        self.clients += event.clients


def test_a_callback_stops_each_seed_early_and_the_seed_counts_as_finished(make_config, tmp_path):
    stop = StopAt(2)
    run_dir = run_experiment(
        make_config(rounds=5, seeds=[0, 1]), tmp_path / "run", callbacks=[stop]
    )
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds[["seed", "round"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2]]
    assert stop.calls == [("start", 5), ("end", True)]  # on_run_end after the summary
    for seed in (0, 1):
        assert (run_dir / "checkpoints" / f"seed{seed}" / "DONE").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["mean_accuracy"]["mean"] == pytest.approx(
        rounds[rounds["round"] == 2]["mean_accuracy"].mean()
    )


def test_the_rows_a_callback_sees_are_the_rows_recorded(make_config, tmp_path):
    collect = Collect()
    cfg = make_config(rounds=3, eval_every=2)
    run_dir = run_experiment(cfg, tmp_path / "run", callbacks=[collect])
    recorded = pd.read_parquet(run_dir / "rounds.parquet")
    seen = pd.DataFrame(collect.rows)[list(recorded.columns)]
    pd.testing.assert_frame_equal(seen, recorded, check_dtype=False)
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert sorted(clients["round"].unique()) == [2, 3]  # evaluated rounds only
    seen_clients = pd.DataFrame(collect.clients)  # the task's metrics (the table has every one)
    pd.testing.assert_frame_equal(
        seen_clients, clients[list(seen_clients.columns)], check_dtype=False
    )
    again = resume_experiment(run_dir, overrides=["rounds=4"], callbacks=[collect])
    # The last round is checkpointed: a longer run goes on from round 3.
    assert [row["round"] for row in collect.rows] == [1, 2, 3, 4] and again == run_dir
    recorded = pd.read_parquet(run_dir / "rounds.parquet")
    pd.testing.assert_frame_equal(
        pd.DataFrame(collect.rows[3:])[list(recorded.columns)],
        recorded[recorded["round"] > 3].reset_index(drop=True),
        check_dtype=False,
    )


def broken_hosts(runtime, change):
    """RayExecutors whose hosts get a config the driver never saw (it would have refused
    it): what a host raises while it is built."""
    from raymtl.runtime.executors.ray_executor import RayExecutor

    class Broken(RayExecutor):
        def start(self, specs):
            super().start({name: change(spec) for name, spec in specs.items()})

    return lambda: Broken(runtime)


def unknown_algorithm(spec):
    algorithm = spec.config.algorithm.model_copy(update={"name": "no_such_algorithm"})
    return dataclasses.replace(spec, config=spec.config.model_copy(update={"algorithm": algorithm}))


def missing_plugin(spec):
    config = spec.config.model_copy(update={"plugins": ["raymtl_no_such_plugin"]})
    return dataclasses.replace(spec, config=config)


@pytest.mark.ray
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (unknown_algorithm, r"algorithm.name: 'no_such_algorithm' is not one of"),
        (missing_plugin, r"plugins: 'raymtl_no_such_plugin'"),
    ],
)
def test_an_error_raised_while_an_actor_is_built_is_one_line_and_never_recovered(
    ray_session, make_config, tmp_path, change, message
):
    cfg = make_config(**{"runtime.executor": "ray", "runtime.max_restarts": 2})
    with pytest.raises(ConfigError, match=rf"^host clients-0: {message}") as raised:
        LiveFederation(cfg, make_executor=broken_hosts(cfg.runtime, change))
    assert len(str(raised.value).splitlines()) == 1
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("test-")]
    assert not (run_dir / "faults.parquet").exists()  # no host was lost, nothing replayed
    names = [a["name"] for a in ray_session.util.list_named_actors(all_namespaces=True)]
    assert not [name for name in names if name.startswith("raymtl-")]  # its actors are gone

"""A round costs its cohort, not the population: at N = 5,000 clients and a cohort of 10, a
round without evaluation sends messages to the cohort only, and the evaluation copies every
client is evaluated with are one payload, handed to the hosts only when evaluation is due."""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.algorithms.base import EVERY_CLIENT
from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.router import Router
from tests.conftest import digits_experiment

N, COHORT = 5000, 10


@pytest.mark.slow
def test_a_round_messages_its_cohort_and_one_evaluation_copy(tmp_path, monkeypatch):
    delivered: dict[int, list] = {}
    deliver = Router.deliver

    def counting(self, seed, round_index, envelopes, lost=frozenset()):
        delivered.setdefault(round_index, []).extend(envelopes)
        return deliver(self, seed, round_index, envelopes, lost)

    handed: list[list] = []
    hold = Executor.hold_for_evaluation

    def holding(self, envelopes):
        handed.append(list(envelopes))
        return hold(self, envelopes)

    monkeypatch.setattr(Router, "deliver", counting)
    monkeypatch.setattr(Executor, "hold_for_evaluation", holding)
    raw = digits_experiment(tmp_path, rounds=2, eval_every=2, checkpoint_every=2)
    raw["data"] = {  # made on the host, client by client: 5,000 clients cost their counts
        "name": "leaf_synthetic",
        "num_clients": N,
        "params": {"alpha": 0.5, "beta": 0.5, "max_samples": 12},
    }
    raw["model"] = {"name": "logreg"}
    raw["algorithm"]["params"]["sample_fraction"] = COHORT / N
    run_dir = run_experiment(parse_config(raw), tmp_path / "run")
    for round_index in (1, 2):
        envelopes = delivered[round_index]
        traffic = [e for e in envelopes if not e.evaluation_only]
        copies = [e for e in envelopes if e.evaluation_only]
        assert len(traffic) == 2 * COHORT  # the cohort's global model down, its models up
        assert [e.dst for e in copies] == [EVERY_CLIENT]  # one copy, whatever N
    (evaluation,) = handed  # round 2 only: round 1 was not evaluated
    assert [e.dst for e in evaluation] == [EVERY_CLIENT]

    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert clients["client"].nunique() == N  # every client evaluated with that one copy


def test_eval_fraction_evaluates_a_seeded_sample_and_every_client_at_the_end(tmp_path):
    raw = digits_experiment(tmp_path, rounds=3, eval_every=1, eval_fraction=0.5)
    run_dir = run_experiment(parse_config(raw), tmp_path / "run")
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["clients_evaluated"].tolist() == [3, 3, 6]  # ⌈0.5·6⌉, then all at the end
    clients = pd.read_parquet(run_dir / "clients.parquet")
    per_round = clients.groupby("round")["client"].apply(list)
    assert [len(per_round[r]) for r in (1, 2, 3)] == [3, 3, 6]
    assert per_round[1] != per_round[2]  # drawn per round
    again = run_experiment(parse_config(raw), tmp_path / "again")  # seeded
    pd.testing.assert_frame_equal(
        clients.drop(columns=["seconds"], errors="ignore")[["round", "client", "loss"]],
        pd.read_parquet(again / "clients.parquet")[["round", "client", "loss"]],
    )

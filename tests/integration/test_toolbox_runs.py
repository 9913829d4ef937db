"""The toolbox end to end (docs/ALGORITHMS.md §9): runs that combine an aggregation rule, a
server optimiser, compression, attackers and DP give the same numbers inline and on Ray, and
through a stop and a resume; the ledger counts the encoded bits; ε reaches the outputs."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from raymtl.runtime import resume_experiment, run_experiment
from raymtl.toolbox.accounting import central_epsilon
from raymtl.toolbox.compression import bits_of
from raymtl.toolbox.settings import UplinkCodec

pytestmark = pytest.mark.ray

# median, FedAdam, top-k with error feedback and 20 % sign-flip attackers
ROBUST = {
    "data.num_clients": 10,
    "aggregation": {"rule": "median"},
    "server_optimizer": {"name": "fedadam", "lr": 0.03},
    "compression": {"uplink": {"kind": "topk", "ratio": 0.1, "error_feedback": True}},
    "attack": {"fraction": 0.2, "kind": "sign_flip"},
}
# central DP with adaptive clipping, FedAdam and 8-bit QSGD
PRIVATE = {
    "data.num_clients": 10,
    "algorithm.params": {"epochs": 1, "lr": 0.1, "sample_fraction": 0.5},
    "privacy": {"clip": 0.5, "noise_multiplier": 0.2, "clipping": "adaptive", "delta": 1e-3},
    "server_optimizer": {"name": "fedadam", "lr": 0.03},
    "compression": {"uplink": {"kind": "qsgd", "levels": 127}},
}
# local DP, a trimmed mean, scaled sign with error feedback, 20 % label flippers, FedYogi
LOCAL = {
    "data.num_clients": 10,
    "privacy": {"clip": 0.5, "noise_multiplier": 0.3, "noise": "local", "delta": 1e-3},
    "aggregation": {"rule": "trimmed_mean", "beta": 0.2},
    "server_optimizer": {"name": "fedyogi", "lr": 0.03},
    "compression": {"uplink": {"kind": "sign", "error_feedback": True}},
    "attack": {"fraction": 0.2, "kind": "label_flip"},
}
COMBINATIONS = {"robust": ROBUST, "private": PRIVATE, "local": LOCAL}
COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def clients_of(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(COLUMNS[:3]).reset_index(drop=True)[COLUMNS]


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_inline_ray_and_resume_agree_exactly(ray_session, make_config, tmp_path, combination):
    settings = {"rounds": 4, "checkpoint_every": 2, **COMBINATIONS[combination]}
    inline = run_experiment(make_config(**settings), tmp_path / "inline")
    remote = run_experiment(
        make_config(**settings, **{"runtime.executor": "ray"}), tmp_path / "ray"
    )
    pd.testing.assert_frame_equal(clients_of(inline), clients_of(remote))
    # Stopped after round 3: the round-2 checkpoint holds the optimiser's moments, the
    # clients' residuals and the clip bound; the resume replays round 3 and goes on.
    broken = run_experiment(make_config(**settings), tmp_path / "broken", stop_after=3)
    resumed = resume_experiment(broken)
    pd.testing.assert_frame_equal(clients_of(inline), clients_of(resumed))
    rounds = [pd.read_parquet(d / "rounds.parquet") for d in (inline, remote, resumed)]
    for other in rounds[1:]:
        pd.testing.assert_series_equal(rounds[0]["epsilon"], other["epsilon"])


def test_the_ledger_counts_encoded_bits(ray_session, make_config, tmp_path):
    settings = {"rounds": 1, **ROBUST}
    run_dir = run_experiment(make_config(**settings), tmp_path / "run")
    messages = pd.read_parquet(run_dir / "messages.parquet")
    up = messages[messages["dst_role"] == "server"]
    from raymtl.models import build_model

    model = build_model("cnn_mnist", (1, 8, 8), 10)  # digits: 8x8
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items() if t.is_floating_point()}
    codec = UplinkCodec(kind="topk", ratio=0.1, error_feedback=True)
    assert set(up["bits"]) == {bits_of(codec, shapes)}
    down = messages[messages["dst_role"] == "client"]
    assert set(down["bits"]) == {32 * sum(t.numel() for t in model.state_dict().values())}
    attackers = pd.read_parquet(run_dir / "attackers.parquet")
    assert len(attackers) == 2 and set(attackers["kind"]) == {"sign_flip"}


def test_epsilon_in_rounds_summary_and_table(ray_session, make_config, tmp_path):
    from raymtl.metrics.report import results_table

    settings = {"rounds": 3, **PRIVATE, "privacy": {"clip": 0.5, "noise_multiplier": 1.0}}
    run_dir = run_experiment(make_config(**settings), tmp_path / "run")
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    delta = min(1e-5, 10**-1.1)
    expected = [central_epsilon(1.0, 5, 10, t, delta, "poisson") for t in (1, 2, 3)]
    assert list(rounds["epsilon"]) == pytest.approx(expected, rel=1e-12)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epsilon"] == pytest.approx(expected[-1])
    assert summary["privacy"]["accounting"].startswith("rdp/poisson")
    assert summary["privacy"]["note"] == "approximation for fixed-size cohorts"
    header = [column.header for column in results_table([summary], "t").columns]
    assert "ε" in header


def test_error_feedback_residuals_spill_and_come_back_exactly(make_config, tmp_path):
    """The residuals e_k are the clients' kept state: under a budget of 1 KB every client's
    is spilled to disk between its rounds, and the run's numbers do not change."""
    settings = {"rounds": 3, **ROBUST}
    resident = run_experiment(make_config(**settings), tmp_path / "resident")
    budget = {"runtime.memory_budget": "1KB"}
    spilled = run_experiment(make_config(**settings, **budget), tmp_path / "spilled")
    pd.testing.assert_frame_equal(clients_of(resident), clients_of(spilled))
    rounds = pd.read_parquet(spilled / "rounds.parquet")
    assert (rounds["state_spilled_bytes"] > 0).all() and (rounds["clients_spilled"] > 0).all()

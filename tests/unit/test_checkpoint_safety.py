"""Checkpoints hold tensors and plain data only: a planted pickle never runs on --resume,
and is refused in one line naming the host that read it."""

from __future__ import annotations

import pickle

import pytest
import torch

from raymtl.config import ConfigError, parse_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment


class Planted:
    """An object whose unpickling would create a file (stands for arbitrary code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# FedAvg's clients keep nothing (no file): its server's; pFedMe's clients keep θ̃.
@pytest.mark.parametrize(
    ("algorithm", "file"), [("fedavg", "server.pt"), ("pfedme", "client_0.pt")]
)
def test_a_planted_checkpoint_is_refused_not_run(tmp_path, algorithm, file):
    cfg = parse_config(digits_experiment(tmp_path, **{"algorithm.name": algorithm, "rounds": 3}))
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=2)
    (checkpoint,) = (run_dir / "checkpoints" / "seed0" / "round00002").glob(file)
    state = torch.load(checkpoint, weights_only=True)  # what raymtl writes loads safely
    assert set(state) == {"model", "extras"}
    marker = tmp_path / "code-ran"
    torch.save({"model": None, "extras": {"x": Planted(marker)}}, checkpoint)
    # Refused while its host is built: one line naming the host, the unpickling error behind.
    host = "server" if algorithm == "fedavg" else "clients-0"
    with pytest.raises(ConfigError, match=rf"^host {host}: Weights only load failed") as refused:
        resume_experiment(run_dir)
    assert isinstance(refused.value.__cause__, pickle.UnpicklingError)
    assert not marker.exists()

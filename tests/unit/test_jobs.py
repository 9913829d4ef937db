"""Every shipped experiment file is valid, and every arm of a comparison file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raymtl.api.experiments import experiment_configs
from raymtl.config import ConfigError, load_config

JOBS = sorted((Path(__file__).resolve().parents[2] / "jobs").glob("*.yaml"))
# LEAF's jobs name their clients, so they validate without LEAF's files; the twin's text is
# generated (results/scripts/shakespeare_twin.py) and counted when it loads.
LEAF_JOBS = sorted(
    path
    for path in (Path(__file__).resolve().parents[2] / "jobs" / "leaf").glob("*.yaml")
    if path.stem != "shakespeare_twin"
)


def is_comparison(path: Path) -> bool:
    return "arms" in yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", JOBS + LEAF_JOBS, ids=[p.stem for p in JOBS + LEAF_JOBS])
def test_job_file_validates(path):
    if is_comparison(path):
        arms = yaml.safe_load(path.read_text())["arms"]
        configs = experiment_configs([path])
        assert [cfg.name for cfg in configs] == list(arms)
        assert all(cfg.rounds >= 1 for cfg in configs)
        with pytest.raises(ConfigError, match="run it with raymtl compare"):
            load_config(path)
        return
    cfg = load_config(path)
    assert cfg.name and cfg.rounds >= 1


def test_an_arm_replaces_whole_sections_and_overrides_reach_every_arm(tmp_path: Path):
    path = tmp_path / "arms.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "base",
                "data": {"name": "digits", "num_clients": 8},
                "algorithm": {"name": "fedavg", "params": {"lr": 0.1}},
                "topology": {"kind": "erdos_renyi", "params": {"p": 0.5}},
                "rounds": 3,
                "arms": {
                    "peer": {"algorithm": {"name": "dpsgd"}},
                    "star": {"algorithm": {"name": "fedavg"}, "topology": {"kind": "star"}},
                },
            }
        )
    )
    peer, star = experiment_configs([path], ["rounds=2"])
    assert (peer.name, peer.algorithm.name, peer.topology.kind) == ("peer", "dpsgd", "erdos_renyi")
    assert (star.name, star.topology.kind, star.topology.params) == ("star", "star", {})
    assert star.algorithm.params == {}  # the base's lr went with the base's algorithm section
    assert peer.rounds == star.rounds == 2


def test_arms_that_are_not_a_mapping_are_one_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"data": {"name": "digits"}, "arms": ["fedavg", "local"]}))
    with pytest.raises(ConfigError, match="^arms: give a mapping"):
        experiment_configs([path])

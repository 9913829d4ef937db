"""Every shipped experiment file is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from raymtl.config import load_config

JOBS = sorted((Path(__file__).resolve().parents[2] / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("path", JOBS, ids=[p.stem for p in JOBS])
def test_job_file_validates(path):
    cfg = load_config(path)
    assert cfg.name and cfg.rounds >= 1

"""startup.parquet: where a seed's start-up went, one row per start (and per restart)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import raymtl

PARTS = ["plan_s", "hosts_up_s", "build_s", "ray_s"]


def test_every_seed_records_its_start_up(tmp_path: Path):
    results = raymtl.run(
        "jobs/fedavg_digits.yaml",
        overrides=[
            "rounds=1",
            "seeds=[0,1]",
            "runtime.executor=inline",
            f"output.dir={tmp_path}",
            "output.plots=false",
        ],
    )
    startup = pd.read_parquet(results.run_dir / "startup.parquet").sort_values("seed")
    assert startup["seed"].tolist() == [0, 1] and startup["round"].tolist() == [0, 0]
    assert (startup[PARTS + ["setup_s", "warm_up_s"]] >= 0).all(axis=None)
    assert (startup["ray_s"] == 0).all()  # in process: no Ray
    # The parts add up to the whole; the build's slowest host is inside the build.
    assert (startup[PARTS].sum(axis=1) <= startup["total_s"] + 1e-6).all()
    assert (startup["warm_up_s"] + startup["setup_s"] <= startup["build_s"] + 1e-6).all()
    # From the process's start: at least the seed's own start-up, and later for seed 1.
    assert (startup["process_s"] >= startup["total_s"]).all()
    assert startup["process_s"].iloc[1] > startup["process_s"].iloc[0]

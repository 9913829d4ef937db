"""A quiet terminal around real runs (issue 34; the CLI's own checks: tests/unit/test_cli_quiet.py).

- a first start of a local Ray of raymtl's own prints none of Ray's INFO or WARNING lines;
- a resume on Ray that meets a damaged checkpoint index falls back with one warning line, and
  Ray prints no "Unhandled error" traceback for the hosts' builds that failed on it;
- `repr(Results)` is one line, and `Results.config` is the `ExperimentConfig` that callbacks'
  `on_run_start` receive (load_results validates config.yaml as a resume does).
"""

from __future__ import annotations

import gc
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

import raymtl
from raymtl.config import ConfigError, ExperimentConfig, parse_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

ROOT = Path(__file__).resolve().parents[2]
# A line of Ray's log: "2026-11-27 13:48:17,429	WARNING authentication_token_setup.py:85 -- ..."
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING)\b")
START_A_LOCAL_RAY = """
import ray
from raymtl.config import parse_config
from raymtl.runtime.executors.launch import start_ray
cfg = parse_config({**RAW, "runtime": {"executor": "ray", "num_cpus": 1, "dashboard": False}})
start_ray(cfg)
print("started", ray.is_initialized())
ray.shutdown()
"""


@pytest.mark.ray
@pytest.mark.cluster
def test_a_first_local_ray_of_raymtl_prints_no_ray_log_line(tmp_path):
    """Ray started as `raymtl run` starts it, in a process of its own (the session's Ray is
    running in this one), on a home with no token yet (Ray makes one): its stderr holds no
    line of Ray's log."""
    raw = digits_experiment(tmp_path)
    home = Path(tempfile.mkdtemp(prefix="home-"))  # short: Ray's socket paths live under it
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "RAYMTL_HOME": str(home / "raymtl"),  # no `raymtl up` to join
        "RAY_TMPDIR": str(home / "ray"),
    }
    try:
        result = subprocess.run(
            [sys.executable, "-c", f"RAW = {raw!r}\n{START_A_LOCAL_RAY}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=180,
        )
        made_a_token = (home / ".ray" / "auth_token").is_file()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.returncode == 0 and "started True" in result.stdout, result.stderr
    assert made_a_token  # the first start: Ray's "Generated new authentication token" case
    assert [line for line in result.stderr.splitlines() if RAY_LOG_LINE.match(line)] == []


class Kept(logging.Handler):
    """Every record of a logger, whatever its `propagate` (Ray's loggers do not)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.ray
@pytest.mark.slow  # three sets of actors: the first pass, the refused start, the fall-back
@pytest.mark.cluster
def test_a_damaged_index_on_ray_falls_back_in_one_line(ray_session, tmp_path, caplog):
    """Every host reads client_0's index, so every build fails on it: the driver names the
    file once, and reads every failed build (none left for Ray to print as unhandled)."""
    settings = {"rounds": 3, "checkpoint_every": 1, "runtime.executor": "ray"}
    cfg = parse_config(digits_experiment(tmp_path, **settings))
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=2)  # checkpoints 1 and 2
    target = run_dir / "checkpoints" / "seed0" / "round00002" / "index-client_0.json"
    target.write_bytes(b'["client/0", "cl')
    unhandled = Kept()
    ray_worker_log = logging.getLogger("ray._private.worker")
    ray_worker_log.addHandler(unhandled)
    try:
        with caplog.at_level(logging.WARNING):
            resume_experiment(run_dir)
        gc.collect()  # Ray reports an error never read when its reference goes
        time.sleep(1.0)
    finally:
        ray_worker_log.removeHandler(unhandled)
    (line,) = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert line.startswith(f"seed 0: checkpoint file {target} is damaged (")
    assert line.endswith("; falling back to round 1") and "\n" not in line
    messages = [record.getMessage() for record in unhandled.records]
    assert not [m for m in messages if "Unhandled error" in m], messages[0][:300]


class KeepsConfig(raymtl.Callback):
    def on_run_start(self, config, run_dir):
        self.config = config


def test_results_config_is_what_callbacks_receive_and_repr_is_one_line(tmp_path):
    raw = digits_experiment(tmp_path, rounds=1, **{"data.num_clients": 4})
    callback = KeepsConfig()
    results = raymtl.run(raw, callbacks=[callback])
    assert isinstance(results.config, ExperimentConfig)
    assert type(callback.config) is type(results.config)
    assert callback.config.model_dump() == results.config.model_dump()
    loaded = raymtl.load_results(results.run_dir)
    assert loaded.config == results.config and loaded.config.algorithm.name == "fedavg"

    shown = repr(loaded)
    assert "\n" not in shown and len(shown) < 300, shown
    assert shown.startswith(f"Results({str(results.run_dir)!r}, algorithm='fedavg', seeds=[0]")
    assert "rounds=1" in shown and "'clients'" in shown and "partition" not in shown

    # A config.yaml this raymtl does not accept is one line naming the run and the setting.
    config_file = results.run_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump({**yaml.safe_load(config_file.read_text()), "rounds": 0}))
    with pytest.raises(ConfigError) as refused:
        raymtl.load_results(results.run_dir)
    message = str(refused.value)
    assert message.startswith(f"run_dir: '{results.run_dir}' config.yaml: rounds")
    assert "\n" not in message

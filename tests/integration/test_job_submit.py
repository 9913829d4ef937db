"""`ray job submit` as the README shows it, on a token-authenticated head started here with
`ray start` (its own processes, temp dir and ports; the session's shared Ray is untouched)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def token_head(tmp_path):
    """A head with RAY_AUTH_MODE=token: (environment with its token and address, dashboard)."""
    token = secrets.token_hex(16)
    # As after `source .venv/bin/activate`: the head's `python` has raymtl's dependencies.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PATH": path}
    env.pop("RAY_ADDRESS", None)
    gcs, dashboard = free_port(), free_port()
    temp = Path("/tmp") / f"rj{secrets.token_hex(3)}"  # Ray's socket paths must stay short
    start = [
        RAY,
        "start",
        "--head",
        f"--port={gcs}",
        "--num-cpus=2",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
        "--block",
        # a second Ray on this machine (the session's): its agents need ports of their own
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]
    # --block, in a process group of its own: stopping it stops this head only (`ray stop`
    # would stop every Ray on the machine, the test session's shared one included).
    head = subprocess.Popen(
        start, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        wait_for_head(env, address)
        yield env, address
    finally:
        stop_head(head)
        shutil.rmtree(temp, ignore_errors=True)


def stop_head(head: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop the head's process group: SIGTERM, then SIGKILL (`ray stop --force`'s signal)
    what is left after `grace_s`. A `ray start --block` given SIGTERM waits ~30 s for its
    processes to stop gracefully, which a head about to be deleted does not need."""
    os.killpg(head.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):  # still stopping: killed below
        head.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):  # every process already gone
        os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=60)


def wait_for_head(env, address: str, seconds: float = 120) -> None:
    """Until the head's job server answers (`ray job list`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [RAY, "job", "list", f"--address={address}"], env=env, capture_output=True, timeout=60
        )
        if probe.returncode == 0:
            return
        time.sleep(2)
    raise TimeoutError(f"no Ray head answered at {address}")


def submit(env, address, output_dir, *extra):
    entrypoint = [
        "python",
        "-m",
        "raymtl",
        "run",
        "jobs/fedavg_digits.yaml",
        "runtime.address=auto",
        "rounds=1",
        "seeds=[0]",
        "output.plots=false",
        f"output.dir={output_dir}",
        *extra,
    ]
    command = [RAY, "job", "submit", f"--address={address}", "--working-dir", str(ROOT), "--"]
    for _ in range(10):  # a fresh head's job agent takes a while to come up
        result = subprocess.run(
            [*command, *entrypoint],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        if "No available agent" not in result.stderr + result.stdout:
            return result
        time.sleep(3)
    return result


@pytest.mark.slow
def test_a_job_submitted_with_the_token_runs_and_one_without_is_refused(token_head, tmp_path):
    env, address = token_head
    refused = submit({**env, "RAY_AUTH_TOKEN": "not-the-token"}, address, tmp_path / "x")
    assert refused.returncode != 0
    result = submit(env, address, tmp_path / "runs")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # the absolute output.dir, not Ray's package dir
    assert str(run_dir) in result.stdout  # printed as an absolute path
    assert list(pd.read_parquet(run_dir / "rounds.parquet")["round"]) == [1]
    relative = submit(env, address, "runs")
    assert relative.returncode != 0 and "output.dir: 'runs' is relative inside a Ray job" in (
        relative.stdout + relative.stderr
    )

"""Commands forked from a preloaded process (raymtl/runtime/warm/preload.py), without Ray: a
preloaded process serving a small test command, and commands that forward to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raymtl.runtime.warm import preload
from tests.conftest import as_typed_at_a_terminal

# The command side, as raymtl/command.py runs it: forwarded, or says it was not.
COMMAND = (
    "import sys; from raymtl.runtime.warm.preload import forward; code = forward(sys.argv[1:]); "
    "print('ran here') if code is None else sys.exit(code)"
)
# The command the preloaded process runs in each child.
TARGET = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    def main():
        from raymtl.runtime.warm import preload
        what = sys.argv[1]
        if what == "wait":  # until interrupted, as a run stopped by Ctrl-C
            try:
                Path("started").write_text("")
                while True:
                    time.sleep(0.05)
            except KeyboardInterrupt:
                Path("interrupted").write_text(str(os.getpid()))
                print("interrupted", file=sys.stderr)
                sys.exit(130)
        seen = {
            "what": what,
            "cwd": os.getcwd(),
            "value": os.environ.get("RAYMTL_TEST_VALUE"),
            "pid": os.getpid(),
            "since_command_start": preload.seconds_since_command_start(),
            "forked": preload.COMMAND_STARTED is not None,
            "own_age": preload.seconds_since_process_start(),
        }
        print(json.dumps(seen))
        print("to stderr", file=sys.stderr)
        sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    """
)


@pytest.fixture
def preloaded(tmp_path):
    """A preloaded process serving TARGET (--bare: none of raymtl's heavy imports)."""
    (tmp_path / "target_command.py").write_text(TARGET)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, RAYMTL_HOME=str(home), RAYMTL_TEST_VALUE="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    sock = home / preload.SOCKET_FILE
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raymtl.runtime.warm.preload",
            sock,
            "target_command:main",
            "--bare",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert server.poll() is None and time.monotonic() < deadline, "preloaded process"
        time.sleep(0.05)
    yield env
    server.terminate()
    server.wait()


def command(env, *args, cwd, **options):
    return subprocess.Popen(
        [sys.executable, "-c", COMMAND, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_typed_at_a_terminal,
        **options,
    )


def test_a_command_runs_forked_in_its_directory_environment_and_streams(preloaded, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = dict(preloaded, RAYMTL_TEST_VALUE="from the command")
    process = command(env, "hello", "3", cwd=work)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 3  # the child's exit code is the command's
    seen = json.loads(out)
    assert (seen["what"], seen["cwd"], seen["value"]) == ("hello", str(work), "from the command")
    assert seen["forked"] and seen["pid"] != process.pid  # a forked child ran it
    # counted from the command's start, before the child's own
    assert seen["own_age"] < seen["since_command_start"] < 60
    assert "to stderr" in err


def test_import_time_variables_that_differ_run_the_command_here(preloaded, tmp_path):
    env = dict(preloaded, OMP_NUM_THREADS="3")  # torch would have read another value
    process = command(env, "hello", cwd=tmp_path)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == "ran here"


def test_ctrl_c_reaches_the_child_and_a_dead_command_interrupts_it(preloaded, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
    # Ctrl-C at the command: the child stops as after a KeyboardInterrupt, code 130
    process = command(preloaded, "wait", cwd=first)
    wait_for(first / "started")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in err
    # The command killed outright: its child is interrupted, not left running
    process = command(preloaded, "wait", cwd=second)
    wait_for(second / "started")
    process.kill()
    process.wait()
    wait_for(second / "interrupted")


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_no_socket_or_the_service_commands_are_not_forwarded(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    assert preload.forward(["run", "x.yaml"]) is None  # no preloaded process
    (tmp_path / preload.SOCKET_FILE).write_text("")  # stale: nothing listens
    assert preload.forward(["run", "x.yaml"]) is None
    for argv in (["up"], ["down"], []):
        assert preload.forward(argv) is None
    monkeypatch.setenv("RAYMTL_PRELOAD", "0")
    assert preload.forward(["run", "x.yaml"]) is None


def test_what_the_preloaded_process_refuses():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    code = preload.code_fingerprint()
    environment = {"OMP_NUM_THREADS": "2", "PYTHONPATH": "/x"}
    set_by_imports = {"RAY_CLIENT_MODE": "0"}
    hello = {
        "code": code,
        "python": preload.python_identity(),
        # RAY_CLIENT_MODE is Ray's own (set by its import): no difference
        "environ": {"OMP_NUM_THREADS": "2", "PYTHONPATH": "/x", "HOME": "/elsewhere"},
    }

    def refusal(**changes):
        return preload.refuse(ours, hello | changes, code, environment, set_by_imports, 3)

    assert refusal() == ""
    assert refusal(code="edited") == "other raymtl code"
    assert refusal(python=["/usr/bin/python3", "/usr", "3.11"]) == "another Python"
    changed = dict(hello["environ"], OMP_NUM_THREADS="4", CUDA_VISIBLE_DEVICES="0")
    assert refusal(environ=changed) == (
        "environment differs: CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS"
    )
    assert refusal(environ={"PYTHONPATH": "/x"}) == "environment differs: OMP_NUM_THREADS"
    assert preload.refuse(ours, hello, code, environment, set_by_imports, 1) == (
        "no terminal descriptors"
    )
    ours.close()
    theirs.close()


def test_the_command_entry_runs_the_cli_when_nothing_serves(tmp_path):
    env = dict(os.environ, RAYMTL_HOME=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "raymtl", "run", str(tmp_path / "missing.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr

"""Commands forked from a preloaded process while `raymtl up` runs.

A command's own imports (torch, Ray, pandas, raymtl: about 5 s on a 2-core machine,
benchmarks/RESULTS.md) come before anything it does, even when it joins the warm Ray and
actors of `raymtl up` (service.py). So the service also keeps a *preloaded process*
(`serve`): a Python that has imported what a command imports, started nothing (no Ray, no
thread, no torch op, so it is safe to fork) and waits on a Unix socket,
$RAYMTL_HOME/preload.sock. The `raymtl` command (`forward`, standard library only) sends it
its arguments, working directory, environment, sys.path and its terminal's file
descriptors; the preloaded process forks, and the child runs the command as the command
itself would have (`_run_child`): the same stdin, stdout and stderr, a session of its own,
the command's exit code sent back. The command forwards its signals to the child (Ctrl-C is
a KeyboardInterrupt there, as at home), and the child is interrupted when the command dies.

The preloaded process refuses (and the command runs as usual, in its own process) when it
was started from other raymtl code (an edited checkout), another Python, or an environment
that differs in a variable read at import (threads, devices, Ray's and torch's settings).
RAYMTL_PRELOAD=0 turns forwarding off.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from raymtl.paths import raymtl_home

SOCKET_FILE = "preload.sock"
# Read by Ray, torch and the native libraries when imported (or by the preloaded imports):
# a command whose values differ is not forked from a process that read others.
IMPORT_TIME_PREFIXES = ("RAY_", "TORCH", "PYTORCH", "OMP_", "MKL_", "CUDA_", "NVIDIA_", "KMP_")
IMPORT_TIME_NAMES = ("PYTHONPATH", "PYTHONHASHSEED", "LD_PRELOAD", "LD_LIBRARY_PATH", "TZ")
# What a command imports before its first round (the `raymtl` CLI and everything `run`,
# `compare` and `report` load); imported once by the preloaded process.
PRELOADED = (
    "raymtl.cli",
    "raymtl.api.running",
    "raymtl.api.comparison",
    "raymtl.runtime.loop.experiment",
    "raymtl.runtime.loop.federation",
    "raymtl.runtime.executors.ray_executor",
    "raymtl.runtime.warm.service",
    "raymtl.data",
    "raymtl.models",
    "pyarrow.parquet",
)
# Set by Ray's import: the service's environment holds it already, a command's does not.
SET_BY_IMPORTS = ("RAY_CLIENT_MODE",)
# The commands never forked: those that start or stop the service itself.
NOT_FORKED = ("up", "down")
# Set in a forked child: when the command (not the child) started, time.time() seconds.
COMMAND_STARTED: float | None = None


def code_fingerprint() -> str:
    """The raymtl code this process imports: every module's path, size and mtime, hashed.
    A service or preloaded process that imported other code serves no command."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def seconds_since_process_start() -> float:
    """Seconds since this process started (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: since boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return float("nan")


def seconds_since_command_start() -> float:
    """Seconds since the command started: its own process's age, or, in a child forked for
    a command, since the `raymtl` process that asked for it started."""
    if COMMAND_STARTED is not None:
        return time.time() - COMMAND_STARTED
    return seconds_since_process_start()


def import_time_environment(environ: dict) -> dict:
    """The variables of `environ` that imports read (IMPORT_TIME_PREFIXES/_NAMES)."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith(IMPORT_TIME_PREFIXES) or name in IMPORT_TIME_NAMES
    }


def python_identity() -> list[str]:
    """The interpreter and environment (a venv's python and python3 are the same one)."""
    return [os.path.realpath(sys.executable), sys.prefix, sys.version]


def socket_path() -> Path:
    return raymtl_home() / SOCKET_FILE


# -- the command's side (standard library only: it runs before any heavy import) --------


def forward(argv: list[str]) -> int | None:
    """Run the command `argv` in a child of the preloaded process; its exit code, or None
    when there is no preloaded process to use (the caller then runs the command itself)."""
    if os.environ.get("RAYMTL_PRELOAD", "1") == "0" or not argv or argv[0] in NOT_FORKED:
        return None
    path = socket_path()
    if not path.exists():
        return None
    started = time.time() - seconds_since_process_start()
    hello = {
        "argv": [sys.argv[0], *argv],
        # how the command was started (`python -m raymtl` or the script): its usage line
        "main_package": getattr(sys.modules["__main__"], "__package__", None),
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "path": sys.path,
        "python": python_identity(),
        "code": code_fingerprint(),
        "started": started if started == started else time.time(),  # NaN: not Linux
    }
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(str(path))
        socket.send_fds(connection, [json.dumps(hello).encode()], [0, 1, 2])
        reply = json.loads(connection.recv(4096) or b'{"refused": "closed"}')
    except (OSError, ValueError):  # stale socket, a service stopping: run here
        connection.close()
        return None
    if "pid" not in reply:
        connection.close()
        return None
    return wait_for_child(connection, reply["pid"])


def wait_for_child(connection: socket.socket, pid: int) -> int:
    """Forward this process's signals to the child `pid` until it reports its exit code."""

    def relay(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored here (`&`): there too
            signal.signal(signum, relay)
    while True:
        try:
            message = connection.recv(64)
        except InterruptedError:
            continue
        if not message:  # the child died without a word (killed)
            return 1
        return struct.unpack("!i", message[:4])[0]


# -- the preloaded process's side -------------------------------------------------------


def serve(path: Path, target: str = "raymtl.cli:main", preload: bool = True) -> None:
    """The preloaded process: import `target` (module:function, the command's main) and
    PRELOADED, then fork a child for every accepted command until SIGTERM."""
    import importlib

    before = dict(os.environ)
    module, _, function = target.partition(":")
    main = getattr(importlib.import_module(module), function)
    for name in PRELOADED if preload else ():
        importlib.import_module(name)
    # What the imports set (Ray: RAY_CLIENT_MODE, also in the service this one inherits
    # from) is set again in every child; the rest must match the command's.
    set_by_imports = {
        name: value
        for name, value in os.environ.items()
        if before.get(name) != value or name in SET_BY_IMPORTS
    }
    environment = {
        name: value
        for name, value in import_time_environment(before).items()
        if name not in set_by_imports
    }
    code = code_fingerprint()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    umask = os.umask(0o177)  # this user's commands only, from the moment it exists
    try:
        listener.bind(str(path))
    finally:
        os.umask(umask)
    listener.listen(16)
    print(f"preloaded process {os.getpid()}: serving {path}", flush=True)
    while True:
        connection, _ = listener.accept()
        fds = []
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            hello = json.loads(message)
            refusal = refuse(connection, hello, code, environment, set_by_imports, len(fds))
        except (OSError, ValueError, KeyError, TypeError) as error:
            refusal = f"unreadable request ({error!r})"
        try:
            if refusal:
                connection.send(json.dumps({"refused": refusal}).encode())
            elif os.fork() == 0:
                try:  # the child: it runs the command, and never serves
                    listener.close()
                    _run_child(connection, fds, hello, set_by_imports, main)
                finally:  # a child that failed before it ran the command: it runs itself
                    os._exit(1)
        except OSError:  # the command went away, or no process could be forked: it runs
            pass  # itself (it reads no pid)
        for fd in fds:
            os.close(fd)
        connection.close()


def refuse(
    connection, hello: dict, code: str, environment: dict, set_by_imports: dict, fd_count: int
) -> str:
    """Why this process cannot run the command of `hello` ('' when it can)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    if struct.unpack("3i", credentials)[1] != os.getuid():
        return "another user"
    if fd_count != 3:
        return "no terminal descriptors"
    if hello.get("code") != code:
        return "other raymtl code"
    if hello.get("python") != python_identity():
        return "another Python"
    commands = import_time_environment(hello.get("environ", {}))
    differing = environment.keys() ^ (commands.keys() - set_by_imports.keys())
    differing |= {
        name for name, value in environment.items() if hello["environ"].get(name, value) != value
    }
    return f"environment differs: {', '.join(sorted(differing))}" if differing else ""


def _run_child(
    connection: socket.socket, fds: list[int], hello: dict, set_by_imports: dict, main
) -> None:
    """The forked child: become the command (its descriptors, directory, environment,
    arguments), run `main`, report the exit code, exit as an interpreter does."""
    global COMMAND_STARTED
    os.setsid()  # the command's signals reach it through the command, not the service's
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target_fd, fd in enumerate(fds):
        os.dup2(fd, target_fd)
        os.close(fd)
    os.chdir(hello["cwd"])
    os.environ.clear()
    os.environ.update(hello["environ"])
    os.environ.update(set_by_imports)
    sys.path[:] = hello["path"]
    sys.argv = hello["argv"]
    sys.modules["__main__"].__package__ = hello.get("main_package")
    COMMAND_STARTED = hello["started"]
    reopen_standard_streams()
    connection.send(json.dumps({"pid": os.getpid()}).encode())
    threading.Thread(target=interrupt_when_gone, args=(connection,), daemon=True).start()
    code = 1
    try:
        main()
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:  # sys.exit("message"): printed, code 1, as the interpreter does
            print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # Ray's shutdown among them
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        # The command exits once told: the end of the connection interrupts no more
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            connection.send(struct.pack("!i", code))
        os._exit(code)


def reopen_standard_streams() -> None:
    """Standard streams on the command's descriptors, buffered as the interpreter would
    buffer them there (line-buffered on a terminal); rich's consoles made again."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        line_buffered = mode == "w" and (name == "stderr" or os.isatty(fd))
        errors = "backslashreplace" if name == "stderr" else None
        buffering = 1 if line_buffered else -1
        # kept open for the process's life, as the interpreter's own standard streams are
        stream = open(fd, mode, buffering=buffering, errors=errors, closefd=False)  # noqa: SIM115
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    cli = sys.modules.get("raymtl.cli")
    if cli is not None:
        cli.make_consoles()


def interrupt_when_gone(connection: socket.socket) -> None:
    """The command died (its terminal closed, killed): interrupt the run, which then
    stops as after Ctrl-C (its last complete checkpoint kept)."""
    try:
        while connection.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGINT)


def main() -> None:
    """`python -m raymtl.runtime.warm.preload SOCKET [module:function] [--bare]`."""
    path = Path(sys.argv[1])
    target = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else None
    serve(path, target or "raymtl.cli:main", preload="--bare" not in sys.argv)


if __name__ == "__main__":  # run as raymtl.runtime.warm.preload, whose globals a child sets
    from raymtl.runtime.warm.preload import main as serve_module

    serve_module()

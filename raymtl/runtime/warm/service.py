"""`raymtl up` / `raymtl down`: a local Ray, warm host actors and a preloaded process kept on
this machine between commands, so a command pays neither Ray's start nor its actors'.

    raymtl up                      # a Ray and warm actors, in a service process of their own
    raymtl run jobs/x.yaml         # joins them: no Ray start, no actor start
    raymtl down                    # stops the service, its Ray and its actors

`serve` is the service: a local Ray, a `WarmPool` actor owning warm host actors of the kinds
a run here asks for by default, and `up.json` under $RAYMTL_HOME (its pid, Ray's address, the
fingerprint of its code). A run with runtime.address null and runtime.join_up true `join`s
it when it serves the same code, and borrows actors through a `Lender`. docs/ARCHITECTURE.md
has the rules of loans, plugins, layouts the pool cannot serve and Tune trials.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from raymtl.paths import raymtl_home
from raymtl.runtime.actors.classes import GRAPH_KIND, start_actor
from raymtl.runtime.actors.pool import ActorKind
from raymtl.runtime.warm.preload import code_fingerprint, socket_path

log = logging.getLogger(__name__)

NAMESPACE = "raymtl-up"
POOL_NAME = "pool"
STATE_FILE = "up.json"


@dataclass(frozen=True)
class Service:
    """What up.json holds: the running service."""

    pid: int
    address: str  # Ray's GCS address, for ray.init(address=...)
    code: str  # code_fingerprint() of the service's actors
    num_cpus: int
    actors: dict  # role -> how many warm actors it keeps
    started: float  # time.time() when it was ready
    auth: str | None = None  # its RAY_AUTH_MODE ("token": a driver joins with ~/.ray's token)
    preloaded: int | None = None  # pid of its preloaded process (preload.py), if any


# Ray's notices, at its start, about the token it makes for a local Ray (it sets RAY_AUTH_MODE
# and keeps the token in ~/.ray): nothing the user of a Ray of raymtl's own can act on.
TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_NOTICES = (
    "Token authentication is enabled for this Ray cluster",
    "Generated new authentication token",
)


class DropTokenNotices(logging.Filter):
    """Drops Ray's TOKEN_NOTICES; its other records (a token missing, an error) pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TOKEN_NOTICES)


def quiet_local_ray(num_cpus: int | None, dashboard: bool) -> dict:
    """ray.init's settings for a Ray of this process's own ("local": never a `ray start`
    head running here); its workers use this interpreter, where raymtl is installed.

    Quiet: Ray's driver logs warnings and errors only (with the dashboard asked for, also
    the INFO line giving its address), and its TOKEN_NOTICES are dropped (installed here,
    once, on Ray's logger of them)."""
    token_logger = logging.getLogger(TOKEN_LOGGER)
    if not any(isinstance(f, DropTokenNotices) for f in token_logger.filters):
        token_logger.addFilter(DropTokenNotices())
    return {
        "address": "local",
        "num_cpus": num_cpus,
        "include_dashboard": dashboard,
        "dashboard_host": "127.0.0.1",
        "log_to_driver": False,
        "logging_level": logging.INFO if dashboard else logging.WARNING,
    }


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:  # Linux: the state after the command's closing parenthesis
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def running() -> Service | None:
    """The service described by up.json, if its process is alive (a stale file is removed)."""
    path = raymtl_home() / STATE_FILE
    try:
        service = Service(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not process_alive(service.pid):
        path.unlink(missing_ok=True)
        return None
    return service


def warm_kinds(
    num_cpus: int, client_actors: int | None, cpus_per_actor: float, gpus_per_actor: float
) -> dict[ActorKind, int]:
    """The actors a service keeps: client actors filling the CPUs (as clients_per_actor:
    auto lays a run out), one server and one graph service (they take no CPU)."""
    clients = client_actors or max(1, int(num_cpus // cpus_per_actor))
    return {
        ActorKind("client", cpus_per_actor, gpus_per_actor): clients,
        ActorKind("server", 0.0, 0.0): 1,
        GRAPH_KIND: 1,
    }


class WarmPool:
    """The service's actors: idle ones by kind, and loans (driver pid -> actors lent)."""

    def __init__(self, targets: list[tuple[ActorKind, int]]):
        self.targets = dict(targets)
        self.idle: dict[ActorKind, list] = {kind: [] for kind in self.targets}
        self.loans: dict[int, list[tuple[ActorKind, object]]] = {}
        self.started = 0  # actors started over the service's life (names, status)
        self.warming: list = []  # warm_start calls of actors not yet awaited

    def _start(self, kind: ActorKind) -> None:
        self.started += 1
        actor = start_actor(kind, f"{kind.role}-{self.started}", namespace=NAMESPACE)
        self.warming.append(actor.warm_start.remote())
        self.idle[kind].append(actor)

    def top_up(self, wait: bool = False) -> dict[str, int]:
        """Start the actors missing from each kind's target (none while a loan is out: they
        would take the room a run's own actors need); with `wait`, until all are warm."""
        if not self.loans:
            for kind, target in self.targets.items():
                for _ in range(target - len(self.idle[kind])):
                    self._start(kind)
        if wait:
            import ray

            ray.get(self.warming)
            self.warming = []
        return self.status()

    def lend(self, pid: int, needed: list[tuple[ActorKind, int]]) -> list[tuple[ActorKind, object]]:
        """Up to `needed` actors of each kind, to the driver `pid`. A kind this pool cannot
        serve in full makes room: idle actors holding CPUs or GPUs are killed (top_up
        starts them again once no loan is out)."""
        self.reclaim()
        lent = []
        short = False
        for kind, count in needed:
            available = self.idle.get(kind, [])
            while count > 0 and available:
                lent.append((kind, available.pop()))
                count -= 1
            # Only a short kind that takes CPUs or GPUs needs room (LPSs, leaders take none)
            short = short or (count > 0 and bool(kind.num_cpus or kind.num_gpus))
        if short:
            self._make_room()
        # A loan even when empty-handed: while it is out, top_up starts nothing that could
        # take the room this driver's own actors need.
        self.loans.setdefault(pid, []).extend(lent)
        return lent

    def make_room(self, pid: int) -> None:
        """For a driver that starts all its actors itself (no reuse session): kill the idle
        actors holding CPUs or GPUs; its (empty) loan keeps top_up from starting them again
        until the driver ends it or dies."""
        self.loans.setdefault(pid, [])
        self._make_room()

    def _make_room(self) -> None:
        import ray

        for kind, actors in self.idle.items():
            if kind.num_cpus or kind.num_gpus:
                for actor in actors:
                    ray.kill(actor)
                actors.clear()

    def take_back(self, pid: int, actors: list, close: bool) -> dict[str, int]:
        """Actors the driver `pid` hands back (released: fresh state). With `close` the loan
        ends: its actors not handed back were killed by the run, and are replaced."""
        import ray

        returned = {actor._actor_id for actor in actors}
        loan = self.loans.get(pid, [])
        kept = []
        for kind, actor in loan:
            if actor._actor_id in returned:
                self.idle[kind].append(actor)
            elif close:
                ray.kill(actor)  # killed by the run already, or stuck in a failed step
            else:
                kept.append((kind, actor))
        if close:
            self.loans.pop(pid, None)
        else:  # still open (if empty): the driver may be running actors of its own
            self.loans[pid] = kept
        return self.top_up()

    def reclaim(self) -> None:
        """End the loans of drivers that died (their actors may be mid-step: replaced)."""
        import ray

        for pid in [pid for pid in self.loans if not process_alive(pid)]:
            for _, actor in self.loans.pop(pid):
                ray.kill(actor)
        self.top_up()

    def status(self) -> dict[str, int]:
        counts = Counter()
        for kind, actors in self.idle.items():
            counts[f"idle {kind.role}"] += len(actors)
        counts["lent"] = sum(len(loan) for loan in self.loans.values())
        return dict(counts)


class Lender:
    """A driver's side of the pool: borrows actors for its reuse session, hands them back."""

    def __init__(self, pool):
        self.pool = pool
        self.pid = os.getpid()

    def borrow(self, needed: Counter) -> list[tuple[ActorKind, object]]:
        import ray

        wanted = [(kind, count) for kind, count in needed.items() if count > 0]
        return ray.get(self.pool.lend.remote(self.pid, wanted)) if wanted else []

    def make_room(self) -> None:
        import ray

        ray.get(self.pool.make_room.remote(self.pid))

    def give_back(self, actors: list, close: bool) -> None:
        import ray

        ray.get(self.pool.take_back.remote(self.pid, actors, close))


def join(ray, join_up: bool) -> Service | None:
    """Join the `raymtl up` service (its Ray; its actors through the reuse session) when one
    runs this code; None otherwise (then the caller starts a Ray of its own)."""
    if not join_up:
        return None
    service = running()
    if service is None:
        return None
    if service.code != code_fingerprint():
        log.warning(
            "raymtl up (pid %d) serves other raymtl code (edited since it started): not "
            "joined; `raymtl down && raymtl up` serves this one",
            service.pid,
        )
        return None
    if service.auth and "RAY_AUTH_MODE" not in os.environ:
        # Ray joins an explicit address without its token unless told (~/.ray holds it);
        # its config was read at import, so it is read again, as Ray does for a local Ray.
        os.environ["RAY_AUTH_MODE"] = service.auth
        from ray._raylet import Config

        Config.initialize("")
    try:
        # Ray's INFO lines of joining (its address, "Connected") are raymtl's business
        ray.init(address=service.address, log_to_driver=False, logging_level=logging.WARNING)
        pool = ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except Exception as error:  # stopping, or not ours to join: a Ray of the run's own
        log.warning("raymtl up (pid %d) not joined: %s", service.pid, str(error)[:200])
        if ray.is_initialized():
            ray.shutdown()
        return None
    from raymtl.runtime.actors.pool import POOL

    POOL.lender = Lender(pool)
    return service


def start_preloaded(logfile) -> subprocess.Popen:
    """The preloaded process (preload.py) that commands are forked from, in this process's
    environment as it was before Ray's start (what a command's own environment holds)."""
    return subprocess.Popen(
        [sys.executable, "-m", "raymtl.runtime.warm.preload", str(socket_path())],
        stdout=logfile,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def wait_until_serving(preloaded: subprocess.Popen, timeout: float = 300.0) -> None:
    """Until the preloaded process listens (its imports done), so the commands after
    `raymtl up` are forked; one that exited leaves commands to run as usual."""
    deadline = time.monotonic() + timeout
    while not socket_path().exists() and preloaded.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)


def serve(
    num_cpus: int,
    client_actors: int | None,
    cpus_per_actor: float,
    gpus_per_actor: float,
    preload: bool = True,
):
    """The service process: a local Ray, the pool, its warm actors, the preloaded process;
    up.json once they are warm; until SIGTERM (`raymtl down`) or SIGINT, when it stops them
    and Ray and removes up.json."""
    import ray

    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    # Imports in parallel with Ray's start and the actors' warm-up (a CPU each, at most).
    # A socket left by a service that was killed would read as serving: removed first.
    socket_path().unlink(missing_ok=True)
    preloaded = start_preloaded(sys.stdout) if preload else None
    context = ray.init(namespace=NAMESPACE, **quiet_local_ray(num_cpus, dashboard=False))
    state = raymtl_home() / STATE_FILE
    try:
        kinds = warm_kinds(num_cpus, client_actors, cpus_per_actor, gpus_per_actor)
        pool = (
            ray.remote(WarmPool)
            .options(name=POOL_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=1)
            .remote(list(kinds.items()))
        )
        ray.get(pool.top_up.remote(wait=True))
        if preloaded is not None:
            wait_until_serving(preloaded)
        service = Service(
            pid=os.getpid(),
            address=context.address_info["gcs_address"],
            code=code_fingerprint(),
            num_cpus=num_cpus,
            actors={kind.role: count for kind, count in kinds.items()},
            started=time.time(),
            auth=os.environ.get("RAY_AUTH_MODE"),  # set by ray.init for a local Ray
            preloaded=preloaded.pid if preloaded else None,
        )
        partial = state.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(service)))
        partial.replace(state)
        print(f"raymtl up: ready at {service.address}", flush=True)
        while not stopping:
            time.sleep(1.0)
            ray.get(pool.reclaim.remote())  # loans of drivers that died
    finally:
        state.unlink(missing_ok=True)
        if preloaded is not None:  # commands it forked run on: they are not its to stop
            preloaded.terminate()
            preloaded.wait()
            socket_path().unlink(missing_ok=True)
        ray.shutdown()


def up(
    num_cpus: int | None = None,
    client_actors: int | None = None,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    timeout: float = 300.0,
    preload: bool = True,
) -> tuple[Service, bool]:
    """Start the service (in a process of its own) unless one runs; (service, started).
    With `preload`, it keeps a preloaded process that `raymtl` commands fork from."""
    service = running()
    if service is not None:
        return service, False
    folder = raymtl_home()
    folder.mkdir(parents=True, exist_ok=True)
    logfile = folder / "up.log"
    settings = [
        num_cpus or os.cpu_count() or 1,
        client_actors,
        cpus_per_actor,
        gpus_per_actor,
        preload,
    ]
    with open(logfile, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "raymtl.runtime.warm.service", json.dumps(settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at this terminal does not stop it
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        service = running()
        if service is not None and service.pid == process.pid:
            return service, True
        if process.poll() is not None:
            tail = logfile.read_text().strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(f"raymtl up: the service exited ({tail[0]}); see {logfile}")
        time.sleep(0.2)
    process.terminate()
    raise RuntimeError(f"raymtl up: the service was not ready within {timeout:g} s")


def down(timeout: float = 60.0) -> Service | None:
    """Stop the service (its Ray and actors go with it); the service stopped, or None."""
    service = running()
    if service is None:
        return None
    os.kill(service.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(service.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if process_alive(service.pid):
        os.kill(service.pid, signal.SIGKILL)
    (raymtl_home() / STATE_FILE).unlink(missing_ok=True)
    return service


if __name__ == "__main__":  # the service process that `up` starts
    serve(*json.loads(sys.argv[1]))

"""Host actors kept alive between the federations of one driver process, and reused.

Starting a host actor costs a process, Ray's worker start-up, torch's imports and its one-time
warm-up: 5–7 s of CPU each on a 2-core machine, seconds of wall time per seed. Within a reuse
session (every seed of `raymtl run`, every experiment and seed of a sequential `raymtl
compare`), a federation that finishes cleanly hands its actors back here, and the next
federation whose layout asks for actors of the same kind (role, CPUs, GPUs) takes them instead
of starting new ones. A taken actor is re-attached to its new spec (`ObjectStoreHost.attach`):
every attribute of the old host is dropped first, so a federation starts from fresh state and
its results equal a separate run's (tests/integration/test_actor_reuse.py). The process-wide
leftovers are what a fresh process would also build the same way (imported modules, torch's
thread pools, FLOP measurements of a module shape).

A federation rolling back from a lost host (federation.py `_recover`) hands back the actors
that still answer `release` (alive, and done with any step: Ray runs an actor's calls one
after another), so its replay starts new actors only for the hosts it lost; the lost ones
are killed.

What is never reused: the actors of a federation that ended on an error (they may be
half-way through a step), actors inside a Ray Tune trial's placement group
(the trial's group ends with it), and anything once the session closes: the outermost
session kills every idle actor, so a notebook is not left holding the cluster's CPUs.
Idle actors of a kind the next federation does not need are killed before it places its own
(an idle actor holds its CPUs: it could keep a differently laid out federation from fitting);
a federation that starts every actor of its own (runtime.reuse_actors false, autoscaling) and
Ray Tune's trials kill every idle one first.

Joined to a `raymtl up` service (warm.py), the pool has a `lender`: actors the session
lacks are borrowed from the service's warm ones (`borrow`, `take`), and the session hands
what it borrowed back instead of killing it: idle ones it cannot use at once, the rest when
it ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorKind:
    """What makes two host actors interchangeable: the role (the actor class) and the
    resources Ray gave it."""

    role: str
    num_cpus: float
    num_gpus: float


@dataclass
class IdleActor:
    handle: object
    kind: ActorKind
    host: str  # the host name it served last: taken again by that host name first


class ActorPool:
    """The idle host actors of this process, by kind; `sessions` > 0 while reuse is on."""

    def __init__(self) -> None:
        self.idle: list[IdleActor] = []
        self.sessions = 0
        self.reused = 0  # actors handed out again, over the process's life (tests, logs)
        self.lender = None  # warm.Lender while joined to `raymtl up`
        self.borrowed: set = set()  # actor_key of each actor borrowed and not handed back
        self.lent_out = False  # a loan is open: the session's end closes it

    @property
    def active(self) -> bool:
        return self.sessions > 0

    def borrow(self, needed: Counter) -> None:
        """From the lender, the actors of each kind `needed` (kind -> count) beyond the idle
        ones: idle here after this, for `take`."""
        if self.lender is None or not self.active:
            return
        have = Counter(idle.kind for idle in self.idle)
        missing = Counter({kind: count - have[kind] for kind, count in needed.items()})
        missing = +missing  # only the kinds short of what is needed
        if not missing:
            return
        self.lent_out = True
        for kind, handle in self.lender.borrow(missing):
            self.borrowed.add(actor_key(handle))
            self.idle.append(IdleActor(handle, kind, host=""))

    def take(self, kind: ActorKind, host: str, layout: frozenset[str] = frozenset()):
        """An idle actor of `kind`, or None: the one that served `host` last, if idle; else
        one that served no other host of `layout` (the hosts started with `host`: each takes
        its own actor back, as after a rollback); else one borrowed from the lender."""

        def available() -> list[IdleActor]:
            return [
                idle
                for idle in self.idle
                if idle.kind == kind and (idle.host == host or idle.host not in layout)
            ]

        matching = available()
        if not matching:
            self.borrow(Counter({kind: 1}))  # from the lender, when joined to one
            matching = available()
        if not matching:
            return None
        chosen = next((idle for idle in matching if idle.host == host), matching[0])
        self.idle.remove(chosen)
        self.reused += 1
        return chosen.handle

    def give_back(self, handle, kind: ActorKind, host: str) -> None:
        self.idle.append(IdleActor(handle, kind, host))

    def keep_only(self, needed: Counter, kill, layout: frozenset[str] = frozenset()) -> None:
        """Kill the idle actors beyond what `needed` (kind -> count) can use; those that
        served a host of `layout` are kept first (`take` hands them back to it)."""
        wanted = Counter(needed)
        kept, returned = [], []
        for idle in sorted(self.idle, key=lambda idle: idle.host not in layout):
            if wanted[idle.kind] > 0:
                wanted[idle.kind] -= 1
                kept.append(idle)
            elif actor_key(idle.handle) in self.borrowed:
                returned.append(idle.handle)
            else:
                kill(idle.handle)
        self.idle = kept
        self._return(returned, close=False)

    def drain(self, kill) -> None:
        """Kill every idle actor (hand the borrowed ones back, and end the loan)."""
        idle, self.idle = self.idle, []
        returned = [a.handle for a in idle if actor_key(a.handle) in self.borrowed]
        for actor in idle:
            if actor_key(actor.handle) in self.borrowed:
                continue  # handed back below
            try:
                kill(actor.handle)
            except Exception as error:  # Ray already shut down: the actor is gone with it
                log.info("killing an idle actor: %s", error)
        if self.lent_out:
            self._return(returned, close=True)
            self.lent_out = False
        self.borrowed.clear()  # what was not handed back was killed: the lender replaces it

    def _return(self, handles: list, close: bool) -> None:
        if self.lender is None or not (handles or close):
            return
        for handle in handles:
            self.borrowed.discard(actor_key(handle))
        try:
            self.lender.give_back(handles, close)
        except Exception as error:  # the service stopped: its actors are gone with it
            log.info("handing actors back to raymtl up: %s", error)


def actor_key(handle):
    """What identifies an actor across its handles (a Ray handle's actor id)."""
    return getattr(handle, "_actor_id", handle)


POOL = ActorPool()


def ray_kill(handle) -> None:
    import ray

    if ray.is_initialized():
        ray.kill(handle)


@contextlib.contextmanager
def reusing_actors(enabled: bool = True) -> Iterator[ActorPool]:
    """A reuse session: federations started inside it hand their actors on to the next one.
    Sessions nest (a comparison's runs inside the comparison's session); the outermost one
    kills the idle actors when it ends. `enabled=False` opens no session."""
    if not enabled:
        yield POOL
        return
    POOL.sessions += 1
    try:
        yield POOL
    finally:
        POOL.sessions -= 1
        if POOL.sessions == 0:
            POOL.drain(ray_kill)

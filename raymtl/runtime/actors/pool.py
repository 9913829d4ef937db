"""Host actors kept alive between the federations of one driver process, and reused.

Within a reuse session (the seeds of `raymtl run`, the experiments and seeds of a sequential
`raymtl compare`) a federation that ends cleanly, or rolls back from a lost host, hands the
actors that still answer back here; the next federation takes idle ones of the kind it needs
(role, CPUs, GPUs) and `attach`es them to fresh specs, so its results equal a separate run's.
Idle actors a layout cannot use are killed before it places its own; the outermost session
kills every idle one. Joined to `raymtl up`, missing actors are borrowed from its pool
(`lender`) and handed back. docs/ARCHITECTURE.md says what is never reused, and why.
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

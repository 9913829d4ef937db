"""`raymtl up`'s pool (no Ray): what a driver's reuse session borrows and hands back, what
the service lends, replaces and kills to make room, and its state file."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from raymtl.runtime.actors.pool import ActorKind, ActorPool
from raymtl.runtime.warm import service as warm
from raymtl.runtime.warm.service import Service, WarmPool

CLIENT = ActorKind("client", 1.0, 0.0)
SERVER = ActorKind("server", 0.0, 0.0)
HALF = ActorKind("client", 0.5, 0.0)


class FakeLender:
    """The service as a driver sees it: hands out named actors, records what comes back."""

    def __init__(self, stock: dict[ActorKind, list[str]]):
        self.stock = {kind: list(names) for kind, names in stock.items()}
        self.returns: list[tuple[list, bool]] = []

    def borrow(self, needed: Counter):
        lent = []
        for kind, count in needed.items():
            for _ in range(min(count, len(self.stock.get(kind, [])))):
                lent.append((kind, self.stock[kind].pop(0)))
        return lent

    def give_back(self, actors, close):
        self.returns.append((list(actors), close))


def lending_pool(lender) -> ActorPool:
    pool = ActorPool()
    pool.lender, pool.sessions = lender, 1
    return pool


def test_a_session_borrows_what_it_lacks_and_hands_it_back_when_it_ends():
    lender = FakeLender({CLIENT: ["warm-a", "warm-b"], SERVER: ["warm-s"]})
    pool, killed = lending_pool(lender), []
    pool.give_back("own-a", CLIENT, "clients-0")  # an actor this driver started itself
    pool.borrow(Counter({CLIENT: 2, SERVER: 1}))  # one client short, and the server
    assert lender.stock == {CLIENT: ["warm-b"], SERVER: []}
    assert pool.take(CLIENT, "clients-0") == "own-a"
    assert pool.take(CLIENT, "clients-1") == "warm-a"
    assert pool.take(SERVER, "server") == "warm-s"
    assert pool.take(CLIENT, "clients-2") == "warm-b"  # none idle: borrowed on the spot
    for handle, host in [("own-a", "clients-0"), ("warm-a", "clients-1"), ("warm-s", "server")]:
        pool.give_back(handle, CLIENT if host != "server" else SERVER, host)
    # warm-b was killed by a federation that failed: it is simply not handed back
    pool.sessions = 0
    pool.drain(killed.append)
    assert killed == ["own-a"]  # only what this driver started is killed
    assert lender.returns == [(["warm-a", "warm-s"], True)]  # the loan ends
    assert not pool.borrowed and not pool.lent_out


def test_borrowed_actors_a_layout_cannot_use_go_back_at_once_not_killed():
    lender = FakeLender({CLIENT: ["warm-a", "warm-b"], SERVER: ["warm-s"]})
    pool, killed = lending_pool(lender), []
    pool.borrow(Counter({CLIENT: 2, SERVER: 1}))
    pool.keep_only(Counter({CLIENT: 1}), killed.append)  # the next layout: one client
    assert killed == []
    assert lender.returns == [(["warm-b", "warm-s"], False)]  # the loan stays open
    assert pool.borrowed == {"warm-a"}


def test_no_lender_or_no_session_borrows_nothing():
    pool = ActorPool()
    pool.borrow(Counter({CLIENT: 1}))
    assert pool.take(CLIENT, "clients-0") is None
    lender = FakeLender({CLIENT: ["warm-a"]})
    pool.lender = lender  # joined, but reuse is off (no session)
    assert pool.take(CLIENT, "clients-0") is None and lender.stock[CLIENT] == ["warm-a"]


class FakeHandle:
    def __init__(self, name):
        self.name = self._actor_id = name
        self.warm_start = self

    def remote(self):  # warm_start.remote(): a ref nobody waits for in these tests
        return f"warm {self.name}"

    def __repr__(self):
        return self.name


@pytest.fixture
def service_pool(monkeypatch):
    """A WarmPool whose actors are FakeHandles and whose kills are recorded."""
    import ray

    killed = []
    monkeypatch.setattr(warm, "start_actor", lambda kind, name, **options: FakeHandle(name))
    monkeypatch.setattr(ray, "kill", lambda handle: killed.append(handle.name))
    pool = WarmPool([(CLIENT, 2), (SERVER, 1)])
    pool.top_up()
    return pool, killed


def test_the_service_lends_replaces_lost_actors_only_when_no_loan_is_out(service_pool):
    pool, killed = service_pool
    me, other = os.getpid(), os.getppid()
    lent = pool.lend(me, [(CLIENT, 2), (SERVER, 1)])
    assert sorted(handle.name for _, handle in lent) == ["client-1", "client-2", "server-3"]
    assert pool.status() == {"idle client": 0, "idle server": 0, "lent": 3}
    assert pool.lend(other, [(SERVER, 1)]) == []  # nothing idle: an empty loan, held open
    handles = {handle.name: handle for _, handle in lent}
    # client-2 died with a failed federation: the loan ends without it
    pool.take_back(me, [handles["client-1"], handles["server-3"]], close=True)
    assert killed == ["client-2"]
    assert pool.status()["idle client"] == 1  # no replacement while `other` holds a loan
    pool.take_back(other, [], close=True)
    assert pool.status() == {"idle client": 2, "idle server": 1, "lent": 0}
    assert pool.started == 4  # client-4 replaced client-2


def test_a_layout_the_service_cannot_serve_makes_room(service_pool):
    pool, killed = service_pool
    assert pool.lend(os.getpid(), [(HALF, 4), (SERVER, 1)])[0][1].name == "server-3"
    assert sorted(killed) == ["client-1", "client-2"]  # they held the CPUs the run needs
    assert pool.status()["idle client"] == 0
    pool.take_back(os.getpid(), [], close=True)
    assert pool.status()["idle client"] == 2  # started again once no loan is out


def test_coordinators_the_service_does_not_keep_take_no_room(service_pool):
    pool, killed = service_pool
    lps = ActorKind("lps", 0.0, 0.0)
    assert pool.lend(os.getpid(), [(CLIENT, 1), (lps, 2)])  # one client lent, no LPS kept
    assert killed == [] and pool.status()["idle client"] == 1


def test_loans_of_drivers_that_died_are_reclaimed(service_pool, monkeypatch):
    pool, killed = service_pool
    dead_pid = 999_999_999
    pool.loans[dead_pid] = [(CLIENT, pool.idle[CLIENT].pop())]
    pool.reclaim()
    assert killed == ["client-2"] and dead_pid not in pool.loans
    assert pool.status() == {"idle client": 2, "idle server": 1, "lent": 0}


def test_the_state_file_names_a_live_service_and_a_stale_one_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    assert warm.running() is None
    service = Service(os.getpid(), "127.0.0.1:1", "abc", 2, {"client": 2}, 0.0, "token")
    (tmp_path / "up.json").write_text(json.dumps(service.__dict__))
    assert warm.running() == service
    (tmp_path / "up.json").write_text(json.dumps(service.__dict__ | {"pid": 999_999_999}))
    assert warm.running() is None and not (tmp_path / "up.json").exists()


def test_a_service_of_other_code_is_not_joined(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    service = Service(os.getpid(), "127.0.0.1:1", "other", 2, {"client": 2}, 0.0)
    (tmp_path / "up.json").write_text(json.dumps(service.__dict__))

    class NoRay:  # join must not touch Ray for a service it will not join
        def init(self, **_):
            raise AssertionError("joined")

    assert warm.join(NoRay(), join_up=True) is None
    monkeypatch.setattr(warm, "code_fingerprint", lambda: "other")
    assert warm.join(NoRay(), join_up=False) is None  # runtime.join_up: false


def test_the_default_service_fills_the_cpus_with_client_actors():
    kinds = warm.warm_kinds(4, None, 1.0, 0.25)
    assert kinds[ActorKind("client", 1.0, 0.25)] == 4
    assert warm.warm_kinds(4, None, 2.0, 0.0)[ActorKind("client", 2.0, 0.0)] == 2
    assert warm.warm_kinds(4, 3, 1.0, 0.0)[CLIENT] == 3
    assert {kind.role for kind in kinds} == {"client", "server", "graph"}


def test_a_driver_starting_its_own_actors_has_the_room_until_it_ends(service_pool):
    pool, killed = service_pool
    pool.make_room(os.getpid())  # runtime.reuse_actors: false on a joined Ray
    assert sorted(killed) == ["client-1", "client-2"]
    pool.reclaim()  # the driver lives: nothing is started in its room
    assert pool.status()["idle client"] == 0
    pool.take_back(os.getpid(), [], close=True)
    assert pool.status()["idle client"] == 2

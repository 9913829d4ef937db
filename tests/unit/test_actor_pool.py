"""The reuse session's pool of idle actors (no Ray): which idle actor a host takes, which
are killed for a layout that cannot use them, and that only the outermost session kills."""

from __future__ import annotations

from raymtl.runtime.actors import pool as actor_pool
from raymtl.runtime.actors.pool import ActorKind, ActorPool, reusing_actors


def test_idle_actors_of_other_kinds_are_killed_and_the_last_host_is_taken_first():
    pool, killed = ActorPool(), []
    client, server = ActorKind("client", 1.0, 0.0), ActorKind("server", 0.0, 0.0)
    pool.give_back("actor-a", client, "clients-0")
    pool.give_back("actor-b", client, "clients-1")
    pool.give_back("actor-s", server, "server")
    pool.keep_only({client: 2}, killed.append)  # a layout without a server
    assert killed == ["actor-s"]
    assert pool.take(client, "clients-1") == "actor-b"  # the actor that was clients-1
    assert pool.take(server, "server") is None
    assert pool.take(client, "clients-7") == "actor-a"
    assert pool.take(client, "clients-0") is None and pool.reused == 2


def test_a_host_without_its_own_actor_leaves_the_others_of_its_layout_theirs():
    # After a rollback that lost clients-0's actor: clients-1's survivor is idle, beside
    # two actors that earlier federations left. clients-0 is started first.
    pool, client = ActorPool(), ActorKind("client", 1.0, 0.0)
    pool.give_back("actor-x", client, "clients-5")
    pool.give_back("actor-b", client, "clients-1")
    pool.give_back("actor-y", client, "clients-6")
    layout = frozenset({"clients-0", "clients-1"})
    killed = []
    pool.keep_only({client: 2}, killed.append, layout)  # clients-1's own is kept first
    assert killed == ["actor-y"]
    assert pool.take(client, "clients-0", layout) == "actor-x"
    assert pool.take(client, "clients-1", layout) == "actor-b"
    pool.give_back("actor-b", client, "clients-1")
    assert pool.take(client, "clients-0", layout) is None  # clients-1 takes it: start one
    assert pool.take(client, "clients-0") == "actor-b"  # outside that layout, it will do


def test_sessions_nest_and_the_outermost_kills_the_idle_actors(monkeypatch):
    # A pool of its own: the process's may be inside the test session's reuse session
    # (tests/conftest.py, SharedActors) when the integration tests ran first.
    pool = ActorPool()
    monkeypatch.setattr(actor_pool, "POOL", pool)
    killed = []
    monkeypatch.setattr(actor_pool, "ray_kill", killed.append)
    kind = ActorKind("client", 1.0, 0.0)
    with reusing_actors():
        with reusing_actors():
            pool.give_back("actor-a", kind, "clients-0")
        assert pool.active and killed == []  # the inner session ended: still kept
    assert not pool.active and killed == ["actor-a"] and not pool.idle
    with reusing_actors(enabled=False):
        assert not pool.active  # runtime.reuse_actors: false opens no session

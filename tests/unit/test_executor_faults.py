"""How the Ray executor classifies what goes wrong in a call (no Ray started: a stand-in for
`ray.get`): a lost host, or a payload lost with its sender, is a HostsLost (roll back);
with min_clients_fraction < 1 a lost client host is dropped instead."""

from __future__ import annotations

import pytest
import ray.exceptions

from raymtl.config import RuntimeConfig
from raymtl.runtime.executor import HostsLost
from raymtl.runtime.ray_executor import RayExecutor


class FakeMethod:
    def __init__(self, name):
        self.name = name

    def remote(self, *args):
        return self.name


class FakeHost:
    def __getattr__(self, method):
        return FakeMethod(self.name)

    def __init__(self, name):
        self.name = name


class FakeRay:
    exceptions = ray.exceptions

    def __init__(self, failures: dict):
        self.failures = failures

    def get(self, ref):
        if ref in self.failures:
            raise self.failures[ref]
        return ref


def executor(failures: dict, fraction: float = 1.0) -> RayExecutor:
    ex = object.__new__(RayExecutor)  # no graph actor, no cluster: only the call logic
    ex.runtime = RuntimeConfig(min_clients_fraction=fraction)
    ex._ray = FakeRay(failures)
    ex.hosts = {name: FakeHost(name) for name in ("clients-0", "clients-1", "server")}
    ex.members = {"clients-0": ("client/0", "client/1"), "clients-1": ("client/2", "client/3"),
                  "server": ("server",)}  # fmt: skip
    ex.specs, ex.nodes, ex.lost, ex.dropped, ex.rehosted = {}, {}, set(), [], {}
    return ex


def test_a_payload_lost_with_its_sender_rolls_back():
    lost = ray.exceptions.OwnerDiedError("ab" * 28, None, "leader step")
    with pytest.raises(HostsLost, match="clients-1"):
        executor({"clients-1": lost})._call("run_phase", {"clients-0": (), "clients-1": ()})


def test_a_lost_client_host_is_dropped_when_enough_answered():
    died = ray.exceptions.ActorDiedError()
    ex = executor({"clients-1": died}, fraction=0.5)
    assert ex._call("run_phase", {"clients-0": (), "clients-1": ()}) == {"clients-0": "clients-0"}
    assert ex.lost == {"client/2", "client/3"} and "clients-1" not in ex.hosts


def test_a_lost_server_always_rolls_back():
    died = ray.exceptions.ActorDiedError()
    with pytest.raises(HostsLost, match="server"):
        executor({"server": died}, fraction=0.1)._call("run_phase", {"server": ()})

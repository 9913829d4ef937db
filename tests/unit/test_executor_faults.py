"""How the Ray executor classifies what goes wrong in a call (no Ray started: a stand-in for
`ray.get`): a lost host, or a payload lost with its sender, is a HostsLost (roll back);
with min_clients_fraction < 1 a lost client host is dropped instead, and the call's answer
says so; an error raised while a host is built is a one-line ConfigError. And how the round
loop records a client host lost in any call: in the round it was lost in."""

from __future__ import annotations

import pytest
import ray.exceptions

from raymtl.config import ConfigError, RuntimeConfig
from raymtl.runtime.executors.executor import HostsLost, InlineExecutor
from raymtl.runtime.executors.ray_executor import RayExecutor
from raymtl.runtime.results import Answer


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

    def wait(self, refs, num_returns, timeout):  # every actor placed at once
        return list(refs), []


def executor(failures: dict, fraction: float = 1.0) -> RayExecutor:
    ex = object.__new__(RayExecutor)  # no graph actor, no cluster: only the call logic
    ex.runtime = RuntimeConfig(min_clients_fraction=fraction)
    ex._ray = FakeRay(failures)
    ex._attaching = {}
    ex.hosts = {name: FakeHost(name) for name in ("clients-0", "clients-1", "server")}
    ex.members = {
        "clients-0": ("client/0", "client/1"),
        "clients-1": ("client/2", "client/3"),
        "server": ("server",),
    }
    ex.specs, ex.nodes, ex.lost, ex.rehosted = {}, {"clients-1": "node-b"}, set(), {}
    ex.placed, ex.injected = set(), set()
    return ex


def test_a_payload_lost_with_its_sender_rolls_back():
    lost = ray.exceptions.OwnerDiedError("ab" * 28, None, "leader step")
    with pytest.raises(HostsLost, match="clients-1"):
        executor({"clients-1": lost})._call("run_phase", {"clients-0": (), "clients-1": ()})


def test_a_lost_client_host_is_dropped_when_enough_answered():
    died = ray.exceptions.ActorDiedError()
    ex = executor({"clients-1": died}, fraction=0.5)
    answer = ex._call("run_phase", {"clients-0": (), "clients-1": ()})
    assert answer.value == {"clients-0": "clients-0"}
    (lost,) = answer.lost
    assert lost["host"] == "clients-1" and lost["node"] == "node-b"
    assert lost["during"] == "run_phase" and lost["participants"] == ["client/2", "client/3"]
    assert ex.lost == {"client/2", "client/3"} and "clients-1" not in ex.hosts


def test_a_lost_server_always_rolls_back():
    died = ray.exceptions.ActorDiedError()
    with pytest.raises(HostsLost, match="server"):
        executor({"server": died}, fraction=0.1)._call("run_phase", {"server": ()})


def test_an_error_raised_while_a_host_is_built_is_one_config_error_line():
    raised = ray.exceptions.RayTaskError(
        "build", "Traceback ...", ValueError("algorithm.name: 'nope' is not one of fedavg, local")
    )
    with pytest.raises(ConfigError, match=r"^host clients-1: algorithm.name: 'nope' is not one"):
        executor({"clients-1": raised})._build(["clients-0", "clients-1"])


def test_an_actor_whose_creation_failed_is_a_config_error_and_one_that_died_a_lost_host():
    creation = ray.exceptions.RayTaskError(
        "ClientActor.__init__",
        "Traceback ...\nModuleNotFoundError: No module named 'mine'",
        ModuleNotFoundError("No module named 'mine'"),
    )
    failed = ray.exceptions.ActorDiedError(creation)
    with pytest.raises(ConfigError, match=r"^host clients-0: .*No module named 'mine'"):
        executor({"clients-0": failed})._build(["clients-0"])
    with pytest.raises(HostsLost, match=r"during build: clients-0"):
        executor({"clients-0": ray.exceptions.ActorDiedError()})._build(["clients-0"])


class LosingExecutor(InlineExecutor):
    """Inline hosts; client host clients-0 is lost during `method` of round `at_round`."""

    def __init__(self, runtime, method: str, at_round: int):
        super().__init__(runtime)
        self.method, self.at_round, self.round = method, at_round, 0

    def _call(self, method, calls):
        if method == "run_phase":
            self.round = next(iter(calls.values()))[0]
        answer = super()._call(method, calls)
        if method != self.method or self.round != self.at_round or "clients-0" not in calls:
            return answer
        row = self.drop("clients-0", method, "killed by the test")
        value = {name: result for name, result in answer.value.items() if name != "clients-0"}
        return Answer(value, answer.lost + [row])

"""Checkpoints on a cluster: the driver and the hosts must see each other's files; COMPLETE
only when every participant's file is there; a host never starts silently from scratch.
Checkpoints to trust: every file checked against its manifest's sha256, a file that is not
a tensor archive named without torch's advice, the manifest bound to the settings."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
import torch

from raymtl.config import ConfigError
from raymtl.runtime.results import Answer
from raymtl.runtime.storage.checkpoints import (
    DamagedCheckpoint,
    check_shared,
    checkpoint_file,
    damaged_cause,
    index_file,
    read_blob,
    read_host_checkpoint,
    read_manifest,
    saved_clients,
    verify_checkpoint,
    write_host_checkpoint,
    write_manifest,
)
from raymtl.runtime.storage.location import Location
from raymtl.runtime.storage.run_dirs import bound_config, check_bound


class FakeExecutor:
    """Hosts on two nodes; the one on node-b writes into a directory the driver never sees."""

    def __init__(self, private: Path):
        self.private = private
        self.nodes = {"clients-0": "node-a", "clients-1": "node-b"}

    @property
    def hosts(self) -> dict[str, str]:
        return self.nodes

    def call(self, method: str, calls: dict[str, tuple]) -> Answer:
        assert method == "probe"
        seen = {}
        for host, (directory, name) in calls.items():
            node = self.nodes[host]
            where = Path(directory) if node == "node-a" else self.private
            where.mkdir(parents=True, exist_ok=True)
            (where / name).write_text(node)
            seen[host] = (where / "driver").is_file()
        return Answer(seen)


def test_a_directory_the_hosts_of_one_node_do_not_share_is_refused(tmp_path):
    probe_dir = Location.of(tmp_path / "run" / "checkpoints" / "seed0" / ".probe")
    with pytest.raises(ConfigError, match=r"^output.dir: .* not shared .* node\(s\) node-b;"):
        check_shared(probe_dir, FakeExecutor(tmp_path / "node-b-disk"))


def test_a_shared_directory_passes(tmp_path):
    executor = FakeExecutor(tmp_path / "unused")
    executor.nodes = {"clients-0": "node-a"}
    check_shared(Location.of(tmp_path / "run" / "checkpoints" / "seed0" / ".probe"), executor)


def test_complete_needs_every_participants_file(tmp_path):
    folder = Location.of(tmp_path)
    hosts = {"clients-0": ("client/0", "client/1"), "server": ("server",)}
    with pytest.raises(ConfigError, match=r"2 checkpoint files \(e.g. index of client/0's\)"):
        verify_checkpoint(folder, hosts)
    # The client host's index names the clients it saved (client/1 never took part).
    index_file(folder, "client/0").write_text('["client/0"]')
    checkpoint_file(folder, "server").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"1 checkpoint files \(e.g. client/0's\)"):
        verify_checkpoint(folder, hosts)
    checkpoint_file(folder, "client/0").write_bytes(b"x")
    verify_checkpoint(folder, hosts)
    assert saved_clients(folder) == {"client/0"}


def test_a_host_never_starts_from_scratch_when_its_checkpoint_is_missing(tmp_path, make_config):
    from raymtl.runtime.executors.executor import InlineExecutor
    from raymtl.runtime.executors.layout import lay_out
    from raymtl.runtime.executors.planning import plan_seed
    from raymtl.runtime.hosts.host import ParticipantHost

    cfg = make_config()
    specs = lay_out(plan_seed(cfg, 0), InlineExecutor(cfg.runtime), tmp_path, resume_round=2)
    spec = next(iter(specs.values()))
    with pytest.raises(FileNotFoundError, match=r"^output.dir: checkpoint file .* not visible"):
        ParticipantHost(spec).build()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is not a checkpoint raymtl wrote"),
        (bytes(range(256)) * 4, "is not a checkpoint raymtl wrote"),
        (b'{"model": null}', "is not a checkpoint raymtl wrote"),
    ],
)
def test_a_file_that_is_not_a_tensor_archive_is_named_without_torchs_advice(
    tmp_path, content, problem
):
    location = Location.of(tmp_path / "server.pt")
    location.write_bytes(content)
    with pytest.raises(DamagedCheckpoint) as damaged:
        read_blob(location, "cpu", "local")  # a manifest without checksums: torch reads it
    assert str(damaged.value) == f"checkpoint file {location} {problem}"
    assert "weights_only" not in str(damaged.value)


def test_a_tensor_archive_holding_other_objects_is_refused_unread(tmp_path):
    location = Location.of(tmp_path / "server.pt")
    torch.save({"model": None, "extras": {"x": Path("not a tensor")}}, str(location))
    with pytest.raises(DamagedCheckpoint) as damaged:
        read_blob(location, "cpu", "local")
    message = "holds objects other than tensors and plain data (refused unread)"
    assert str(damaged.value) == f"checkpoint file {location} {message}"
    assert (
        damaged.value.__suppress_context__
    )  # torch's text (and its advice to load unsafely) is not shown
    truncated = location.read_bytes()[:-100]
    location.write_bytes(truncated)
    with pytest.raises(DamagedCheckpoint, match="server.pt is not a checkpoint raymtl wrote"):
        read_blob(location, "cpu", "local")


def test_a_file_is_checked_against_its_manifest_before_it_is_read(tmp_path):
    folder = Location.of(tmp_path)
    checksums = write_host_checkpoint(
        str(tmp_path), {"server": {"model": None, "extras": {"t": torch.arange(3)}}}
    )
    server = checkpoint_file(folder, "server")
    assert checksums == {"server.pt": hashlib.sha256(server.read_bytes()).hexdigest()}
    assert torch.equal(read_blob(server, "cpu", "local", checksums)["extras"]["t"], torch.arange(3))
    data = server.read_bytes()
    server.write_bytes(data[:-1] + bytes([data[-1] ^ 0x80]))
    with pytest.raises(DamagedCheckpoint, match=rf"server.pt is damaged \({len(data)} bytes; its"):
        read_blob(server, "cpu", "local", checksums)
    with pytest.raises(DamagedCheckpoint, match="server.pt is not listed in its checkpoint's"):
        read_blob(server, "cpu", "local", {})


def test_a_damaged_checkpoint_survives_being_sent_and_is_found_behind_its_wrappers():
    damaged = DamagedCheckpoint("/run/round00002/client_0.pt", "is not a checkpoint raymtl wrote")
    again = pickle.loads(pickle.dumps(damaged))  # how Ray brings it back from an actor
    assert (again.file, again.problem, str(again)) == (damaged.file, damaged.problem, str(damaged))

    class RayTaskError(RuntimeError):  # Ray's wrapper keeps what the actor raised as `cause`
        cause = damaged

    try:
        raise ConfigError("host clients-0: checkpoint file ...") from RayTaskError()
    except ConfigError as error:
        assert damaged_cause(error) is damaged
    assert damaged_cause(ConfigError("host clients-0: algorithm.name: ...")) is None


def test_a_manifest_binds_the_settings_a_resume_may_not_change(make_config, tmp_path):
    cfg = make_config(**{"algorithm.params.lr": 0.1})
    folder = Location.of(tmp_path)
    write_manifest(folder, 2, ["client/5"], {"server.pt": "ab"}, bound_config(cfg))
    manifest = read_manifest(folder)
    assert (manifest["round"], manifest["lost"], manifest["files"]) == (
        2,
        ["client/5"],
        {"server.pt": "ab"},
    )
    assert "rounds" not in manifest["config"] and "runtime" not in manifest["config"]
    check_bound(make_config(**{"rounds": 9, "runtime.max_restarts": 3}), manifest, "here")
    with pytest.raises(
        ConfigError,
        match=r"^algorithm.params.lr: 0.1 in the checkpoints, 0.5 now \(here\); --resume",
    ):
        check_bound(make_config(**{"algorithm.params.lr": 0.5}), manifest, "here")
    # A setting raymtl added since the checkpoint was written is not a change; an old
    # manifest (no config) binds nothing.
    del manifest["config"]["eval_every"]
    manifest["config_sha256"] = "older"
    check_bound(cfg, manifest, "here")
    check_bound(make_config(**{"algorithm.params.lr": 0.5}), {"round": 2, "lost": []}, "here")
    # A parameter given now that the checkpoints ran with by default is a change.
    with pytest.raises(
        ConfigError, match=r"^algorithm.params.momentum: unset in the checkpoints, 0.9 now"
    ):
        check_bound(make_config(**{"algorithm.params.momentum": 0.9}), manifest, "here")


class SavedFromAGpu:
    """torch.save tags the storages of the tensors given as from "cuda:0", as a GPU host's
    checkpoint tags them (torch.serialization's tagger registry), on a machine without one."""

    def __init__(self, *tensors: torch.Tensor):
        self.storages = {t.untyped_storage().data_ptr() for t in tensors}

    def tag(self, storage):
        data_ptr = getattr(storage, "data_ptr", None)
        if data_ptr is not None and data_ptr() in self.storages:
            return "cuda:0"
        return None

    def __enter__(self):
        import torch.serialization as serialization

        serialization.register_package(1, self.tag, lambda storage, location: None)
        self.entry = serialization._package_registry[0]
        return self

    def __exit__(self, *exc):
        import torch.serialization as serialization

        serialization._package_registry.remove(self.entry)


def test_every_kind_of_state_loads_onto_the_device_it_lives_on(tmp_path):
    """A checkpoint read by a host whose device is another one ("meta" stands for a GPU):
    a model's weights go to the host's device (a client's kept weights, a coordinator's
    state_dict); tensors saved from the CPU stay there (Sheaf-FMTL's maps, models kept as
    CPU copies, a FedMuscle batch of indices); tensors saved from a GPU (SFMTL-Graph's
    anchor lives on its model's device) go to the host's device; plain data stays plain."""
    maps = {1: torch.randn(3, 5), 4: torch.randn(2, 5)}
    anchor = torch.randn(4, 8)
    coordinators = {"server": {"model": {"w": torch.ones(2, 2)}, "extras": {"round": 3}}}
    clients = [
        (
            "client/0",
            {
                "model": {"fc.weight": torch.randn(4, 5), "fc.bias": torch.zeros(4)},
                "extras": {
                    "maps": maps,
                    "personal": {"fc.weight": torch.randn(4, 5)},
                    "anchor": anchor,
                    "public_batch": torch.arange(6),
                    "classes": [0, 3],
                },
            },
        ),
        ("client/1", {"model": None, "extras": {}, "initial_model": True}),
    ]
    with SavedFromAGpu(anchor):
        write_host_checkpoint(str(tmp_path), coordinators, clients, "client/0")
    kept_coordinators, kept_clients = read_host_checkpoint(
        str(tmp_path), ["server"], ["client/0", "client/1"], "meta", "local"
    )
    assert kept_coordinators["server"]["model"]["w"].device.type == "meta"
    assert kept_coordinators["server"]["extras"] == {"round": 3}
    client = kept_clients["client/0"]
    assert {t.device.type for t in client["model"].values()} == {"meta"}
    extras = client["extras"]
    assert {j: m.device.type for j, m in extras["maps"].items()} == {1: "cpu", 4: "cpu"}
    for j, matrix in maps.items():
        assert torch.equal(extras["maps"][j], matrix)  # bit for bit, on the CPU
    assert extras["personal"]["fc.weight"].device.type == "cpu"
    assert extras["public_batch"].device.type == "cpu"
    assert extras["anchor"].device.type == "meta"  # saved from the GPU: onto the host's
    assert extras["classes"] == [0, 3]
    assert kept_clients["client/1"] == {"model": None, "extras": {}, "initial_model": True}
    # A CPU host reads every tensor onto the CPU, the GPU's included, values unchanged.
    _, on_cpu = read_host_checkpoint(str(tmp_path), [], ["client/0"], "cpu", "local")
    assert torch.equal(on_cpu["client/0"]["extras"]["anchor"], anchor)

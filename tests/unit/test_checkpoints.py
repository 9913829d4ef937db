"""Checkpoints on a cluster: the driver and the hosts must see each other's files; COMPLETE
only when every participant's file is there; a host never starts silently from scratch."""

from __future__ import annotations

from pathlib import Path

import pytest

from raymtl.config import ConfigError
from raymtl.runtime.checkpoints import (
    check_shared,
    checkpoint_file,
    index_file,
    saved_clients,
    verify_checkpoint,
)
from raymtl.runtime.storage import Location


class FakeExecutor:
    """Hosts on two nodes; the one on node-b writes into a directory the driver never sees."""

    def __init__(self, private: Path):
        self.private = private
        self.nodes = {"clients-0": "node-a", "clients-1": "node-b"}

    def probe(self, directory: str) -> dict[str, bool]:
        seen = {}
        for host, node in self.nodes.items():
            where = Path(directory) if node == "node-a" else self.private
            where.mkdir(parents=True, exist_ok=True)
            (where / host).write_text(node)
            seen[host] = (where / "driver").is_file()
        return seen


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
    from raymtl.runtime.executor import InlineExecutor
    from raymtl.runtime.host import ParticipantHost
    from raymtl.runtime.planning import build_setup

    cfg = make_config()
    setup = build_setup(cfg, 0, InlineExecutor(cfg.runtime), tmp_path, resume_round=2)
    spec = next(iter(setup.specs.values()))
    with pytest.raises(FileNotFoundError, match=r"^output.dir: checkpoint file .* not visible"):
        ParticipantHost(spec).build()

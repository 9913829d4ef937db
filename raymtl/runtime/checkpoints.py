"""Checkpoints: where they live, how a host writes and reads its participants' files, and
the checks that make them safe on a cluster.

Every host writes its own participants' files into `<seed dir>/round<k>/`; the driver writes
`COMPLETE` only once it sees every participant's file there, and a (re)started host loads the
round the driver names, failing loudly when a file is not visible on its node. Before the
first round, `check_shared` proves the driver and every host see each other's files.
"""

from __future__ import annotations

import io
import json

import torch

from raymtl.config import ConfigError
from raymtl.runtime.storage import Location


def latest_checkpoint(seed_dir: Location) -> int:
    """The last round under `seed_dir` with a complete checkpoint (0 = none)."""
    rounds = [name for name in seed_dir.entries() if name.startswith("round")]
    complete = [name for name in rounds if seed_dir.child(name, "COMPLETE").is_file()]
    return max((int(name.removeprefix("round")) for name in complete), default=0)


def lost_at(seed_dir: Location, round_index: int) -> list[str]:
    """The participants a checkpoint's federation goes on without (min_clients_fraction)."""
    if not round_index:
        return []
    complete = json.loads(checkpoint_dir(seed_dir, round_index).child("COMPLETE").read_text())
    return list(complete.get("lost", []))


def checkpoint_dir(seed_dir: Location, round_index: int) -> Location:
    """The folder of the checkpoint taken after `round_index`."""
    return seed_dir.child(f"round{round_index:05d}")


def checkpoint_file(directory: Location, participant: str) -> Location:
    """Where a participant's state is saved inside a checkpoint folder."""
    return directory.child(f"{participant.replace('/', '_')}.pt")


def index_file(directory: Location, first_participant: str) -> Location:
    """A client host's list of the clients it saved (those that never took part have no
    file): named by its first participant, so any layout of hosts can read it back."""
    return directory.child(f"index-{first_participant.replace('/', '_')}.json")


def saved_clients(directory: Location) -> set[str] | None:
    """Every client saved in a checkpoint folder (None: a folder written before indexes,
    where every client has its file)."""
    indexes = [name for name in directory.entries() if name.startswith("index-")]
    if not indexes:
        return None
    return {p for name in indexes for p in json.loads(directory.child(name).read_text())}


def check_shared(directory: Location, executor) -> None:
    """Every host writes a file under `directory` and looks for the driver's: both sides must
    see each other's, or checkpoints written on one node are lost to the others."""
    directory.child("driver").write_text("driver")
    sees_driver = executor.probe(directory.uri)
    hidden = [
        name
        for name, seen in sees_driver.items()
        if not seen or not directory.child(name).is_file()
    ]
    if hidden:
        nodes = sorted({executor.nodes.get(name, "?") for name in hidden})
        run = directory.uri.rsplit("/checkpoints/", 1)[0]
        raise ConfigError(
            f"output.dir: '{run}' is not shared between the driver and the hosts on node(s) "
            f"{', '.join(nodes)}; use storage every node mounts at one path, or a URI"
        )


def verify_checkpoint(directory: Location, hosts: dict[str, tuple[str, ...]]) -> None:
    """COMPLETE only when every participant's state is there (as the driver sees it): each
    coordinator's file, each client host's index and the files of the clients it lists."""
    expected, missing = [], []
    for members in hosts.values():
        if not members[0].startswith("client/"):
            expected += list(members)
        elif not index_file(directory, members[0]).is_file():
            missing.append(f"index of {members[0]}")
    saved = saved_clients(directory) or set()
    expected += sorted(saved & {p for members in hosts.values() for p in members})
    missing += [p for p in expected if not checkpoint_file(directory, p).is_file()]
    if missing:
        raise ConfigError(
            f"output.dir: {len(missing)} checkpoint files (e.g. {missing[0]}'s) were written by "
            "their hosts but are not visible to the driver: use storage every node shares"
        )


def write_blob(location: Location, blob: dict) -> None:
    """torch.save a participant's state to a file or a URI."""
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    location.write_bytes(buffer.getvalue())


def read_blob(location: Location, device: str, node: str) -> dict:
    """A participant's saved state; a missing file is an error, never a fresh start."""
    if not location.is_file():
        raise FileNotFoundError(
            f"output.dir: checkpoint file {location} is not visible on node {node} "
            "(output.dir must be storage every node shares)"
        )
    return torch.load(
        io.BytesIO(location.read_bytes()),
        map_location=device,
        weights_only=True,  # tensors and plain data only: a file cannot run code
    )


def write_host_checkpoint(
    directory: str, coordinators: dict[str, dict], clients=(), first_client: str | None = None
) -> None:
    """A host's files in checkpoint folder `directory` (a path or a URI: each host writes its
    own, on whatever node it runs): one blob `{"model", "extras"}` per coordinator and per
    client of `clients` ((participant, blob) pairs: clients that never took part have none),
    and, on a host with clients (`first_client` names it), the index of the clients saved."""
    folder = Location.of(directory)
    for participant, blob in coordinators.items():
        write_blob(checkpoint_file(folder, participant), blob)
    if first_client is None:
        return
    saved = []
    for participant, blob in clients:
        write_blob(checkpoint_file(folder, participant), blob)
        saved.append(participant)
    index_file(folder, first_client).write_text(json.dumps(sorted(saved)))


def read_host_checkpoint(directory: str, coordinators, clients, device: str, node: str):
    """The blobs of a host's participants in checkpoint folder `directory`: every
    coordinator's, and those of its `clients` that were saved (a folder written before
    indexes holds every client's). Returns (coordinator blobs, client blobs) by participant."""
    folder = Location.of(directory)

    def read(participant):
        return read_blob(checkpoint_file(folder, participant), device, node)

    saved = saved_clients(folder)
    return (
        {participant: read(participant) for participant in coordinators},
        {p: read(p) for p in clients if saved is None or p in saved},
    )

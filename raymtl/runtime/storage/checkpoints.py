"""Checkpoints: where they live, how a host writes and reads its participants' files, and
the checks that make them safe on a cluster and worth trusting.

Every host writes its own participants' files into `<seed dir>/round<k>/` and returns the
sha256 of each; the driver writes the manifest `COMPLETE` only once it sees every
participant's file there: the round, the participants the run goes on without, every file's
checksum, and the part of the config a resume may not change (with its hash). A (re)started
host loads the round the driver names and checks each file against the manifest before
torch reads it: a damaged, truncated or foreign file is a `DamagedCheckpoint` naming it (the
driver marks that checkpoint DAMAGED and falls back to the one before), and a file that is
not visible on its node fails loudly. Before the first round, `check_shared` proves the
driver and every host see each other's files.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile

import torch

from raymtl.config import ConfigError
from raymtl.runtime.storage.location import Location


class DamagedCheckpoint(ValueError):
    """A checkpoint file whose bytes are not what its manifest recorded, or not a checkpoint
    at all: the checkpoint is unusable, its host is not lost."""

    def __init__(self, file: str, problem: str):
        self.file, self.problem = file, problem
        super().__init__(f"checkpoint file {file} {problem}")

    def __reduce__(self):  # rebuilt from its two parts when Ray sends it to the driver
        return (type(self), (self.file, self.problem))


def damaged_cause(error: BaseException | None) -> DamagedCheckpoint | None:
    """The DamagedCheckpoint behind an error a host's build raised (the executors wrap it in
    a ConfigError; Ray in a RayTaskError that keeps it as `cause`), or None."""
    for _ in range(8):
        wrapped = getattr(error, "cause", None)
        if isinstance(wrapped, BaseException):  # Ray's wrapper (whose text is a traceback)
            error = wrapped
        elif error is None or isinstance(error, DamagedCheckpoint):
            return error
        else:
            error = error.__cause__
    return None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def latest_checkpoint(seed_dir: Location, before: int | None = None) -> int:
    """The last round under `seed_dir` (before round `before`, if given) with a complete
    checkpoint not found damaged (0 = none)."""
    complete = [
        int(name.removeprefix("round"))
        for name in seed_dir.entries()
        if name.startswith("round")
        and seed_dir.child(name, "COMPLETE").is_file()
        and not seed_dir.child(name, "DAMAGED").is_file()
    ]
    return max((k for k in complete if before is None or k < before), default=0)


def read_manifest(directory: Location) -> dict:
    """A checkpoint's COMPLETE manifest (an unreadable one is a DamagedCheckpoint). Older
    manifests hold only the round and the lost participants: no `files`, no `config`."""
    marker = directory.child("COMPLETE")
    try:
        manifest = json.loads(marker.read_bytes().decode())
    except ValueError:  # not UTF-8, not JSON
        raise DamagedCheckpoint(marker.uri, "is not the manifest raymtl wrote") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        raise DamagedCheckpoint(marker.uri, "is not the manifest raymtl wrote")
    return manifest


def write_manifest(
    directory: Location, round_index: int, lost, files: dict[str, str], config: dict
) -> None:
    """COMPLETE: written last, by the driver, once every file is there (the checkpoint
    counts from then on). `config`: the settings a resume may not change."""
    manifest = {
        "round": round_index,
        "lost": sorted(lost),
        "files": dict(sorted(files.items())),
        "config_sha256": config_hash(config),
        "config": config,
    }
    directory.child("COMPLETE").write_text(json.dumps(manifest))


def config_hash(config: dict) -> str:
    return digest(json.dumps(config, sort_keys=True).encode())


def mark_damaged(directory: Location, reason: str) -> None:
    """The checkpoint is skipped from now on (its files and manifest stay, to look at); a
    later checkpoint of the same round removes the mark."""
    directory.child("DAMAGED").write_text(reason + "\n")


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


def saved_clients(directory: Location, checksums: dict[str, str] | None = None) -> set[str] | None:
    """Every client saved in a checkpoint folder (None: a folder written before indexes,
    where every client has its file). With the manifest's `checksums`, the indexes it lists
    (an index it does not list, e.g. of a host lost while saving, is no part of it), each
    checked against its checksum."""
    indexes = [name for name in directory.entries() if name.startswith("index-")]
    if checksums is not None:
        indexes = [name for name in checksums if name.startswith("index-")]
    if not indexes:
        return None
    saved = set()
    for name in indexes:
        location = directory.child(name)
        data = checked_bytes(location, checksums)
        try:
            clients = json.loads(data.decode())
        except ValueError:  # not UTF-8, not JSON
            clients = None
        if not isinstance(clients, list) or not all(isinstance(p, str) for p in clients):
            raise DamagedCheckpoint(location.uri, "is not a client index raymtl wrote")
        saved.update(clients)
    return saved


def checked_bytes(location: Location, checksums: dict[str, str] | None) -> bytes:
    """A checkpoint file's bytes, checked against the manifest's checksum (`checksums`: None
    for a manifest written before checksums: nothing to check against)."""
    data = location.read_bytes()
    if checksums is None:
        return data
    if location.name not in checksums:
        raise DamagedCheckpoint(location.uri, "is not listed in its checkpoint's COMPLETE")
    if digest(data) != checksums[location.name]:
        problem = "its sha256 differs from the one COMPLETE recorded"
        raise DamagedCheckpoint(location.uri, f"is damaged ({len(data)} bytes; {problem})")
    return data


def check_shared(directory: Location, executor) -> None:
    """Every host writes a file under `directory` and looks for the driver's: both sides must
    see each other's, or checkpoints written on one node are lost to the others."""
    directory.child("driver").write_text("driver")
    calls = {name: (directory.uri, name) for name in executor.hosts}  # ParticipantHost.probe
    sees_driver = executor.call("probe", calls).value
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


def verify_checkpoint(directory: Location, hosts: dict[str, tuple[str, ...]]) -> list[str]:
    """COMPLETE only when every participant's state is there (as the driver sees it): each
    coordinator's file, each client host's index and the files of the clients it lists.
    Returns the names of the checkpoint's files."""
    expected, missing, indexes = [], [], []
    for members in hosts.values():
        if not members[0].startswith("client/"):
            expected += list(members)
        elif not index_file(directory, members[0]).is_file():
            missing.append(f"index of {members[0]}")
        else:
            indexes.append(index_file(directory, members[0]).name)
    saved = saved_clients(directory) or set()
    expected += sorted(saved & {p for members in hosts.values() for p in members})
    missing += [p for p in expected if not checkpoint_file(directory, p).is_file()]
    if missing:
        raise ConfigError(
            f"output.dir: {len(missing)} checkpoint files (e.g. {missing[0]}'s) were written by "
            "their hosts but are not visible to the driver: use storage every node shares"
        )
    return [checkpoint_file(directory, p).name for p in expected] + indexes


def checkpoint_checksums(directory: Location, files: list[str], reported: dict) -> dict:
    """sha256 of every file of a checkpoint: as the hosts reported them from what they
    wrote (`reported`), or, for a file none reported, read back through `directory`."""
    return {
        name: reported.get(name) or digest(directory.child(name).read_bytes()) for name in files
    }


class HashingWriter(io.RawIOBase):
    """A writable stream that passes what it is given on and hashes it (sha256) on the way."""

    def __init__(self, stream):
        self.stream, self.sha256 = stream, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        self.stream.write(bytes(data))
        return len(data)


def write_blob(location: Location, blob: dict) -> str:
    """torch.save a participant's state to a file or a URI; the sha256 of what it wrote.
    Streamed: a client holding gigabytes (Sheaf-FMTL's maps) is not copied into memory to
    be written."""
    hashed: list[HashingWriter] = []

    def save(stream) -> None:
        writer = HashingWriter(stream)
        torch.save(blob, writer)
        hashed.append(writer)

    location.write_stream(save)
    return hashed[0].sha256.hexdigest()


def read_blob(
    location: Location, device: str, node: str, checksums: dict[str, str] | None = None
) -> dict:
    """A participant's saved state, checked against the manifest's `checksums` first; a
    missing file is an error, never a fresh start. Each tensor comes back where such state
    lives (`onto_device`): the model's weights on the host's `device`; every other tensor
    on the host's device when it was saved from an accelerator, on the CPU when it was
    saved from the CPU (Sheaf-FMTL's maps, models kept as CPU copies)."""
    if not location.is_file():
        raise FileNotFoundError(
            f"output.dir: checkpoint file {location} is not visible on node {node} "
            "(output.dir must be storage every node shares)"
        )
    data = checked_bytes(location, checksums)
    if not zipfile.is_zipfile(io.BytesIO(data)):  # torch.save writes a zip archive
        raise DamagedCheckpoint(location.uri, "is not a checkpoint raymtl wrote")
    saved_on_device: set[int] = set()

    def restore(storage, saved_on: str):  # read onto the CPU; where it was, noted
        if saved_on != "cpu":
            saved_on_device.add(storage.data_ptr())
        return storage

    try:
        blob = torch.load(
            io.BytesIO(data),
            map_location=restore,
            weights_only=True,  # tensors and plain data only: a file cannot run code
        )
    except pickle.UnpicklingError:  # our own line: never torch's advice to turn the guard off
        raise DamagedCheckpoint(
            location.uri, "holds objects other than tensors and plain data (refused unread)"
        ) from None
    except Exception:  # a damaged archive, or one of something else
        raise DamagedCheckpoint(location.uri, "is not a checkpoint raymtl wrote") from None
    if not isinstance(blob, dict):
        raise DamagedCheckpoint(location.uri, "is not a checkpoint raymtl wrote")
    return onto_device(blob, device, saved_on_device)


def onto_device(blob: dict, device: str, saved_on_device: set[int]) -> dict:
    """`blob` (read onto the CPU) with its model's weights moved to `device`, and every other
    tensor whose storage `saved_on_device` names (by data pointer) too; the rest stay."""
    if device == "cpu":
        return blob

    def place(value, always: bool):
        if isinstance(value, torch.Tensor):
            moved = always or value.untyped_storage().data_ptr() in saved_on_device
            return value.to(device) if moved else value
        if isinstance(value, dict):
            return {key: place(item, always) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(place(item, always) for item in value)
        return value

    return {key: place(value, key == "model") for key, value in blob.items()}


def write_host_checkpoint(
    directory: str, coordinators: dict[str, dict], clients=(), first_client: str | None = None
) -> dict[str, str]:
    """A host's files in checkpoint folder `directory` (a path or a URI: each host writes its
    own, on whatever node it runs): one blob `{"model", "extras"}` per coordinator and per
    client of `clients` ((participant, blob) pairs: clients that never took part have none),
    and, on a host with clients (`first_client` names it), the index of the clients saved.
    Returns the sha256 of every file written, by file name (for the manifest)."""
    folder = Location.of(directory)
    checksums = {}
    for participant, blob in coordinators.items():
        location = checkpoint_file(folder, participant)
        checksums[location.name] = write_blob(location, blob)
    if first_client is None:
        return checksums
    saved = []
    for participant, blob in clients:
        location = checkpoint_file(folder, participant)
        checksums[location.name] = write_blob(location, blob)
        saved.append(participant)
    index = json.dumps(sorted(saved)).encode()
    index_file(folder, first_client).write_bytes(index)
    checksums[index_file(folder, first_client).name] = digest(index)
    return checksums


def read_host_checkpoint(directory: str, coordinators, clients, device: str, node: str):
    """The blobs of a host's participants in checkpoint folder `directory`, each file checked
    against the manifest (COMPLETE) first: every coordinator's, and those of its `clients`
    that were saved (a folder written before indexes holds every client's). Returns
    (coordinator blobs, client blobs) by participant."""
    folder = Location.of(directory)
    # The driver named this round from its manifest; one written before checksums (or not
    # visible here: the files then say so) has nothing to check against.
    checksums = None
    if folder.child("COMPLETE").is_file():
        checksums = read_manifest(folder).get("files")

    def read(participant):
        return read_blob(checkpoint_file(folder, participant), device, node, checksums)

    saved = saved_clients(folder, checksums)
    return (
        {participant: read(participant) for participant in coordinators},
        {p: read(p) for p in clients if saved is None or p in saved},
    )

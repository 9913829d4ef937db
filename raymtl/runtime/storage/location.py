"""Where a run's files live: a local path, a shared mount, or a URI (`s3://`, `gs://`,
`hdfs://`, `file://` ... through `pyarrow.fs`).

Checkpoints are written and read through a `Location` by every host, on whatever node it runs,
so a URI needs no shared mount. The driver's own outputs (Parquet tables, plots, summary) are
written to a local folder first and copied to the URI at every checkpoint and at the end
(`publish`); for a local `output.dir` the two are the same folder and nothing is copied.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow.fs as pafs


def is_uri(location: str | Path) -> bool:
    return "://" in str(location)


@dataclass(frozen=True)
class Location:
    """A file or folder on some file system (picklable: hosts get it in their spec)."""

    fs: pafs.FileSystem
    path: str
    uri: str  # how it is shown: the URI or the absolute local path

    @classmethod
    def of(cls, where: str | Path) -> Location:
        if is_uri(where):
            filesystem, path = pafs.FileSystem.from_uri(str(where))
            return cls(filesystem, path.rstrip("/"), str(where).rstrip("/"))
        path = os.path.abspath(os.path.expanduser(str(where)))
        return cls(pafs.LocalFileSystem(), path, path)

    def child(self, *parts: str) -> Location:
        tail = "/".join(parts)
        return Location(self.fs, f"{self.path}/{tail}", f"{self.uri}/{tail}")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def __str__(self) -> str:
        return self.uri

    def mkdir(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def is_file(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.File

    def write_bytes(self, data: bytes) -> None:
        """Whole-file write; on a local disk through a temporary file and a rename (atomic)."""
        self.write_stream(lambda stream: stream.write(data))

    def write_stream(self, write: Callable[[BinaryIO], object]) -> None:
        """`write(stream)` writes the file as it goes (no copy of it in memory first); on a
        local disk into a temporary file renamed over the target when done (atomic)."""
        parent = self.path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        target = f"{self.path}.tmp" if self.local else self.path
        try:
            with self.fs.open_output_stream(target) as stream:
                write(stream)
        except BaseException:  # a full disk: leave no partial file behind to fill it further
            if self.local and os.path.exists(target):
                os.remove(target)
            raise
        if self.local:
            self.fs.move(target, self.path)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def delete(self) -> None:
        if self.is_file():
            self.fs.delete_file(self.path)

    def entries(self) -> list[str]:
        """Names directly inside this folder ([] when it does not exist)."""
        selector = pafs.FileSelector(self.path, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]


def publish(local_dir: Path, store: Location) -> None:
    """Copy the driver's outputs (everything but checkpoints/) from `local_dir` to `store`,
    when the run's store is not that folder itself."""
    if store.local and os.path.abspath(local_dir) == store.path:
        return
    for item in Path(local_dir).iterdir():
        if item.name == "checkpoints":
            continue
        target = store.child(item.name)
        if item.is_dir():
            pafs.copy_files(str(item), target.path, destination_filesystem=store.fs)
        else:
            target.write_bytes(item.read_bytes())


def fetch(store: Location, local_dir: Path) -> None:
    """Copy a run's outputs (not its checkpoints) from `store` into `local_dir` (resume)."""
    local_dir.mkdir(parents=True, exist_ok=True)
    for name in store.entries():
        if name != "checkpoints" and store.child(name).is_file():
            (local_dir / name).write_bytes(store.child(name).read_bytes())

"""Decoded pools kept on local disk between processes, keyed by the files they came from.

Decoding a built-in dataset costs seconds at every start on a small machine, paid before the
first round; reading it back from this cache costs a fraction of that (benchmarks/RESULTS.md,
"Between commands"). A built-in source whose
samples come from fixed local files decodes them once: the pool is written under
`raymtl_home()/cache/pools/<name>-<key>/` (x.npy, y.npy and meta.json), where `key` hashes
every source file's path, size and modification time and the cache's format, and later
processes read it back (a read of the arrays, tens of milliseconds). A source file that
changes is a new key; a cache that cannot be written (a read-only home) is skipped with a
log line; $RAYMTL_POOL_CACHE=0 turns it off. Sources with a seed or parameters (synthetic,
a user's arrays or image folder) and those loaded through torchvision's own classes are
never cached here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from raymtl.data.source_registry import Pool
from raymtl.paths import raymtl_home

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is written changes: older entries are then never read


def cache_root() -> Path:
    return raymtl_home() / "cache" / "pools"


def cache_key(name: str, files: list[Path]) -> str:
    digest = hashlib.sha256(f"{name}:{FORMAT}\n".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def read_entry(folder: Path) -> Pool:
    meta = json.loads((folder / "meta.json").read_text())
    return Pool(
        x=torch.from_numpy(np.load(folder / "x.npy")),
        y=torch.from_numpy(np.load(folder / "y.npy")),
        num_classes=meta["num_classes"],
        class_names=tuple(meta["class_names"]),
        scale=meta["scale"],
        source=meta["source"],
        test_start=meta["test_start"],
    )


def write_entry(folder: Path, pool: Pool) -> None:
    """Write the entry whole or not at all: into a scratch folder, then renamed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        np.save(scratch / "x.npy", pool.x.numpy())
        np.save(scratch / "y.npy", pool.y.numpy())
        meta = {
            "num_classes": pool.num_classes,
            "class_names": list(pool.class_names),
            "scale": pool.scale,
            "source": pool.source,
            "test_start": pool.test_start,
        }
        (scratch / "meta.json").write_text(json.dumps(meta))
        scratch.rename(folder)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        if not folder.is_dir():  # another process may have written it first
            raise


def cached_pool(name: str, files: list[Path], decode: Callable[[], Pool]) -> Pool:
    """The pool decoded from `files`, from the cache when it holds it (else decoded, then
    kept for the next process)."""
    if os.environ.get("RAYMTL_POOL_CACHE", "1") == "0":
        return decode()
    folder = cache_root() / f"{name}-{cache_key(name, files)}"
    if (folder / "meta.json").is_file():
        try:
            return read_entry(folder)
        except (OSError, ValueError, KeyError) as error:  # damaged: decoded again below
            log.warning("pool cache %s unreadable (%s): decoding %s again", folder, error, name)
            shutil.rmtree(folder, ignore_errors=True)
    pool = decode()
    try:
        write_entry(folder, pool)
    except OSError as error:
        log.info("pool cache not written (%s): %s", folder, error)
    return pool

"""`raymtl list` without torch: the catalogue's rows kept on disk between commands, and the
tables they are printed as.

Filling the registries imports every algorithm, model and dataset module, and with them torch:
seconds on a busy 2-core machine, for rows that change only with raymtl's code or the
packages it runs on. So a `raymtl list` that filled them itself keeps the rows in
`raymtl_home()/cache/catalogue/<key>.json`, and the next one prints them without importing
torch. The key hashes raymtl's code (every module's path, size and modification time), the
interpreter and the versions of the packages the rows quote (torch, torchvision, pydantic).

The cache is read and written only by a process that has not imported the registries yet and
loads no plugin: there, the registries hold raymtl's own entries and nothing else. A process
that imported them already (a notebook, a command forked from `raymtl up`) or loads plugins
builds the rows itself, and keeps none. RAYMTL_CATALOGUE_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from raymtl.paths import raymtl_home
from raymtl.runtime.warm.preload import code_fingerprint, python_identity

log = logging.getLogger(__name__)

# (title, rows): one registry; a row is (name, what, parameters).
Section = tuple[str, list[tuple[str, str, str]]]
# Modules whose import fills the registries: one already imported may hold entries of code
# that is not raymtl's (a plugin, a notebook's own registrations).
REGISTRY_MODULES = (
    "raymtl.algorithms",
    "raymtl.models",
    "raymtl.data",
    "raymtl.graph",
    "raymtl.tasks",
    "raymtl.api.catalogue",
)
QUOTED_PACKAGES = ("torch", "torchvision", "pydantic")
FORMAT = 1  # of the cache file: a new format is a new key


def table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    """One registry as `raymtl list` prints it."""
    result = Table(title=title, title_justify="left", show_lines=False)
    for column in ("name", "what", "parameters"):
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*(escape(cell) for cell in row))  # "[i, j]" is text, not markup
    return result


def cache_file() -> Path | None:
    """Where this code's catalogue is kept; None where the cache may not be used (turned
    off, or the registries imported already in this process)."""
    if os.environ.get("RAYMTL_CATALOGUE_CACHE", "1") == "0":
        return None
    if any(name in sys.modules for name in REGISTRY_MODULES):
        return None
    versions = []
    for package in QUOTED_PACKAGES:
        try:
            versions.append(f"{package}={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package}=-")
    identity = [f"format={FORMAT}", code_fingerprint(), *python_identity(), *versions]
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return raymtl_home() / "cache" / "catalogue" / f"{key}.json"


def cached_sections(path: Path | None) -> list[Section] | None:
    """The sections kept at `path`; None when there are none (or they cannot be read)."""
    if path is None:
        return None
    try:
        sections = json.loads(path.read_text())
        return [(title, [tuple(row) for row in rows]) for title, rows in sections]
    except (OSError, ValueError, TypeError):
        return None


def keep_sections(path: Path | None, sections: list[Section]) -> None:
    """Write `sections` at `path` (atomically), and drop the files of other keys: code that
    changed never comes back to an old key. A home that cannot be written is skipped."""
    if path is None:
        return
    written = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, suffix=".partial", delete=False
        ) as written:
            json.dump(sections, written)
        os.replace(written.name, path)
        for other in path.parent.glob("*.json"):
            if other != path:
                other.unlink(missing_ok=True)
    except OSError as error:
        log.info("raymtl list: catalogue not cached in %s (%s)", path.parent, error)
        if written is not None:
            Path(written.name).unlink(missing_ok=True)

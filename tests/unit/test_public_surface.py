"""raymtl.runtime is internal: what users read and copy (examples, docs, README, job files'
plugins) imports only the public surface: `raymtl`, `raymtl.api`, `raymtl.extend` (and the
pure packages a plugin builds on). Inside raymtl, import-linter's `internal` contract keeps
every package but the API, the CLI and the entry points off it (pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

import raymtl

ROOT = Path(__file__).resolve().parents[2]
INTERNAL_IMPORT = re.compile(r"^\s*(from|import)\s+raymtl\.runtime\b", re.MULTILINE)


def user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("examples", "jobs"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def test_examples_and_docs_import_no_internal_module():
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for path in user_facing_files()
        for match in INTERNAL_IMPORT.finditer(path.read_text())
    ]
    assert user_facing_files() and not offenders, offenders


def test_the_public_surface_reaches_what_users_run():
    for name in ("run", "resume", "compare", "tune", "Federation", "Results", "load_results"):
        assert name in raymtl.__all__, name
    from raymtl import extend

    registrars = {n for n in extend.__all__ if n.startswith("register_")}
    assert {"register_algorithm", "register_model", "register_dataset"} <= registrars

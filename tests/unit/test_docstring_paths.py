"""Every file a docstring or comment of raymtl/ names exists in the repository.

A docstring that points a reader at `warm.py` or `metrics/flops.py` after the file moved
sends them nowhere. Every module, class and function docstring (read with `ast`) and every
comment (read with `tokenize`) of raymtl/**/*.py is searched for names that look like files
of this repository: any `name.py` or `name.md`, bare or with folders, and a path of another
kind (yaml, toml, txt, ...) that starts at a top-level folder of the repository (`jobs/`,
`docs/`, `benchmarks/`, ...). A bare name matches a file of that name anywhere in the
repository; a name with folders matches a real path that ends with it.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "raymtl"

# Folders that hold no file of the repository (caches, run outputs; .gitignore's), anywhere
# and at the top (raymtl/data is the package's, /data the downloads').
PRUNED = {"__pycache__", "runs", "build", "node_modules"}
PRUNED_AT_TOP = {"data"}

# Extensions looked for anywhere, bare or with folders.
SOURCE_EXTENSIONS = ("py", "md")
# Extensions looked for only in a path that starts at a top-level folder of the repository:
# bare, they are mostly a run's outputs (config.yaml, summary.json, table.csv).
PATH_EXTENSIONS = ("yaml", "yml", "toml", "txt", "cfg", "ini", "sh", "json", "csv", "png")

# A file name, with or without folders, not inside a longer path, URL or dotted name.
FILE_NAME = re.compile(
    r"(?<![\w./~$-])"
    r"((?:[\w.-]+/)*[\w-]+\.(?:" + "|".join(SOURCE_EXTENSIONS + PATH_EXTENSIONS) + r"))"
    r"(?![\w/-])"
)

# Names that are not this repository's files, each with why: (module or "*", name) -> reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("raymtl/data/leaf_synthetic.py", "generate_synthetic.py"): (
        "LEAF's own generator script (TalwalkarLab/leaf), which the module follows"
    ),
    ("raymtl/data/text.py", "models/utils/language_utils.py"): (
        "LEAF's own file that defines the Shakespeare alphabet"
    ),
    ("raymtl/runtime/warm/service.py", "jobs/x.yaml"): (
        "a placeholder experiment file in a usage example"
    ),
}


def repository_files(root: Path = ROOT) -> list[str]:
    """Every file under `root`, as a '/'-separated path relative to it (hidden folders,
    caches, environments and run outputs left out)."""
    found = []
    for folder, folders, names in os.walk(root):
        folders[:] = [
            name
            for name in folders
            if not name.startswith(".")
            and name not in PRUNED
            and not (name in PRUNED_AT_TOP and Path(folder) == root)
            and not name.endswith(".egg-info")
        ]
        relative = Path(folder).relative_to(root)
        found += [(relative / name).as_posix() for name in names]
    return found


def candidates(text: str, top_folders: set[str]) -> Iterator[tuple[int, str]]:
    """(offset in `text`, name) of each name in `text` that looks like a repository file."""
    for match in FILE_NAME.finditer(text):
        name = match.group(1)
        extension = name.rsplit(".", 1)[1]
        if extension in SOURCE_EXTENSIONS or ("/" in name and name.split("/", 1)[0] in top_folders):
            yield match.start(1), name


def exists(name: str, files: list[str]) -> bool:
    """A bare name: some file has that name. A path: some file's path ends with it."""
    if "/" not in name:
        return any(path.rsplit("/", 1)[-1] == name for path in files)
    return any(path == name or path.endswith("/" + name) for path in files)


def documented_text(source: str) -> Iterator[tuple[int, str, str]]:
    """(first line, what it documents, text) of every module, class and function docstring
    of `source`, and of every comment."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        docstring = ast.get_docstring(node, clean=False)
        if docstring is None:
            continue
        what = "module" if isinstance(node, ast.Module) else f"docstring of {node.name}"
        yield node.body[0].lineno, what, docstring
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], "comment", token.string


def missing_names(package: Path = PACKAGE, root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """(module, line, what, name) of every file named under `package` that `root` lacks."""
    files = repository_files(root)
    top_folders = {path.split("/", 1)[0] for path in files if "/" in path}
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for first_line, what, text in documented_text(path.read_text(encoding="utf-8")):
            for offset, name in candidates(text, top_folders):
                if exists(name, files):
                    continue
                line = first_line + text.count("\n", 0, offset)
                found.append((module, line, what, name))
    return found


def test_docstrings_and_comments_name_existing_files():
    missing = [
        finding
        for finding in missing_names()
        if (finding[0], finding[3]) not in ALLOWED and ("*", finding[3]) not in ALLOWED
    ]
    lines = [
        f"{module}:{line} ({what}) names {name}, no file of the repository"
        for module, line, what, name in missing
    ]
    assert not lines, "\n".join(lines)


def test_every_allowed_name_is_still_named_and_missing():
    # An allow-list entry nothing needs any more (the docstring was fixed, or the file now
    # exists) is removed rather than left to hide a later mistake.
    named = {(module, name) for module, _, _, name in missing_names()}
    unused = [entry for entry in ALLOWED if entry not in named and entry[0] != "*"]
    assert not unused, f"allow-list entries no longer needed: {unused}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_names_found_and_matched_as_the_rules_say():
    files = ["raymtl/flops.py", "raymtl/runtime/actors/pool.py", "docs/EXTENDING.md", "jobs/a.yaml"]
    top = {"raymtl", "docs", "jobs"}
    text = (
        "see `pool.py`, actors/pool.py, raymtl/flops.py and metrics/flops.py; docs/EXTENDING.md "
        "and jobs/b.yaml; not https://example.org/x/setup.py, config.yaml, raymtl.config, "
        "*.py, <name>.py or ~/.raymtl/up.json"
    )
    names = [name for _, name in candidates(text, top)]
    assert names == [
        "pool.py",
        "actors/pool.py",
        "raymtl/flops.py",
        "metrics/flops.py",
        "docs/EXTENDING.md",
        "jobs/b.yaml",
    ]
    assert [name for name in names if not exists(name, files)] == [
        "metrics/flops.py",
        "jobs/b.yaml",
    ]
    assert not exists("ctors/pool.py", files)  # a path matches whole folder names only


def test_a_missing_name_is_reported_with_its_line(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "real.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(
        '"""Module.\n\nSee real.py and gone.py."""\n\n\ndef f():\n    """Uses old/real.py."""\n'
        "    # pkg/real.py holds it\n"
    )
    found = missing_names(tmp_path / "pkg", tmp_path)
    assert found == [
        ("pkg/mod.py", 3, "module", "gone.py"),
        ("pkg/mod.py", 7, "docstring of f", "old/real.py"),
    ]

"""Only raymtl/runtime may import Ray: algorithms and graph code stay pure, and never reach
into the runtime (the runtime calls them, not the other way round)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "raymtl"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # walks function bodies too: lazy imports count
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ["algorithms", "graph", "data", "models", "metrics", "tasks"])
def test_pure_packages_never_import_ray(package):
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in (PACKAGE / package).rglob("*.py")
        if "ray" in imported_modules(path)
    ]
    assert offenders == []


@pytest.mark.parametrize("package", ["algorithms", "graph"])
def test_algorithms_and_graph_never_import_the_runtime(package):
    offenders = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in sorted(imported_module_paths(path))
        if name == "raymtl.runtime" or name.startswith("raymtl.runtime.")
    ]
    assert offenders == []


def test_importing_the_algorithms_loads_neither_ray_nor_the_runtime():
    code = (
        "import raymtl.algorithms, raymtl.graph, sys; "
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('raymtl.runtime')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_data_package_has_no_import_circle():
    """task_splits.py and partitions.py share shards.py; task_splits never imports partitions."""
    data = PACKAGE / "data"
    modules = {path.stem: imported_module_paths(path) for path in data.glob("*.py")}
    assert "raymtl.data.partitions" not in modules["task_splits"]
    assert "raymtl.data.partitions" not in modules["shards"]
    assert "raymtl.data.task_splits" not in modules["shards"]


def imported_module_paths(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names

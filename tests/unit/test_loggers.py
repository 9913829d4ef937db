"""Every module-level logger of raymtl/ is used by its module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "raymtl"


def unused_loggers(package: Path = PACKAGE) -> list[str]:
    """'module: name' for each module-level `name = logging.getLogger(...)` never read."""
    unused = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        read = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            if not ast.unparse(node.value.func).endswith("getLogger"):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id not in read:
                    unused.append(f"{path.relative_to(package.parent).as_posix()}: {target.id}")
    return unused


def test_no_unused_module_loggers():
    assert unused_loggers() == []


def test_an_unused_logger_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "quiet.py").write_text(
        "import logging\nlog = logging.getLogger(__name__)\n"
    )
    (tmp_path / "pkg" / "loud.py").write_text(
        "import logging\nlog = logging.getLogger(__name__)\n\ndef f():\n    log.info('x')\n"
    )
    assert unused_loggers(tmp_path / "pkg") == ["pkg/quiet.py: log"]

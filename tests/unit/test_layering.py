"""The house's layers (pyproject.toml's import-linter contracts: a layer imports only those
below it, function-level imports included; only the runtime imports Ray; no import circles
between the modules or packages of any package), and what importing a package loads: `import
raymtl` loads neither Ray nor torch, the pure packages load neither Ray nor the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_linter_keeps_every_contract():
    # In a process of its own: import-linter's command line, run in this one after a test has
    # imported absl (dp-accounting's logging), leaves pytest's captured stderr closed.
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "Contracts: 5 kept, 0 broken." in report


# One fresh interpreter: what `import raymtl` loads, then what the pure packages add to it.
PROBE = """
import json, sys
import raymtl
names = ("run", "compare", "tune", "Results", "Comparison", "ExperimentConfig", "Callback",
         "RoundEvent", "Federation", "MLflowCallback", "RunStopped", "register_algorithm")
top = sorted(sys.modules)
import raymtl.algorithms, raymtl.graph, raymtl.tasks, raymtl.models, raymtl.data
import raymtl.algorithms.batched
print(json.dumps({
    "raymtl": [m for m in ("ray", "torch") if m in top],
    "missing": [n for n in names if n not in dir(raymtl)],
    "own_imports": [n for n in ("importlib", "annotations") if n in dir(raymtl)],
    "pure": sorted(m for m in sys.modules
                   if m == "ray" or m.startswith(("ray.", "raymtl.runtime"))),
}))
"""


def test_importing_loads_only_what_each_layer_needs():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded == {"raymtl": [], "missing": [], "own_imports": [], "pure": []}

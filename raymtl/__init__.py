"""raymtl: federated multi-task learning on Ray.

From Python, as from the command line:

    import raymtl
    results = raymtl.run("jobs/fedavg_digits.yaml", overrides=["rounds=5"])
    results.rounds.tail()            # pandas frames: clients, rounds, messages, every table
    results.summary["final"]         # summary.json
    comparison = raymtl.compare(["jobs/fedavg_digits.yaml"], ["algorithm.name=fedavg,local"])
    comparison.table                 # table.csv
    sweep = raymtl.tune("jobs/fedavg_digits.yaml", ["algorithm.params.lr=loguniform(1e-3, 1e-1)"])
    sweep.table, sweep.best_file     # the trials, best first; best.yaml (raymtl run it)

An experiment is an `ExperimentConfig`, a mapping or a YAML path; `callbacks=[...]` run after
every round (`raymtl.Callback`); `raymtl.Federation(cfg)` runs one seed round by round; the
names a plugin author needs (`raymtl.extend`) are here too.

Names resolve lazily: importing raymtl starts nothing and imports neither Ray nor torch.
"""

from __future__ import annotations

import importlib

# Public name -> the module that defines it; raymtl.extend's names are added on first use.
EXPORTS = {
    "run": "raymtl.api.running",
    "resume": "raymtl.api.running",
    "load_results": "raymtl.api.results",
    "Results": "raymtl.api.results",
    "compare": "raymtl.api.comparison",
    "tune": "raymtl.api.tuning",
    "Sweep": "raymtl.api.tuning",
    "Comparison": "raymtl.api.comparison",
    "ExperimentConfig": "raymtl.config",
    "ConfigError": "raymtl.config",
    "RunStopped": "raymtl.runtime.faults",
    "StepFailed": "raymtl.errors",
    "Callback": "raymtl.api.callbacks",
    "RoundEvent": "raymtl.api.callbacks",
    "Federation": "raymtl.api.federation",
    "MLflowCallback": "raymtl.api.mlflow",
}
EXTEND = "raymtl.extend"


def extension_names() -> list[str]:
    """`raymtl.extend.__all__` (importing it imports torch: done only when asked)."""
    return [name for name in importlib.import_module(EXTEND).__all__ if name not in EXPORTS]


def __getattr__(name: str):
    if name in EXPORTS:
        return getattr(importlib.import_module(EXPORTS[name]), name)
    if name == "__all__":  # `from raymtl import *`
        return sorted(EXPORTS) + extension_names()
    if not name.startswith("_") and name in extension_names():
        return getattr(importlib.import_module(EXTEND), name)
    raise AttributeError(f"module 'raymtl' has no attribute {name!r}")


def __dir__() -> list[str]:
    # A notebook's completion lists what a user may reach, not what this module imports.
    own = set(globals()) - {"annotations", "importlib"}
    return sorted({*own, *EXPORTS, *extension_names()})

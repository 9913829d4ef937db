"""raymtl's internals: no name here is a public API, and any may change between releases.
The public surface is `raymtl` (run, resume, compare, tune, Federation, Results, ...),
`raymtl.api`, `raymtl.extend` and its `register_*` decorators; the `internal` contract of
import-linter (pyproject.toml) keeps every package but the API, the CLI and the entry points
from importing this one, and tests/unit/test_public_surface.py keeps examples and docs off it.

The only package that imports Ray, in subpackages by responsibility (top to bottom):
`trials` (Ray Tune), `loop` (federation, rounds, driver), `executors` (where hosts run and
how they are laid out), `warm` (`raymtl up`), `actors` (Ray actors and their pool), `hosts`
(what runs inside one), `storage` (run folders, checkpoints). Beside them, what they all
speak: `router` (envelopes, the bit ledger), `results` (what calls return), `faults`
(faults.parquet rows, `RunStopped`).

Exports are resolved lazily: actors import `raymtl.runtime.hosts.host`, and must not pay for
the driver's plotting and reporting imports.
"""

# name -> the module that defines it
EXPORTS = {
    "Federation": "raymtl.runtime.loop.federation",
    "resume_experiment": "raymtl.runtime.loop.experiment",
    "run_experiment": "raymtl.runtime.loop.experiment",
    "start_ray": "raymtl.runtime.executors.launch",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name in EXPORTS:
        import importlib

        return getattr(importlib.import_module(EXPORTS[name]), name)
    raise AttributeError(name)

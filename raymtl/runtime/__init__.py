"""The only package that imports Ray: actors, executors, router and the round loop.

Exports are resolved lazily: actors import `raymtl.runtime.host`, and must not pay for
the driver's plotting and reporting imports.
"""

# name -> the module that defines it
EXPORTS = {
    "Federation": "raymtl.runtime.federation",
    "resume_experiment": "raymtl.runtime.api",
    "run_experiment": "raymtl.runtime.api",
    "start_ray": "raymtl.runtime.launch",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name in EXPORTS:
        import importlib

        return getattr(importlib.import_module(EXPORTS[name]), name)
    raise AttributeError(name)

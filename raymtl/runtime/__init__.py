"""The only package that imports Ray: actors, executors, router and the round loop.

Exports are resolved lazily: actors import `raymtl.runtime.host`, and must not pay for
the driver's plotting and reporting imports.
"""

__all__ = ["resume_experiment", "run_experiment", "start_ray"]


def __getattr__(name: str):
    if name in __all__:
        from raymtl.runtime import api

        return getattr(api, name)
    raise AttributeError(name)

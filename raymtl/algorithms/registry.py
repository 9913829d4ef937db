"""The one place where algorithm names map to algorithm classes.

    @register
    class FedAvg(Algorithm):
        name = "fedavg"
        ...

Everything else (config validation, the CLI's `list`, the runtime hosts) looks
algorithms up here, so adding an algorithm never touches an if/elif chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raymtl.algorithms.base import Algorithm

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make `cls` available under `cls.name`."""
    if cls.name in ALGORITHMS:
        raise ValueError(f"algorithm.name: '{cls.name}' is registered twice")
    ALGORITHMS[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name` (one-line error otherwise)."""
    _load_builtin()
    if name not in ALGORITHMS:
        allowed = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"algorithm.name: '{name}' is not one of {allowed}")
    return ALGORITHMS[name]


def all_algorithms() -> dict[str, type[Algorithm]]:
    """Every registered algorithm, by name."""
    _load_builtin()
    return dict(sorted(ALGORITHMS.items()))


def _load_builtin() -> None:
    # Importing the package registers the built-in algorithms (decorators run on import).
    import raymtl.algorithms  # noqa: F401

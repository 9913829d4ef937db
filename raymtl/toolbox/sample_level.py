"""Which local training runs sample-level DP-SGD (`privacy.sample_level`): a scope a client's
host opens around the client's step, so that `local_sgd` wraps its model and optimiser with
Opacus (raymtl/toolbox/sample_dp.py) without any algorithm knowing. Each `local_sgd` call in
the scope adds (steps, samples, batch size) to the scope's list: the host turns them into the
client's ε (accounting.sample_level_epsilon)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from raymtl.toolbox.settings import SampleLevelSettings

Scope = tuple[SampleLevelSettings, list[tuple[int, int, int]]]
_ACTIVE: ContextVar[Scope | None] = ContextVar("raymtl_sample_level", default=None)


@contextmanager
def sample_level(settings: SampleLevelSettings | None) -> Iterator[list[tuple[int, int, int]]]:
    """Local training inside the block runs DP-SGD with `settings` (None: plain SGD); yields
    the list the runs add (steps, samples, batch size) to."""
    taken: list[tuple[int, int, int]] = []
    token = _ACTIVE.set((settings, taken) if settings is not None else None)
    try:
        yield taken
    finally:
        _ACTIVE.reset(token)


def active() -> Scope | None:
    """The open scope's (settings, runs), or None: plain local SGD."""
    return _ACTIVE.get()

"""Plugins: the user's own modules that register algorithms, models, datasets, partitions,
topologies or task targets. (Interface stub: the plugins helper completes it.)

`load_plugins(entries)` imports each entry (a module name, or a path to a .py file) once per
process; the driver calls it before validating the experiment and every host before it
builds anything.
"""

from __future__ import annotations

import importlib


def load_plugins(entries) -> None:
    """Import every plugin module named in `entries` (idempotent)."""
    for entry in entries or ():
        importlib.import_module(entry)

"""raymtl's own folder on this machine: `raymtl up`'s state and log, the decoded-pool cache."""

from __future__ import annotations

import os
from pathlib import Path


def raymtl_home() -> Path:
    """$RAYMTL_HOME, else ~/.raymtl: up.json and up.log of `raymtl up`, cache/pools/."""
    return Path(os.environ.get("RAYMTL_HOME") or Path.home() / ".raymtl")

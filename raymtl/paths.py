"""Folders raymtl writes: its own folder on this machine (`raymtl up`'s state and log, the
decoded-pool cache) and run or comparison folders, made with one clear error line."""

from __future__ import annotations

import os
from pathlib import Path

from raymtl.errors import ConfigError


def raymtl_home() -> Path:
    """$RAYMTL_HOME, else ~/.raymtl: up.json and up.log of `raymtl up`, cache/pools/."""
    return Path(os.environ.get("RAYMTL_HOME") or Path.home() / ".raymtl")


def make_directory(path: Path, exist_ok: bool = False) -> Path:
    """`mkdir -p` that turns a permission or file-system error into one ConfigError line."""
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        raise ConfigError(f"output.dir: '{path}' exists already") from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"output.dir: cannot create '{path}' ({reason})") from None
    return path.resolve()

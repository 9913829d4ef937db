"""Directories raymtl writes (run and comparison folders): made with one clear error line."""

from __future__ import annotations

from pathlib import Path


def make_directory(path: Path, exist_ok: bool = False) -> Path:
    """`mkdir -p` that turns a permission or file-system error into one ConfigError line."""
    from raymtl.config import ConfigError

    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        raise ConfigError(f"output.dir: '{path}' exists already") from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"output.dir: cannot create '{path}' ({reason})") from None
    return path.resolve()

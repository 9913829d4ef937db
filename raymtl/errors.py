"""The one-line error every part of raymtl raises for what a user gave: `ConfigError`, and the
one line taken from any exception. It imports nothing, so every layer may raise it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A one-line, user-facing configuration error naming the field."""


def one_line(error: BaseException) -> str:
    """The first line of an exception's text (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

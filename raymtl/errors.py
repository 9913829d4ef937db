"""The one-line error every part of raymtl raises for what a user gave: `ConfigError`; an
exception inside an algorithm's step: `StepFailed`; and the one line taken from any exception
(with where it was raised). It imports nothing of raymtl, so every layer may raise them."""

from __future__ import annotations

import sys
import traceback


class ConfigError(ValueError):
    """A one-line, user-facing configuration error naming the field."""


def one_line(error: BaseException) -> str:
    """The first line of an exception's text (its type name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class StepFailed(RuntimeError):
    """An exception raised inside an algorithm's step (a plugin's code, or a built-in's bug):
    `line` names the algorithm, its class, the step, the exception and where it was raised;
    `details` is the step's whole traceback, for the run's log file (run.log). It crosses
    processes whole (a Ray actor's step), so both travel with it."""

    def __init__(self, line: str, details: str = ""):
        super().__init__(line)
        self.line, self.details = line, details

    def __reduce__(self):
        return type(self), (self.line, self.details)


def raised_at(error: BaseException, code: type) -> str:
    """Where `error` was raised, as 'file:line': its innermost frame in the file of `code` or
    of a class `code` derives from, in its own package or raymtl (a plugin's class, or the
    built-in one it extends; not torch's or pydantic's), else its innermost frame ('' without
    a traceback)."""
    packages = {code.__module__.partition(".")[0], "raymtl"}
    bases = [k for k in code.__mro__ if k.__module__.partition(".")[0] in packages]
    files = {source_file(k) for k in bases} - {None}
    frames = traceback.extract_tb(error.__traceback__)
    ours = [frame for frame in frames if frame.filename in files]
    frame = (ours or frames or [None])[-1]
    return "" if frame is None else f"{frame.filename}:{frame.lineno}"


def source_file(code: type) -> str | None:
    """The file a class is defined in (None for one defined nowhere on disk)."""
    return getattr(sys.modules.get(code.__module__), "__file__", None)


def raised(error: BaseException) -> str:
    """'KeyError: 'missing'': an exception's type and the first line of its text."""
    text = str(error).strip()
    return f"{type(error).__name__}: {one_line(error)}" if text else type(error).__name__

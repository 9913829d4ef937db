"""The one-line error every part of raymtl raises for what a user gave: `ConfigError`; an
exception inside an algorithm's step: `StepFailed`; and the one line taken from any exception
(with where it was raised). It imports nothing of raymtl, so every layer may raise them."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Frame:
    """Where an exception was raised: its file, line and function (qualified name)."""

    file: str
    line: int
    function: str


def raised_in(error: BaseException, code: type) -> Frame | None:
    """The frame `error` was raised in: its innermost frame in the file of `code` or of a
    class `code` derives from, in its own package or raymtl (a plugin's class, or the
    built-in one it extends; not torch's or pydantic's), else its innermost frame (None
    without a traceback)."""
    packages = {code.__module__.partition(".")[0], "raymtl"}
    bases = [k for k in code.__mro__ if k.__module__.partition(".")[0] in packages]
    files = {source_file(k) for k in bases} - {None}
    tb = error.__traceback__
    # The lines as tracebacks print them; the functions' qualified names from their frames
    # (both from the outermost frame on).
    summaries, walked = traceback.extract_tb(tb), traceback.walk_tb(tb)
    frames = [
        Frame(summary.filename, summary.lineno, frame.f_code.co_qualname)
        for summary, (frame, _) in zip(summaries, walked, strict=False)
    ]
    ours = [frame for frame in frames if frame.file in files]
    return (ours or frames or [None])[-1]


def raised_at(error: BaseException, code: type) -> str:
    """Where `error` was raised (`raised_in`), as 'file:line' ('' without a traceback)."""
    frame = raised_in(error, code)
    return "" if frame is None else f"{frame.file}:{frame.line}"


def step_raised(code: type, step: str, error: BaseException, context: str) -> str:
    """'Cls.step raised KeyError: 'x' (file:line; context)' for an exception raised in
    algorithm class `code`'s `step`. When the function that raised is another one (a hook
    the step calls: FedAvg's `aggregate` calling a plugin's `merge`), it is named too:
    'Cls.aggregate (in Cls.merge, file:line) raised ValueError: text (context)'."""
    called = f"{code.__qualname__}.{step}"
    frame = raised_in(error, code)
    if frame is None:
        return f"{called} raised {raised(error)} ({context})"
    where = f"{frame.file}:{frame.line}"
    if frame.function.rpartition(".")[2] != step:
        return f"{called} (in {frame.function}, {where}) raised {raised(error)} ({context})"
    return f"{called} raised {raised(error)} ({where}; {context})"


def source_file(code: type) -> str | None:
    """The file a class is defined in (None for one defined nowhere on disk)."""
    return getattr(sys.modules.get(code.__module__), "__file__", None)


def raised(error: BaseException) -> str:
    """'KeyError: 'missing'': an exception's type and the first line of its text."""
    text = str(error).strip()
    return f"{type(error).__name__}: {one_line(error)}" if text else type(error).__name__

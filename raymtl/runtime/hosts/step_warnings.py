"""Warnings that algorithm code logs during a step (a rejected non-finite update), caught on
the host: they become rows of warnings.parquet and lines on the driver's console, not lines
lost in a worker's log."""

from __future__ import annotations

import logging


class AlgorithmWarnings(logging.Handler):
    """Collects what `raymtl.algorithms` loggers warn about while it is entered."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("raymtl.algorithms").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("raymtl.algorithms").removeHandler(self)

"""Warnings that algorithm code logs during a step (a rejected non-finite update), caught on
the host: they become rows of warnings.parquet and lines on the driver's console, not lines
lost in a worker's log.

While a step runs they go to the host's collector only, not on to the process's own
handlers as well: an inline run (hosts in the driver's process) would otherwise print each
one raw and then again as the driver's summary line (round_loop.py)."""

from __future__ import annotations

import logging
import threading

ALGORITHMS = "raymtl.algorithms"

_lock = threading.Lock()
_entered = 0  # collectors entered (threads of one process): propagation is off while > 0
_propagate = True  # the logger's own setting, restored when the last collector leaves


class AlgorithmWarnings(logging.Handler):
    """Collects what `raymtl.algorithms` loggers warn about while it is entered; their
    records below WARNING (RAYMTL_LOG=INFO) go on to the usual handlers."""

    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage())
            return
        logger = logging.getLogger(ALGORITHMS)
        collectors = [h for h in logger.handlers if isinstance(h, AlgorithmWarnings)]
        if collectors and collectors[0] is self and logger.parent is not None:
            logger.parent.handle(record)  # what propagation would have done, once

    def __enter__(self):
        global _entered, _propagate
        logger = logging.getLogger(ALGORITHMS)
        with _lock:
            if _entered == 0:
                _propagate = logger.propagate
            _entered += 1
            logger.propagate = False
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        global _entered
        logger = logging.getLogger(ALGORITHMS)
        logger.removeHandler(self)
        with _lock:
            _entered -= 1
            if _entered == 0:
                logger.propagate = _propagate

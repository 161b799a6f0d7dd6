"""Structured (logfmt) logging, quiet by default."""

from __future__ import annotations

import logging
import sys
from typing import Any

from components.errors import TritonshipError


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        parts = [f"{self.formatTime(record, '%H:%M:%S')}", record.levelname.lower(), record.name, record.getMessage()]
        parts += [f"{k}={_quote(v)}" for k, v in fields.items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _StderrHandler(logging.StreamHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], TritonshipError):
            raise  # a signal's Cancelled, raised while this line was written: logging would swallow it
        super().handleError(record)


def _quote(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


def configure(verbosity: int = 0) -> None:
    """0: warnings only, 1: info (steps and figures), 2+: debug (also our dependencies at info)."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if verbosity < 2 else logging.INFO)
    logging.getLogger("tritonship").setLevel(level)


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"tritonship.{name}")


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `message` with key=value fields."""
    logger.log(level, message, extra={"fields": fields})

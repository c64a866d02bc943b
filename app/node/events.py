"""Structured logs: one JSON object per line on stderr, with a stable ``event`` name.

State transitions (DESIGN.md §9) are emitted exactly once, where they happen, through
``EventLog.emit``; ordinary log records go through ``logging`` and are formatted as
JSON by ``JsonFormatter``, so every line an operator greps is one object.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import TextIO


class EventLog:
    """Writes ``{"ts", "level", "event", ...fields}`` lines; thread-safe."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()

    def emit(
        self, event: str, fields: Mapping[str, object] | None = None, level: str = "info"
    ) -> None:
        record: dict[str, object] = {"ts": round(time.time(), 3), "level": level, "event": event}
        if fields:
            record.update(fields)
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def __call__(self, event: str, fields: Mapping[str, object]) -> None:
        self.emit(event, fields, _LEVELS.get(event, "info"))


#: Events that deserve more than info.
_LEVELS = {
    "wal.rotation.retrying": "warning",
    "wal.rotation.terminal": "error",
    "wal.segment.sealed": "warning",
    "barrier.latch.set": "error",
    "disk.low_water": "warning",
    "disk.stop_water": "error",
    "disk.reserve.released": "warning",
    "snapshot.install.failed": "warning",
    "wal.unreclaimed.limit": "error",
    "wal.archive.failed": "error",
    "wal.segment.quarantined": "error",
    "server.start_failed": "error",
    "tenant.unrecoverable": "error",
    "tenant.settling": "warning",
    "tenant.frame_isolated": "error",
    "wal.floor.pinned": "warning",
    "tenant.share.exceeded": "warning",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": "log",
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

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
    """Writes ``{"ts", "level", "event", ...fields}`` lines; thread-safe.

    ``emit`` never raises: an event is emitted from inside the WAL's append, a cut, a
    tick, and a log that cannot be written (EPIPE, EIO, ENOSPC on a redirected stderr)
    must not fail any of them. A line that could not be written is counted in
    ``write_failures`` and the first failure of a run is reported on ``logging``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        #: event lines that could not be written (the stream raised)
        self.write_failures = 0
        self._failing = False

    def emit(
        self, event: str, fields: Mapping[str, object] | None = None, level: str = "info"
    ) -> None:
        record: dict[str, object] = {"ts": round(time.time(), 3), "level": level, "event": event}
        if fields:
            record.update(fields)
        try:
            line = json.dumps(record, default=str, separators=(",", ":"))
        except (TypeError, ValueError) as exc:  # a field json cannot take (a cycle)
            line = json.dumps(
                {**{k: record[k] for k in ("ts", "level", "event")}, "unencodable": str(exc)}
            )
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError) as exc:  # ValueError: the stream was closed
                self.write_failures += 1
                first, self._failing = not self._failing, True
                error = str(exc)
            else:
                self._failing = False
                return
        if first:
            logging.getLogger("ourios.events").error(
                "event %s could not be written (%s); events are counted, not raised", event, error
            )

    def __call__(self, event: str, fields: Mapping[str, object]) -> None:
        self.emit(event, fields, _LEVELS.get(event, "info"))


#: Events that deserve more than info.
_LEVELS = {
    "wal.rotation.retrying": "warning",
    "wal.rotation.terminal": "error",
    "wal.segment.sealed": "warning",
    "wal.torn_tail": "warning",
    "wal.high_water.failed": "warning",
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
    "sink.spool.started": "warning",
    "sink.store.unavailable": "warning",
    "sink.partition.dead_lettered": "warning",
    "thread.crashed": "error",
    "thread.failed": "error",
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

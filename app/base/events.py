"""Structured logs: one event per line on stderr, with a stable ``event`` name, in one
of two formats (``server.log_format``):

* ``json`` for machines: one object per line, ``{"ts", "level", "event", ...fields}``,
  ``ts`` an RFC 3339 UTC timestamp with milliseconds (``2026-12-05T16:21:06.123Z``);
* ``console`` for a person at a terminal: ``16:21:06.123 INFO  event key=value ...``,
  and ``server.listening`` rendered as a short start-up summary (ports, data directory,
  store, cadences, auth mode, how to stop).

``auto`` (the default) picks ``console`` when stderr is a terminal, else ``json``; the
core and its workers resolve it alike, since the workers inherit the core's stderr.

State transitions (DESIGN.md §9) are emitted exactly once, where they happen, through
``EventLog.emit``; ordinary log records go through ``logging`` and are formatted the same
way (``JsonFormatter``, ``ConsoleFormatter``), so every line an operator greps is one event.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal, TextIO

#: a resolved format (``auto`` is resolved by ``resolve_format``)
Format = Literal["json", "console"]


def resolve_format(setting: str, stream: TextIO | None = None) -> Format:
    """``server.log_format`` resolved against the stream the logs go to."""
    if setting in ("json", "console"):
        return "console" if setting == "console" else "json"
    target = stream if stream is not None else sys.stderr
    try:
        tty = target.isatty()
    except (AttributeError, ValueError):  # a closed or stream-less stderr
        tty = False
    return "console" if tty else "json"


def rfc3339(epoch: float) -> str:
    """``epoch`` as an RFC 3339 UTC timestamp with milliseconds."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventLog:
    """Writes one line per event in the log's format; thread-safe. Events at level
    ``debug`` are written only when ``debug`` is set (``server.log_level`` debug).

    ``emit`` never raises: an event is emitted from inside the WAL's append, a cut, a
    tick, and a log that cannot be written (EPIPE, EIO, ENOSPC on a redirected stderr)
    must not fail any of them. A line that could not be written is counted in
    ``write_failures`` and the first failure of a run is reported on ``logging``."""

    def __init__(
        self, stream: TextIO | None = None, *, fmt: Format = "json", debug: bool = False
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self.format: Format = fmt
        self._debug = debug
        #: event lines that could not be written (the stream raised)
        self.write_failures = 0
        self._failing = False

    def emit(
        self, event: str, fields: Mapping[str, object] | None = None, level: str = "info"
    ) -> None:
        if level == "debug" and not self._debug:
            return
        now = time.time()
        if self.format == "console":
            line = _console_event(now, level, event, fields or {})
        else:
            line = _json_event(now, level, event, fields or {})
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


def _json_event(now: float, level: str, event: str, fields: Mapping[str, object]) -> str:
    record: dict[str, object] = {"ts": rfc3339(now), "level": level, "event": event}
    record.update(fields)
    try:
        return json.dumps(record, default=str, separators=(",", ":"))
    except (TypeError, ValueError) as exc:  # a field json cannot take (a cycle)
        head = {k: record[k] for k in ("ts", "level", "event")}
        return json.dumps({**head, "unencodable": str(exc)})


def _console_event(now: float, level: str, event: str, fields: Mapping[str, object]) -> str:
    if event == "server.listening":
        return _console_head(now, level, "ourios is ready") + _summary(fields)
    parts = [_console_head(now, level, event)]
    for key, value in fields.items():
        parts.append(f"{key}={_console_value(value)}")
    return " ".join(parts)


def _console_head(now: float, level: str, text: str) -> str:
    clock = datetime.fromtimestamp(now, UTC).strftime("%H:%M:%S.%f")[:-3]
    return f"{clock}Z {level.upper():<7} {text}"


def _console_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if isinstance(value, str) and (not text or any(c in text for c in ' ="\n')):
        text = json.dumps(text)  # quoted so key=value pairs stay apart
    return text


def _summary(f: Mapping[str, object]) -> str:
    """``server.listening``'s fields as the lines a person starting a node reads."""
    host = f.get("host", "0.0.0.0")
    rows = [
        ("OTLP/HTTP", f"http://{host}:{f.get('http_port')}/v1/logs  (/metrics /healthz /readyz)"),
        ("OTLP/gRPC", f"{host}:{f.get('grpc_port')}"),
        ("data dir", f"{f.get('data_dir')}  (WAL {f.get('wal')})"),
        ("store", str(f.get("store"))),
        ("cadences", str(f.get("cadences"))),
        ("auth", str(f.get("auth"))),
        ("workers", _workers(f.get("workers"))),
        ("stop", str(f.get("stop"))),
    ]
    return "".join(f"\n    {name:<10} {value}" for name, value in rows)


def _workers(pids: object) -> str:
    if not isinstance(pids, list) or not pids:
        return "none (the receivers run in this process)"
    return f"{len(pids)} (pid {', '.join(str(p) for p in pids)})"


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
    "tenant.share.exceeded": "warning",
    "sink.spool.started": "warning",
    "sink.store.unavailable": "warning",
    "sink.partition.dead_lettered": "warning",
    "thread.crashed": "error",
    "thread.failed": "error",
}


class JsonFormatter(logging.Formatter):
    """A ``logging`` record as a ``json`` event line (``event`` is ``log``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "event": "log",
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class ConsoleFormatter(logging.Formatter):
    """A ``logging`` record as a ``console`` line: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_console_head(record.created, record.levelname.lower(), record.name)}: "
        line += record.getMessage()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str, stream: TextIO | None = None, fmt: Format = "json") -> None:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(ConsoleFormatter() if fmt == "console" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def open_logs(level: str, setting: str, stream: TextIO | None = None) -> EventLog:
    """The process's logs as ``server.log_level`` and ``server.log_format`` say: the root
    logger configured and the ``EventLog`` to emit events through, in one format."""
    fmt = resolve_format(setting, stream)
    configure_logging(level, stream, fmt)
    return EventLog(stream, fmt=fmt, debug=level == "debug")

"""``app.base.events``: every event and every log record is one JSON object per line."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import pty
import re
import sys
from pathlib import Path

import pytest

from app.base.events import (
    ConsoleFormatter,
    EventLog,
    JsonFormatter,
    configure_logging,
    open_logs,
    resolve_format,
    rfc3339,
)
from tests.support.walkit import SMALL, faulty, payload
from wal import Journal
from wal.errors import WalIoError

#: what a json event's ``ts`` is: RFC 3339, UTC, milliseconds
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_emit_writes_one_json_line_per_event() -> None:
    stream = io.StringIO()
    log = EventLog(stream)
    log.emit("wal.segment.sealed", {"segment": 7, "path": "/wal/00007.wal"}, level="warning")
    log.emit("barrier.cut", None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "wal.segment.sealed"
    assert first["level"] == "warning"
    assert first["segment"] == 7 and first["path"] == "/wal/00007.wal"
    assert RFC3339.fullmatch(first["ts"]), first["ts"]
    assert second["event"] == "barrier.cut" and second["level"] == "info"


def test_calling_the_log_picks_the_event_level() -> None:
    stream = io.StringIO()
    log = EventLog(stream)
    log("wal.rotation.terminal", {"errno": 28})
    log("some.ordinary.event", {})
    terminal, ordinary = (json.loads(line) for line in stream.getvalue().splitlines())
    assert terminal["level"] == "error" and terminal["errno"] == 28
    assert ordinary["level"] == "info"


def test_unserialisable_fields_are_written_as_text() -> None:
    stream = io.StringIO()
    EventLog(stream).emit("x", {"obj": object(), "text": "a\nb"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1  # an embedded newline does not split the object
    record = json.loads(lines[0])
    assert record["obj"].startswith("<object object")
    assert record["text"] == "a\nb"


def test_json_formatter_formats_a_log_record_with_its_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "ourios.x", logging.ERROR, __file__, 1, "m %d", (3,), sys.exc_info()
        )
    out = json.loads(JsonFormatter().format(record))
    assert out["event"] == "log" and out["level"] == "error"
    assert out["logger"] == "ourios.x" and out["message"] == "m 3"
    assert "ValueError: boom" in out["exception"]


def test_configure_logging_routes_the_root_logger_as_json() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        configure_logging("warning", stream)
        logging.getLogger("ourios.test").info("dropped")
        logging.getLogger("ourios.test").warning("kept %s", "here")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["kept here"]


class _BrokenStream(io.StringIO):
    """A redirected stderr that fails (EIO) until it is mended."""

    broken = True

    def write(self, text: str) -> int:
        if self.broken:
            raise OSError(errno.EIO, "Input/output error")
        return super().write(text)


def test_every_state_3_a_failed_event_write_raises_nothing_and_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EIO on the event stream: emit raises nothing, counts each lost line, says so once
    on ``logging``; a WAL append that emits through it is durable; writes resume."""
    stream = _BrokenStream()
    events = EventLog(stream)
    with caplog.at_level(logging.ERROR, "ourios.events"):
        events.emit("a", {})
        events("wal.rotation.terminal", {"attempts": 3})
    assert events.write_failures == 2
    assert len([r for r in caplog.records if r.name == "ourios.events"]) == 1
    fs = faulty(tmp_path)
    journal = Journal.open(tmp_path / "wal", SMALL, fs=fs, events=events)
    journal.commit("acme", payload(0))
    fs.fail("write", "*.wal")  # wal.segment.sealed, written to the broken stream
    with pytest.raises(WalIoError):
        journal.commit("acme", payload(1))
    journal.commit("acme", payload(2))
    journal.close()
    assert events.write_failures >= 3
    stream.broken = False
    events.emit("b", {})
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["b"]


def test_clone_6_json_events_and_log_records_carry_rfc3339_timestamps() -> None:
    stream = io.StringIO()
    EventLog(stream).emit("barrier.cut", {"epoch": 3})
    record = logging.LogRecord("ourios.x", logging.INFO, __file__, 1, "m", (), None)
    record.created = 1_796_487_818.4056
    event = json.loads(stream.getvalue())
    logged = json.loads(JsonFormatter().format(record))
    assert RFC3339.fullmatch(event["ts"]) and event["epoch"] == 3
    assert logged["ts"] == "2026-12-05T16:23:38.405Z" == rfc3339(record.created)


def test_clone_6_console_format_is_one_readable_line_per_event() -> None:
    stream = io.StringIO()
    log = EventLog(stream, fmt="console")
    log("wal.floor.pinned", {"tenants": 2, "example_tenants": ["a", "b"], "why": "no snap"})
    log.emit("config.effective", {"config": {"X": 1}}, "debug")  # dropped: not debug
    (line,) = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3}Z WARNING wal\.floor\.pinned tenants=2 "
        r'example_tenants=\["a", "b"\] why="no snap"',
        line,
    ), line
    record = logging.LogRecord("ourios.x", logging.ERROR, __file__, 1, "m %d", (3,), None)
    assert ConsoleFormatter().format(record).endswith(" ERROR   ourios.x: m 3")


def test_clone_6_console_renders_server_listening_as_the_start_up_summary() -> None:
    stream = io.StringIO()
    EventLog(stream, fmt="console").emit(
        "server.listening",
        {
            "http_port": 4318,
            "grpc_port": 4317,
            "host": "0.0.0.0",
            "data_dir": "./data",
            "wal": "data/wal",
            "store": "file:///data/objects",
            "workers": [11, 12],
            "cadences": "barrier 300 s",
            "auth": "open mode",
            "stop": "Ctrl-C",
        },
    )
    text = stream.getvalue()
    assert "ourios is ready" in text.splitlines()[0]
    for expected in (
        "OTLP/HTTP  http://0.0.0.0:4318/v1/logs",
        "OTLP/gRPC  0.0.0.0:4317",
        "data dir   ./data",
        "store      file:///data/objects",
        "cadences   barrier 300 s",
        "auth       open mode",
        "workers    2 (pid 11, 12)",
        "stop       Ctrl-C",
    ):
        assert expected in text, text
    assert len(text) < 600 and len(text.splitlines()) == 9


def test_clone_6_auto_is_console_on_a_terminal_and_json_elsewhere() -> None:
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(secondary, "w", closefd=False) as tty:
            assert resolve_format("auto", tty) == "console"
            assert resolve_format("json", tty) == "json"
    finally:
        os.close(primary)
        os.close(secondary)
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("console", io.StringIO()) == "console"
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        events = open_logs("debug", "console", stream)
        events.emit("config.effective", {"config": {}}, "debug")  # debug level: written
        logging.getLogger("ourios.test").debug("kept")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    first, second = stream.getvalue().splitlines()
    assert " DEBUG   config.effective config={}" in first
    assert second.endswith(" DEBUG   ourios.test: kept")

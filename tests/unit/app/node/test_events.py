"""``app.node.events``: every event and every log record is one JSON object per line."""

from __future__ import annotations

import errno
import io
import json
import logging
import sys
from pathlib import Path

import pytest

from app.node.events import EventLog, JsonFormatter, configure_logging
from tests.support.walkit import SMALL, faulty, payload
from wal import Journal
from wal.errors import WalIoError


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
    assert isinstance(first["ts"], float)
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

"""``wal/log.py``: the no-space latch every part of the journal shares — set once by a
full filesystem, cleared only by the owner naming the latching it saw — a segment's end
as its base plus the bytes its LSN range used, and the journal mutex, after whose
release the events emitted under it go out."""

from __future__ import annotations

import errno
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.threads import WAIT_S, Worker
from tests.support.walkit import SMALL, faulty, payload, replay_all
from wal import Journal
from wal.errors import WalIoError, WalNoSpace
from wal.log import NoSpaceLatch, Segment
from wal.segment import SegmentHeader
from wal.testing import FaultyFs
from wal.types import NoSpace

PATH = Path("/wal/00000000000000000000.wal")


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def current(latch: NoSpaceLatch) -> NoSpace | None:
    """The latch (a call, so that mypy does not narrow it across a change)."""
    return latch.current


def test_a_full_filesystem_latches_and_an_io_error_does_not() -> None:
    clock = Clock()
    latch = NoSpaceLatch(clock)
    plain = latch.io_error_locked("fsync", PATH, OSError(errno.EIO, "io"))
    assert type(plain) is WalIoError and latch.current is None
    full = latch.io_error_locked("write", PATH, OSError(errno.ENOSPC, "No space left"))
    assert isinstance(full, WalNoSpace) and not full.latched
    assert latch.current == NoSpace(1, "write", str(PATH), "[Errno 28] No space left", 1000.0)


def test_a_set_latch_keeps_its_first_failure() -> None:
    clock = Clock()
    latch = NoSpaceLatch(clock)
    latch.set_locked("write", PATH, OSError(errno.ENOSPC, "first"))
    clock.now = 2000.0
    latch.io_error_locked("fsync", PATH, OSError(errno.EDQUOT, "quota"))
    assert latch.current is not None
    assert (latch.current.seq, latch.current.op, latch.current.at) == (1, "write", 1000.0)


def test_only_the_latching_the_owner_saw_is_cleared() -> None:
    latch = NoSpaceLatch(Clock())
    latch.set_locked("write", PATH, OSError(errno.ENOSPC, "full"))
    first = latch.current
    assert first is not None
    assert latch.clear_locked(first.seq + 1) is None and current(latch) is first
    assert latch.clear_locked(first.seq) is first and current(latch) is None
    assert latch.clear_locked(first.seq) is None  # cleared already
    latch.set_locked("rename", PATH, OSError(errno.ENOSPC, "full again"))
    again = current(latch)
    assert again is not None and again.seq == first.seq + 1
    assert latch.clear_locked(first.seq) is None and current(latch) is again  # stale clear


def test_a_segment_ends_at_its_base_plus_the_range_it_used() -> None:
    seg = Segment(SegmentHeader(base_lsn=4096, uuid=uuid.uuid4()), PATH, None, 0.0)
    assert seg.end_lsn == 4096 and seg.synced_lsn == 4096
    seg.data_len = 300
    assert seg.end_lsn == 4396


# -- issue 22 item 3: events go out after the journal mutex --------------------------------


class _Sink:
    """An event sink that, armed, fails (``raises``) or blocks until released."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.armed = False
        self.reached = threading.Event()
        self.go = threading.Event()
        self.names: list[str] = []

    def __call__(self, name: str, fields: Mapping[str, object]) -> None:
        self.names.append(name)
        if not self.armed:
            return
        if self.raises:
            raise OSError(errno.EPIPE, "stderr is gone")
        self.reached.set()
        assert self.go.wait(WAIT_S), "the blocked sink was never released"


def _sealing_journal(tmp_path: Path, sink: _Sink) -> tuple[Journal, FaultyFs]:
    fs = faulty(tmp_path)
    journal = Journal.open(tmp_path / "wal", SMALL, fs=fs, events=sink)
    journal.commit("acme", payload(0))
    fs.fail("write", "*.wal")  # the next frame's write: wal.segment.sealed under the mutex
    sink.armed = True
    return journal, fs


def test_every_state_3_an_event_sink_that_raises_fails_no_append(tmp_path: Path) -> None:
    """The sink raises on wal.segment.sealed (emitted inside a failed append, under the
    journal mutex): that append reports its own write error, and the next one — which
    rotates past the sealed segment — succeeds."""
    sink = _Sink(raises=True)
    journal, _ = _sealing_journal(tmp_path, sink)
    with pytest.raises(WalIoError):
        journal.commit("acme", payload(1))
    assert "wal.segment.sealed" in sink.names
    journal.commit("acme", payload(2))  # durable: the raising sink broke nothing
    journal.close()
    assert replay_all(tmp_path / "wal") == [payload(0), payload(2)]


def test_every_state_3_an_event_sink_that_blocks_holds_no_other_append(tmp_path: Path) -> None:
    """The sink blocks (a stalled stderr pipe) while a failed append emits its event:
    only that thread waits — another thread's append takes the mutex and is durable."""
    sink = _Sink()
    journal, _ = _sealing_journal(tmp_path, sink)
    failing = Worker("failing-append", lambda: journal.commit("acme", payload(1)))
    assert sink.reached.wait(WAIT_S)  # the sealing thread is inside the sink
    sink.armed = False
    other = Worker("other-append", lambda: journal.commit("acme", payload(2)))
    done = other.finished()
    sink.go.set()
    assert done, "an append waited for another thread's blocked event write"
    other.join()
    with pytest.raises(WalIoError):
        failing.join()
    journal.close()

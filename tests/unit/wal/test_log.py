"""``wal/log.py``: the no-space latch every part of the journal shares — set once by a
full filesystem, cleared only by the owner naming the latching it saw — and a
segment's end as its base plus the bytes its LSN range used."""

from __future__ import annotations

import errno
import uuid
from pathlib import Path

from wal.errors import WalIoError, WalNoSpace
from wal.log import NoSpaceLatch, Segment
from wal.segment import SegmentHeader
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

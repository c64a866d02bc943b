"""The log's shared state: the surviving segments, the current one, how far the log is
written and synced, and the journal mutex that guards all of it.

Every part of the journal (``opening``, ``commit``, ``rotation``, ``reading``,
``reclamation``, ``frontiers``, ``checkpointing``) is given the one ``Log`` of its
journal and reads and moves these fields under ``Log.lock``; each part keeps its own
state to itself. The fields here are the ones more than one part must see:

* the segment set (the ledger, which owns membership, and the current segment);
* ``end_lsn`` (the next frame's LSN: valid frames plus reserved torn bytes) and
  ``synced_lsn`` (what an fsync has covered), so a mark beyond the durable end is refused;
* ``disk_bytes`` (headers plus every byte written, what the segments take on disk);
* the stale ``<uuid>.wal.partial`` files rotation leaves and housekeeping sweeps;
* the retired segments whose descriptors a running sync round may still hold;
* the quarantine records in force (their LSNs are never reused);
* the no-space latch, which every writer sets and admission reads without the mutex.

Crash case it protects: nothing; it holds no file of its own. The invariants it carries
are the writers' (a segment is ``sealed`` before anything could land behind a torn
frame; ``synced_lsn`` never passes what an fsync covered).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from .config import WalConfig
from .errors import WalIoError, WalNoSpace, is_no_space
from .fs import Fs
from .quarantine import QuarantineRecord
from .scan import SegmentFile, SegmentScan, scan_segment
from .segment import HEADER_SIZE, SegmentHeader
from .segment_ledger import LedgerSegment, SegmentLedger
from .types import Clock, EventSink, FrameKind, NoSpace


class Segment(LedgerSegment):
    """A surviving segment: the ledger's view plus the writer's file state."""

    __slots__ = ("header", "path", "fd", "data_len", "sealed", "dir_gen", "synced_lsn")

    def __init__(self, header: SegmentHeader, path: Path, fd: int | None, created: float) -> None:
        super().__init__(header.uuid, header.base_lsn, created)
        self.header = header
        self.path = path
        self.fd = fd
        self.data_len = 0  # LSN range used: valid frames plus failed/torn bytes
        self.sealed = False
        self.dir_gen = 0  # directory generation whose fsync makes its entry durable
        #: the end of the valid frames a completed fsync covered: the synced high-water
        #: the successor's header records (``rotation``), so it is never raised by a
        #: failed write or fsync, nor past a torn tail open found
        self.synced_lsn = header.base_lsn

    @property
    def end_lsn(self) -> int:
        return self.base + self.data_len


class NoSpaceLatch:
    """The no-space latch (``types.NoSpace``): set by any write, fsync or rotation step
    that hits ENOSPC/EDQUOT, cleared only by the owner that saw free space again.

    ``current`` is a plain attribute read without the mutex (admission consults it on
    every request); everything else runs under the journal mutex.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._seq = 0
        self.current: NoSpace | None = None

    def set_locked(self, op: str, path: Path, exc: OSError) -> None:
        if self.current is None:
            self._seq += 1
            self.current = NoSpace(self._seq, op, str(path), str(exc), self._clock())

    def io_error_locked(self, op: str, path: Path, exc: OSError) -> WalIoError:
        """The typed error for a failed write or fsync; a full filesystem latches."""
        if is_no_space(exc):
            self.set_locked(op, path, exc)
            return WalNoSpace(op, path, exc)
        return WalIoError(op, path, exc)

    def clear_locked(self, seq: int) -> NoSpace | None:
        """Clear the latch numbered ``seq``; a newer latch stays. Returns what was cleared."""
        latch = self.current
        if latch is None or latch.seq != seq:
            return None
        self.current = None
        return latch


class Mutex:
    """The journal mutex (a ``threading.Lock`` to its users, ``Condition`` included).

    An event emitted while it is held is queued and emitted by the holder right after
    its release: an event sink that blocks or fails (a stalled or broken stderr) then
    holds up only the thread that emitted it, never every appender waiting for the
    mutex, and a sink that raises fails no append (issue 22 item 3)."""

    __slots__ = ("_lock", "_holder", "_pending", "_sink")

    def __init__(self, sink: EventSink) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None
        self._pending: list[tuple[str, Mapping[str, object]]] = []
        self._sink = sink

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._holder = threading.get_ident()
        return got

    def release(self) -> None:
        pending = self._pending
        if pending:
            self._pending = []
        self._holder = None
        self._lock.release()
        for name, fields in pending:
            self._deliver(name, fields)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def emit(self, name: str, fields: Mapping[str, object]) -> None:
        """The journal's event sink: queued while this thread holds the mutex."""
        if self._holder == threading.get_ident():
            self._pending.append((name, fields))
        else:
            self._deliver(name, fields)

    def _deliver(self, name: str, fields: Mapping[str, object]) -> None:
        try:
            self._sink(name, fields)
        except Exception:  # noqa: BLE001 - a failed event write never fails an append
            pass  # the WAL never logs by itself: the owner's sink counts its failures


class Log:
    """The segment set and the positions every part of one journal shares (module
    docstring). Plain fields, read and written under ``lock``."""

    def __init__(
        self,
        root: Path,
        config: WalConfig,
        fs: Fs,
        clock: Clock,
        events: EventSink,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.root = root
        self.config = config
        self.fs = fs
        #: wall time, for what is written (segment names); ages run on ``monotonic``
        self.clock = clock
        self.monotonic = monotonic
        #: the current segment's birth on the monotonic clock (``install``)
        self._current_born = 0.0
        #: the journal mutex: the single-writer position
        self.lock = Mutex(events)
        #: every part's event sink: what is emitted under the mutex goes out after it
        self.events: EventSink = self.lock.emit
        self.ledger = SegmentLedger()
        #: every segment's frames are accounted in the ledger (open walked only the newest)
        self.rebuilt = False
        self._current: Segment | None = None
        self.end_lsn = 0
        self.synced_lsn = 0
        self.disk_bytes = 0
        #: segment files created since open (a failed rotation's partial included)
        self.segments_created = 0
        #: ``<uuid>.wal.partial`` files a failed rotation left (seeded at open)
        self.partials: list[Path] = []
        #: segments rotated away whose descriptors close once no sync round holds them
        self.retired: list[Segment] = []
        #: the quarantine records in force at open (their segments left the set)
        self.quarantined: list[QuarantineRecord] = []
        self.latch = NoSpaceLatch(clock)

    # -- the segment set ---------------------------------------------------------------

    @property
    def current(self) -> Segment:
        """The segment appends go to (installed at open, replaced by each rotation)."""
        assert self._current is not None
        return self._current

    def install(self, seg: Segment) -> None:
        """Make ``seg`` the current segment; the previous one closes in the ledger. Its
        age from now on runs on the monotonic clock, from the wall age its name gives
        once (0 for a segment created now): a wall clock stepped back later never holds
        back its age rotation (issue 22 item 7)."""
        self.ledger.add_segment(seg)
        self._current = seg
        self._current_born = self.monotonic() - max(0.0, self.clock() - seg.created)

    def current_age(self) -> float:
        """Seconds since the current segment was created (monotonic)."""
        return max(0.0, self.monotonic() - self._current_born)

    @staticmethod
    def seg(seg: LedgerSegment) -> Segment:
        assert isinstance(seg, Segment)
        return seg

    def segments(self) -> list[Segment]:
        """The surviving segments, oldest first."""
        return [self.seg(s) for s in self.ledger.segments()]

    def account_scan(self, seg: Segment, scan: SegmentScan) -> None:
        """Account a walked segment's frames in the ledger."""
        base = seg.base
        on_frame = self.ledger.on_frame
        for raw in scan.frames:
            end = base + raw.end - HEADER_SIZE
            tenant = raw.tenant if raw.kind is FrameKind.TENANT_BATCH else None
            on_frame(seg, tenant, end, raw.end - raw.start)
        seg.scanned = True
        if seg is not self._current:
            self.ledger.close(seg)

    def rebuild_locked(self) -> None:
        """Walk every segment not yet accounted (oldest first, frames validated exactly as
        replay validates them) into the ledger. Replay does this as a by-product."""
        if self.rebuilt:
            return
        for seg in self.segments():
            if seg.scanned:
                continue
            scan = scan_segment(
                self.fs, SegmentFile(seg.path, seg.header, HEADER_SIZE + seg.data_len)
            )
            self.account_scan(seg, scan)
        self.rebuilt = True

    def removed_locked(self, segs: list[LedgerSegment]) -> None:
        """Segments housekeeping unlinked no longer take space."""
        for s in segs:
            self.disk_bytes -= HEADER_SIZE + self.seg(s).data_len

    # -- descriptors -------------------------------------------------------------------

    def close_retired_locked(self) -> None:
        for seg in self.retired:
            if seg.fd is not None:
                try:
                    self.fs.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None
        self.retired.clear()

    def release_files(self) -> None:
        """Close every segment descriptor without syncing (a refused open leaks none)."""
        for seg in self.segments() + list(self.retired):
            if seg.fd is not None:
                try:
                    self.fs.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None

    def close_locked(self) -> None:
        """Fsync what an unsealed segment holds beyond its last sync, close every fd."""
        segments = self.segments() + list(self.retired)
        self.retired.clear()
        for seg in segments:
            if seg.fd is None:
                continue
            try:
                if not seg.sealed and seg.synced_lsn < seg.end_lsn:
                    self.fs.fsync(seg.fd)
                    # an unsealed segment holds only frames whose writes succeeded
                    seg.synced_lsn = seg.end_lsn
                self.fs.close(seg.fd)
            except OSError:
                pass
            seg.fd = None

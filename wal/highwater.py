"""Recording the current segment's synced high-water in HIGHWATER (the format and the
crash argument are ``wal/highwater_file.py``'s).

When: after a group commit's sync rounds, by the thread that led them, once the
current segment's ``synced_lsn`` has moved at least ``wal.high_water_bytes`` past what
the file records for it (a new segment counts from its base); at open, after the
newest segment's fsync, by the same rule; at a clean close, whatever moved. A cadence
by bytes rather than time keeps the unprotected part of the newest segment bounded in
bytes, costs one small write and fsync per ``wal.high_water_bytes`` of frames, and
makes what the file holds depend on what was appended alone (deterministic in tests).

The leader writes after its own frame is acknowledged and after it handed the next
round on, so no waiter waits for it: only the leading request's reply is later by one
small fsync. One write at a time (a busy writer means the next leader skips). A failed
write leaves the previous slot live and the claim where it was — protection lags,
nothing is wrong — and is reported once (``wal.high_water.failed``) until a write
succeeds again (``wal.high_water.recovered``).

Lock order: this part's lock, then the journal mutex (held only to read the position).
"""

from __future__ import annotations

import threading
import uuid

from .errors import CorruptionError
from .highwater_file import HighWaterFile, HighWaterRecord
from .log import Log, Segment
from .scan import SegmentFile


class HighWater:
    """HIGHWATER's record in force and the writes that advance it (module docstring)."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._file: HighWaterFile | None = None
        self._record = HighWaterRecord()
        self._failing = False
        #: successful writes since open
        self.writes = 0
        #: failed writes since open (each left the previous claim in force)
        self.failures = 0

    @property
    def record(self) -> HighWaterRecord:
        return self._record

    def open(self) -> None:
        """Load the file, or create it preallocated (a fresh root, or one from before it
        existed). Raises ``OSError`` (the open names the file) or ``CorruptionError``."""
        log = self._log
        loaded = HighWaterFile.load(log.fs, log.root)
        if loaded is None:
            record = HighWaterRecord()
            self._file = HighWaterFile.create(log.fs, log.root, 1, record)
        else:
            self._file, record = loaded
            self._file.refuse_newer()
        self._record = record

    def claim(self, seg: SegmentFile) -> tuple[int, str] | None:
        """The recorded high-water of ``seg`` (the newest segment) and who recorded it,
        when the record names it; None otherwise."""
        rec = self._record
        if rec.segment != seg.header.uuid:
            return None
        if rec.base_lsn != seg.base:
            path = self._log.root / HighWaterFile.NAME
            raise CorruptionError(
                path,
                None,
                f"HIGHWATER names segment {rec.segment} at base {rec.base_lsn}, but "
                f"{seg.path.name} with that id has base {seg.base}",
            )
        return rec.lsn, f"recorded in HIGHWATER (generation {rec.generation})"

    def _recorded(self, seg: Segment) -> int:
        rec = self._record
        return rec.lsn if rec.segment == seg.uuid else seg.base

    def after_round(self) -> None:
        """The group commit leader's call once its rounds are done: record the current
        segment's synced high-water when it moved ``wal.high_water_bytes`` or more."""
        log = self._log
        cur = log.current  # read without the mutex: a cheap test on the hot path
        if cur.synced_lsn - self._recorded(cur) < log.config.high_water_bytes:
            return
        if not self._lock.acquire(blocking=False):
            return  # another thread is writing it
        try:
            self._record_locked(log.config.high_water_bytes)
        finally:
            self._lock.release()

    def record_due(self) -> None:
        """Open's call after the newest segment's fsync: the same rule as a round's."""
        with self._lock:
            self._record_locked(self._log.config.high_water_bytes)

    def close(self) -> None:
        """A clean close: record what the last fsync covered (any amount), then release
        the file. The caller made the segment's ``synced_lsn`` current."""
        with self._lock:
            if self._file is not None:
                self._record_locked(1)
                self._file.close()
                self._file = None

    def release(self) -> None:
        """Close the file without writing (a refused open)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _record_locked(self, at_least: int) -> None:
        file = self._file
        if file is None or file.closed:
            return
        log = self._log
        with log.lock:
            cur = log.current
            lsn = cur.synced_lsn
            if lsn - self._recorded(cur) < at_least:
                return
            seg_id, base = cur.uuid, cur.base
        self._write(file, seg_id, base, lsn)

    def _write(self, file: HighWaterFile, seg_id: uuid.UUID, base: int, lsn: int) -> None:
        rec = HighWaterRecord(self._record.generation, seg_id, base, lsn)
        try:
            file.write(rec)
        except OSError as exc:
            self.failures += 1
            if not self._failing:
                self._failing = True
                self._log.events(
                    "wal.high_water.failed",
                    {
                        "path": str(file.path),
                        "segment": str(seg_id),
                        "lsn": lsn,
                        "recorded_lsn": self._record.lsn,
                        "error": str(exc),
                        "action": "the previous high-water stays in force: damage above it "
                        "in the newest segment would read as a torn tail; the next sync "
                        "round tries again",
                    },
                )
            return
        self._record = rec
        self.writes += 1
        if self._failing:
            self._failing = False
            self._log.events(
                "wal.high_water.recovered",
                {"path": str(file.path), "segment": str(seg_id), "lsn": lsn},
            )

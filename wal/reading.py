"""Reading the log back: recovery's ``Replay`` over every surviving frame, and the bounded
per-tenant reads settlement uses (``oldest_frame``, ``read_frames_from``).

Replay walks segments oldest first and, before it yields a segment's first frame,
checks it against the synced high-water its direct successor's header records (module
``layout``): damage or a short end below the high-water raises ``CorruptionError``
naming the file, the offset and the high-water, because acknowledged frames are missing
there, however many frames after the damage still verify; damage above it is a torn
tail (the newest segment's, checked against the checkpoint mark, is open's). Every
frame it yields is CRC-checked; walking a segment accounts it in the ledger as a
by-product.

Bounded reads hold the journal mutex for at most ``limit`` returned frames within one
segment, so appends and rotations interleave between calls (RFC 0055 §9.4); every
returned frame's checksum is verified on the re-read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c

from .errors import CorruptionError, WalError, WalIoError
from .frame import BODY_OVERHEAD, PREFIX, PREFIX_SIZE
from .log import Log, Segment
from .scan import SegmentFile, chain_problem, scan_segment
from .segment import HEADER_SIZE
from .tenant import MAX_TENANT_BYTES
from .types import Frame, FrameCursor, FrameKind, FrameSpan, WalOffset


@dataclass
class SegmentReport:
    """What replay found in one segment."""

    name: str
    base_lsn: int
    frames: int
    frame_bytes: int
    valid_end_lsn: int
    damage: str = ""  # empty when the segment ends cleanly
    damage_offset: int | None = None


@dataclass
class ReplayReport:
    segments: list[SegmentReport] = field(default_factory=list)
    frames: int = 0
    skipped: int = 0  # frames at or below the starting LSN

    @property
    def torn(self) -> list[SegmentReport]:
        return [s for s in self.segments if s.damage]


class Replay:
    """Iterator over replayed frames; ``report`` is complete once exhausted."""

    def __init__(self, log: Log, segments: list[Segment], after_lsn: int | None) -> None:
        self._log = log
        self._segments = segments
        #: each segment's length when the replay was made (under the journal mutex): the
        #: replay covers exactly the frames that existed then, whatever is appended while
        #: it is iterated (a node serves while it replays, DESIGN.md §5)
        self._lengths = [HEADER_SIZE + seg.data_len for seg in segments]
        self._after = after_lsn
        self.report = ReplayReport()

    @property
    def start_lsn(self) -> int:
        """The base of the first segment this replay reads."""
        return self._segments[0].base if self._segments else 0

    @property
    def end_lsn(self) -> int:
        """The end of the last frame this replay can return (the log's end when made)."""
        if not self._segments:
            return 0
        return self._segments[-1].base + self._lengths[-1] - HEADER_SIZE

    def validate(self) -> None:
        """Walk every segment as iterating would (CRC, torn tails, high-waters), without
        yielding a frame: ``CorruptionError`` now rather than part-way through. The
        ledger is rebuilt as a by-product."""
        for _ in self._frames(yielding=False):
            pass

    def __iter__(self) -> Iterator[Frame]:
        return self._frames(yielding=True)

    def _frames(self, *, yielding: bool) -> Iterator[Frame]:
        log = self._log
        fs = log.fs
        after = -1 if self._after is None else self._after
        n = len(self._segments)
        for i, seg in enumerate(self._segments):
            f = SegmentFile(seg.path, seg.header, self._lengths[i])
            scan = scan_segment(fs, f)
            if i + 1 < n:
                # Before any of its frames is fed: damage below the high-water its
                # direct successor records is corruption, never a torn tail.
                nxt = self._segments[i + 1]
                successor = SegmentFile(nxt.path, nxt.header, self._lengths[i + 1])
                problem = chain_problem(scan, successor)
                if problem is not None:
                    raise problem
            with log.lock:
                if not seg.scanned:
                    log.account_scan(seg, scan)
            if not yielding:
                continue
            report = SegmentReport(
                seg.path.name,
                seg.base,
                len(scan.frames),
                scan.frame_bytes,
                scan.valid_end_lsn,
                scan.stop.reason if scan.stop.damaged else "",
                scan.stop.valid_end if scan.stop.damaged else None,
            )
            self.report.segments.append(report)
            base = seg.base
            data = scan.data
            uid = seg.uuid
            for raw in scan.frames:
                end = base + raw.end - HEADER_SIZE
                if end <= after:
                    self.report.skipped += 1
                    continue
                self.report.frames += 1
                yield Frame(
                    raw.kind,
                    raw.tenant,
                    data[raw.payload_start : raw.end],
                    base + raw.start - HEADER_SIZE,
                    WalOffset(uid, end),
                )
        with log.lock:
            log.rebuilt = True


class Reader:
    """Reads of one journal's log (module docstring). It keeps no state of its own."""

    def __init__(self, log: Log) -> None:
        self._log = log

    def replay_locked(self, after_lsn: int | None) -> Replay:
        """A ``Replay`` over the segments surviving now."""
        return Replay(self._log, self._log.segments(), after_lsn)

    def oldest_frame(self, tenant: str) -> FrameCursor | None:
        """A cursor from which ``read_frames_from`` returns ``tenant``'s oldest surviving
        frame first (the start of the segment holding it); None when it has none."""
        log = self._log
        with log.lock:
            if not log.rebuilt:
                log.rebuild_locked()
            first = log.ledger.oldest_frame(tenant)
            if first is None:
                return None
            seg = log.ledger.segment(first.segment)
            assert seg is not None
            return FrameCursor(seg.uuid, seg.base)

    def read_frames_from(
        self, cursor: FrameCursor, to: FrameSpan, tenant: str, limit: int
    ) -> tuple[list[Frame], FrameCursor | None]:
        """``tenant``'s frames after ``cursor`` through the ``to`` frame, oldest first,
        in bounded calls (RFC 0055 §9.4): one call holds the journal mutex for at most
        ``limit`` returned frames within one segment, so appends and rotations
        interleave between calls. Returns the frames and the cursor of the next call,
        None once the ``to`` frame was returned (it is returned last). Other tenants'
        frames are skipped at their prefix; every returned frame's checksum is verified.
        A ``to`` that does not end on a frame boundary of ``tenant``, or a cursor whose
        segment is gone, raises ``WalError`` naming the file and the offsets."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        log = self._log
        with log.lock:
            if not log.rebuilt:
                log.rebuild_locked()
            seg = self._seg_at_or_after_locked(cursor, tenant)
            if seg is None:
                raise WalError(
                    f"read_frames_from: no surviving segment holds a frame of tenant "
                    f"{tenant!r} at or after LSN {cursor.lsn} (segment {cursor.segment}), "
                    f"but the span {to.start}+{to.length} in segment {to.segment} was expected"
                )
            start = max(cursor.lsn, seg.base)
            frames = self._read_segment_locked(seg, start, to, tenant, limit)
            last = frames[-1] if frames else None
            if last is not None and last.offset.lsn == to.end:
                return frames, None
            if len(frames) >= limit:
                assert last is not None
                return frames, FrameCursor(seg.uuid, last.offset.lsn)
            nxt = self._next_segment_locked(seg)
            if nxt is None or seg.end_lsn >= to.end:
                raise WalError(
                    f"read_frames_from: the span {to.start}+{to.length} of tenant {tenant!r} "
                    f"(segment {to.segment}) does not end on a frame boundary of a surviving "
                    f"segment ({seg.path.name} read from LSN {start})"
                )
            return frames, FrameCursor(nxt.uuid, nxt.base)

    def _seg_at_or_after_locked(self, cursor: FrameCursor, tenant: str) -> Segment | None:
        """The first surviving segment holding a frame of ``tenant`` at or after the
        cursor; segments below it, or without the tenant, are skipped by the ledger."""
        for s in self._log.ledger.segments():
            seg = Log.seg(s)
            span = seg.tenants.get(tenant)
            # No frame of the tenant after the cursor here: skipped unread (such a
            # segment may be mid-reclamation, its file already unlinked).
            if span is not None and span[1] > cursor.lsn:
                return seg
        return None

    def _next_segment_locked(self, seg: Segment) -> Segment | None:
        later = [Log.seg(s) for s in self._log.ledger.segments() if s.base > seg.base]
        return later[0] if later else None

    def _read_segment_locked(
        self, seg: Segment, start: int, to: FrameSpan, tenant: str, limit: int
    ) -> list[Frame]:
        """At most ``limit`` of ``tenant``'s frames of ``seg`` from LSN ``start``, stopping
        after the ``to`` frame; other tenants' frames are skipped by their prefix."""
        fs = self._log.fs
        want = tenant.encode("ascii")
        out: list[Frame] = []
        end_lsn = seg.highest if seg.highest is not None else seg.base
        try:
            fd = fs.open(seg.path, os.O_RDONLY)
        except OSError as exc:
            raise WalIoError("open for reading", seg.path, exc) from exc
        try:
            lsn = start
            while lsn < end_lsn and len(out) < limit:
                at = HEADER_SIZE + (lsn - seg.base)
                head = fs.pread(fd, PREFIX_SIZE + BODY_OVERHEAD + MAX_TENANT_BYTES, at)
                if len(head) < PREFIX_SIZE + BODY_OVERHEAD:
                    raise CorruptionError(seg.path, at, "short frame prefix inside valid frames")
                body_len, crc = PREFIX.unpack_from(head)
                size = PREFIX_SIZE + body_len
                kind, tenant_len = head[PREFIX_SIZE], head[PREFIX_SIZE + 1]
                named = head[PREFIX_SIZE + BODY_OVERHEAD : PREFIX_SIZE + BODY_OVERHEAD + tenant_len]
                if (
                    to.start < lsn + size
                    and lsn < to.start
                    or (lsn == to.start and size != to.length)
                ):
                    raise WalError(
                        f"read_frames_from: the span {to.start}+{to.length} does not match the "
                        f"frame at LSN {lsn} ({size} bytes) in {seg.path.name} (file offset {at})"
                    )
                mine = kind == FrameKind.TENANT_BATCH and named == want
                if mine:
                    body = fs.pread(fd, body_len, at + PREFIX_SIZE)
                    if len(body) != body_len or crc32c.crc32c(body) != crc:
                        raise CorruptionError(
                            seg.path, at, "frame checksum mismatch on re-read of a valid frame"
                        )
                    out.append(
                        Frame(
                            FrameKind.TENANT_BATCH,
                            tenant,
                            body[BODY_OVERHEAD + tenant_len :],
                            lsn,
                            WalOffset(seg.uuid, lsn + size),
                        )
                    )
                if lsn == to.start:
                    if not mine:
                        raise WalError(
                            f"read_frames_from: the frame at LSN {lsn} in {seg.path.name} is "
                            f"not a frame of tenant {tenant!r}"
                        )
                    break
                lsn += size
        finally:
            fs.close(fd)
        return out

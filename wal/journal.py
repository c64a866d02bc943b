"""The journal: the WAL's single writer. It appends, group-commits, rotates,
checkpoints and replays; *when* to checkpoint or rotate on a timer is the caller's
business (``app/barrier.py``).

Guarantees:

* **WAL before ack.** ``append_batch`` writes the frame and returns a ``Pending``;
  ``Pending.wait()`` returns only after an fsync that started after the frame was
  written succeeded, and after the directory entry of the frame's segment is durable
  (no rotation obligation pending). One fsync covers every waiter written before it
  started (group commit); the thread that runs it wakes exactly the waiters it covered
  and hands the next round to the oldest uncovered one.
* **Own-frame marks.** ``wait()`` returns the frame's own end offset beside the EOF the
  fsync reached; only the former is a mark (RFC 0052 §3.1).
* **Nothing behind a torn frame.** A write or fsync failure on the active segment
  seals it: every unacknowledged frame in it fails, and the next append takes an owed
  rotation into a fresh segment. For the client this stays transient.
* **Bounded rotation retry** (RFC 0052 §3.3). The five steps — create
  ``<uuid>.wal.partial``, write the header, fsync it, rename it, fsync the parent —
  run in that order and the segment is installed before the parent fsync. A failure
  before the rename leaves only a ``.partial`` (never selectable; housekeeping sweeps
  it) and fails the append; a failed parent fsync keeps the installed segment and
  leaves ``dir_fsync_pending`` with origin ROTATION, discharged by the next sync before
  anything is acknowledged. Each failure, and each failed discharge, consumes one unit
  of ``rotation_retry_attempts``; only the obligation itself succeeding resets it; an
  exhausted budget is ``Terminal`` and every append is refused with the first error.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from .checkpoint import SPARE_NAME, make_spare, read_checkpoint, write_checkpoint
from .config import MAX_TENANT_BYTES, WalConfig, reclaim_file_bytes
from .errors import (
    AppendError,
    CheckpointError,
    CorruptionError,
    JournalClosed,
    OpenError,
    OpenIoError,
    RotationRetrying,
    RotationTerminal,
    WalError,
    WalIoError,
    WalNoSpace,
    is_no_space,
)
from .frame import BODY_OVERHEAD, PREFIX, PREFIX_SIZE, encode_frame, validate_tenant
from .frontiers import FrontiersMixin
from .fs import Fs, OsFs
from .housekeeping import ArchiveHook, HousekeepingMixin, ReclaimState
from .layout import SegmentFile, SegmentScan, chain_problem, list_root, scan_segment
from .ledger import HousekeepingProgress, Ledger, LedgerSegment
from .published import PublishedEntry, PublishedFile
from .quarantine import QuarantineRecord, in_force, load_records
from .reclaim import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    Geometry,
    ReclaimFile,
    ReclaimRecord,
)
from .segment import (
    FLAG_HAS_PREDECESSOR,
    FLAG_PREDECESSOR_SEALED,
    HEADER_SIZE,
    SegmentHeader,
    partial_name,
    segment_name,
    uuid7,
    uuid7_time,
)
from .slots import SlotDefect
from .types import (
    CommitOutcome,
    DirFsyncOrigin,
    Frame,
    FrameCursor,
    FrameKind,
    FrameSpan,
    Healthy,
    NoSpace,
    PublishedMarks,
    Retrying,
    RotationKind,
    RotationState,
    Terminal,
    WalOffset,
)

EventSink = Callable[[str, Mapping[str, object]], None]
Clock = Callable[[], float]
Timing = Callable[[float], None]

_TENANT_CACHE_MAX = 4096
#: A leader whose own frame is acknowledged leads at most this many more rounds while
#: waiters are queued: the next fsync starts without first waking another thread, and the
#: leader's own latency stays bounded (it never leads indefinitely under load).
EXTRA_ROUNDS = 1


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    return None


class _Segment(LedgerSegment):
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
        self.synced_lsn = header.base_lsn

    @property
    def end_lsn(self) -> int:
        return self.base + self.data_len


class Pending:
    """An appended frame waiting for the fsync that covers it.

    ``offset`` is the frame's own end (the mark a caller may use once ``wait`` returns);
    ``span`` locates the whole frame (settlement's unmined entries record it).
    """

    __slots__ = (
        "seq",
        "offset",
        "size",
        "_journal",
        "_seg",
        "_lock",
        "_leader",
        "_done",
        "_outcome",
        "_error",
    )

    def __init__(
        self, journal: Journal, seq: int, offset: WalOffset, seg: _Segment, size: int
    ) -> None:
        self.seq = seq
        self.offset = offset
        self.size = size
        self._journal = journal
        self._seg = seg
        self._lock = threading.Lock()
        self._lock.acquire()
        self._leader = False
        self._done = False
        self._outcome: CommitOutcome | None = None
        self._error: AppendError | None = None

    @property
    def span(self) -> FrameSpan:
        return FrameSpan(self.offset.segment, self.offset.lsn - self.size, self.size)

    def wait(self) -> CommitOutcome:
        """Block until the covering fsync; raise the typed ``AppendError`` on failure."""
        if not self._leader:
            self._lock.acquire()
        if self._leader:
            self._journal._lead(self)
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome


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


@dataclass(frozen=True, slots=True)
class OpenReport:
    """What open found and did."""

    fresh: bool
    segments: int
    sealed_newest: bool  # the newest segment had a torn tail and was sealed
    seal_reason: str
    stale_partials: int
    checkpoint: WalOffset | None


class _StepError(Exception):
    def __init__(self, step: str, path: Path, cause: OSError) -> None:
        super().__init__(f"{step} {path}: {cause}")
        self.step = step
        self.path = path
        self.cause = cause


class Journal(HousekeepingMixin, FrontiersMixin):
    """The WAL's single writer. Construct with ``Journal.open``."""

    def __init__(
        self,
        root: Path,
        config: WalConfig,
        fs: Fs,
        clock: Clock,
        events: EventSink,
        on_append: Timing | None = None,
        on_fsync: Timing | None = None,
        archive: ArchiveHook | None = None,
    ) -> None:
        self.root = root
        #: copies a segment before housekeeping unlinks it (``wal.archive``); None: off
        self._archive = archive
        #: observers of each frame write's and each fsync's duration (the metrics)
        self._on_append = on_append
        self._on_fsync = on_fsync
        self.config = config
        self._fs = fs
        self._clock = clock
        self._events = events
        self._lock = threading.Lock()  # the journal mutex: the single-writer position
        self._idle = threading.Condition(self._lock)
        self._ckpt_lock = threading.Lock()
        self._ledger = Ledger()
        self._ledger_rebuilt = False
        self._last_progress: HousekeepingProgress | None = None
        self._record_lock = threading.Lock()
        self._record = ReclaimRecord()
        self._record_version = 0
        self._record_durable_version = 0
        self._disk_bytes = 0
        self._config_max_tenants = config.max_tenants
        self._armed_durable = False
        self._cur: _Segment | None = None
        self._end_lsn = 0
        self._synced_lsn = 0
        self._next_seq = 1
        self._waiters: deque[Pending] = deque()
        self._leader: Pending | None = None
        self._dir_gen = 0
        self._dir_durable_gen = 0
        self._dir_pending: DirFsyncOrigin | None = None
        self._rotation: RotationState = Healthy()
        self._no_space: NoSpace | None = None
        self._no_space_seq = 0
        self._segments_created = 0  # new segment files since open (see segments_created)
        self._retired: list[_Segment] = []
        self._partials: list[Path] = []
        self._checkpoint: WalOffset | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._valid_tenants: dict[str, bytes] = {}
        self._quarantined: list[QuarantineRecord] = []
        self._published_file: PublishedFile | None = None
        self._published: dict[int, PublishedEntry] = {}
        self._published_lock = threading.Lock()
        self._published_durable: dict[str, PublishedMarks] = {}
        self._reclaim_rebuilt = False
        self.open_report: OpenReport | None = None

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        root: Path | str,
        config: WalConfig | None = None,
        *,
        fs: Fs | None = None,
        clock: Clock = time.time,
        events: EventSink | None = None,
        on_append: Timing | None = None,
        on_fsync: Timing | None = None,
        archive: ArchiveHook | None = None,
    ) -> Journal:
        """Open (or create) the WAL at ``root``.

        Validates the configuration and the directory structure, checks the newest
        segment frame by frame and seals it if its tail is torn (nothing is truncated:
        the bytes stay as evidence and the next append starts a new segment), reads
        CHECKPOINT behind an fsync of the root. An empty directory is a fresh root.
        Older segments' frames are checked by ``replay`` (recovery) and ``verify``.
        """
        root = Path(root).absolute()
        config = config or WalConfig()
        config.validate()
        fs = fs or OsFs()
        journal = cls(root, config, fs, clock, events or _no_events, on_append, on_fsync, archive)
        try:
            journal._open()
        except BaseException:
            journal._release_files()  # a refused open leaks no descriptor
            raise
        return journal

    def _release_files(self) -> None:
        reclaim = getattr(self, "_reclaim_file", None)
        if reclaim is not None and not reclaim.closed:
            reclaim.close()
        if self._published_file is not None and not self._published_file.closed:
            self._published_file.close()
        segs = [self._seg(x) for x in self._ledger.segments()] + list(self._retired)
        for seg in segs:
            if seg.fd is not None:
                try:
                    self._fs.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None

    def _open(self) -> None:
        fs, root = self._fs, self.root
        try:
            st = fs.stat(root)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise OpenIoError(root, "stat the WAL directory", exc) from exc
        if st is None:
            missing = [root]
            while not missing[-1].parent.exists():
                missing.append(missing[-1].parent)
            try:
                for d in reversed(missing):
                    fs.mkdir(d)
                    fs.fsync_dir(d.parent)
            except OSError as exc:
                raise OpenIoError(root, "create the WAL directory", exc) from exc
        elif not os.path.isdir(root):
            raise OpenError(f"WAL path {root} exists and is not a directory")
        try:
            fs.fsync_dir(root)  # make what the listing shows durable before trusting it
        except OSError as exc:
            raise OpenIoError(root, "fsync the WAL directory", exc) from exc

        listing = list_root(fs, root)
        self._partials = list(listing.partials)
        self._remove_leftover_rebuild(listing.other)
        self._checkpoint = read_checkpoint(fs, root)
        # Segments an operator quarantined (``ourios wal quarantine``): their LSNs are
        # never reused and a horizon inside one is a recorded loss (wal/quarantine.py).
        self._quarantined = in_force(
            load_records(fs, root), {f.path.name for f in listing.segments}
        )
        quarantined_end = max((q.end_lsn for q in self._quarantined), default=0)
        self._open_reclaim(listing.segments)
        sealed_reason = ""
        fresh = not listing.segments
        if fresh:
            if self._checkpoint is not None and (
                not self._quarantined or self._checkpoint.lsn > quarantined_end
            ):
                raise CorruptionError(
                    root / "CHECKPOINT",
                    None,
                    f"CHECKPOINT holds mark {self._checkpoint} but the WAL has no segment "
                    f"(the current segment is never reclaimed; were segments removed by hand?)",
                )
            # RECLAIM is durable (``_open_reclaim``) before the first segment exists, so
            # no restart ever finds a segment beside no record.
            header = SegmentHeader(quarantined_end, uuid7(self._clock()))
            try:
                seg = self._create_segment_locked(header)
            except _StepError as exc:
                raise OpenIoError(exc.path, f"{exc.step} the first segment", exc.cause) from exc
            self._install(seg)
            self._disk_bytes = HEADER_SIZE
            self._end_lsn = quarantined_end
            self._ledger_rebuilt = True  # nothing to walk
        else:
            for f in listing.segments[:-1]:
                seg = _Segment(f.header, f.path, None, uuid7_time(f.header.uuid))
                seg.data_len = f.data_len
                seg.synced_lsn = f.data_end
                seg.scanned = False  # membership unknown until replay walks it
                self._ledger.add_closed(seg)
                self._disk_bytes += f.size
            newest_file = listing.segments[-1]
            scan = scan_segment(fs, newest_file)
            seg = _Segment(
                newest_file.header, newest_file.path, None, uuid7_time(newest_file.header.uuid)
            )
            seg.data_len = newest_file.data_len
            seg.synced_lsn = newest_file.data_end
            seg.scanned = False
            self._install(seg)
            if len(listing.segments) == 1:
                self._account_scan(seg, scan)  # the whole ledger, in order
            self._disk_bytes += newest_file.size
            self._end_lsn = newest_file.data_end  # the next base skips any torn bytes
            if scan.stop.damaged:
                seg.sealed = True
                sealed_reason = scan.stop.reason
                self._events(
                    "wal.segment.sealed",
                    {
                        "segment": seg.path.name,
                        "offset": scan.stop.valid_end,
                        "reason": f"torn tail at open: {scan.stop.reason}",
                        "kept_bytes": scan.file.size - scan.stop.valid_end,
                    },
                )
            if quarantined_end > self._end_lsn:
                # The newest segment was quarantined: appending here would reuse its
                # LSNs. Seal the survivor; the next append starts at the quarantined end.
                self._end_lsn = quarantined_end
                if not seg.sealed:
                    seg.sealed = True
                    sealed_reason = "a quarantined segment lies beyond it"
                    self._events(
                        "wal.segment.sealed",
                        {
                            "segment": seg.path.name,
                            "offset": scan.stop.valid_end,
                            "reason": f"sealed at open: a quarantined segment ends at LSN "
                            f"{quarantined_end}, beyond it",
                            "kept_bytes": 0,
                        },
                    )
            # A killed process may have left frames in the page cache only: make the
            # newest segment durable before anything is appended or rotated behind it.
            try:
                fd = fs.open(seg.path, os.O_WRONLY | os.O_APPEND)
            except OSError as exc:
                raise OpenIoError(seg.path, "open the newest segment", exc) from exc
            try:
                fs.fsync(fd)
            except OSError as exc:
                fs.close(fd)
                raise OpenIoError(seg.path, "fsync the newest segment", exc) from exc
            if seg.sealed:
                fs.close(fd)
            else:
                seg.fd = fd
            if self._checkpoint is not None and self._checkpoint.lsn > self._end_lsn:
                raise CorruptionError(
                    root / "CHECKPOINT",
                    None,
                    f"CHECKPOINT mark {self._checkpoint} is beyond the end of the log "
                    f"(newest segment {seg.path.name} ends at LSN {self._end_lsn})",
                )
            self._ledger_rebuilt = len(listing.segments) == 1
        self._ledger.checkpoint = self._checkpoint
        self._synced_lsn = self._end_lsn
        # Every open owes a directory fsync; the first sync discharges it (origin OPEN
        # is outside the rotation budget).
        self._dir_gen = 1
        for s in self._ledger.segments():
            s_ = self._seg(s)
            s_.dir_gen = 1
        self._dir_pending = DirFsyncOrigin.OPEN
        try:
            make_spare(fs, root)
        except OSError as exc:
            raise OpenIoError(
                root / SPARE_NAME,
                "allocate the checkpoint spare (so a full disk can still checkpoint)",
                exc,
            ) from exc
        for q in self._quarantined:
            self._events(
                "wal.segment.quarantined",
                {
                    "segment": q.segment,
                    "base_lsn": q.base_lsn,
                    "end_lsn": q.end_lsn,
                    "lost_frames_above_checkpoint": q.lost_frames,
                    "lost_records_above_checkpoint": q.lost_records,
                    "unreadable_bytes": q.unreadable_bytes,
                    "tenants": sorted(q.tenants),
                    "record": str(root / "quarantine" / f"{q.segment}.json"),
                    "loss": q.summary(),
                },
            )
        self.open_report = OpenReport(
            fresh=fresh,
            segments=self._ledger.segment_count,
            sealed_newest=bool(sealed_reason),
            seal_reason=sealed_reason,
            stale_partials=len(self._partials),
            checkpoint=self._checkpoint,
        )

    def _remove_leftover_rebuild(self, other: list[str]) -> None:
        """A ``RECLAIM.new`` or ``PUBLISHED.new`` left by a crashed geometry rebuild is
        never read: remove it."""
        names = [n for n in (ReclaimFile.NEW_NAME, PublishedFile.NEW_NAME) if n in other]
        for name in names:
            try:
                self._fs.unlink(self.root / name)
            except OSError as exc:
                raise OpenIoError(self.root / name, "remove the leftover", exc) from exc
        if names:
            try:
                self._fs.fsync_dir(self.root)
            except OSError as exc:
                raise OpenIoError(self.root, "fsync after removing leftovers", exc) from exc

    def _open_reclaim(self, segments: list[SegmentFile]) -> None:
        """The RECLAIM × CHECKPOINT × segments matrix (RFC 0052 §3.2, DESIGN.md §4: the
        legacy rows do not apply), the geometry rebuild and planned-entry reconciliation.
        Every change is durable before anything else reads the record."""
        fs, root = self._fs, self.root
        rpath = root / ReclaimFile.NAME
        cpath = root / "CHECKPOINT"
        wanted = Geometry(self.config.max_tenants, self.config.max_unlinks_per_pass)
        loaded = ReclaimFile.load(fs, root)
        if loaded is None:
            if segments or self._checkpoint is not None:
                missing = "RECLAIM" if self._checkpoint is not None else "RECLAIM and CHECKPOINT"
                raise CorruptionError(
                    rpath,
                    None,
                    f"{missing} missing beside {len(segments)} segment(s)"
                    + (f" and a CHECKPOINT at {self._checkpoint}" if self._checkpoint else "")
                    + ": this root has run this WAL, so the record of what was reclaimed is "
                    "lost; refusing to guess (restore RECLAIM from a backup of the volume)",
                )
            self._published_file = self._create_published_fresh(wanted.max_tenants)
            try:
                self._reclaim_file = ReclaimFile.create(fs, root, wanted, self._record)
            except OSError as exc:
                raise OpenIoError(
                    rpath,
                    f"allocate {reclaim_file_bytes(wanted.max_tenants, wanted.max_unlinks)} "
                    f"bytes for",
                    exc,
                ) from exc
            return
        file, record = loaded
        self._armed_durable = bool(record.flags & FLAG_CHECKPOINT_ARMED)
        rejected = file.rejected
        if (
            rejected is not None
            and rejected.defect is SlotDefect.FORMAT
            and rejected.generation is not None
            and rejected.generation > file.generation
        ):
            # A newer slot whose checksum holds but whose format this build does not
            # know: acting on the older slot would ignore what that writer recorded.
            raise CorruptionError(
                rpath,
                rejected.offset,
                f"newer slot {rejected.index} is unreadable: {rejected.reason}",
            )
        self._reclaim_file = file
        self._record = record
        changed = False
        armed = bool(record.flags & FLAG_CHECKPOINT_ARMED)
        seen = bool(record.flags & FLAG_CHECKPOINT_SEEN)
        if self._checkpoint is None:
            if seen:
                raise CorruptionError(
                    cpath,
                    None,
                    f"CHECKPOINT is missing but {rpath.name} records that one was written "
                    f"(checkpoint_seen): the checkpoint was lost; refusing to replay as if "
                    f"nothing was ever published",
                )
            if record.entries or record.planned:
                raise CorruptionError(
                    cpath,
                    None,
                    f"CHECKPOINT is missing but {rpath.name} records reclaimed or planned "
                    f"segments, which only a checkpoint could have allowed",
                )
            if armed and not segments:
                self._record = ReclaimRecord(generation=record.generation)
                self._armed_durable = False  # reset below; the next checkpoint re-arms
                changed = True
        else:
            if not armed and not seen:
                raise CorruptionError(
                    rpath,
                    None,
                    f"CHECKPOINT exists at {self._checkpoint} but {rpath.name} was never armed "
                    f"for it; no correct writer leaves this pair",
                )
            if not seen:
                record.flags |= FLAG_CHECKPOINT_SEEN  # promoted durably, below
                changed = True
        stored = file.geometry
        if wanted.max_tenants < self._record.next_slot_id:
            raise OpenError(
                f"max_tenants={wanted.max_tenants} is below the {self._record.next_slot_id} "
                f"tenant ids {rpath} has recorded; raise max_tenants to at least "
                f"{self._record.next_slot_id}"
            )
        if wanted.max_tenants > stored.max_tenants or wanted.max_unlinks > stored.max_unlinks:
            grown = Geometry(
                max(wanted.max_tenants, stored.max_tenants),
                max(wanted.max_unlinks, stored.max_unlinks),
            )
            try:
                self._reclaim_file = file.rebuild(grown, self._record)
            except OSError as exc:
                raise OpenIoError(rpath, "rebuild at a larger geometry", exc) from exc
            self._reclaim_rebuilt = True
        present = {f.header.uuid for f in segments}
        if self._record.planned:
            self._reconcile_planned(present)
            changed = True
        changed |= self._open_published(bool(segments))
        if changed:
            try:
                self._reclaim_file.write(self._record)
            except OSError as exc:
                raise OpenIoError(rpath, "write the reconciled record", exc) from exc

    def _reconcile_planned(self, present: set[uuid.UUID]) -> None:
        """Planned entries at open: a segment still present is retained (the next pass
        re-plans it); one that is gone was reclaimed, and raises ``reclaimed_through``."""
        record = self._record
        mode = record.consumer_mode
        for planned in record.planned:
            if planned.segment in present:
                continue
            for slot, offset in planned.pairs.items():
                entry = record.entries.get(slot)
                if entry is None or offset.lsn > entry.reclaimed_through.lsn:
                    from .reclaim import ReclaimEntry

                    record.entries[slot] = ReclaimEntry(mode, offset)
        record.planned = []

    def _account_scan(self, seg: _Segment, scan: SegmentScan) -> None:
        base = seg.base
        on_frame = self._ledger.on_frame
        for raw in scan.frames:
            end = base + raw.end - HEADER_SIZE
            tenant = raw.tenant if raw.kind is FrameKind.TENANT_BATCH else None
            on_frame(seg, tenant, end, raw.end - raw.start)
        seg.scanned = True
        if seg is not self._cur:
            self._ledger.close(seg)

    def rebuild_ledger(self) -> None:
        """Walk every segment not yet accounted (oldest first, frames validated exactly as
        replay validates them) into the ledger. Replay does this as a by-product."""
        with self._lock:
            self._rebuild_locked()

    def _rebuild_locked(self) -> None:
        if self._ledger_rebuilt:
            return
        for s in self._ledger.segments():
            seg = self._seg(s)
            if seg.scanned:
                continue
            scan = scan_segment(
                self._fs, SegmentFile(seg.path, seg.header, HEADER_SIZE + seg.data_len)
            )
            self._account_scan(seg, scan)
        self._ledger_rebuilt = True

    @staticmethod
    def _seg(seg: LedgerSegment) -> _Segment:
        assert isinstance(seg, _Segment)
        return seg

    def _segment_path(self, seg: LedgerSegment) -> Path:
        return self._seg(seg).path

    def _install(self, seg: _Segment) -> None:
        self._ledger.add_segment(seg)
        self._cur = seg

    # ------------------------------------------------------------------ append

    def append_batch(
        self, tenant: str, payload: bytes, kind: FrameKind = FrameKind.TENANT_BATCH
    ) -> Pending:
        """Write one frame and return its ``Pending`` (call ``wait()`` before acking).

        Raises ``FrameRejected`` for an invalid tenant or an oversize payload (nothing
        written), ``RotationRetrying``/``RotationTerminal`` when a needed rotation
        failed, ``WalIoError`` when the write failed (the segment is sealed).
        """
        raw = self._valid_tenants.get(tenant)
        if raw is None:
            raw = validate_tenant(tenant) if (tenant or kind is FrameKind.TENANT_BATCH) else b""
            if len(self._valid_tenants) < _TENANT_CACHE_MAX:
                self._valid_tenants[tenant] = raw
        frame = encode_frame(kind, raw, payload, max_payload=self.config.max_frame_bytes)
        size = len(frame)
        with self._lock:
            self._check_writable_locked()
            if not self._ledger_rebuilt:
                self._rebuild_locked()  # once, before the ledger's first live frame
            cur = self._cur
            assert cur is not None
            if cur.sealed or (
                cur.frames
                and (
                    HEADER_SIZE + cur.data_len + size > self.config.segment_max_bytes
                    or self._clock() - cur.created >= self.config.segment_age_secs
                )
            ):
                self._rotate_locked()
                cur = self._cur
                assert cur is not None
            end = self._end_lsn + size
            try:
                assert cur.fd is not None
                started = time.perf_counter()
                self._fs.write(cur.fd, frame)
                if self._on_append is not None:
                    self._on_append(time.perf_counter() - started)
            except OSError as exc:
                # The frame may be partly on disk: reserve its LSN range and seal, so
                # nothing is ever appended behind it.
                self._end_lsn = end
                cur.data_len += size
                self._disk_bytes += size
                self._seal_locked(cur, "write", exc)
                raise self._io_error_locked("write", cur.path, exc) from exc
            self._end_lsn = end
            cur.data_len += size
            self._disk_bytes += size
            self._ledger.on_frame(
                cur, tenant if kind is FrameKind.TENANT_BATCH else None, end, size
            )
            pending = Pending(self, self._next_seq, WalOffset(cur.header.uuid, end), cur, size)
            self._next_seq += 1
            self._waiters.append(pending)
            if self._leader is None:
                self._leader = pending
                pending._leader = True
            return pending

    def commit(self, tenant: str, payload: bytes) -> CommitOutcome:
        """``append_batch`` then ``wait``: the frame is durable when this returns."""
        return self.append_batch(tenant, payload).wait()

    def _check_writable_locked(self) -> None:
        if self._closed or self._broken is not None:
            raise JournalClosed()
        if isinstance(self._rotation, Terminal):
            raise RotationTerminal(self._rotation.attempts, self._rotation.first_error)
        latch = self._no_space
        if latch is not None:
            # Nothing is attempted on a full disk: an owed rotation tried append after
            # append would spend the rotation budget and end terminal (RFC 0052 §3.3).
            raise WalNoSpace(latch.op, latch.path, OSError(latch.error), latched=True)

    # ------------------------------------------------------------------ no space

    def _io_error_locked(self, op: str, path: Path, exc: OSError) -> WalIoError:
        """The typed error for a failed write or fsync; a full filesystem latches."""
        if is_no_space(exc):
            self._latch_no_space_locked(op, path, exc)
            return WalNoSpace(op, path, exc)
        return WalIoError(op, path, exc)

    def _latch_no_space_locked(self, op: str, path: Path, exc: OSError) -> None:
        if self._no_space is None:
            self._no_space_seq += 1
            self._no_space = NoSpace(self._no_space_seq, op, str(path), str(exc), self._clock())

    @property
    def no_space(self) -> NoSpace | None:
        """The no-space latch, or None. A plain attribute read (no lock): admission
        consults it on every request."""
        return self._no_space

    def clear_no_space(self, seq: int) -> NoSpace | None:
        """Clear the latch numbered ``seq`` (the owner saw free space return after it
        observed that latch); a newer latch stays. Returns what was cleared."""
        with self._lock:
            latch = self._no_space
            if latch is None or latch.seq != seq:
                return None
            self._no_space = None
            return latch

    @property
    def unreclaimed_bytes(self) -> int:
        """The ledger's incremental unreclaimed-bytes counter (RFC 0052 §3.5), read
        without the journal mutex: one int, for admission's per-request check."""
        return self._ledger.unreclaimed_bytes

    # ------------------------------------------------------------------ group commit

    def _lead(self, me: Pending) -> None:
        extra = 0
        while self._sync_round(me, extra < EXTRA_ROUNDS):
            if me._done:
                extra += 1

    def _sync_round(self, me: Pending, may_continue: bool = False) -> bool:
        """One fsync round led by ``me``. True when ``me`` leads the next round too: its
        own frame is not yet covered, or (at most ``EXTRA_ROUNDS`` times) waiters are
        queued, so the next round starts without waking another thread first."""
        fs = self._fs
        with self._lock:
            covered = self._next_seq - 1
            cur = self._cur
            assert cur is not None
            fd = cur.fd
            do_data = not cur.sealed and fd is not None
            dir_pending = self._dir_pending
            gen = self._dir_gen
            eof = WalOffset(cur.header.uuid, self._end_lsn)
            eof_lsn = self._end_lsn
        dir_err: OSError | None = None
        data_err: OSError | None = None
        try:
            if dir_pending is not None:
                try:
                    fs.fsync_dir(self.root)
                except OSError as exc:
                    dir_err = exc
            if dir_err is None and do_data:
                assert fd is not None
                started = time.perf_counter()
                try:
                    fs.fsync(fd)
                except OSError as exc:
                    data_err = exc
                if self._on_fsync is not None:
                    self._on_fsync(time.perf_counter() - started)
        except BaseException as exc:
            self._abandon(exc)
            raise
        with self._lock:
            failure: AppendError | None = None
            if dir_pending is not None:
                failure = self._dir_fsync_outcome_locked(dir_pending, gen, dir_err)
            if data_err is not None:
                self._seal_locked(cur, "fsync", data_err)
            elif do_data and dir_err is None:
                cur.synced_lsn = max(cur.synced_lsn, eof_lsn)
                self._synced_lsn = max(self._synced_lsn, eof_lsn)
            waiters = self._waiters
            while waiters and waiters[0].seq <= covered:
                w = waiters[0]
                if failure is not None:
                    _finish(w, None, _copy_error(failure))
                elif w._seg.dir_gen > self._dir_durable_gen:
                    break  # its segment's entry is not durable yet: the next round
                else:
                    _finish(w, CommitOutcome(w.seq, w.offset, eof), None)
                waiters.popleft()
            if self._retired:
                self._close_retired_locked()
            if waiters:
                nxt = waiters[0]
                if nxt is me or may_continue:
                    return True
                self._leader = nxt
                me._leader = False
                nxt._leader = True
                nxt._lock.release()
                return False
            self._leader = None
            me._leader = False
            self._idle.notify_all()
            return False

    def _dir_fsync_outcome_locked(
        self, origin: DirFsyncOrigin, gen: int, err: OSError | None
    ) -> AppendError | None:
        if err is None:
            self._dir_durable_gen = max(self._dir_durable_gen, gen)
            if self._dir_gen == gen:
                self._dir_pending = None
            if origin is DirFsyncOrigin.ROTATION:
                self._rotation_succeeded_locked()
            return None
        if origin is DirFsyncOrigin.ROTATION:
            return self._rotation_failed_locked(
                "discharge the pending directory fsync", self.root, err
            )
        return self._io_error_locked("directory fsync", self.root, err)

    def _seal_locked(self, seg: _Segment, op: str, exc: OSError) -> None:
        """Seal ``seg``: every unacknowledged frame in it fails; nothing more lands in it."""
        if seg.sealed:
            return
        seg.sealed = True
        self._events(
            "wal.segment.sealed",
            {"segment": seg.path.name, "reason": f"{op} failed: {exc}", "lsn": seg.end_lsn},
        )
        kept: deque[Pending] = deque()
        error = self._io_error_locked(op, seg.path, exc)
        for w in self._waiters:
            if w._seg is seg:
                _finish(w, None, _copy_error(error))
            else:
                kept.append(w)
        # A resolved leader keeps running its round and hands off at the round's end.
        self._waiters = kept

    def _abandon(self, exc: BaseException) -> None:
        """An unexpected exception (or a simulated crash) inside a round: fail every
        waiter so no thread is stranded, and refuse further appends."""
        with self._lock:
            self._broken = exc
            for w in self._waiters:
                _finish(w, None, JournalClosed())
            self._waiters.clear()
            self._leader = None
            self._idle.notify_all()

    # ------------------------------------------------------------------ rotation

    def rotate(self, kind: RotationKind = RotationKind.DISCRETIONARY) -> bool:
        """Rotate now (the barrier's idle path, or an owed seal). Discharges a pending
        rotation obligation first; a no-op (False) when the current segment holds no
        frame and is not sealed. Raises ``RotationRetrying``/``RotationTerminal``."""
        with self._lock:
            self._check_writable_locked()
            if not self._ledger_rebuilt:
                self._rebuild_locked()
            cur = self._cur
            assert cur is not None
            if self._dir_pending is DirFsyncOrigin.ROTATION:
                self._discharge_rotation_obligation_locked()
            if not cur.sealed and cur.frames == 0:
                return False
            self._rotate_locked()
            return True

    def _discharge_rotation_obligation_locked(self) -> None:
        try:
            self._fs.fsync_dir(self.root)
        except OSError as exc:
            raise self._rotation_failed_locked(
                "discharge the pending directory fsync", self.root, exc
            ) from exc
        self._dir_fsync_outcome_locked(DirFsyncOrigin.ROTATION, self._dir_gen, None)

    def _rotate_locked(self) -> None:
        if self._dir_pending is DirFsyncOrigin.ROTATION:
            # One rotation obligation at a time (RFC 0052 §3.3).
            self._discharge_rotation_obligation_locked()
        old = self._cur
        assert old is not None
        if not old.sealed and old.fd is not None and old.synced_lsn < old.end_lsn:
            try:
                self._fs.fsync(old.fd)
            except OSError as exc:
                self._seal_locked(old, "fsync", exc)
                if is_no_space(exc):
                    raise WalNoSpace("fsync", old.path, exc) from exc
            else:
                old.synced_lsn = old.end_lsn
        flags = FLAG_HAS_PREDECESSOR | (FLAG_PREDECESSOR_SEALED if old.sealed else 0)
        header = SegmentHeader(self._end_lsn, uuid7(self._clock()), flags, old.base)
        try:
            seg = self._create_segment_locked(header)
        except _StepError as exc:
            raise self._rotation_failed_locked(exc.step, exc.path, exc.cause) from exc.cause
        if not self._ledger_rebuilt:
            self._rebuild_locked()
        self._install(seg)
        self._disk_bytes += HEADER_SIZE
        self._retired.append(old)
        if self._leader is None:
            self._close_retired_locked()
        self._dir_gen += 1
        seg.dir_gen = self._dir_gen
        try:
            self._fs.fsync_dir(self.root)
        except OSError as exc:
            self._dir_pending = DirFsyncOrigin.ROTATION
            err = self._rotation_failed_locked("fsync the parent directory", self.root, exc)
            if isinstance(err, RotationTerminal):
                raise err from exc
            return  # installed; the next sync discharges the obligation before any ack
        self._dir_durable_gen = self._dir_gen
        self._dir_pending = None
        self._rotation_succeeded_locked()

    def _create_segment_locked(self, header: SegmentHeader) -> _Segment:
        """Steps 1–4 of the creation protocol; raises ``_StepError`` naming the step."""
        fs = self._fs
        partial = self.root / partial_name(header.uuid)
        final = self.root / segment_name(header.base_lsn)
        step = "create"
        fd: int | None = None
        try:
            fd = fs.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
            self._segments_created += 1
            self._partials.append(partial)
            step = "write the header of"
            fs.write(fd, header.encode())
            step = "fsync the header of"
            fs.fsync(fd)
            step = "rename"
            try:
                fs.stat(final)
            except FileNotFoundError:
                pass
            else:
                raise FileExistsError(17, "a segment with this base already exists", str(final))
            fs.rename(partial, final)
        except OSError as exc:
            if fd is not None:
                try:
                    fs.close(fd)
                except OSError:
                    pass
            raise _StepError(step, partial, exc) from exc
        self._partials.remove(partial)
        # Reopen on the final path so every later message names the real file.
        try:
            final_fd = fs.open(final, os.O_WRONLY | os.O_APPEND)
        except OSError:
            final_fd = None
        if final_fd is not None:
            try:
                fs.close(fd)
            except OSError:
                pass
            fd = final_fd
        seg = _Segment(header, final, fd, uuid7_time(header.uuid))
        seg.scanned = True
        return seg

    def _close_retired_locked(self) -> None:
        for seg in self._retired:
            if seg.fd is not None:
                try:
                    self._fs.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None
        self._retired.clear()

    def _rotation_failed_locked(self, step: str, path: Path, exc: OSError) -> AppendError:
        what = f"{step} {path}: {exc}"
        if is_no_space(exc):
            self._latch_no_space_locked(step, path, exc)
        budget = self.config.rotation_retry_attempts
        state = self._rotation
        if isinstance(state, Terminal):
            return RotationTerminal(state.attempts, state.first_error)
        attempts = 1 if isinstance(state, Healthy) else state.attempts + 1
        first = what if isinstance(state, Healthy) else state.first_error
        if attempts >= budget:
            self._rotation = Terminal(attempts, first)
            self._events(
                "wal.rotation.terminal",
                {"attempts": attempts, "first_error": first, "last_error": what},
            )
            return RotationTerminal(attempts, first)
        self._rotation = Retrying(attempts, first)
        if isinstance(state, Healthy):
            self._events(
                "wal.rotation.retrying", {"attempts": attempts, "budget": budget, "error": what}
            )
        return RotationRetrying(attempts, budget, first)

    def _rotation_succeeded_locked(self) -> None:
        state = self._rotation
        if isinstance(state, Retrying):
            self._rotation = Healthy()
            self._events(
                "wal.rotation.recovered",
                {"attempts": state.attempts, "first_error": state.first_error},
            )

    # ------------------------------------------------------------------ checkpoint

    @property
    def last_checkpoint(self) -> WalOffset | None:
        with self._lock:
            return self._checkpoint

    def checkpoint(
        self, mark: WalOffset, published: Mapping[str, PublishedMarks] | None = None
    ) -> bool:
        """Advance the CHECKPOINT to ``mark`` (a turn's own frame end), then write
        ``published`` (each tenant's frontiers) to PUBLISHED in the same call — after
        CHECKPOINT, so a crash between the two leaves a stale PUBLISHED, whose entries
        still govern their tenants (RFC 0055 §9.4).

        Monotonic: a lower mark raises ``CheckpointError``; an equal one writes no
        CHECKPOINT (False). On a failed CHECKPOINT write the previous mark stays in force
        and ``CheckpointError`` carries the cause; on a failed PUBLISHED write after it
        ``PublishedWriteError`` (``checkpointed`` says whether the mark moved). The file
        I/O runs without the journal mutex, so appends continue meanwhile.
        """
        advanced = self._checkpoint_mark(mark)
        if published:
            self._write_published(published, checkpointed=advanced)
        return advanced

    def _checkpoint_mark(self, mark: WalOffset) -> bool:
        with self._ckpt_lock:
            with self._lock:
                current = self._checkpoint
                if current is not None:
                    if mark.lsn < current.lsn:
                        raise CheckpointError(
                            f"checkpoint mark {mark} is below the current mark {current}"
                        )
                    if mark.lsn == current.lsn:
                        if mark.segment != current.segment:
                            raise CheckpointError(
                                f"checkpoint mark {mark} names another segment than the "
                                f"current mark {current} at the same LSN"
                            )
                        return False
                found = self._ledger.segment(mark.segment)
                seg = None if found is None else self._seg(found)
                if seg is None or not seg.base < mark.lsn <= seg.end_lsn:
                    raise CheckpointError(
                        f"checkpoint mark {mark} does not end a frame of a surviving segment"
                    )
                if mark.lsn > self._synced_lsn:
                    raise CheckpointError(
                        f"checkpoint mark {mark} is beyond the durable end (LSN {self._synced_lsn})"
                    )
                # Decided on what is durable, not on the in-memory flag: a failed arming
                # write must be retried before any CHECKPOINT exists.
                arm = not self._armed_durable
                if arm:
                    self._record.flags |= FLAG_CHECKPOINT_ARMED
                    self._touch_record_locked()
            if arm:
                # The witness is durable before the first CHECKPOINT can exist, so a
                # crash in between never reads as a lost checkpoint (RFC 0052 §3.2).
                try:
                    self._write_record()
                except OSError as exc:
                    raise CheckpointError(
                        f"arming RECLAIM before the first checkpoint failed: {exc}; no mark "
                        f"was written"
                    ) from exc
            try:
                write_checkpoint(self._fs, self.root, mark)
            except OSError as exc:
                raise CheckpointError(
                    f"writing CHECKPOINT at {mark} failed: {exc}; the previous mark "
                    f"{current} stays in force"
                ) from exc
            with self._lock:
                self._checkpoint = mark
                self._ledger.checkpoint = mark  # O(1): nothing is promoted eagerly
                see = not self._record.flags & FLAG_CHECKPOINT_SEEN
                if see:
                    self._record.flags |= FLAG_CHECKPOINT_SEEN
                    self._touch_record_locked()
            if see:
                try:
                    self._write_record()
                except OSError:
                    pass  # stays dirty: the next pass writes it; open promotes it anyway
            return True

    # ------------------------------------------------------------------ replay

    def replay(self, after_lsn: int | None = None) -> Replay:
        """Iterate every surviving frame, oldest first, CRC-checked, skipping frames
        that end at or below ``after_lsn``. Recovery calls it before the first append.
        Damage is legal only where a torn tail can be (module ``layout``); anywhere else
        it raises ``CorruptionError`` naming the file and the offset."""
        with self._lock:
            if self._next_seq != 1:
                raise WalError("replay is recovery's: it runs before the first append")
            segments = [self._seg(x) for x in self._ledger.segments()]
        return Replay(self, segments, after_lsn)

    # ------------------------------------------------------------------ bounded reads

    def oldest_frame(self, tenant: str) -> FrameCursor | None:
        """A cursor from which ``read_frames_from`` returns ``tenant``'s oldest surviving
        frame first (the start of the segment holding it); None when it has none."""
        with self._lock:
            if not self._ledger_rebuilt:
                self._rebuild_locked()
            first = self._ledger.oldest_frame(tenant)
            if first is None:
                return None
            seg = self._ledger.segment(first.segment)
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
        with self._lock:
            if not self._ledger_rebuilt:
                self._rebuild_locked()
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

    def _seg_at_or_after_locked(self, cursor: FrameCursor, tenant: str) -> _Segment | None:
        """The first surviving segment holding a frame of ``tenant`` at or after the
        cursor; segments below it, or without the tenant, are skipped by the ledger."""
        for s in self._ledger.segments():
            seg = self._seg(s)
            span = seg.tenants.get(tenant)
            # No frame of the tenant after the cursor here: skipped unread (such a
            # segment may be mid-reclamation, its file already unlinked).
            if span is not None and span[1] > cursor.lsn:
                return seg
        return None

    def _next_segment_locked(self, seg: _Segment) -> _Segment | None:
        later = [self._seg(s) for s in self._ledger.segments() if s.base > seg.base]
        return later[0] if later else None

    def _read_segment_locked(
        self, seg: _Segment, start: int, to: FrameSpan, tenant: str, limit: int
    ) -> list[Frame]:
        """At most ``limit`` of ``tenant``'s frames of ``seg`` from LSN ``start``, stopping
        after the ``to`` frame; other tenants' frames are skipped by their prefix."""
        fs = self._fs
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

    # ------------------------------------------------------------------ state

    @property
    def rotation_state(self) -> RotationState:
        with self._lock:
            return self._rotation

    @property
    def dir_fsync_pending(self) -> DirFsyncOrigin | None:
        with self._lock:
            return self._dir_pending

    @property
    def quarantined(self) -> list[QuarantineRecord]:
        """The quarantine records in force at open (their segments left the set)."""
        return list(self._quarantined)

    @property
    def stale_partials(self) -> list[Path]:
        """``<uuid>.wal.partial`` files left by failed rotations (seeded at open)."""
        with self._lock:
            return list(self._partials)

    @property
    def end_lsn(self) -> int:
        with self._lock:
            return self._end_lsn

    @property
    def segments_created(self) -> int:
        """Segment files created since open (a failed rotation's partial included): with
        ``end_lsn`` it is what the WAL added to its volume, for a caller estimating free
        space between two samples of it (read differences; one int, no lock)."""
        return self._segments_created

    def unflushed_bytes(self) -> int:
        """Bytes written but not yet covered by a successful fsync."""
        return self._end_lsn - self._synced_lsn

    def reclaim_state(self) -> ReclaimState:
        """What RFC 0052 §3.5 exports, O(1) under the journal mutex."""
        with self._lock:
            return self._reclaim_state_locked(
                self._end_lsn - self._synced_lsn,
                self._disk_bytes + self._reclaim_file.geometry.file_size,
                self._rotation,
                self._clock(),
            )

    def _on_removed_locked(self, segs: list[LedgerSegment]) -> None:
        for s in segs:
            self._disk_bytes -= HEADER_SIZE + self._seg(s).data_len

    def segment_names(self) -> list[str]:
        with self._lock:
            return [self._seg(s).path.name for s in self._ledger.segments()]

    def current_segment_age(self) -> tuple[float, int]:
        """(seconds since the current segment was created, frames it holds) — what the
        barrier's idle rotation decides on."""
        with self._lock:
            cur = self._cur
            assert cur is not None
            return max(0.0, self._clock() - cur.created), cur.frames

    @property
    def current_segment(self) -> uuid.UUID:
        with self._lock:
            assert self._cur is not None
            return self._cur.uuid

    # ------------------------------------------------------------------ close

    @property
    def closed(self) -> bool:
        """True once ``close`` ran: appends are refused and descriptors released."""
        with self._lock:
            return self._closed

    def close(self) -> None:
        """Refuse new appends, let in-flight waiters finish, fsync and close files."""
        with self._lock:
            self._closed = True
            while self._leader is not None:
                self._idle.wait()
            for w in self._waiters:  # only reachable after an abandoned round
                _finish(w, None, JournalClosed())
            self._waiters.clear()
            segments = [self._seg(x) for x in self._ledger.segments()] + list(self._retired)
            self._retired.clear()
            reclaim = getattr(self, "_reclaim_file", None)
            if reclaim is not None and not reclaim.closed:
                reclaim.close()
            if self._published_file is not None and not self._published_file.closed:
                self._published_file.close()
            for seg in segments:
                if seg.fd is None:
                    continue
                try:
                    if not seg.sealed and seg.synced_lsn < seg.end_lsn:
                        self._fs.fsync(seg.fd)
                    self._fs.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Replay:
    """Iterator over replayed frames; ``report`` is complete once exhausted."""

    def __init__(self, journal: Journal, segments: list[_Segment], after_lsn: int | None) -> None:
        self._journal = journal
        self._segments = segments
        self._after = after_lsn
        self.report = ReplayReport()

    def __iter__(self) -> Iterator[Frame]:
        journal = self._journal
        fs = journal._fs
        after = -1 if self._after is None else self._after
        previous: SegmentScan | None = None
        n = len(self._segments)
        for i, seg in enumerate(self._segments):
            f = SegmentFile(seg.path, seg.header, HEADER_SIZE + seg.data_len)
            scan = scan_segment(fs, f)
            if previous is not None:
                problem = chain_problem(previous, f)
                if problem is not None:
                    raise problem
            newest = i == n - 1
            if scan.stop.damaged and not newest:
                nxt = self._segments[i + 1].header
                direct = nxt.has_predecessor and nxt.prev_base_lsn == seg.base
                if direct and not nxt.predecessor_sealed:
                    raise CorruptionError(
                        seg.path,
                        scan.stop.valid_end,
                        f"damage ({scan.stop.reason}) in a segment closed by a clean "
                        f"rotation; acknowledged frames after LSN {scan.valid_end_lsn} may be "
                        f"unreadable",
                    )
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
            with journal._lock:
                if not seg.scanned:
                    journal._account_scan(seg, scan)
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
            previous = scan
        with journal._lock:
            journal._ledger_rebuilt = True


def _finish(w: Pending, outcome: CommitOutcome | None, error: AppendError | None) -> None:
    if w._done:
        return
    w._outcome = outcome
    w._error = error
    w._done = True
    if not w._leader:
        w._lock.release()


def _copy_error(err: AppendError) -> AppendError:
    """A fresh exception per waiter: one instance raised in many threads would share
    (and race on) its traceback."""
    if isinstance(err, RotationTerminal):
        return RotationTerminal(err.attempts, err.first_error)
    if isinstance(err, RotationRetrying):
        return RotationRetrying(err.attempts, err.budget, err.first_error)
    if isinstance(err, WalNoSpace):
        return WalNoSpace(err.op, err.path, err.cause, latched=err.latched)
    if isinstance(err, WalIoError):
        return WalIoError(err.op, err.path, err.cause)
    return JournalClosed()

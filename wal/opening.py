"""Opening a root: what ``Journal.open`` checks and does before the first append.

In order:

1. The directory: created (parents fsynced) when missing, refused when not a directory,
   and fsynced before any listing is trusted.
2. The listing (``layout.list_root``): names and headers agree, no duplicate base or
   UUID, no overlap; stale ``<uuid>.wal.partial`` files are remembered for housekeeping;
   a ``RECLAIM.new`` or ``PUBLISHED.new`` left by a crashed rebuild is removed.
3. CHECKPOINT is read, and the quarantine records in force (``wal/quarantine.py``).
4. The RECLAIM × CHECKPOINT × segments matrix (RFC 0052 §3.2, DESIGN.md §4: the legacy
   rows do not apply), the geometry rebuild, planned-entry reconciliation against the
   directory, then PUBLISHED's rows (``frontiers``). Every change is durable before
   anything else reads the record; a fresh root gets RECLAIM before its first segment,
   so no restart ever finds a segment beside no record.
5. HIGHWATER is loaded, or created preallocated (``wal/highwater_file.py``).
6. The newest segment is walked frame by frame. Damage below its high-water — the
   larger of the CHECKPOINT mark, when the mark lies in it, and what HIGHWATER records
   for it — is corruption and refuses the open naming the file, the offset and the
   high-water. A torn tail (damage above it) is sealed, never truncated: the bytes stay
   as evidence and the next append starts a new segment, whose header records the end
   of the valid frames as the sealed segment's high-water (open's fsync below makes
   them durable before any rotation can record it). The frames that still verify after
   the damage are counted and named (``wal.torn_tail``): above the high-water they may
   be acknowledged frames of the last ``wal.high_water_bytes``, lost with the tail. If
   a quarantined segment lies beyond it, it is sealed too, so no LSN is reused. It is
   fsynced (a killed process may have left its last frames only in the page cache), and
   HIGHWATER records what that fsync covered when it moved far enough. Older segments'
   frames are walked by replay and by ``ourios wal verify``.
7. Every open owes a directory fsync (``rotation``); the checkpoint spare is allocated
   so a full disk can still checkpoint; each quarantine record is reported.

An allocation that fails here (RECLAIM, HIGHWATER, the first segment, the spare) fails
the open naming the file; the same root opens once space is freed.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from .checkpoint_file import SPARE_NAME, make_spare, read_checkpoint
from .config import reclaim_file_bytes
from .errors import CorruptionError, OpenError, OpenIoError
from .frontiers import Frontiers
from .highwater import HighWater
from .highwater_file import HighWaterFile
from .log import Log, Segment
from .published_file import PublishedFile
from .quarantine import in_force, load_records
from .reclaim_file import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    Geometry,
    ReclaimEntry,
    ReclaimFile,
    ReclaimRecord,
)
from .reclamation import Reclamation
from .rotation import Rotation, StepError, create_segment
from .scan import (
    SegmentFile,
    SegmentScan,
    checkpoint_high_water,
    frames_after_damage,
    high_water_problem,
    list_root,
    scan_segment,
)
from .segment import HEADER_SIZE, SegmentHeader, uuid7, uuid7_time
from .types import WalOffset


@dataclass(frozen=True, slots=True)
class OpenReport:
    """What open found and did."""

    fresh: bool
    segments: int
    sealed_newest: bool  # the newest segment had a torn tail and was sealed
    seal_reason: str
    stale_partials: int
    checkpoint: WalOffset | None
    #: bytes after the newest segment's valid frames (a torn tail; kept, never replayed)
    torn_tail_bytes: int = 0
    #: frames that still verify after the damage (left behind it, uncounted before)
    torn_tail_frames: int = 0


class Opener:
    """Runs one open over a journal's parts (module docstring); each part is handed what
    it owns: the segment set to the ``Log``, RECLAIM to ``Reclamation``, PUBLISHED to
    ``Frontiers``, HIGHWATER to ``HighWater``, the open obligation to ``Rotation``. The
    CHECKPOINT mark read here is ``OpenReport.checkpoint``, which the journal hands to
    its checkpoint writer."""

    def __init__(
        self,
        log: Log,
        rotation: Rotation,
        reclamation: Reclamation,
        frontiers: Frontiers,
        high_water: HighWater,
    ) -> None:
        self._log = log
        self._rotation = rotation
        self._reclamation = reclamation
        self._frontiers = frontiers
        self._high_water = high_water
        self._torn_bytes = 0
        self._torn_frames = 0

    def run(self) -> OpenReport:
        """Open the root; the report carries the CHECKPOINT mark in force."""
        log = self._log
        fs, root = log.fs, log.root
        self._directory()
        listing = list_root(fs, root)
        log.partials = list(listing.partials)
        self._remove_leftover_rebuild(listing.other)
        checkpoint = read_checkpoint(fs, root)
        # Segments an operator quarantined (``ourios wal quarantine``): their LSNs are
        # never reused and a horizon inside one is a recorded loss (wal/quarantine.py).
        log.quarantined = in_force(load_records(fs, root), {f.path.name for f in listing.segments})
        quarantined_end = max((q.end_lsn for q in log.quarantined), default=0)
        self._open_reclaim(listing.segments, checkpoint)
        try:
            self._high_water.open()
        except OSError as exc:
            raise OpenIoError(
                root / HighWaterFile.NAME,
                "allocate (so the newest segment's high-water can be recorded)",
                exc,
            ) from exc
        sealed_reason = ""
        fresh = not listing.segments
        if fresh:
            if checkpoint is not None and (not log.quarantined or checkpoint.lsn > quarantined_end):
                raise CorruptionError(
                    root / "CHECKPOINT",
                    None,
                    f"CHECKPOINT holds mark {checkpoint} but the WAL has no segment "
                    f"(the current segment is never reclaimed; were segments removed by hand?)",
                )
            # RECLAIM is durable (``_open_reclaim``) before the first segment exists, so
            # no restart ever finds a segment beside no record.
            header = SegmentHeader(quarantined_end, uuid7(log.clock()))
            try:
                seg = create_segment(log, header)
            except StepError as exc:
                raise OpenIoError(exc.path, f"{exc.step} the first segment", exc.cause) from exc
            log.install(seg)
            log.disk_bytes = HEADER_SIZE
            log.end_lsn = quarantined_end
            log.rebuilt = True  # nothing to walk
        else:
            sealed_reason = self._newest(listing.segments, quarantined_end, checkpoint)
        log.synced_lsn = log.end_lsn
        if not fresh:
            self._high_water.record_due()  # what open's fsync of the newest covered
        self._rotation.owe_open()
        try:
            make_spare(fs, root)
        except OSError as exc:
            raise OpenIoError(
                root / SPARE_NAME,
                "allocate the checkpoint spare (so a full disk can still checkpoint)",
                exc,
            ) from exc
        for q in log.quarantined:
            log.events(
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
        return OpenReport(
            fresh=fresh,
            segments=log.ledger.segment_count,
            sealed_newest=bool(sealed_reason),
            seal_reason=sealed_reason,
            stale_partials=len(log.partials),
            checkpoint=checkpoint,
            torn_tail_bytes=self._torn_bytes,
            torn_tail_frames=self._torn_frames,
        )

    def _directory(self) -> None:
        fs, root = self._log.fs, self._log.root
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

    def _newest(
        self, segments: list[SegmentFile], quarantined_end: int, checkpoint: WalOffset | None
    ) -> str:
        """Account the older segments, walk the newest, seal it when its tail is torn or a
        quarantined segment lies beyond it, fsync it. Returns why it was sealed ("")."""
        log = self._log
        fs, root = log.fs, log.root
        sealed_reason = ""
        for f in segments[:-1]:
            seg = Segment(f.header, f.path, None, uuid7_time(f.header.uuid))
            seg.data_len = f.data_len
            seg.synced_lsn = f.data_end
            seg.scanned = False  # membership unknown until replay walks it
            log.ledger.add_closed(seg)
            log.disk_bytes += f.size
        newest_file = segments[-1]
        scan = scan_segment(fs, newest_file)
        seg = Segment(
            newest_file.header, newest_file.path, None, uuid7_time(newest_file.header.uuid)
        )
        seg.data_len = newest_file.data_len
        seg.scanned = False
        log.install(seg)
        if len(segments) == 1:
            log.account_scan(seg, scan)  # the whole ledger, in order
        log.disk_bytes += newest_file.size
        log.end_lsn = newest_file.data_end  # the next base skips any torn bytes
        # The newest segment's durable high-waters are the checkpoint mark when it lies
        # here (an acknowledged frame's end) and what HIGHWATER records for it (an end a
        # completed fsync covered): damage below the larger is corruption, not a torn
        # tail to seal. Refused before anything is written.
        marks = [
            m
            for m in (
                checkpoint_high_water(newest_file, checkpoint),
                self._high_water.claim(newest_file),
            )
            if m is not None
        ]
        mark = max(marks, key=lambda m: m[0]) if marks else None
        if mark is not None:
            problem = high_water_problem(scan, *mark)
            if problem is not None:
                raise problem
        # The frames open's fsync (below) makes durable end where the valid frames end:
        # that, never the torn bytes after them, is the high-water the successor records.
        seg.synced_lsn = scan.valid_end_lsn
        if scan.stop.damaged:
            seg.sealed = True
            sealed_reason = scan.stop.reason
            self._report_torn_tail(scan, mark)
            log.events(
                "wal.segment.sealed",
                {
                    "segment": seg.path.name,
                    "offset": scan.stop.valid_end,
                    "reason": f"torn tail at open: {scan.stop.reason}",
                    "kept_bytes": scan.file.size - scan.stop.valid_end,
                },
            )
        if quarantined_end > log.end_lsn:
            # The newest segment was quarantined: appending here would reuse its
            # LSNs. Seal the survivor; the next append starts at the quarantined end.
            log.end_lsn = quarantined_end
            if not seg.sealed:
                seg.sealed = True
                sealed_reason = "a quarantined segment lies beyond it"
                log.events(
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
        if checkpoint is not None and checkpoint.lsn > log.end_lsn:
            raise CorruptionError(
                root / "CHECKPOINT",
                None,
                f"CHECKPOINT mark {checkpoint} is beyond the end of the log "
                f"(newest segment {seg.path.name} ends at LSN {log.end_lsn})",
            )
        log.rebuilt = len(segments) == 1
        return sealed_reason

    def _report_torn_tail(self, scan: SegmentScan, mark: tuple[int, str] | None) -> None:
        """Count and name what a torn tail at or above the high-water leaves behind: its
        bytes, and the frames that still verify after the damage (one ``wal.torn_tail``
        event). Above the high-water they may be acknowledged frames of the newest
        ``wal.high_water_bytes``; a crash rarely leaves any, a power loss that persisted
        pages out of order can."""
        path = scan.file.path
        at = scan.stop.valid_end
        after = frames_after_damage(scan.data, at, path)
        self._torn_bytes = scan.file.size - at
        self._torn_frames = len(after)
        self._log.events(
            "wal.torn_tail",
            {
                "path": str(path),
                "segment": path.name,
                "offset": at,
                "lsn": scan.valid_end_lsn,
                "reason": scan.stop.reason,
                "bytes": self._torn_bytes,
                "frames_after": len(after),
                "frame_bytes_after": sum(f.end - f.start for f in after),
                "frames_after_first_offset": after[0].start if after else None,
                "high_water": mark[0] if mark is not None else None,
                "high_water_source": mark[1] if mark is not None else "none recorded",
                "action": "the tail is kept in the sealed segment and never replayed; "
                "frames after it were not recovered (see `ourios wal verify`)"
                if after
                else "the tail is kept in the sealed segment and never replayed",
            },
        )

    def _remove_leftover_rebuild(self, other: list[str]) -> None:
        """A ``RECLAIM.new``, ``PUBLISHED.new`` or ``HIGHWATER.new`` left by a crashed
        creation or rebuild is never read: remove it."""
        fs, root = self._log.fs, self._log.root
        leftovers = (ReclaimFile.NEW_NAME, PublishedFile.NEW_NAME, HighWaterFile.NEW_NAME)
        names = [n for n in leftovers if n in other]
        for name in names:
            try:
                fs.unlink(root / name)
            except OSError as exc:
                raise OpenIoError(root / name, "remove the leftover", exc) from exc
        if names:
            try:
                fs.fsync_dir(root)
            except OSError as exc:
                raise OpenIoError(root, "fsync after removing leftovers", exc) from exc

    def _open_reclaim(self, segments: list[SegmentFile], checkpoint: WalOffset | None) -> None:
        """The RECLAIM × CHECKPOINT × segments matrix (RFC 0052 §3.2, DESIGN.md §4: the
        legacy rows do not apply), the geometry rebuild and planned-entry reconciliation.
        Every change is durable before anything else reads the record."""
        log, reclamation = self._log, self._reclamation
        fs, root = log.fs, log.root
        rpath = root / ReclaimFile.NAME
        cpath = root / "CHECKPOINT"
        wanted = Geometry(log.config.max_tenants, log.config.max_unlinks_per_pass)
        loaded = ReclaimFile.load(fs, root)
        if loaded is None:
            if segments or checkpoint is not None:
                missing = "RECLAIM" if checkpoint is not None else "RECLAIM and CHECKPOINT"
                raise CorruptionError(
                    rpath,
                    None,
                    f"{missing} missing beside {len(segments)} segment(s)"
                    + (f" and a CHECKPOINT at {checkpoint}" if checkpoint else "")
                    + ": this root has run this WAL, so the record of what was reclaimed is "
                    "lost; refusing to guess (restore RECLAIM from a backup of the volume)",
                )
            self._frontiers.create_fresh(wanted.max_tenants)
            try:
                created = ReclaimFile.create(fs, root, wanted, reclamation.record)
            except OSError as exc:
                raise OpenIoError(
                    rpath,
                    f"allocate {reclaim_file_bytes(wanted.max_tenants, wanted.max_unlinks)} "
                    f"bytes for",
                    exc,
                ) from exc
            reclamation.adopt(created, reclamation.record, armed_durable=False)
            return
        file, record = loaded
        file.refuse_newer()
        armed = bool(record.flags & FLAG_CHECKPOINT_ARMED)
        seen = bool(record.flags & FLAG_CHECKPOINT_SEEN)
        reclamation.adopt(file, record, armed_durable=armed)
        changed = False
        if checkpoint is None:
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
                # Reset; the next checkpoint re-arms.
                record = ReclaimRecord(generation=record.generation)
                reclamation.adopt(file, record, armed_durable=False)
                changed = True
        else:
            if not armed and not seen:
                raise CorruptionError(
                    rpath,
                    None,
                    f"CHECKPOINT exists at {checkpoint} but {rpath.name} was never armed "
                    f"for it; no correct writer leaves this pair",
                )
            if not seen:
                record.flags |= FLAG_CHECKPOINT_SEEN  # promoted durably, below
                changed = True
        stored = file.geometry
        if wanted.max_tenants < record.next_slot_id:
            raise OpenError(
                f"max_tenants={wanted.max_tenants} is below the {record.next_slot_id} "
                f"tenant ids {rpath} has recorded; raise max_tenants to at least "
                f"{record.next_slot_id}"
            )
        rebuilt = False
        if wanted.max_tenants > stored.max_tenants or wanted.max_unlinks > stored.max_unlinks:
            grown = Geometry(
                max(wanted.max_tenants, stored.max_tenants),
                max(wanted.max_unlinks, stored.max_unlinks),
            )
            try:
                reclamation.regrow(grown)
            except OSError as exc:
                raise OpenIoError(rpath, "rebuild at a larger geometry", exc) from exc
            rebuilt = True
        present = {f.header.uuid for f in segments}
        if record.planned:
            _reconcile_planned(record, present)
            changed = True
        changed |= self._frontiers.open(bool(segments), reclaim_rebuilt=rebuilt)
        if changed:
            try:
                reclamation.write_at_open()
            except OSError as exc:
                raise OpenIoError(rpath, "write the reconciled record", exc) from exc


def _reconcile_planned(record: ReclaimRecord, present: set[uuid.UUID]) -> None:
    """Planned entries at open: a segment still present is retained (the next pass
    re-plans it); one that is gone was reclaimed, and raises ``reclaimed_through``."""
    mode = record.consumer_mode
    for planned in record.planned:
        if planned.segment in present:
            continue
        for slot, offset in planned.pairs.items():
            entry = record.entries.get(slot)
            if entry is None or offset.lsn > entry.reclaimed_through.lsn:
                record.entries[slot] = ReclaimEntry(mode, offset)
    record.planned = []

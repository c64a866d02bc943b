"""Quarantine: moving an unreadable segment out of the set, on an operator's command, with
a record of what it held — so the node can start and the loss stays named.

Layout, inside the WAL root::

    quarantine/<base:020d>.wal        the segment, moved (a rename: same filesystem)
    quarantine/<base:020d>.wal.json   its record (JSON, ``format``/``version`` below)

The record is written (temp → fsync → rename → directory fsync) *before* the segment is
moved, so a crash between the two leaves the segment in the set with a record beside it
(not in force: the segment is still read, and ``ourios wal quarantine`` run again
completes the move); a crash after the move leaves both. A record is **in force** when
its segment is no longer in the root. Nothing here ever runs on its own: only the
command writes, and only ``Journal.open`` and the read-only tools read.

What an in-force record changes at open (``Journal.open``) and nothing else:

* **LSN continuity.** ``end_lsn`` bounds the LSNs the segment ever held (its base plus
  its size past the header). Open never lets the log's end fall below it, so a frame is
  never written at an LSN a quarantined frame (a snapshot horizon, a published
  ``wal_lsn``) already names: when the quarantined segment was the newest, the newest
  surviving one is sealed and the next append starts a segment at ``end_lsn``.
* **The stale-gap check** (RFC 0052 §3.2) is explained, not weakened: a tenant's
  horizon that lies in a quarantined segment (its UUID, or its LSN range when the
  header was unreadable) is a recorded loss, not "a segment removed outside the WAL".
  A horizon in any other missing segment still refuses the start. The
  ``reclaimed_through`` check is unchanged: quarantine never writes RECLAIM.
* **Visibility.** Every start emits one ``wal.segment.quarantined`` event per record;
  ``ourios wal inspect``/``verify`` list them; the metrics count them.

The loss a record names: the frames it could read above the checkpoint at quarantine
time (their records were never part of a cut; those the size trigger or the age sweep
published before the quarantine are in the store, the rest are gone), and the bytes
past the first damage. Whether those held acknowledged frames is told by the segment's
synced high-water (``wal/segment.py``: its direct successor's header, or the checkpoint
mark in it), recorded as ``high_water_lsn`` when there is one: damage below it is
corruption of acknowledged frames, and the frames that still verify after the damage
(``frames_after_damage``, ``frames_after_damage_below_high_water``) are named lost with
the segment; without one it cannot be told. Frames at or below the checkpoint are in
the store already; only the WAL copy is lost.

Versions: 2 added ``high_water_lsn``, ``high_water_source``, ``frames_after_damage`` and
``frames_after_damage_below_high_water``; a version 1 record is still read (those read
as unknown: no high-water, no count).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .checkpoint_file import read_checkpoint
from .errors import CorruptionError, WalError
from .frame import RawFrame, scan_frames
from .fs import Fs, read_file
from .scan import SegmentFile, frames_after_damage, recorded_high_water
from .segment import HEADER_SIZE, SEGMENT_RE, SegmentHeader
from .types import FrameKind

DIR_NAME: Final = "quarantine"
RECORD_SUFFIX: Final = ".json"
FORMAT: Final = "ourios-wal-quarantine"
VERSION: Final = 2
#: record versions this build reads (1: before the high-water fields)
READABLE_VERSIONS: Final = (1, 2)

#: ``count_records(payload) -> records`` for a tenant batch's payload (the app decodes
#: OTLP; the WAL cannot), or None when it cannot say.
RecordCounter = Callable[[bytes], "int | None"]


class QuarantineError(WalError):
    """The command refused; nothing was moved."""

    error_type = "wal_quarantine"


@dataclass
class TenantLoss:
    """One tenant's readable frames in a quarantined segment."""

    frames: int = 0
    records: int | None = 0
    first_lsn: int = 0  # the end of its first frame in the segment
    last_lsn: int = 0  # the end of its last readable frame
    frames_above_checkpoint: int = 0
    records_above_checkpoint: int | None = 0


@dataclass
class QuarantineRecord:
    segment: str
    base_lsn: int
    end_lsn: int  # an upper bound of every LSN the segment held
    size: int
    seg_uuid: uuid.UUID | None
    header_error: str
    checkpoint_lsn: int | None
    readable_frames: int
    readable_end_lsn: int
    damage_offset: int | None
    damage: str
    unreadable_bytes: int
    reason: str
    quarantined_unix: float
    tenants: dict[str, TenantLoss] = field(default_factory=dict)
    #: the segment's synced high-water when one was recorded (None: unknown)
    high_water_lsn: int | None = None
    high_water_source: str = ""
    #: frames that still verify after the damaged one, and those ending at or below
    #: the high-water (acknowledged frames the damage cost)
    frames_after_damage: int = 0
    frames_after_damage_below_high_water: int = 0

    @property
    def lost_frames(self) -> int:
        return sum(t.frames_above_checkpoint for t in self.tenants.values())

    @property
    def lost_records(self) -> int | None:
        counts = [t.records_above_checkpoint for t in self.tenants.values()]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def explains(self, segment: uuid.UUID, lsn: int) -> bool:
        """Whether a horizon at (segment, lsn) lies in this quarantined segment."""
        if self.seg_uuid is not None and segment == self.seg_uuid:
            return True
        return self.base_lsn < lsn <= self.end_lsn

    def summary(self) -> str:
        """The loss in one sentence, for logs and the command's output."""
        records = self.lost_records
        what = "an unknown number of records" if records is None else f"{records} record(s)"
        x = self.checkpoint_lsn
        mark = "no checkpoint" if x is None else f"the checkpoint (LSN {x})"
        tail = ""
        if self.unreadable_bytes:
            tail = (
                f"; {self.unreadable_bytes} byte(s) after offset {self.damage_offset} were "
                f"unreadable ({self.damage})"
            )
            hw = self.high_water_lsn
            if x is not None and x >= self.end_lsn:
                tail += ", all at or below the checkpoint: their records are in the store"
            elif hw is not None and self.readable_end_lsn < hw:
                tail += (
                    f", below the high-water {hw} ({self.high_water_source}): corruption of "
                    f"acknowledged frames, not a torn tail — the damaged frame and "
                    f"{self.frames_after_damage_below_high_water} frame(s) after it that "
                    f"still verify were acknowledged and are lost unless published"
                )
            else:
                tail += " and may have held acknowledged frames above the checkpoint"
        tenants = sorted(t for t, loss in self.tenants.items() if loss.frames_above_checkpoint)
        who = f" of tenant(s) {', '.join(tenants[:8])}" if tenants else ""
        return (
            f"segment {self.segment} (LSN {self.base_lsn}..{self.end_lsn}): "
            f"{self.lost_frames} readable frame(s) holding {what}{who} lie above {mark} and "
            f"are lost unless the size trigger or the age sweep had published them{tail}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "high_water_lsn": self.high_water_lsn,
            "high_water_source": self.high_water_source,
            "frames_after_damage": self.frames_after_damage,
            "frames_after_damage_below_high_water": self.frames_after_damage_below_high_water,
            "segment": self.segment,
            "base_lsn": self.base_lsn,
            "end_lsn": self.end_lsn,
            "size": self.size,
            "uuid": None if self.seg_uuid is None else str(self.seg_uuid),
            "header_error": self.header_error,
            "checkpoint_lsn": self.checkpoint_lsn,
            "readable_frames": self.readable_frames,
            "readable_end_lsn": self.readable_end_lsn,
            "damage_offset": self.damage_offset,
            "damage": self.damage,
            "unreadable_bytes": self.unreadable_bytes,
            "reason": self.reason,
            "quarantined_unix": self.quarantined_unix,
            "lost_frames_above_checkpoint": self.lost_frames,
            "lost_records_above_checkpoint": self.lost_records,
            "summary": self.summary(),
            "tenants": {
                t: {
                    "frames": loss.frames,
                    "records": loss.records,
                    "first_lsn": loss.first_lsn,
                    "last_lsn": loss.last_lsn,
                    "frames_above_checkpoint": loss.frames_above_checkpoint,
                    "records_above_checkpoint": loss.records_above_checkpoint,
                }
                for t, loss in sorted(self.tenants.items())
            },
        }

    @classmethod
    def from_json(cls, raw: bytes, path: Path) -> QuarantineRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise CorruptionError(
                    path, None, f"not a quarantine record (format {doc.get('format')!r})"
                )
            if doc.get("version") not in READABLE_VERSIONS:
                raise CorruptionError(
                    path, None, f"unknown quarantine record version {doc.get('version')!r}"
                )
            tenants = {
                str(t): TenantLoss(
                    int(v["frames"]),
                    None if v["records"] is None else int(v["records"]),
                    int(v["first_lsn"]),
                    int(v["last_lsn"]),
                    int(v["frames_above_checkpoint"]),
                    None
                    if v["records_above_checkpoint"] is None
                    else int(v["records_above_checkpoint"]),
                )
                for t, v in dict(doc["tenants"]).items()
            }
            return cls(
                segment=str(doc["segment"]),
                base_lsn=int(doc["base_lsn"]),
                end_lsn=int(doc["end_lsn"]),
                size=int(doc["size"]),
                seg_uuid=None if doc["uuid"] is None else uuid.UUID(str(doc["uuid"])),
                header_error=str(doc["header_error"]),
                checkpoint_lsn=None
                if doc["checkpoint_lsn"] is None
                else int(doc["checkpoint_lsn"]),
                readable_frames=int(doc["readable_frames"]),
                readable_end_lsn=int(doc["readable_end_lsn"]),
                damage_offset=_opt_int(doc["damage_offset"]),
                damage=str(doc["damage"]),
                unreadable_bytes=int(doc["unreadable_bytes"]),
                reason=str(doc["reason"]),
                quarantined_unix=float(doc["quarantined_unix"]),
                tenants=tenants,
                high_water_lsn=_opt_int(doc.get("high_water_lsn")),
                high_water_source=str(doc.get("high_water_source", "")),
                frames_after_damage=int(doc.get("frames_after_damage", 0)),
                frames_after_damage_below_high_water=int(
                    doc.get("frames_after_damage_below_high_water", 0)
                ),
            )
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptionError(path, None, f"unreadable quarantine record: {exc}") from exc


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def describe_segment(
    fs: Fs,
    root: Path,
    name: str,
    *,
    reason: str,
    now: float,
    count_records: RecordCounter | None = None,
) -> QuarantineRecord:
    """Read ``root/name`` (never written) and describe what quarantining it would lose."""
    match = SEGMENT_RE.match(name)
    if match is None:
        raise QuarantineError(f"{name!r} is not a segment name (<20 digits>.wal)")
    path = root / name
    try:
        data = read_file(fs, path)
    except FileNotFoundError:
        raise QuarantineError(f"{path} does not exist; nothing was moved") from None
    except OSError as exc:
        raise QuarantineError(f"{path} could not be read ({exc}); nothing was moved") from exc
    name_base = int(match.group(1))
    header: SegmentHeader | None = None
    header_error = ""
    try:
        header = SegmentHeader.decode(data[:HEADER_SIZE], path)
    except CorruptionError as exc:
        header_error = f"byte {exc.offset}: {exc.reason}"
    try:
        mark = read_checkpoint(fs, root)
    except CorruptionError:
        mark = None  # the record then says "no checkpoint": everything readable counts lost
    x = None if mark is None else mark.lsn
    base = header.base_lsn if header is not None else name_base
    size = len(data)
    record = QuarantineRecord(
        segment=name,
        base_lsn=base,
        end_lsn=max(base, name_base) + max(0, size - HEADER_SIZE),
        size=size,
        seg_uuid=None if header is None else header.uuid,
        header_error=header_error,
        checkpoint_lsn=x,
        readable_frames=0,
        readable_end_lsn=base,
        damage_offset=None,
        damage="",
        unreadable_bytes=0,
        reason=reason,
        quarantined_unix=now,
    )
    if header is None:
        record.damage_offset = 0
        record.damage = f"unreadable header ({header_error})"
        record.unreadable_bytes = size
        return record
    frames: list[RawFrame]
    stop_offset: int | None
    try:
        frames, stop = scan_frames(data, HEADER_SIZE, path=path)
    except CorruptionError as exc:
        frames, stop_offset, stop_reason = [], exc.offset or HEADER_SIZE, exc.reason
    else:
        stop_offset, stop_reason = (stop.valid_end, stop.reason) if stop.damaged else (None, "")
    for raw in frames:
        if raw.kind is not FrameKind.TENANT_BATCH:
            continue
        end = base + raw.end - HEADER_SIZE
        loss = record.tenants.setdefault(raw.tenant, TenantLoss(first_lsn=end))
        loss.frames += 1
        loss.last_lsn = end
        count = None if count_records is None else count_records(data[raw.payload_start : raw.end])
        loss.records = None if loss.records is None or count is None else loss.records + count
        if x is None or end > x:
            loss.frames_above_checkpoint += 1
            above = loss.records_above_checkpoint
            loss.records_above_checkpoint = (
                None if above is None or count is None else above + count
            )
        record.readable_frames += 1
        record.readable_end_lsn = end
    if stop_offset is not None:
        record.damage_offset = stop_offset
        record.damage = stop_reason
        record.unreadable_bytes = size - stop_offset
        recorded = recorded_high_water(fs, root, SegmentFile(path, header, size), mark)
        if recorded is not None:
            record.high_water_lsn, record.high_water_source = recorded
        after = frames_after_damage(data, stop_offset, path)
        record.frames_after_damage = len(after)
        hw = record.high_water_lsn
        record.frames_after_damage_below_high_water = (
            0 if hw is None else sum(1 for f in after if base + f.end - HEADER_SIZE <= hw)
        )
    return record


def quarantine_segment(
    fs: Fs,
    root: Path,
    name: str,
    *,
    reason: str,
    now: float,
    count_records: RecordCounter | None = None,
) -> QuarantineRecord:
    """Write the record, then move ``root/name`` into ``root/quarantine/``. Refuses
    (``QuarantineError``, nothing moved) when the name is not a segment of the root or
    the quarantine already holds that name. Completes a move a crash interrupted."""
    qdir = root / DIR_NAME
    record_path = qdir / f"{name}{RECORD_SUFFIX}"
    target = qdir / name
    if os.path.lexists(target):
        raise QuarantineError(
            f"{target} already exists: a segment of this name was quarantined before; "
            f"move it away (it is evidence) before quarantining {name} again"
        )
    existing = _read_record(fs, record_path)
    record = existing or describe_segment(
        fs, root, name, reason=reason, now=now, count_records=count_records
    )
    if not (root / name).exists():
        raise QuarantineError(f"{root / name} does not exist; nothing was moved")
    if not qdir.is_dir():
        fs.mkdir(qdir)
        fs.fsync_dir(root)
    if existing is None:
        tmp = qdir / f"{name}{RECORD_SUFFIX}.tmp"
        body = json.dumps(record.to_json(), indent=2, sort_keys=True).encode() + b"\n"
        fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            fs.write(fd, body)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.rename(tmp, record_path)
        fs.fsync_dir(qdir)
    fs.rename(root / name, target)
    fs.fsync_dir(qdir)
    fs.fsync_dir(root)
    return record


def _read_record(fs: Fs, path: Path) -> QuarantineRecord | None:
    try:
        raw = read_file(fs, path)
    except FileNotFoundError:
        return None
    return QuarantineRecord.from_json(raw, path)


def load_records(fs: Fs, root: Path) -> list[QuarantineRecord]:
    """Every record under ``root/quarantine/`` (in force or not), by base. An
    unreadable record raises ``CorruptionError`` naming it: a loss must stay named."""
    qdir = root / DIR_NAME
    try:
        names = sorted(fs.listdir(qdir))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise CorruptionError(qdir, None, "quarantine is not a directory") from None
    records = []
    for n in names:
        if n.endswith(RECORD_SUFFIX) and SEGMENT_RE.match(n[: -len(RECORD_SUFFIX)]):
            record = _read_record(fs, qdir / n)
            if record is not None:
                records.append(record)
    return sorted(records, key=lambda r: r.base_lsn)


def in_force(records: list[QuarantineRecord], segment_names: set[str]) -> list[QuarantineRecord]:
    """The records whose segment has left the set (the move completed)."""
    return [r for r in records if r.segment not in segment_names]

"""Read-only operator views of a WAL root: ``inspect_root`` and ``verify_root``, and of
one segment on its own (``verify_segment_bytes``: an archived copy, a file handed over).

None of them writes, renames, fsyncs or creates anything, so they are safe against a
stopped node's volume (or a copy of it) and against a running node (they may then see
a torn tail the writer is about to complete, which is reported as such).

``verify_root`` is the full CRC walk: every segment header, every frame, the set's
structure and chain rules (``wal.scan``), the CHECKPOINT and the quarantine records.
It collects every problem with its file and offset instead of stopping at the first.
Each segment's synced high-water (``SegmentSummary.high_water``: its direct successor's
header, or the checkpoint mark when the mark lies in it) decides what damage means:
below it, corruption of acknowledged frames — a problem naming the offset and the
high-water, the same refusal recovery makes; at or above it, a torn tail (a note).
The checkpoint mark is a high-water even where a torn tail would otherwise be legal
(the newest segment): the mark is an acknowledged frame's end, and nothing is ever
appended behind a torn frame, so bytes before it are no torn write. (A torn tail in an
*earlier* sealed segment lies below the mark's LSN too, legally: the range a failed
write reserved is never reused, so only the mark's own segment proves it.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint_file import NAME as CHECKPOINT_NAME
from .checkpoint_file import decode_checkpoint
from .errors import CorruptionError, OpenIoError
from .frame import ScanStop, scan_frames
from .fs import Fs, OsFs, read_file
from .quarantine import DIR_NAME as QUARANTINE_DIR
from .quarantine import QuarantineRecord, in_force, load_records
from .scan import (
    SegmentFile,
    SegmentScan,
    chain_problem,
    check_structure,
    checkpoint_high_water,
    frames_after_damage,
    high_water_problem,
    read_segment_file,
    recorded_in_highwater,
    scan_segment,
)
from .segment import HEADER_SIZE, PARTIAL_RE, SEGMENT_RE, SegmentHeader, uuid7_time
from .types import WalOffset


@dataclass(frozen=True, slots=True)
class Problem:
    path: Path
    offset: int | None
    message: str

    def __str__(self) -> str:
        where = self.path.name if self.offset is None else f"{self.path.name} at byte {self.offset}"
        return f"{where}: {self.message}"


@dataclass
class SegmentSummary:
    name: str
    base_lsn: int
    uuid: str
    created_unix: float
    size: int
    predecessor_sealed: bool
    prev_base_lsn: int | None
    frames: int = 0
    frame_bytes: int = 0
    valid_end_lsn: int = 0
    tenants: dict[str, int] = field(default_factory=dict)  # tenant -> frames
    tenant_last: dict[str, int] = field(default_factory=dict)  # tenant -> last frame end
    damage: str = ""
    damage_offset: int | None = None
    #: the synced high-water (below it nothing may be damaged) and who recorded it;
    #: None when no durable record gives one (the newest segment above the checkpoint,
    #: a segment whose direct successor was reclaimed)
    high_water: int | None = None
    high_water_source: str = ""


@dataclass
class ReclaimSummary:
    """The live RECLAIM slot, for operators."""

    max_tenants: int
    max_unlinks: int
    consumer_mode: str
    checkpoint_armed: bool
    checkpoint_seen: bool
    tenant_ids: int
    entries: dict[str, tuple[str, WalOffset]]  # tenant -> (mode, reclaimed_through)
    planned: list[str]  # segment uuids with a planned (maybe uncertain) unlink


@dataclass
class PublishedSummary:
    """The live PUBLISHED slot, for operators (RFC 0055)."""

    max_tenants: int
    #: tenant -> (records frontier, audit frontier, flags "terminal"/"publishing"); a
    #: publishing entry's frontiers are the ones in force before its settlement
    frontiers: dict[str, tuple[WalOffset | None, WalOffset | None, str]]
    #: tenant -> the end of the span a settlement's unconfirmed intent covers
    intents: dict[str, WalOffset] = field(default_factory=dict)


@dataclass
class RootReport:
    root: Path
    segments: list[SegmentSummary] = field(default_factory=list)
    partials: list[str] = field(default_factory=list)
    other_files: list[str] = field(default_factory=list)
    checkpoint: WalOffset | None = None
    problems: list[Problem] = field(default_factory=list)
    #: legal states worth telling an operator (a torn tail open will seal)
    notes: list[Problem] = field(default_factory=list)
    reclaim: ReclaimSummary | None = None
    published: PublishedSummary | None = None
    #: segment name -> why it is retained ("" when it is eligible now); with horizons
    eligibility: dict[str, str] = field(default_factory=dict)
    floor: str = ""
    #: quarantine records whose segment left the set (in force at the next open)
    quarantined: list[QuarantineRecord] = field(default_factory=list)
    #: records whose segment is still in the set: a quarantine a crash interrupted
    quarantine_pending: list[str] = field(default_factory=list)
    #: the sidecars beside the segments and what state each is in
    sidecars: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _problem(exc: CorruptionError | OpenIoError) -> Problem:
    if isinstance(exc, CorruptionError):
        return Problem(exc.path, exc.offset, exc.reason)
    return Problem(exc.path, None, f"{exc.op}: {exc.cause}")


def verify_root(root: Path | str, *, fs: Fs | None = None) -> RootReport:
    """Walk every byte of the WAL at ``root``; report every problem found."""
    fs = fs or OsFs()
    root = Path(root)
    report = RootReport(root)
    if not root.is_dir():
        report.problems.append(Problem(root, None, "not a directory"))
        return report
    names = sorted(os.listdir(root))
    seg_names = [n for n in names if SEGMENT_RE.match(n)]
    report.partials = [n for n in names if PARTIAL_RE.match(n)]
    report.other_files = [n for n in names if n not in seg_names and n not in report.partials]
    files: list[SegmentFile] = []
    for i, name in enumerate(seg_names):
        try:
            files.append(read_segment_file(fs, root / name, newest=i == len(seg_names) - 1))
        except (CorruptionError, OpenIoError) as exc:
            report.problems.append(_problem(exc))
    try:
        check_structure(files)
    except CorruptionError as exc:
        report.problems.append(_problem(exc))
    scans: list[SegmentScan] = []
    for f in files:
        try:
            scans.append(scan_segment(fs, f))
        except CorruptionError as exc:
            report.problems.append(_problem(exc))
            scans.append(SegmentScan(f, [], _unscannable(), b""))
        except OpenIoError as exc:
            report.problems.append(_problem(exc))
            scans.append(SegmentScan(f, [], _unscannable(), b""))
    for i, scan in enumerate(scans):
        summary = _summarise(scan)
        report.segments.append(summary)
        if i + 1 < len(scans):
            nxt_file = scans[i + 1].file
            nxt = nxt_file.header
            direct = nxt.has_predecessor and nxt.prev_base_lsn == scan.file.base
            if direct:
                summary.high_water = nxt.prev_high_water
                summary.high_water_source = f"recorded by its successor {nxt_file.path.name}"
            problem = chain_problem(scan, nxt_file) if scan.data else None
            if problem is not None:
                report.problems.append(_problem(problem))
            elif scan.stop.damaged and scan.data:
                if direct:
                    why = (
                        f"it lies at or above the high-water {nxt.prev_high_water} its "
                        f"successor records (the seal), so the tail held no acknowledged "
                        f"frame"
                    )
                else:
                    why = (
                        "its direct successor was reclaimed, so whether the tail held an "
                        "acknowledged frame cannot be checked from the set"
                    )
                report.notes.append(
                    Problem(
                        scan.file.path,
                        scan.stop.valid_end,
                        f"torn tail ({scan.stop.reason}); {why}",
                    )
                )
    if scans and files:
        newest = scans[-1]
        if newest.stop.damaged and newest.stop.reason:
            after = _frames_after_damage(newest.data, newest.stop.valid_end, newest.file.path)
            # Above its recorded high-water (checked below) a torn tail is legal, so this
            # stays a note; frames that verify after it are worth an operator's look.
            suspect = (
                f"; {after} frame(s) after it still verify, which a crash rarely leaves: "
                f"if the node was neither killed nor lost power, suspect the disk"
                if after
                else ""
            )
            report.notes.append(
                Problem(
                    newest.file.path,
                    newest.stop.valid_end,
                    f"torn tail in the newest segment ({newest.stop.reason}); legal after a "
                    f"crash above its recorded high-water (the checkpoint mark, HIGHWATER): "
                    f"the next open seals it and keeps the bytes{suspect}",
                )
            )
    _read_checkpoint_into(fs, report, scans)
    _read_reclaim_into(fs, report)
    _read_quarantine_into(fs, report, {f.path.name for f in files} | set(seg_names))
    _damage_below_checkpoint(fs, report, scans)
    _read_published_into(fs, report)
    _describe_sidecars(report, names)
    return report


def _read_quarantine_into(fs: Fs, report: RootReport, present: set[str]) -> None:
    try:
        records = load_records(fs, report.root)
    except CorruptionError as exc:
        report.problems.append(_problem(exc))
        return
    report.quarantined = in_force(records, present)
    report.quarantine_pending = sorted(r.segment for r in records if r.segment in present)
    for r in report.quarantined:
        report.notes.append(
            Problem(
                report.root / QUARANTINE_DIR / r.segment,
                r.damage_offset,
                f"quarantined: {r.summary()}",
            )
        )
    for name in report.quarantine_pending:
        report.problems.append(
            Problem(
                report.root / name,
                None,
                "a quarantine record exists but the segment is still in the set (the "
                "command was interrupted); run `ourios wal quarantine` for it again",
            )
        )


def _damage_below_checkpoint(fs: Fs, report: RootReport, scans: list[SegmentScan]) -> None:
    """Damage below the checkpoint mark in the mark's own segment, or below what HIGHWATER
    records for the newest segment, is corruption of acknowledged frames, even where a
    torn tail would be legal (the newest segment): each is a high-water of that segment
    (the same refusal open makes)."""
    reported = {(p.path, p.offset) for p in report.problems}
    for i, (scan, summary) in enumerate(zip(scans, report.segments, strict=False)):
        marks = [checkpoint_high_water(scan.file, report.checkpoint)]
        if i == len(scans) - 1:
            marks.append(recorded_in_highwater(fs, report.root, scan.file))
        found = [m for m in marks if m is not None]
        if not found or not scan.data:
            continue
        recorded = max(found, key=lambda m: m[0])
        if summary.high_water is None or recorded[0] > summary.high_water:
            summary.high_water, summary.high_water_source = recorded
        problem = high_water_problem(scan, *recorded)
        where = (scan.file.path, scan.stop.valid_end)
        if problem is not None and scan.stop.damaged and where not in reported:
            report.problems.append(
                Problem(
                    scan.file.path,
                    scan.stop.valid_end,
                    f"below the checkpoint: {problem.reason} (the store holds the records "
                    f"of the frames at or below the checkpoint)"
                    if "checkpoint" in recorded[1]
                    else f"below the high-water HIGHWATER records: {problem.reason}",
                )
            )
            report.notes = [n for n in report.notes if (n.path, n.offset) != where]


def _describe_sidecars(report: RootReport, names: list[str]) -> None:
    from .checkpoint_file import SIZE as CHECKPOINT_SIZE
    from .checkpoint_file import SPARE_NAME, TMP_NAME

    present = set(names)
    report.sidecars[CHECKPOINT_NAME] = (
        f"mark {report.checkpoint}" if report.checkpoint is not None else "absent (never stamped)"
    )
    if SPARE_NAME in present:
        st = (report.root / SPARE_NAME).stat()
        live = report.root / CHECKPOINT_NAME
        shared = live.exists() and live.stat().st_ino == st.st_ino
        if shared:
            report.sidecars[SPARE_NAME] = (
                "shares CHECKPOINT's inode (a checkpoint write was interrupted between its "
                "link and its rename; replaced at the next open, harmless)"
            )
        elif st.st_size == CHECKPOINT_SIZE:
            report.sidecars[SPARE_NAME] = "allocated (a checkpoint can be written on a full disk)"
        else:
            report.sidecars[SPARE_NAME] = f"{st.st_size} bytes (replaced at the next open)"
    else:
        report.sidecars[SPARE_NAME] = "absent (allocated at the next open)"
    if TMP_NAME in present:
        report.sidecars[TMP_NAME] = "present (a checkpoint write was interrupted; harmless)"
    if report.reclaim is not None:
        r = report.reclaim
        report.sidecars["RECLAIM"] = (
            f"mode {r.consumer_mode}, armed={r.checkpoint_armed}, seen={r.checkpoint_seen}, "
            f"{len(r.entries)} tenant entries, {len(r.planned)} planned unlink(s)"
        )
    elif "RECLAIM" in present:
        report.sidecars["RECLAIM"] = "unreadable (see the problems)"
    else:
        report.sidecars["RECLAIM"] = "absent"
    if report.published is not None:
        pub = report.published
        report.sidecars["PUBLISHED"] = (
            f"{len(pub.frontiers)} tenant frontier(s), max_tenants={pub.max_tenants}"
        )
    elif "PUBLISHED" in present:
        report.sidecars["PUBLISHED"] = "unreadable (see the problems)"
    else:
        report.sidecars["PUBLISHED"] = "absent"
    _describe_high_water(report, present)


def _describe_high_water(report: RootReport, present: set[str]) -> None:
    from .highwater_file import NAME, HighWaterFile

    if NAME not in present:
        report.sidecars[NAME] = "absent (created at the next open)"
        return
    try:
        found = HighWaterFile.read_only(OsFs(), report.root)
    except (CorruptionError, OSError) as exc:
        report.problems.append(Problem(report.root / NAME, None, f"unreadable: {exc}"))
        report.sidecars[NAME] = "unreadable (see the problems)"
        return
    rec = found[1] if found is not None else None
    if rec is None or rec.segment is None:
        report.sidecars[NAME] = "nothing recorded yet"
    else:
        report.sidecars[NAME] = (
            f"high-water {rec.lsn} of segment {rec.segment} (base {rec.base_lsn}), "
            f"generation {rec.generation}"
        )


@dataclass
class SegmentVerdict:
    """``verify_segment_bytes``: one segment on its own (an archived copy)."""

    name: str
    size: int
    header: SegmentHeader | None = None
    frames: int = 0
    tenants: dict[str, int] = field(default_factory=dict)
    valid_end_lsn: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_segment_bytes(data: bytes, name: str, *, where: Path | None = None) -> SegmentVerdict:
    """CRC-walk one segment's bytes. ``name`` is its file name (checked against the
    header); ``where`` is what problems name (a path, or the store key as a path).

    On its own a segment cannot say whether a torn tail held an acknowledged frame (its
    successor would), so a torn tail is a note; damage followed by frames that verify
    is a problem (a torn write leaves nothing valid after it).
    """
    path = where if where is not None else Path(name)
    verdict = SegmentVerdict(name, len(data))
    match = SEGMENT_RE.match(name)
    if match is None:
        verdict.problems.append(Problem(path, None, f"{name!r} is not a segment name"))
    try:
        header = SegmentHeader.decode(data[:HEADER_SIZE], path)
    except CorruptionError as exc:
        verdict.problems.append(_problem(exc))
        return verdict
    verdict.header = header
    if match is not None and int(match.group(1)) != header.base_lsn:
        verdict.problems.append(
            Problem(
                path,
                8,
                f"name/header disagreement: the name says base {int(match.group(1))} but "
                f"the header declares base {header.base_lsn}",
            )
        )
    try:
        frames, stop = scan_frames(data, HEADER_SIZE, path=path)
    except CorruptionError as exc:
        verdict.problems.append(_problem(exc))
        return verdict
    verdict.frames = len(frames)
    for raw in frames:
        verdict.tenants[raw.tenant] = verdict.tenants.get(raw.tenant, 0) + 1
    verdict.valid_end_lsn = header.base_lsn + stop.valid_end - HEADER_SIZE
    if stop.damaged:
        after = _frames_after_damage(data, stop.valid_end, path)
        if after:
            verdict.problems.append(
                Problem(
                    path,
                    stop.valid_end,
                    f"damage ({stop.reason}) followed by {after} frame(s) that verify: "
                    f"corruption inside the segment, not a torn tail",
                )
            )
        else:
            verdict.notes.append(
                Problem(
                    path, stop.valid_end, f"torn tail ({stop.reason}); legal in a sealed segment"
                )
            )
    return verdict


def _frames_after_damage(data: bytes, damage: int, path: Path) -> int:
    """Frames that verify after the damaged one, skipping it by its length prefix."""
    return len(frames_after_damage(data, damage, path))


def _read_published_into(fs: Fs, report: RootReport) -> None:
    from .published_file import PublishedFile

    try:
        loaded = PublishedFile.read_only(fs, report.root)
    except CorruptionError as exc:
        report.problems.append(_problem(exc))
        return
    if loaded is None:
        if report.segments:
            report.problems.append(
                Problem(report.root / "PUBLISHED", None, "missing beside segments")
            )
        return
    t, record = loaded
    frontiers: dict[str, tuple[WalOffset | None, WalOffset | None, str]] = {}
    intents: dict[str, WalOffset] = {}
    for slot, entry in record.entries.items():
        flags = ",".join(
            name
            for name, on in (("terminal", entry.terminal), ("publishing", entry.publishing))
            if on
        )
        tenant = record.dictionary[slot].tenant
        marks = entry.marks
        frontiers[tenant] = (marks.records, marks.audit, flags)
        if marks.intent is not None:
            intents[tenant] = marks.intent
    report.published = PublishedSummary(t, frontiers, intents)


def _read_reclaim_into(fs: Fs, report: RootReport) -> None:
    from .reclaim_file import (
        FLAG_CHECKPOINT_ARMED,
        FLAG_CHECKPOINT_SEEN,
        ConsumerMode,
        ReclaimFile,
    )

    try:
        loaded = ReclaimFile.read_only(fs, report.root)
    except CorruptionError as exc:
        report.problems.append(_problem(exc))
        return
    if loaded is None:
        if report.segments:
            report.problems.append(
                Problem(report.root / "RECLAIM", None, "missing beside segments")
            )
        return
    geometry, record = loaded
    names = {i: d.tenant for i, d in record.dictionary.items()}
    report.reclaim = ReclaimSummary(
        max_tenants=geometry.max_tenants,
        max_unlinks=geometry.max_unlinks,
        consumer_mode=ConsumerMode(record.consumer_mode).name.lower(),
        checkpoint_armed=bool(record.flags & FLAG_CHECKPOINT_ARMED),
        checkpoint_seen=bool(record.flags & FLAG_CHECKPOINT_SEEN),
        tenant_ids=record.next_slot_id,
        entries={
            names.get(i, f"#{i}"): (ConsumerMode(e.mode).name.lower(), e.reclaimed_through)
            for i, e in record.entries.items()
        },
        planned=[f"{p.segment}{' (uncertain)' if p.uncertain else ''}" for p in record.planned],
    )


def explain_retention(report: RootReport, horizons: Mapping[str, WalOffset] | None) -> None:
    """Fill ``report.eligibility`` and ``report.floor``: why each segment is kept, by the
    rule housekeeping applies (checkpoint inclusive, horizon inclusive, pin strict)."""
    mark = report.checkpoint
    pinned: list[str] = []
    lowest: WalOffset | None = None
    if horizons is not None:
        tenants = {t for s in report.segments for t in s.tenant_last}
        pinned = sorted(t for t in tenants if t not in horizons)
        for h in horizons.values():
            if lowest is None or h.lsn < lowest.lsn:
                lowest = h
        if pinned:
            report.floor = f"pinned by {len(pinned)} tenant(s): {', '.join(pinned[:8])}"
        else:
            report.floor = f"min {lowest}" if lowest is not None else "min (no tenant holds frames)"
    for i, s in enumerate(report.segments):
        if i == len(report.segments) - 1:
            report.eligibility[s.name] = "the current segment (never reclaimed)"
            continue
        why: list[str] = []
        highest = s.valid_end_lsn if s.frames else None
        if mark is None:
            why.append("no checkpoint yet")
        elif highest is not None and highest > mark.lsn:
            why.append(f"above the checkpoint (frames to {highest} > {mark.lsn})")
        if horizons is None:
            if s.tenant_last:
                why.append("tenant horizons unknown (no snapshots given)")
        else:
            for tenant, last in sorted(s.tenant_last.items()):
                horizon = horizons.get(tenant)
                if horizon is None:
                    why.append(f"pinned by {tenant} (no snapshot; frames to {last})")
                elif last > horizon.lsn:
                    why.append(f"held by {tenant} (frames to {last} > horizon {horizon.lsn})")
        report.eligibility[s.name] = "; ".join(why)


def _unscannable() -> ScanStop:
    return ScanStop(0, True, "unreadable")


def inspect_root(
    root: Path | str,
    *,
    fs: Fs | None = None,
    horizons: Mapping[str, WalOffset] | None = None,
) -> RootReport:
    """The same walk as ``verify_root`` plus why each segment is retained."""
    report = verify_root(root, fs=fs)
    explain_retention(report, horizons)
    return report


def _summarise(scan: SegmentScan) -> SegmentSummary:
    f = scan.file
    h = f.header
    s = SegmentSummary(
        name=f.path.name,
        base_lsn=f.base,
        uuid=str(h.uuid),
        created_unix=uuid7_time(h.uuid),
        size=f.size,
        predecessor_sealed=h.predecessor_sealed,
        prev_base_lsn=h.prev_base_lsn if h.has_predecessor else None,
    )
    if not scan.data:
        s.damage = scan.stop.reason
        return s
    base = f.base
    for raw in scan.frames:
        s.frames += 1
        s.tenants[raw.tenant] = s.tenants.get(raw.tenant, 0) + 1
        s.tenant_last[raw.tenant] = base + raw.end - HEADER_SIZE
    s.frame_bytes = scan.frame_bytes
    s.valid_end_lsn = scan.valid_end_lsn
    if scan.stop.damaged:
        s.damage = scan.stop.reason
        s.damage_offset = scan.stop.valid_end
    return s


def _read_checkpoint_into(fs: Fs, report: RootReport, scans: list[SegmentScan]) -> None:
    path = report.root / CHECKPOINT_NAME
    try:
        raw = read_file(fs, path)
    except FileNotFoundError:
        return
    except OSError as exc:
        report.problems.append(Problem(path, None, f"unreadable: {exc}"))
        return
    try:
        mark = decode_checkpoint(raw, path)
    except CorruptionError as exc:
        report.problems.append(_problem(exc))
        return
    report.checkpoint = mark
    if scans:
        end = scans[-1].file.data_end
        if mark.lsn > end:
            report.problems.append(
                Problem(path, None, f"mark {mark} is beyond the end of the log (LSN {end})")
            )
    elif mark is not None:
        report.problems.append(Problem(path, None, f"mark {mark} but the WAL has no segment"))

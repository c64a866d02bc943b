"""Read-only operator views of a WAL root: ``inspect_root`` and ``verify_root``.

Neither writes, renames, fsyncs or creates anything, so both are safe against a
stopped node's volume (or a copy of it) and against a running node (they may then see
a torn tail the writer is about to complete, which is reported as such).

``verify_root`` is the full CRC walk: every segment header, every frame, the set's
structure and chain rules (``wal.layout``), and the CHECKPOINT. It collects every
problem with its file and offset instead of stopping at the first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import NAME as CHECKPOINT_NAME
from .checkpoint import decode_checkpoint
from .errors import CorruptionError, OpenIoError
from .frame import ScanStop
from .fs import Fs, OsFs, read_file
from .layout import (
    SegmentFile,
    SegmentScan,
    chain_problem,
    check_structure,
    read_segment_file,
    scan_segment,
)
from .segment import HEADER_SIZE, PARTIAL_RE, SEGMENT_RE, uuid7_time
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
        report.segments.append(_summarise(scan))
        if i + 1 < len(scans):
            problem = chain_problem(scan, scans[i + 1].file)
            if problem is not None:
                report.problems.append(_problem(problem))
            elif scan.stop.damaged:
                nxt = scans[i + 1].file.header
                if nxt.has_predecessor and nxt.prev_base_lsn == scan.file.base:
                    why = "its successor records the seal, so the tail held no acknowledged frame"
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
            report.notes.append(
                Problem(
                    newest.file.path,
                    newest.stop.valid_end,
                    f"torn tail in the newest segment ({newest.stop.reason}); legal after a "
                    f"crash: the next open seals it and keeps the bytes",
                )
            )
    _read_checkpoint_into(fs, report, scans)
    return report


def _unscannable() -> ScanStop:
    return ScanStop(0, True, "unreadable")


def inspect_root(root: Path | str, *, fs: Fs | None = None) -> RootReport:
    """The same walk as ``verify_root``; the caller prints the summaries."""
    return verify_root(root, fs=fs)


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

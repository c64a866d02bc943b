"""Reading a WAL root without changing it: the set of segments, its structure, and a
segment's frames. Shared by ``Journal.open``, replay, and ``ourios wal verify``.

Structural rules (DESIGN.md §4, adapted from the segment-set seed §4.4), checked from
headers and sizes alone, before any frame is read:

* every ``<base:020d>.wal`` has a readable header whose base agrees with its name;
* no two segments declare the same base or the same UUID;
* no two segments overlap: a segment's bytes (``base + data length``) end at or before
  the next segment's base. Gaps are normal (tenant-aware reclamation removes a later
  segment while an earlier one stays pinned).

Chain rules, which need a segment's frames (replay and verify), are one rule: **nothing
below a segment's synced high-water may be damaged or missing** (``high_water_problem``).
The high-water comes from durable records only, never from the damage itself:

* a segment followed by its direct successor (the successor's ``prev_base_lsn`` names
  it): the ``prev_high_water`` that header records (``wal/segment.py``). After a clean
  rotation it is the successor's base, so the segment must end exactly there with no
  damage; after a seal it is the end the last good fsync covered, and only the bytes
  above it — the frame whose write failed, frames whose fsync failed — may be torn;
* the segment holding the CHECKPOINT mark: the mark (an acknowledged frame's end, so
  fsynced);
* the newest segment: what HIGHWATER records for it (``wal/highwater_file.py``), an end
  a completed fsync covered, recorded every ``wal.high_water_bytes`` while it is current.
  Open applies the larger of the two;
* anything else has none: a segment whose direct successor was reclaimed (every frame
  of it is at or below the checkpoint that let the successor go, so its records are in
  the store; verify says the tail cannot be checked).

Damage at or above the high-water is a torn tail: legal in the newest segment (open seals
it) and in a sealed one. Damage below it is corruption — bit rot, a bad sector, an edit —
and is refused naming the file, the offset and the high-water, however many frames
after it still verify (``frames_after_damage`` counts them for the message and the
quarantine record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import CorruptionError, OpenIoError
from .frame import PREFIX, RawFrame, ScanStop, scan_frames
from .fs import Fs, read_file
from .highwater_file import HighWaterFile
from .segment import HEADER_SIZE, PARTIAL_RE, SEGMENT_RE, SegmentHeader
from .types import WalOffset

SHAPE_NOTE = (
    "A rotation that failed before this version of the WAL existed is one way to leave "
    "this shape; so is real damage. Nothing was removed: inspect the file and decide "
    "(`ourios wal inspect`, `ourios wal quarantine`)."
)


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A segment as the directory shows it: header and size, no frames read."""

    path: Path
    header: SegmentHeader
    size: int

    @property
    def base(self) -> int:
        return self.header.base_lsn

    @property
    def data_len(self) -> int:
        """Bytes after the header (valid frames plus any torn tail)."""
        return self.size - HEADER_SIZE

    @property
    def data_end(self) -> int:
        return self.base + self.data_len


@dataclass
class RootListing:
    root: Path
    segments: list[SegmentFile] = field(default_factory=list)
    partials: list[Path] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def list_root(fs: Fs, root: Path) -> RootListing:
    """List a WAL root and read every segment header (raises on the first problem)."""
    try:
        names = sorted(fs.listdir(root))
    except OSError as exc:
        raise OpenIoError(root, "list the WAL directory", exc) from exc
    listing = RootListing(root)
    seg_names: list[str] = []
    for name in names:
        if SEGMENT_RE.match(name):
            seg_names.append(name)
        elif PARTIAL_RE.match(name):
            listing.partials.append(root / name)
        else:
            listing.other.append(name)
    for i, name in enumerate(seg_names):
        newest = i == len(seg_names) - 1
        listing.segments.append(read_segment_file(fs, root / name, newest=newest))
    check_structure(listing.segments)
    return listing


def read_segment_file(fs: Fs, path: Path, *, newest: bool) -> SegmentFile:
    """Read one segment's header and size; name the shape when the header is unreadable."""
    import os

    try:
        fd = fs.open(path, os.O_RDONLY)
    except OSError as exc:
        raise OpenIoError(path, "open segment", exc) from exc
    try:
        size = fs.fstat(fd).st_size
        raw = fs.pread(fd, HEADER_SIZE, 0)
    except OSError as exc:
        raise OpenIoError(path, "read segment header", exc) from exc
    finally:
        fs.close(fd)
    try:
        header = SegmentHeader.decode(raw, path)
    except CorruptionError as exc:
        where = "newest segment" if newest else "segment"
        raise CorruptionError(
            path, exc.offset, f"{where}, unreadable header: {exc.reason}. {SHAPE_NOTE}"
        ) from None
    return SegmentFile(path, header, size)


def check_structure(segments: list[SegmentFile]) -> None:
    """Duplicate bases or ids, name/header disagreement and overlaps, from headers and
    sizes alone. Duplicates are checked first: two files declaring one base is the more
    useful message than the name disagreement it also implies."""
    by_base: dict[int, SegmentFile] = {}
    for seg in segments:
        other = by_base.get(seg.base)
        if other is not None:
            raise CorruptionError(
                seg.path,
                8,
                f"duplicate base: {other.path.name} and {seg.path.name} both declare base "
                f"{seg.base}",
            )
        by_base[seg.base] = seg
    for seg in segments:
        name_base = int(SEGMENT_RE.match(seg.path.name).group(1))  # type: ignore[union-attr]
        if name_base != seg.base:
            raise CorruptionError(
                seg.path,
                8,
                f"name/header disagreement: the file name says base {name_base} but the "
                f"header declares base {seg.base} (renamed, copied or restored by hand?)",
            )
    by_uuid: dict[object, SegmentFile] = {}
    for seg in segments:
        other = by_uuid.get(seg.header.uuid)
        if other is not None:
            raise CorruptionError(
                seg.path,
                16,
                f"duplicate segment id {seg.header.uuid}: {other.path.name} declares the same id",
            )
        by_uuid[seg.header.uuid] = seg
    for prev, nxt in zip(segments, segments[1:], strict=False):
        if prev.data_end > nxt.base:
            raise CorruptionError(
                nxt.path,
                0,
                f"overlap: {prev.path.name} holds bytes up to LSN {prev.data_end} but "
                f"{nxt.path.name} declares base {nxt.base}",
            )


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """A segment's frames, read and CRC-checked."""

    file: SegmentFile
    frames: list[RawFrame]
    stop: ScanStop
    data: bytes

    @property
    def valid_end_lsn(self) -> int:
        return self.file.base + self.stop.valid_end - HEADER_SIZE

    @property
    def frame_bytes(self) -> int:
        return self.stop.valid_end - HEADER_SIZE


def scan_segment(fs: Fs, seg: SegmentFile) -> SegmentScan:
    """The frames of ``seg`` up to ``seg.size``: what the directory showed, or what a
    replay captured when it was made — bytes appended since are not this scan's."""
    try:
        data = read_file(fs, seg.path)
    except OSError as exc:
        raise OpenIoError(seg.path, "read segment", exc) from exc
    if len(data) > seg.size:
        data = data[: seg.size]
    frames, stop = scan_frames(data, HEADER_SIZE, path=seg.path)
    return SegmentScan(seg, frames, stop, data)


def chain_problem(prev: SegmentScan, nxt: SegmentFile) -> CorruptionError | None:
    """Whether ``prev``'s frames reach the high-water its direct successor ``nxt``
    records (module docstring); None when ``nxt`` is not its direct successor."""
    if not nxt.header.has_predecessor or nxt.header.prev_base_lsn != prev.file.base:
        # Not its direct successor: the segment between them was reclaimed, so the
        # only rule left is the structural one (no overlap), already checked.
        return None
    how = "sealed" if nxt.header.predecessor_sealed else "closed by a clean rotation"
    return high_water_problem(
        prev,
        nxt.header.prev_high_water,
        f"recorded by its successor {nxt.path.name}; this segment was {how}",
    )


def high_water_problem(scan: SegmentScan, high_water: int, source: str) -> CorruptionError | None:
    """Damage, or the end of the valid frames, below ``high_water`` (``source`` says who
    recorded it) is corruption of fsynced frames: the error names the file, the offset
    and the high-water. None when the valid frames reach it (damage above is torn)."""
    lsn = scan.valid_end_lsn
    if lsn >= high_water:
        return None
    path = scan.file.path
    at = scan.stop.valid_end
    if scan.stop.damaged:
        after = frames_after_damage(scan.data, at, path)
        below = sum(1 for f in after if scan.file.base + f.end - HEADER_SIZE <= high_water)
        what = f"damage ({scan.stop.reason}) at LSN {lsn}"
        tail = (
            f"; {len(after)} frame(s) after it still verify, {below} of them below the high-water"
            if after
            else ""
        )
    else:
        what = f"truncated: the frames end at LSN {lsn}"
        tail = ""
    return CorruptionError(
        path,
        at,
        f"{what}, below the high-water {high_water} ({source}): every frame below the "
        f"high-water had been fsynced, so this is corruption of acknowledged frames, not a "
        f"torn tail ({high_water - lsn} byte(s) below the high-water unreadable{tail}). "
        f"Nothing was changed; see `ourios wal verify`, and `ourios wal quarantine` this "
        f"segment to start without it (RUNBOOK: damage below the high-water)",
        high_water=high_water,
    )


def frames_after_damage(data: bytes, damage: int, path: Path) -> list[RawFrame]:
    """The frames that verify after the damaged one at ``damage`` (skipped by its length
    prefix) up to the next damage; empty when its prefix cannot be trusted that far."""
    if len(data) - damage < PREFIX.size:
        return []
    body_len, _crc = PREFIX.unpack_from(data, damage)
    nxt = damage + PREFIX.size + body_len
    if body_len <= 0 or nxt >= len(data):
        return []
    try:
        frames, _stop = scan_frames(data, nxt, path=path)
    except CorruptionError:
        return []
    return frames


def recorded_in_highwater(fs: Fs, root: Path, seg: SegmentFile) -> tuple[int, str] | None:
    """What HIGHWATER records as ``seg``'s high-water, read without opening it for
    writing (the operator tools); None when it names another segment, is absent, or
    cannot be read (a problem of its own, which open reports)."""
    try:
        found = HighWaterFile.read_only(fs, root)
    except (CorruptionError, OSError):
        return None
    if found is None:
        return None
    rec = found[1]
    if rec.segment != seg.header.uuid or rec.base_lsn != seg.base:
        return None
    return rec.lsn, f"recorded in HIGHWATER (generation {rec.generation})"


def checkpoint_high_water(seg: SegmentFile, checkpoint: WalOffset | None) -> tuple[int, str] | None:
    """The CHECKPOINT mark as ``seg``'s high-water, when the mark lies in it."""
    if checkpoint is None or checkpoint.segment != seg.header.uuid:
        return None
    return checkpoint.lsn, f"the checkpoint mark {checkpoint}, an acknowledged frame's end"


def recorded_high_water(
    fs: Fs, root: Path, seg: SegmentFile, checkpoint: WalOffset | None
) -> tuple[int, str] | None:
    """``seg``'s high-water from the durable records beside it (its direct successor's
    header, the checkpoint mark, HIGHWATER), the largest; None when none applies. Reads
    one header; an unreadable successor gives none (it is a problem of its own)."""
    found: list[tuple[int, str]] = []
    try:
        later = sorted(n for n in fs.listdir(root) if SEGMENT_RE.match(n) and n > seg.path.name)
    except OSError:
        later = []
    if later:
        try:
            nxt = read_segment_file(fs, root / later[0], newest=len(later) == 1)
        except (CorruptionError, OpenIoError):
            nxt = None
        if nxt is not None and nxt.header.has_predecessor and nxt.header.prev_base_lsn == seg.base:
            found.append((nxt.header.prev_high_water, f"recorded by its successor {nxt.path.name}"))
    for mark in (checkpoint_high_water(seg, checkpoint), recorded_in_highwater(fs, root, seg)):
        if mark is not None:
            found.append(mark)
    return max(found, key=lambda hw: hw[0]) if found else None

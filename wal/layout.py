"""Reading a WAL root without changing it: the set of segments, its structure, and a
segment's frames. Shared by ``Journal.open``, replay, and ``ourios wal verify``.

Structural rules (DESIGN.md §4, adapted from the segment-set seed §4.4), checked from
headers and sizes alone, before any frame is read:

* every ``<base:020d>.wal`` has a readable header whose base agrees with its name;
* no two segments declare the same base or the same UUID;
* no two segments overlap: a segment's bytes (``base + data length``) end at or before
  the next segment's base. Gaps are normal (tenant-aware reclamation removes a later
  segment while an earlier one stays pinned).

Chain rules, which need a segment's frames (replay and verify): a segment followed by
its direct successor (the successor's ``prev_base_lsn`` names it) that was closed by a
clean rotation must end exactly at the successor's base with no damage; one the
successor says was *sealed* may end earlier and may carry a torn tail; the newest
segment may carry a torn tail (open seals it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import CorruptionError, OpenIoError
from .frame import RawFrame, ScanStop, scan_frames
from .fs import Fs, read_file
from .segment import HEADER_SIZE, PARTIAL_RE, SEGMENT_RE, SegmentHeader

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
    try:
        data = read_file(fs, seg.path)
    except OSError as exc:
        raise OpenIoError(seg.path, "read segment", exc) from exc
    frames, stop = scan_frames(data, HEADER_SIZE, path=seg.path)
    return SegmentScan(seg, frames, stop, data)


def chain_problem(prev: SegmentScan, nxt: SegmentFile) -> CorruptionError | None:
    """Whether ``prev``'s frames join ``nxt`` as the chain rules require."""
    if not nxt.header.has_predecessor or nxt.header.prev_base_lsn != prev.file.base:
        # Not its direct successor: the segment between them was reclaimed, so the
        # only rule left is the structural one (no overlap), already checked.
        return None
    if nxt.header.predecessor_sealed:
        return None
    if prev.stop.damaged:
        return CorruptionError(
            prev.file.path,
            prev.stop.valid_end,
            f"damage ({prev.stop.reason}) in a segment that was closed by a clean rotation "
            f"(its successor {nxt.path.name} does not mark it sealed): frames after LSN "
            f"{prev.valid_end_lsn} may have been acknowledged and are unreadable",
        )
    if prev.valid_end_lsn != nxt.base:
        return CorruptionError(
            prev.file.path,
            prev.stop.valid_end,
            f"truncated: frames end at LSN {prev.valid_end_lsn} but the successor "
            f"{nxt.path.name} begins at {nxt.base} ({nxt.base - prev.valid_end_lsn} bytes "
            f"missing)",
        )
    return None

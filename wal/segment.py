"""Segments: naming, the header, and how a segment joins the set.

A segment is ``wal/<base_lsn:020d>.wal``: a 56-byte header, then frames. ``base_lsn``
is the LSN of the segment's first frame, so names sort in log order.

Header layout (little-endian)::

    offset  size  field
    0       4     magic b"OWSG"
    4       2     u16 version (SEGMENT_VERSION = 3)
    6       2     u16 flags: bit 0 has_predecessor, bit 1 predecessor_sealed; rest zero
    8       8     u64 base_lsn
    16      16    segment UUIDv7 (RFC 4122 byte order); its timestamp is the creation time
    32      8     u64 prev_base_lsn: base of the segment that was current when this one
                  was created (0 without a predecessor)
    40      8     u64 prev_high_water: the predecessor's synced high-water — every byte
                  of it below this LSN is a valid frame an fsync had made durable before
                  this header was written (0 without a predecessor)
    48      4     u32 CRC-32C over bytes [0, 48)
    52      4     reserved, zero

``predecessor_sealed`` says the predecessor was sealed (a write or fsync failed on it,
or open found a torn tail), so its valid frames may end before this segment's base;
without it the predecessor was closed by a clean rotation after a successful fsync and
must end exactly at this base (its high-water is this base; decode refuses anything
else). ``prev_base_lsn`` lets a reader tell "the direct predecessor is still here" from
"a segment between them was reclaimed", so a truncated middle segment is caught while
tenant-aware reclamation's gaps are not mistaken for one.

**The high-water** (issue 18 item 5) is what makes damage inside acknowledged frames
corruption rather than a torn tail: below it the predecessor held only frames an fsync
had covered (every acknowledged frame of it lies below it), so damage there is bit rot
or tampering and recovery refuses, naming the file, the offset and the high-water;
only damage at or above it can be a write that never completed (``layout``). It is
recorded here, in a header that rotation fsyncs anyway, so it costs nothing on the
append path. Why it is never more than was fsynced: rotation fsyncs the predecessor (or
finds it sealed) *before* it writes this header and records the predecessor's
``synced_lsn`` — the end a completed fsync covered, which stops before any frame whose
write or fsync failed — and a segment open sealed for a torn tail records the end of
its valid frames, which open's own fsync made durable. The header itself is fsynced
before the rename, so a successor that exists under its name carries a whole
high-water, and the predecessor's bytes below it were durable before that header was
written, whatever order a power loss persists pages in.

Versions: 3 added ``prev_high_water`` (the header grew from 48 to 56 bytes). Version 2
was never deployed (DESIGN.md §4: no earlier deployments), so it is refused like any
unknown version, never parsed around; ``tests/unit/wal/data/segment_header_v3.bin`` is
the golden copy.

Creation protocol (RFC 0052 §3.3): create ``<uuid>.wal.partial``, write the header,
fsync it, rename it to its final name, install it as current, fsync the parent. The
header is fsynced before the rename, so no ``.wal`` name ever holds an unreadable
header written by this code; ``*.wal.partial`` is never selectable as a segment.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from .errors import CorruptionError

MAGIC: Final = b"OWSG"
SEGMENT_VERSION: Final = 3
HEADER: Final = struct.Struct("<4sHHQ16sQQII")
HEADER_SIZE: Final = HEADER.size  # 56
_CRC_SPAN: Final = 48
_MAGIC_VERSION: Final = struct.Struct("<4sH")

FLAG_HAS_PREDECESSOR: Final = 1 << 0
FLAG_PREDECESSOR_SEALED: Final = 1 << 1
_KNOWN_FLAGS: Final = FLAG_HAS_PREDECESSOR | FLAG_PREDECESSOR_SEALED

SEGMENT_RE: Final = re.compile(r"^(\d{20})\.wal$")
#: The only temp shape the WAL owns and sweeps (exact match, RFC 0052 §3.3).
PARTIAL_RE: Final = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.wal\.partial$"
)
MAX_BASE: Final = 10**20 - 1


def segment_name(base_lsn: int) -> str:
    if not 0 <= base_lsn <= MAX_BASE:
        raise ValueError(f"segment base {base_lsn} does not fit 20 digits")
    return f"{base_lsn:020d}.wal"


def partial_name(seg_uuid: uuid.UUID) -> str:
    return f"{seg_uuid}.wal.partial"


def uuid7(now: float) -> uuid.UUID:
    """A UUIDv7 whose timestamp is ``now`` (unix seconds, from the injected clock), so
    segment ages and the clock the rotation trigger reads always agree."""
    ms = int(now * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64
    value |= (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


def uuid7_time(seg_uuid: uuid.UUID) -> float:
    """The UUIDv7 timestamp in unix seconds (its creation time)."""
    return (seg_uuid.int >> 80) / 1000.0


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    base_lsn: int
    uuid: uuid.UUID
    flags: int = 0
    prev_base_lsn: int = 0
    #: the predecessor's synced high-water (module docstring); 0 without a predecessor
    prev_high_water: int = 0
    version: int = SEGMENT_VERSION

    @property
    def has_predecessor(self) -> bool:
        return bool(self.flags & FLAG_HAS_PREDECESSOR)

    @property
    def predecessor_sealed(self) -> bool:
        return bool(self.flags & FLAG_PREDECESSOR_SEALED)

    def encode(self) -> bytes:
        head = HEADER.pack(
            MAGIC,
            self.version,
            self.flags,
            self.base_lsn,
            self.uuid.bytes,
            self.prev_base_lsn,
            self.prev_high_water,
            0,
            0,
        )[:_CRC_SPAN]
        return head + struct.pack("<II", crc32c.crc32c(head), 0)

    @classmethod
    def decode(cls, data: bytes, path: Path) -> SegmentHeader:
        """Decode and check a header; every defect is a ``CorruptionError`` naming
        ``path`` and the offending byte offset."""
        if len(data) >= _MAGIC_VERSION.size:
            # Magic and version first: a header of another version has another size and
            # another checksum span, so its checksum would only mislead.
            magic, version = _MAGIC_VERSION.unpack_from(data)
            if magic != MAGIC:
                raise CorruptionError(path, 0, f"bad segment magic {magic!r}, expected {MAGIC!r}")
            if version != SEGMENT_VERSION:
                raise CorruptionError(
                    path,
                    4,
                    f"unknown segment version {version} (this build reads {SEGMENT_VERSION})",
                )
        if len(data) < HEADER_SIZE:
            raise CorruptionError(path, 0, f"header is {len(data)} bytes, expected {HEADER_SIZE}")
        magic, version, flags, base, raw_uuid, prev, high_water, crc, reserved = HEADER.unpack_from(
            data
        )
        if crc32c.crc32c(data[:_CRC_SPAN]) != crc:
            raise CorruptionError(path, _CRC_SPAN, "segment header checksum mismatch")
        if flags & ~_KNOWN_FLAGS:
            raise CorruptionError(path, 6, f"unknown segment header flags 0x{flags:04x}")
        if reserved:
            raise CorruptionError(path, 52, "non-zero reserved bytes in segment header")
        seg_uuid = uuid.UUID(bytes=raw_uuid)
        if seg_uuid.version != 7:
            raise CorruptionError(path, 16, f"segment id {seg_uuid} is not a UUIDv7")
        if not flags & FLAG_HAS_PREDECESSOR:
            if prev or high_water:
                raise CorruptionError(
                    path,
                    32,
                    "a segment without a predecessor names a predecessor's base or high-water",
                )
        elif not prev <= high_water <= base:
            raise CorruptionError(
                path,
                40,
                f"the predecessor's high-water {high_water} lies outside its range "
                f"[{prev}, {base}]",
            )
        elif not flags & FLAG_PREDECESSOR_SEALED and high_water != base:
            raise CorruptionError(
                path,
                40,
                f"the predecessor was closed by a clean rotation (not sealed), so it was "
                f"synced to this base {base}, but the header records the high-water "
                f"{high_water}",
            )
        return cls(base, seg_uuid, flags, prev, high_water, version)

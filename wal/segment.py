"""Segments: naming, the header, and how a segment joins the set.

A segment is ``wal/<base_lsn:020d>.wal``: a 48-byte header, then frames. ``base_lsn``
is the LSN of the segment's first frame, so names sort in log order.

Header layout (little-endian)::

    offset  size  field
    0       4     magic b"OWSG"
    4       2     u16 version (SEGMENT_VERSION = 2)
    6       2     u16 flags: bit 0 has_predecessor, bit 1 predecessor_sealed; rest zero
    8       8     u64 base_lsn
    16      16    segment UUIDv7 (RFC 4122 byte order); its timestamp is the creation time
    32      8     u64 prev_base_lsn: base of the segment that was current when this one
                  was created (0 without a predecessor)
    40      4     u32 CRC-32C over bytes [0, 40)
    44      4     reserved, zero

``predecessor_sealed`` says the predecessor was sealed (a write or fsync failed on it,
or open found a torn tail), so its valid frames may end before this segment's base;
without it the predecessor was closed by a clean rotation after a successful fsync and
must end exactly at this base. ``prev_base_lsn`` lets a reader tell "the direct
predecessor is still here" from "a segment between them was reclaimed", so a truncated
middle segment is caught while tenant-aware reclamation's gaps are not mistaken for one.

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
SEGMENT_VERSION: Final = 2
HEADER: Final = struct.Struct("<4sHHQ16sQII")
HEADER_SIZE: Final = HEADER.size  # 48
_CRC_SPAN: Final = 40

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
            0,
            0,
        )[:_CRC_SPAN]
        return head + struct.pack("<II", crc32c.crc32c(head), 0)

    @classmethod
    def decode(cls, data: bytes, path: Path) -> SegmentHeader:
        """Decode and check a header; every defect is a ``CorruptionError`` naming
        ``path`` and the offending byte offset."""
        if len(data) < HEADER_SIZE:
            raise CorruptionError(path, 0, f"header is {len(data)} bytes, expected {HEADER_SIZE}")
        magic, version, flags, base, raw_uuid, prev, crc, reserved = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptionError(path, 0, f"bad segment magic {magic!r}, expected {MAGIC!r}")
        if crc32c.crc32c(data[:_CRC_SPAN]) != crc:
            raise CorruptionError(path, _CRC_SPAN, "segment header checksum mismatch")
        if version != SEGMENT_VERSION:
            raise CorruptionError(
                path, 4, f"unknown segment version {version} (this build reads {SEGMENT_VERSION})"
            )
        if flags & ~_KNOWN_FLAGS:
            raise CorruptionError(path, 6, f"unknown segment header flags 0x{flags:04x}")
        if reserved:
            raise CorruptionError(path, 44, "non-zero reserved bytes in segment header")
        seg_uuid = uuid.UUID(bytes=raw_uuid)
        if seg_uuid.version != 7:
            raise CorruptionError(path, 16, f"segment id {seg_uuid} is not a UUIDv7")
        return cls(base, seg_uuid, flags, prev, version)

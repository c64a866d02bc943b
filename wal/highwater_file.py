"""HIGHWATER: the current segment's synced high-water, recorded while it is current.

Every acknowledged frame of a segment lies below an LSN an fsync had covered. Once the
segment rotates, its successor's header records that LSN (``wal/segment.py``); while it
is the newest, this file does (issue 22 item 5), so damage inside acknowledged frames of
the newest segment is corruption named by file and offset rather than a torn tail to
seal. It is RECLAIM's and PUBLISHED's two-slot record file (``wal/two_slot_file.py`` over
``wal/slots.py``): preallocated when the root is created, rewritten in place, so a write
needs no block on a full volume. All integers little-endian, the UUID in RFC 4122 byte
order::

    file header, 32 B (wal/slots.py): magic b"OWHW", u16 version 1, u64 slot_len 56,
    u32 1 (one segment per record), u32 0 (no second capacity), CRC-32C, reserved

    slot, 56 B
    0   8   u64 generation
    8   16  segment UUIDv7; all zero: nothing recorded yet (base and LSN then zero)
    24  8   u64 the segment's base LSN
    32  8   u64 high-water LSN, base <= LSN: every byte of the segment below it is a
            valid frame a completed fsync had made durable before this slot was written
    40  8   reserved, zero
    48  8   trailer: u32 CRC-32C over [0, 48), 4 B zero

Who writes it, and why the claim is never more than was durable: the group commit's
leader, after a sync round, when the current segment's ``synced_lsn`` — raised only
once a data fsync has completed, never by a failed write or fsync — has moved at least
``wal.high_water_bytes`` past what the file records (``wal/highwater.py``); open, after
its own fsync of the newest segment; and a clean close. The slot is written and
fsynced after the data fsync it describes completed, so a power loss that persists
pages in any order cannot leave a claim above durable bytes: either the new slot
survives whole (its claim was already true) or its CRC fails and the older slot stays
live. The cadence bounds what stays unprotected: the acknowledged bytes of the newest
segment above the recorded high-water, fewer than ``wal.high_water_bytes`` plus one
group commit's worth.

Open uses it for the newest segment only, and only when it names that segment (UUID
and base): a record naming a segment that rotated away is superseded by that segment's
successor header, and one naming a segment that is gone (quarantined, reclaimed)
applies to nothing.

Version policy: version 1 is the only one written and read; another version, a header
defect or both slots invalid refuse the open naming the file, as for RECLAIM. A root
without the file (created before it existed) gets one at open. Golden bytes:
``tests/unit/wal/data/highwater_v1.bin``.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .errors import CorruptionError
from .slots import FILE_HEADER_SIZE, check_trailer, format_defect, seal_slot
from .two_slot_file import RecordFile, UnencodableRecord, encode_header

NAME: Final = "HIGHWATER"
MAGIC: Final = b"OWHW"
VERSION: Final = 1

_SLOT: Final = struct.Struct("<Q16sQQ8s")  # 48, then the trailer
SLOT_LEN: Final = _SLOT.size + 8  # 56
FILE_BYTES: Final = FILE_HEADER_SIZE + 2 * SLOT_LEN  # 144
_Z8: Final = bytes(8)
_Z16: Final = bytes(16)
_U64_MAX: Final = (1 << 64) - 1


@dataclass
class HighWaterRecord:
    """One slot: the segment it names (None: nothing recorded) and its high-water."""

    generation: int = 0
    segment: uuid.UUID | None = None
    base_lsn: int = 0
    lsn: int = 0


def encode_slot(record: HighWaterRecord, geometry: int) -> bytes:
    if not 0 <= record.generation <= _U64_MAX:
        raise UnencodableRecord(f"generation {record.generation} does not fit a u64")
    if record.segment is None:
        if record.base_lsn or record.lsn:
            raise UnencodableRecord("a record naming no segment must hold LSN 0 and base 0")
        raw = _Z16
    else:
        if not 0 <= record.base_lsn <= record.lsn <= _U64_MAX:
            raise UnencodableRecord(
                f"high-water {record.lsn} is outside [{record.base_lsn}, 2^64) for "
                f"segment {record.segment}"
            )
        raw = record.segment.bytes
    buf = bytearray(SLOT_LEN)
    _SLOT.pack_into(buf, 0, record.generation, raw, record.base_lsn, record.lsn, _Z8)
    seal_slot(buf)
    return bytes(buf)


def decode_slot(data: bytes, geometry: int, path: Path, index: int) -> HighWaterRecord:
    """Check and decode slot ``index``; any defect raises ``InvalidSlot``."""
    check_trailer(data, path, index, SLOT_LEN)
    generation, raw, base, lsn, reserved = _SLOT.unpack_from(data)
    bad = format_defect(path, index, SLOT_LEN, generation)
    if reserved != _Z8:
        raise bad(40, "non-zero reserved slot bytes")
    if raw == _Z16:
        if base or lsn:
            raise bad(24, "no segment named, but a base or a high-water is set")
        return HighWaterRecord(generation)
    segment = uuid.UUID(bytes=raw)
    if segment.version != 7:
        raise bad(8, f"segment id {segment} is not a UUIDv7")
    if lsn < base:
        raise bad(32, f"high-water {lsn} is below the segment's base {base}")
    return HighWaterRecord(generation, segment, base, lsn)


class _Codec:
    """HIGHWATER's half of its two-slot record file; one fixed geometry (1)."""

    name = NAME
    magic = MAGIC
    version = VERSION
    encode = staticmethod(encode_slot)
    decode = staticmethod(decode_slot)

    def slot_len(self, geometry: int) -> int:
        return SLOT_LEN

    def capacities(self, geometry: int) -> tuple[int, int]:
        return 1, 0

    def geometry(self, capacities: tuple[int, int], path: Path) -> int:
        first, second = capacities
        if first != 1:
            raise CorruptionError(path, 16, f"capacity {first} must be 1 for HIGHWATER")
        if second:
            raise CorruptionError(path, 20, f"second capacity {second} must be 0 for HIGHWATER")
        return 1

    def describe(self, geometry: int) -> str:
        return "one segment"

    def covers(self, geometry: int, other: int) -> bool:
        return True


CODEC: Final = _Codec()


def encode_file_header() -> bytes:
    return encode_header(CODEC, 1)


class HighWaterFile(RecordFile[int, HighWaterRecord]):
    """The HIGHWATER file of a WAL root, open read-write for in-place slot writes; the
    lifecycle is ``RecordFile``'s (its geometry never changes, so it is never rebuilt)."""

    @classmethod
    def codec(cls) -> _Codec:
        return CODEC

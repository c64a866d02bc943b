"""PUBLISHED: each tenant's publication frontiers — what recovery may suppress.

RFC 0055 (§9.4; SEED-DIGEST A.7) gives PUBLISHED RECLAIM's shape, not its bytes: the
two-slot record file of ``wal/two_slot_file.py`` (over ``wal/slots.py``), a per-slot
dictionary laid out exactly as RECLAIM's (its code is ``wal/reclaim_file.py``'s, and so is
the id space: the journal keeps one in-memory table seeded from the union of both
dictionaries), then one fixed entry per id. No planned area, so ``slot_len`` derives
from ``max_tenants`` alone. All integers little-endian, UUIDs in RFC 4122 byte order,
every WalOffset 24 bytes::

    file header, 32 B (wal/slots.py): magic b"OWPB", u16 version 1, u64 slot_len,
    u32 max_tenants T, u32 0 (no second capacity), CRC-32C, reserved

    slot, offsets from the slot's start, slot_len = 24 + 188·T + 8
    0            24      header
      0   8  u64 generation
      8   4  u32 entry_count   entries with a flag set (reported, checked, never a length)
      12  4  u32 next_slot_id  lowest id never assigned (<= T), as in RECLAIM
      16  8  reserved, zero
    24           132·T   dictionary; record i is slot id i (RECLAIM's layout)
      0   2   u16 len        0 = unused id
      2   128 key            the tenant's bytes; the len..128 remainder zero
      130 2   u16 flags      bit 0 tombstoned; rest zero
    24 + 132·T   56·T    entries; entry i belongs to dictionary record i
      0   2   u16 flags      bit 0 records_valid, 1 audit_valid, 2 publishing,
                             3 terminal; bits 4-15 zero
      2   2   reserved, zero
      4   4   u32 generation the slot generation of the write that last changed it
      8   24  WalOffset      records frontier (meaningful when records_valid);
                             publishing: the frontier of both sides
      32  24  WalOffset      audit frontier (meaningful when audit_valid);
                             publishing: the end of the span (audit_valid set)
    slot_len - 8  8      trailer: u32 CRC-32C over [0, slot_len - 8), 4 B zero

At T = 1024: slot 192,544 B, file 385,120 B.

A clear validity bit is "no frontier on that side" (recovery falls back to the
checkpoint for it); a zeroed WalOffset is a real position, not an absence. An entry
with no flag set and generation 0 was never written and is unoccupied: the position
must then be all zero. A set flag on a position with no dictionary record, or on a
tombstoned one, makes the slot invalid (the other slot is read), as do a non-zero
reserved byte, an unknown flag bit, and every dictionary defect RECLAIM's reader
refuses.

The ``publishing`` bit is a settlement's intent (RFC 0055 §9.4, "intent then
confirm"; DESIGN.md §13): the entry then holds two positions of one span instead of two
frontiers — the records offset is the frontier in force for *both* sides when the
intent was written (records_valid clear: there was none, so within the span nothing is
known durable and recovery replays it from the tenant's snapshot, as the settlement
did; above it the checkpoint applies), and the audit offset, which must be valid, is
the end of the span being published (the marks the confirm will write). The RFC gives
the entry no room for both a previous and an intended pair, and the two sides of a
frontier a settlement starts from are one position in every state this implementation
reaches, so one offset carries it. ``PublishedEntry.marks`` reads it as
``PublishedMarks(frontier, frontier, intent=end)``; a publishing entry without
audit_valid makes the slot invalid.

Writing is RECLAIM's (``wal/two_slot_file.py``): the inactive slot in place at generation
live + 1, fsynced, so a frontier write allocates nothing. The file is preallocated at
open and rebuilt through ``PUBLISHED.new`` only when ``max_tenants`` grows, together
with RECLAIM.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .errors import CorruptionError
from .reclaim_file import (
    DICT_RECORD_SIZE,
    MAX_TENANTS,
    DictRecord,
    check_dictionary,
    decode_dictionary,
    pack_dictionary,
)
from .slots import FILE_HEADER_SIZE, check_trailer, format_defect, seal_slot
from .two_slot_file import RecordFile, UnencodableRecord, encode_header
from .types import PublishedMarks, WalOffset

NAME: Final = "PUBLISHED"
MAGIC: Final = b"OWPB"
VERSION: Final = 1

ENTRY_RECORDS_VALID: Final = 1 << 0
ENTRY_AUDIT_VALID: Final = 1 << 1
ENTRY_PUBLISHING: Final = 1 << 2
ENTRY_TERMINAL: Final = 1 << 3
_ENTRY_FLAGS: Final = 0xF

_SLOT_HEAD: Final = struct.Struct("<QII8s")  # 24
_ENTRY: Final = struct.Struct("<H2sI24s24s")  # 56
_Z2: Final = bytes(2)
_Z8: Final = bytes(8)
_Z24: Final = bytes(24)
_U64_MAX: Final = (1 << 64) - 1


def published_slot_len(max_tenants: int) -> int:
    return _SLOT_HEAD.size + (DICT_RECORD_SIZE + _ENTRY.size) * max_tenants + 8


def published_file_bytes(max_tenants: int) -> int:
    return FILE_HEADER_SIZE + 2 * published_slot_len(max_tenants)


@dataclass
class PublishedEntry:
    """One tenant's frontiers. ``records``/``audit`` None: that side's validity bit is
    clear. ``generation`` is the slot generation of the write that last changed it."""

    records: WalOffset | None = None
    audit: WalOffset | None = None
    publishing: bool = False
    terminal: bool = False
    generation: int = 0

    @property
    def flags(self) -> int:
        return (
            (ENTRY_RECORDS_VALID if self.records is not None else 0)
            | (ENTRY_AUDIT_VALID if self.audit is not None else 0)
            | (ENTRY_PUBLISHING if self.publishing else 0)
            | (ENTRY_TERMINAL if self.terminal else 0)
        )

    @property
    def marks(self) -> PublishedMarks:
        """The frontiers the entry says (module docstring: a publishing entry's audit
        offset is the end of the span, its records offset the frontier of both sides)."""
        if self.publishing:
            return PublishedMarks(self.records, self.records, self.terminal, self.audit)
        return PublishedMarks(self.records, self.audit, self.terminal)

    @classmethod
    def of(cls, marks: PublishedMarks, generation: int = 0) -> PublishedEntry:
        """The entry saying ``marks``; an intent keeps the records side as the frontier of
        both (the caller checked that the two sides are one position)."""
        if marks.intent is not None:
            return cls(marks.records, marks.intent, True, marks.terminal, generation)
        return cls(marks.records, marks.audit, False, marks.terminal, generation)

    def same_marks(self, other: PublishedEntry) -> bool:
        return (
            self.records == other.records
            and self.audit == other.audit
            and self.publishing == other.publishing
            and self.terminal == other.terminal
        )


@dataclass
class PublishedRecord:
    """One slot's content; ``dictionary`` is the shared id table at write time."""

    generation: int = 0
    next_slot_id: int = 0
    dictionary: dict[int, DictRecord] = field(default_factory=dict)
    entries: dict[int, PublishedEntry] = field(default_factory=dict)

    def copy(self) -> PublishedRecord:
        return PublishedRecord(
            self.generation,
            self.next_slot_id,
            {i: DictRecord(r.tenant, r.tombstoned) for i, r in self.dictionary.items()},
            {
                i: PublishedEntry(e.records, e.audit, e.publishing, e.terminal, e.generation)
                for i, e in self.entries.items()
            },
        )


# -- encoding --------------------------------------------------------------------------


def encode_slot(record: PublishedRecord, max_tenants: int) -> bytes:
    t = max_tenants
    if not 0 <= record.generation <= _U64_MAX:
        raise UnencodableRecord(f"generation {record.generation} does not fit a u64")
    check_dictionary(record.dictionary, record.next_slot_id, t)
    buf = bytearray(published_slot_len(t))
    occupied = 0
    pack_dictionary(buf, _SLOT_HEAD.size, record.dictionary)
    entries_at = _SLOT_HEAD.size + DICT_RECORD_SIZE * t
    try:
        for i, entry in record.entries.items():
            owner = record.dictionary.get(i)
            if owner is None or owner.tombstoned:
                raise UnencodableRecord(f"entry {i} has no live dictionary record")
            if entry.flags == 0:
                continue  # nothing to say: the position stays unoccupied
            if entry.publishing and entry.audit is None:
                raise UnencodableRecord(f"entry {i} is publishing without the end of its span")
            occupied += 1
            _ENTRY.pack_into(
                buf,
                entries_at + _ENTRY.size * i,
                entry.flags,
                _Z2,
                entry.generation,
                (entry.records.encode() if entry.records is not None else _Z24),
                (entry.audit.encode() if entry.audit is not None else _Z24),
            )
    except struct.error as exc:
        raise UnencodableRecord(f"an entry does not fit its fields: {exc}") from exc
    _SLOT_HEAD.pack_into(buf, 0, record.generation, occupied, record.next_slot_id, _Z8)
    seal_slot(buf)
    return bytes(buf)


# -- decoding --------------------------------------------------------------------------


def decode_slot(data: bytes, max_tenants: int, path: Path, index: int) -> PublishedRecord:
    """Check and decode slot ``index``; any defect raises ``InvalidSlot``."""
    t = max_tenants
    slot_len = published_slot_len(t)
    check_trailer(data, path, index, slot_len)
    generation, entry_count, next_id, reserved = _SLOT_HEAD.unpack_from(data)
    bad = format_defect(path, index, slot_len, generation)
    if reserved != _Z8:
        raise bad(16, "non-zero reserved slot header bytes")
    if next_id > t:
        raise bad(12, f"next_slot_id {next_id} exceeds max_tenants={t}")
    dictionary = decode_dictionary(data, _SLOT_HEAD.size, t, next_id, bad)
    entries_at = _SLOT_HEAD.size + DICT_RECORD_SIZE * t
    view = memoryview(data)
    entries: dict[int, PublishedEntry] = {}
    region = view[entries_at : entries_at + _ENTRY.size * t]
    for i, (eflags, ereserved, egen, raw_r, raw_a) in enumerate(_ENTRY.iter_unpack(region)):
        at = entries_at + _ENTRY.size * i
        if eflags == 0:
            if ereserved != _Z2 or egen or raw_r != _Z24 or raw_a != _Z24:
                raise bad(at, f"unoccupied entry {i} is not all zero")
            continue
        if eflags & ~_ENTRY_FLAGS:
            raise bad(at, f"entry {i}: unknown flags 0x{eflags:04x}")
        if ereserved != _Z2:
            raise bad(at + 2, f"entry {i}: non-zero reserved bytes")
        owner = dictionary.get(i)
        if owner is None:
            raise bad(at, f"occupied entry {i} has no dictionary record (len 0)")
        if owner.tombstoned:
            raise bad(at, f"occupied entry {i} belongs to tombstoned tenant {owner.tenant!r}")
        if not eflags & ENTRY_RECORDS_VALID and raw_r != _Z24:
            raise bad(at + 8, f"entry {i}: records frontier set but records_valid is clear")
        if not eflags & ENTRY_AUDIT_VALID and raw_a != _Z24:
            raise bad(at + 32, f"entry {i}: audit frontier set but audit_valid is clear")
        if eflags & ENTRY_PUBLISHING and not eflags & ENTRY_AUDIT_VALID:
            raise bad(at, f"entry {i}: publishing without the end of its span (audit_valid)")
        entries[i] = PublishedEntry(
            WalOffset.decode(raw_r) if eflags & ENTRY_RECORDS_VALID else None,
            WalOffset.decode(raw_a) if eflags & ENTRY_AUDIT_VALID else None,
            bool(eflags & ENTRY_PUBLISHING),
            bool(eflags & ENTRY_TERMINAL),
            egen,
        )
    if entry_count != len(entries):
        raise bad(8, f"entry_count {entry_count} but {len(entries)} entries are occupied")
    return PublishedRecord(generation, next_id, dictionary, entries)


# -- the file --------------------------------------------------------------------------


class _Codec:
    """PUBLISHED's half of its two-slot record file (``wal/two_slot_file.py``); its geometry
    is max_tenants alone."""

    name = NAME
    magic = MAGIC
    version = VERSION
    encode = staticmethod(encode_slot)
    decode = staticmethod(decode_slot)

    def slot_len(self, geometry: int) -> int:
        return published_slot_len(geometry)

    def capacities(self, geometry: int) -> tuple[int, int]:
        return geometry, 0

    def geometry(self, capacities: tuple[int, int], path: Path) -> int:
        t, second = capacities
        if not 1 <= t <= MAX_TENANTS:
            raise CorruptionError(path, 16, f"max_tenants {t} is outside 1..{MAX_TENANTS}")
        if second:
            raise CorruptionError(path, 20, f"second capacity {second} must be 0 for PUBLISHED")
        return t

    def describe(self, geometry: int) -> str:
        return f"max_tenants={geometry}"

    def covers(self, geometry: int, other: int) -> bool:
        return geometry >= other


CODEC: Final = _Codec()


def encode_file_header(max_tenants: int) -> bytes:
    return encode_header(CODEC, max_tenants)


class PublishedFile(RecordFile[int, PublishedRecord]):
    """The PUBLISHED file of a WAL root, open read-write for in-place slot writes; the
    lifecycle (create, load, write, rebuild to more ``max_tenants``, the newer-format
    refusal) is ``RecordFile``'s."""

    @property
    def max_tenants(self) -> int:
        return self.geometry

    @classmethod
    def codec(cls) -> _Codec:
        return CODEC

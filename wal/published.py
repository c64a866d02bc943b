"""PUBLISHED: each tenant's publication frontiers — what recovery may suppress.

RFC 0055 (§9.4; SEED-DIGEST A.7) gives PUBLISHED RECLAIM's shape, not its bytes: the
two-slot protocol of ``wal/slots.py``, a per-slot dictionary laid out exactly as
RECLAIM's (and sharing its ids — RECLAIM owns the id space, the journal keeps one
in-memory table seeded from the union of both dictionaries), then one fixed entry per
id. No planned area, so ``slot_len`` derives from ``max_tenants`` alone. All integers
little-endian, UUIDs in RFC 4122 byte order, every WalOffset 24 bytes::

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

Writing is RECLAIM's: the inactive slot in place at generation live + 1, fsynced, so a
frontier write allocates nothing. The file is preallocated at open and rebuilt through
``PUBLISHED.new`` only when ``max_tenants`` grows, together with RECLAIM.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final

from .errors import CorruptionError
from .fs import Fs, read_file
from .reclaim import (
    _DICT,
    _DICT_TOMBSTONED,
    _U64_MAX,
    _Z24,
    _Z128,
    MAX_KEY_BYTES,
    MAX_TENANTS,
    DictRecord,
    UnencodableRecord,
    _ascii_or_empty,
    _is_tenant_key,
)
from .slots import (
    FILE_HEADER_SIZE,
    FileHeader,
    InvalidSlot,
    SlotDefect,
    SlotFile,
    check_trailer,
    seal_slot,
    select_live,
    slot_offset,
)
from .types import PublishedMarks, WalOffset

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


def published_slot_len(max_tenants: int) -> int:
    return _SLOT_HEAD.size + (_DICT.size + _ENTRY.size) * max_tenants + 8


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
    if not 0 <= record.next_slot_id <= t:
        raise UnencodableRecord(f"next_slot_id {record.next_slot_id} is outside 0..{t}")
    slot_len = published_slot_len(t)
    buf = bytearray(slot_len)
    occupied = 0
    live: dict[str, int] = {}
    for i, rec in record.dictionary.items():
        if not 0 <= i < record.next_slot_id:
            raise UnencodableRecord(f"dictionary id {i} is not below next_slot_id")
        key = _ascii_or_empty(rec.tenant)
        if not _is_tenant_key(key):
            raise UnencodableRecord(f"dictionary id {i} holds an invalid tenant id {rec.tenant!r}")
        if not rec.tombstoned:
            if rec.tenant in live:
                raise UnencodableRecord(f"ids {live[rec.tenant]} and {i} both hold {rec.tenant!r}")
            live[rec.tenant] = i
        flags = _DICT_TOMBSTONED if rec.tombstoned else 0
        _DICT.pack_into(buf, _SLOT_HEAD.size + _DICT.size * i, len(key), key, flags)
    entries_at = _SLOT_HEAD.size + _DICT.size * t
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
    base = slot_offset(index, slot_len)
    generation, entry_count, next_id, reserved = _SLOT_HEAD.unpack_from(data)

    def bad(at: int, reason: str) -> InvalidSlot:
        return InvalidSlot(path, index, base + at, SlotDefect.FORMAT, reason, generation)

    if reserved != _Z8:
        raise bad(16, "non-zero reserved slot header bytes")
    if next_id > t:
        raise bad(12, f"next_slot_id {next_id} exceeds max_tenants={t}")
    view = memoryview(data)
    dictionary: dict[int, DictRecord] = {}
    live: dict[str, int] = {}
    entries_at = _SLOT_HEAD.size + _DICT.size * t
    for i, (length, key, dflags) in enumerate(
        _DICT.iter_unpack(view[_SLOT_HEAD.size : entries_at])
    ):
        at = _SLOT_HEAD.size + _DICT.size * i
        if length == 0:
            if key != _Z128 or dflags:
                raise bad(at, f"unused dictionary record {i} (len 0) is not all zero")
            continue
        if length > MAX_KEY_BYTES:
            raise bad(at, f"dictionary record {i} has len {length} > {MAX_KEY_BYTES}")
        if key[length:] != _Z128[length:]:
            raise bad(at + 2 + length, f"dictionary record {i}: non-zero key padding")
        if not _is_tenant_key(key[:length]):
            raise bad(at + 2, f"dictionary record {i}: key {key[:length]!r} is not a tenant id")
        if dflags & ~_DICT_TOMBSTONED:
            raise bad(at + 130, f"dictionary record {i}: unknown flags 0x{dflags:04x}")
        if i >= next_id:
            raise bad(at, f"dictionary record {i} is at or above next_slot_id {next_id}")
        tenant = key[:length].decode("ascii")
        tombstoned = bool(dflags & _DICT_TOMBSTONED)
        if not tombstoned:
            if tenant in live:
                raise bad(at, f"ids {live[tenant]} and {i} both hold live tenant {tenant!r}")
            live[tenant] = i
        dictionary[i] = DictRecord(tenant, tombstoned)
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


def encode_file_header(max_tenants: int) -> bytes:
    return FileHeader(MAGIC, VERSION, published_slot_len(max_tenants), (max_tenants, 0)).encode()


def decode_file_header(data: bytes, path: Path) -> int:
    """The max_tenants a PUBLISHED header records; any defect is a ``CorruptionError``."""
    header = FileHeader.decode(data, path, magic=MAGIC, version=VERSION)
    t, second = header.capacities
    if not 1 <= t <= MAX_TENANTS:
        raise CorruptionError(path, 16, f"max_tenants {t} is outside 1..{MAX_TENANTS}")
    if second:
        raise CorruptionError(path, 20, f"second capacity {second} must be 0 for PUBLISHED")
    if header.slot_len != published_slot_len(t):
        raise CorruptionError(
            path,
            8,
            f"slot_len {header.slot_len} disagrees with max_tenants={t}, "
            f"which makes {published_slot_len(t)}",
        )
    return t


# -- the file --------------------------------------------------------------------------


class PublishedFile:
    """The PUBLISHED file of a WAL root, open read-write for in-place slot writes.
    ``OSError`` propagates unchanged; bytes that break the format raise
    ``CorruptionError``."""

    NAME: ClassVar[str] = "PUBLISHED"
    NEW_NAME: ClassVar[str] = "PUBLISHED.new"

    def __init__(
        self,
        slots: SlotFile,
        max_tenants: int,
        live_index: int,
        live_generation: int,
        rejected: InvalidSlot | None = None,
    ) -> None:
        self._slots = slots
        self.max_tenants = max_tenants
        self._live_index = live_index
        self._live_generation = live_generation
        self._known: list[bytes | None] = [None, None]
        self.rejected = rejected

    @property
    def path(self) -> Path:
        return self._slots.path

    @property
    def generation(self) -> int:
        return self._live_generation

    @classmethod
    def create(cls, fs: Fs, root: Path, max_tenants: int, record: PublishedRecord) -> PublishedFile:
        """Create PUBLISHED (absent) preallocated for ``max_tenants`` holding ``record``
        in slot 0 at generation 1; durable when it returns."""
        slot0 = _encode_at(record, max_tenants, 1)
        slot_len = published_slot_len(max_tenants)
        slots = SlotFile.create(
            fs, root / cls.NAME, encode_file_header(max_tenants), slot0, slot_len
        )
        record.generation = 1
        made = cls(slots, max_tenants, 0, 1)
        made._known = [slot0, bytes(slot_len)]
        return made

    @classmethod
    def load(cls, fs: Fs, root: Path) -> tuple[PublishedFile, PublishedRecord] | None:
        path = root / cls.NAME
        try:
            slots = SlotFile.open(
                fs, path, lambda head: published_slot_len(decode_file_header(head, path))
            )
        except FileNotFoundError:
            return None
        try:
            t = decode_file_header(slots.header, path)
            raw = slots.read()
            live = select_live(
                path,
                raw.slots,
                lambda data, index: decode_slot(data, t, path, index),
                lambda rec: rec.generation,
            )
        except BaseException:
            slots.close()
            raise
        loaded = cls(slots, t, live.index, live.generation, live.rejected)
        loaded._known = [raw.slots[0], raw.slots[1]]
        return loaded, live.record

    @classmethod
    def read_only(cls, fs: Fs, root: Path) -> tuple[int, PublishedRecord] | None:
        """max_tenants and the live record, without opening for writing (operator tools)."""
        path = root / cls.NAME
        try:
            data = read_file(fs, path)
        except FileNotFoundError:
            return None
        t = decode_file_header(data[:FILE_HEADER_SIZE], path)
        if len(data) != published_file_bytes(t):
            raise CorruptionError(
                path,
                None,
                f"PUBLISHED is {len(data)} bytes; its header says {published_file_bytes(t)}",
            )
        slot_len = published_slot_len(t)
        raw = tuple(
            data[slot_offset(i, slot_len) : slot_offset(i, slot_len) + slot_len] for i in (0, 1)
        )
        live = select_live(
            path,
            raw,
            lambda chunk, index: decode_slot(chunk, t, path, index),
            lambda rec: rec.generation,
        )
        return t, live.record

    def write(self, record: PublishedRecord) -> None:
        """Write ``record`` durably into the inactive slot at generation live + 1; on
        ``OSError`` the previous slot stays live and no generation moves."""
        generation = self._live_generation + 1
        data = _encode_at(record, self.max_tenants, generation)
        target = 1 - self._live_index
        previous = self._known[target]
        self._known[target] = None
        self._slots.write_slot(target, data, previous)
        self._known[target] = data
        self._live_index, self._live_generation = target, generation
        record.generation = generation

    def rebuild(self, max_tenants: int, record: PublishedRecord) -> PublishedFile:
        """Replace the file with one for ``max_tenants`` (never fewer) through
        ``PUBLISHED.new``, ids unchanged; this one is closed once the rename happened."""
        if max_tenants < self.max_tenants:
            raise ValueError(f"a rebuild never shrinks: {max_tenants} < {self.max_tenants}")
        slot0 = _encode_at(record, max_tenants, self._live_generation)
        slot_len = published_slot_len(max_tenants)
        slots = self._slots.rebuild(encode_file_header(max_tenants), slot0, slot_len)
        self.close()
        record.generation = self._live_generation
        rebuilt = PublishedFile(slots, max_tenants, 0, self._live_generation)
        rebuilt._known = [slot0, bytes(slot_len)]
        return rebuilt

    def close(self) -> None:
        self._slots.close()

    @property
    def closed(self) -> bool:
        return self._slots.closed


def _encode_at(record: PublishedRecord, max_tenants: int, generation: int) -> bytes:
    stand_in = PublishedRecord(generation, record.next_slot_id, record.dictionary, record.entries)
    return encode_slot(stand_in, max_tenants)

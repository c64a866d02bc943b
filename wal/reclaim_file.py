"""RECLAIM: what housekeeping reclaimed, per tenant — the proof of loss recovery reads.

The file is pinned byte for byte by RFC 0052 §3.2 (SEED-DIGEST A.6); ``wal/slots.py``
owns the two-slot mechanics and ``wal/two_slot_file.py`` the file's lifecycle, so this
module is the format: the record, its codec, and the tenant dictionary PUBLISHED's
slots carry too. All integers little-endian, UUIDs as their 16 bytes in RFC 4122
order, every WalOffset 24 bytes (UUID, then u64 LSN). T = max_tenants,
U = max_unlinks_per_pass, both stored in the header::

    file header, 32 B, at file offset 0
    0    4   magic b"OWRC"
    4    2   u16 version = 1
    6    2   reserved, zero
    8    8   u64 slot_len = 32 + 164·T + 24·U + 32·T·U
    16   4   u32 max_tenants T (1..65,536: slot ids are u16)
    20   4   u32 max_unlinks_per_pass U (>= 1)
    24   4   u32 CRC-32C over [0, 24)
    28   4   reserved, zero
    then slot 0 at 32 and slot 1 at 32 + slot_len; file size 32 + 2·slot_len

    slot, offsets from the slot's start
    0             24           header
      0   8  u64 generation
      8   4  u32 entry_count     occupied entries (reported, checked, never a length)
      12  4  u32 planned_count   occupied planned records (reported, checked)
      16  2  u16 header_flags    bit 0 checkpoint_armed, 1 checkpoint_seen,
                                 2 published_seeded_armed, 3 published_seeded_confirmed;
                                 bits 4-15 zero
      18  2  u16 consumer_mode   0 unrecorded, 1 Known, 2 NoConsumer
      20  4  u32 next_slot_id    lowest id never assigned (<= T)
    24            132·T        dictionary; record i is slot id i
      0   2   u16 len            0 = unused id (id 0 is an ordinary id)
      2   128 key                the tenant's bytes; the len..128 remainder zero
      130 2   u16 flags          bit 0 tombstoned; rest zero
    24 + 132·T    32·T         entries; entry i belongs to dictionary record i
      0   2   u16 flags          bit 0 occupied; rest zero
      2   2   u16 mode           1 Known or 2 NoConsumer: the pass's mode
      4   4   reserved, zero
      8   24  WalOffset          reclaimed_through
    24 + 164·T    U·(24 + 32·T)  planned records, one per segment a pass will unlink
      0   16  segment UUID
      16  2   u16 tenant_count   present pairs (reported, checked)
      18  4   reserved, zero
      22  1   u8 flags           bit 0 uncertain, bit 1 occupied; rest zero
      23  1   reserved, zero
      24  32·T pairs; pair i belongs to dictionary record i
        0  2   u16 flags         bit 0 present; rest zero
        2  6   reserved, zero
        8  24  WalOffset         that tenant's last offset in the segment
    slot_len - 8  8            trailer: u32 CRC-32C over [0, slot_len - 8), 4 B zero

At T = 1024, U = 128: slot 4,365,344 B, file 8,730,720 B.

Decoding. Nothing is walked by a count: a position is an identity, so an id survives
a tombstone and nothing renumbers. A slot is invalid (and the other one is read) when
its CRC fails — torn or never written — or when its bytes break the format: a
non-zero reserved byte, an unknown flag bit or mode, a dictionary record with len over
128, non-zero key padding or a key outside the tenant grammar (1-128 ASCII graphic
bytes, no ``:#/``), two live records holding one tenant, an id at or above
next_slot_id, an unused position that is not entirely zero, an occupied entry or a
present pair whose id has no dictionary record, an entry on a tombstoned id, a segment
planned twice, or a reported count that disagrees with the positions. The live slot is
the valid one with the greater generation; both invalid is a ``CorruptionError`` naming
the file (damaged means "reclaimed, extent unknown", which is never "missing").

Planned positions carry no identity (nothing refers to a planned record by position),
so a zeroed position between occupied ones reads as absent and the list keeps array
order. This writer always packs the list from position 0.

Writing (``wal/two_slot_file.py``). ``ReclaimFile.write`` rewrites the inactive slot in
place with generation live + 1 and fsyncs it: no rename, no temp, no allocation, so a
pass can still commit on a full disk. A crash or a failed write leaves the previous slot
live. The file is preallocated at creation, and rebuilt through ``RECLAIM.new`` only
when a configured capacity grows (never shrunk): the live record is re-encoded at the
wider strides at the same ids, the other slot zeroed, then fsync, rename, parent fsync.

Version policy: version 1 is the only version read or written. A field defined in a
reserved byte or a new flag bit is a new version; this reader refuses it rather than
parsing around it.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .errors import CorruptionError, ErrorClass, WalError
from .frame import validate_tenant
from .slots import InvalidSlot, check_trailer, format_defect, seal_slot
from .tenant import is_valid_tenant
from .two_slot_file import RecordFile, encode_header
from .two_slot_file import UnencodableRecord as UnencodableRecord
from .types import WalOffset

NAME: Final = "RECLAIM"
MAGIC: Final = b"OWRC"
VERSION: Final = 1
#: u16 slot ids
MAX_TENANTS: Final = 65_536
MAX_KEY_BYTES: Final = 128

FLAG_CHECKPOINT_ARMED: Final = 1 << 0
FLAG_CHECKPOINT_SEEN: Final = 1 << 1
FLAG_PUBLISHED_SEEDED_ARMED: Final = 1 << 2
FLAG_PUBLISHED_SEEDED_CONFIRMED: Final = 1 << 3
_HEADER_FLAGS: Final = 0xF

_DICT_TOMBSTONED: Final = 1 << 0
_ENTRY_OCCUPIED: Final = 1 << 0
_PLANNED_UNCERTAIN: Final = 1 << 0
_PLANNED_OCCUPIED: Final = 1 << 1
_PAIR_PRESENT: Final = 1 << 0

_SLOT_HEAD: Final = struct.Struct("<QIIHHI")  # 24
_DICT: Final = struct.Struct("<H128sH")  # 132
#: one dictionary record; PUBLISHED's dictionary is this one at the same slot offset
DICT_RECORD_SIZE: Final = _DICT.size
_ENTRY: Final = struct.Struct("<HH4s24s")  # 32
_PLANNED: Final = struct.Struct("<16sH4sBB")  # 24
_PAIR: Final = struct.Struct("<H6s24s")  # 32
_U64_MAX: Final = (1 << 64) - 1
_U32_MAX: Final = (1 << 32) - 1

_Z4: Final = bytes(4)
_Z6: Final = bytes(6)
_Z24: Final = bytes(24)
_Z128: Final = bytes(MAX_KEY_BYTES)


class ConsumerMode(enum.IntEnum):
    """The root's consumer mode (RFC 0052 §3.2). 0 is a real value here: a root whose
    first pass has not yet adopted a mode records "unrecorded", not an absence."""

    UNRECORDED = 0
    KNOWN = 1
    NO_CONSUMER = 2


_MODES: Final = frozenset(int(m) for m in ConsumerMode)


class TenantCapacityExceeded(WalError):
    """Every slot id below the configured ``max_tenants`` is taken (DESIGN.md §7: 503,
    naming the tenant, the count and the limit)."""

    error_class = ErrorClass.TRANSIENT
    error_type = "wal_tenant_capacity"

    def __init__(self, tenant: str, assigned: int, limit: int) -> None:
        self.tenant = tenant
        self.assigned = assigned
        self.limit = limit
        super().__init__(
            f"tenant {tenant!r} needs a slot id but {assigned} of max_tenants={limit} "
            f"are assigned (ids are never reused); raise max_tenants"
        )


@dataclass(frozen=True, slots=True)
class Geometry:
    """The two capacities a RECLAIM file is built for, and the offsets they imply."""

    max_tenants: int
    max_unlinks: int

    def __post_init__(self) -> None:
        if not 1 <= self.max_tenants <= MAX_TENANTS:
            raise ValueError(f"max_tenants must be 1..{MAX_TENANTS}, got {self.max_tenants}")
        if not 1 <= self.max_unlinks <= _U32_MAX:
            raise ValueError(f"max_unlinks must be 1..{_U32_MAX}, got {self.max_unlinks}")

    @property
    def slot_len(self) -> int:
        t, u = self.max_tenants, self.max_unlinks
        return 32 + 164 * t + 24 * u + 32 * t * u

    @property
    def file_size(self) -> int:
        return 32 + 2 * self.slot_len

    @property
    def entries_at(self) -> int:
        return _SLOT_HEAD.size + _DICT.size * self.max_tenants

    @property
    def planned_at(self) -> int:
        return self.entries_at + _ENTRY.size * self.max_tenants

    @property
    def planned_stride(self) -> int:
        return _PLANNED.size + _PAIR.size * self.max_tenants

    def covers(self, other: Geometry) -> bool:
        """True when every id and planned position of ``other`` fits here."""
        return self.max_tenants >= other.max_tenants and self.max_unlinks >= other.max_unlinks

    def grown_to(self, other: Geometry) -> Geometry:
        """The smallest geometry covering both (a rebuild never shrinks a dimension)."""
        return Geometry(
            max(self.max_tenants, other.max_tenants), max(self.max_unlinks, other.max_unlinks)
        )


@dataclass
class DictRecord:
    tenant: str
    tombstoned: bool = False


@dataclass
class ReclaimEntry:
    mode: ConsumerMode
    reclaimed_through: WalOffset


@dataclass
class PlannedUnlink:
    """A segment a pass will unlink: each tenant's last offset in it, by slot id."""

    segment: uuid.UUID
    pairs: dict[int, WalOffset] = field(default_factory=dict)
    uncertain: bool = False


@dataclass
class ReclaimRecord:
    """One slot's content. ``planned[k]`` is planned position k (at most U of them)."""

    generation: int = 0
    flags: int = 0
    consumer_mode: ConsumerMode = ConsumerMode.UNRECORDED
    next_slot_id: int = 0
    dictionary: dict[int, DictRecord] = field(default_factory=dict)
    entries: dict[int, ReclaimEntry] = field(default_factory=dict)
    planned: list[PlannedUnlink] = field(default_factory=list)
    _index: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def copy(self) -> ReclaimRecord:
        """A copy sharing nothing mutable with this record."""
        return ReclaimRecord(
            self.generation,
            self.flags,
            self.consumer_mode,
            self.next_slot_id,
            {i: DictRecord(r.tenant, r.tombstoned) for i, r in self.dictionary.items()},
            {i: ReclaimEntry(e.mode, e.reclaimed_through) for i, e in self.entries.items()},
            [PlannedUnlink(p.segment, dict(p.pairs), p.uncertain) for p in self.planned],
        )

    def tenant_ids(self) -> dict[str, int]:
        """Tenant → slot id for every live (not tombstoned) dictionary record."""
        return {r.tenant: i for i, r in self.dictionary.items() if not r.tombstoned}

    def slot_of(self, tenant: str) -> int | None:
        """The tenant's live slot id, or None (a tombstoned id is retired, not found).
        O(1) after the first call: the index is kept in step by ``assign_slot``, the
        only writer of the dictionary once a record is loaded."""
        index = self._index
        if index is None or len(index) > len(self.dictionary):
            index = self._index = self.tenant_ids()
        slot = index.get(tenant)
        if slot is not None:
            found = self.dictionary.get(slot)
            if found is None or found.tombstoned or found.tenant != tenant:
                self._index = None  # the dictionary was edited directly: rebuild
                return self.slot_of(tenant)
        return slot

    def assign_slot(self, tenant: str, capacity: int) -> int:
        """The tenant's id, assigning ``next_slot_id`` when it has none. Ids are never
        reused, so capacity counts every id ever assigned, tombstoned ones included."""
        existing = self.slot_of(tenant)
        if existing is not None:
            return existing
        validate_tenant(tenant)
        limit = min(capacity, MAX_TENANTS)
        if self.next_slot_id >= limit:
            raise TenantCapacityExceeded(tenant, self.next_slot_id, limit)
        slot_id = self.next_slot_id
        self.dictionary[slot_id] = DictRecord(tenant)
        self.next_slot_id = slot_id + 1
        if self._index is not None:
            self._index[tenant] = slot_id
        return slot_id


# -- the tenant dictionary -------------------------------------------------------------
# RECLAIM's and PUBLISHED's slots both carry it at slot offset 24, one 132-byte record per
# id; RECLAIM owns the id space, so the code lives with its format.


def _is_tenant_key(raw: bytes) -> bool:
    # latin-1 maps each byte to one character, and every byte >= 0x80 breaks the grammar
    return len(raw) <= MAX_KEY_BYTES and is_valid_tenant(raw.decode("latin-1"))


def _ascii_or_empty(tenant: str) -> bytes:
    try:
        return tenant.encode("ascii")
    except UnicodeEncodeError:
        return b""


def check_dictionary(dictionary: Mapping[int, DictRecord], next_slot_id: int, t: int) -> None:
    """Raise ``UnencodableRecord`` unless ``dictionary`` and ``next_slot_id`` fit
    ``t`` = max_tenants ids and say each live tenant once."""
    if not 0 <= next_slot_id <= t:
        raise UnencodableRecord(f"next_slot_id {next_slot_id} is outside 0..max_tenants={t}")
    live: dict[str, int] = {}
    for i, rec in dictionary.items():
        if not 0 <= i < next_slot_id:
            raise UnencodableRecord(
                f"dictionary id {i} is not below next_slot_id={next_slot_id} (max_tenants={t})"
            )
        if not _is_tenant_key(_ascii_or_empty(rec.tenant)):
            raise UnencodableRecord(f"dictionary id {i} holds an invalid tenant id {rec.tenant!r}")
        if not rec.tombstoned:
            if rec.tenant in live:
                raise UnencodableRecord(
                    f"ids {live[rec.tenant]} and {i} both hold live tenant {rec.tenant!r}"
                )
            live[rec.tenant] = i


def pack_dictionary(buf: bytearray, at: int, dictionary: Mapping[int, DictRecord]) -> None:
    """Pack a checked dictionary (``check_dictionary``) into ``buf`` from offset ``at``;
    unused ids stay zero."""
    for i, rec in dictionary.items():
        key = rec.tenant.encode("ascii")
        flags = _DICT_TOMBSTONED if rec.tombstoned else 0
        _DICT.pack_into(buf, at + _DICT.size * i, len(key), key, flags)


def decode_dictionary(
    data: bytes, at: int, t: int, next_id: int, bad: Callable[[int, str], InvalidSlot]
) -> dict[int, DictRecord]:
    """The ``t`` dictionary records from slot offset ``at``; a defect raises
    ``bad(offset in the slot, reason)``."""
    dictionary: dict[int, DictRecord] = {}
    live: dict[str, int] = {}
    region = memoryview(data)[at : at + _DICT.size * t]
    for i, (length, key, dflags) in enumerate(_DICT.iter_unpack(region)):
        rec_at = at + _DICT.size * i
        if length == 0:
            if key != _Z128 or dflags:
                raise bad(rec_at, f"unused dictionary record {i} (len 0) is not all zero")
            continue
        if length > MAX_KEY_BYTES:
            raise bad(rec_at, f"dictionary record {i} has len {length} > {MAX_KEY_BYTES}")
        if key[length:] != _Z128[length:]:
            raise bad(rec_at + 2 + length, f"dictionary record {i}: non-zero key padding")
        if not _is_tenant_key(key[:length]):
            raise bad(rec_at + 2, f"dictionary record {i}: key {key[:length]!r} is not a tenant id")
        if dflags & ~_DICT_TOMBSTONED:
            raise bad(rec_at + 130, f"dictionary record {i}: unknown flags 0x{dflags:04x}")
        if i >= next_id:
            raise bad(rec_at, f"dictionary record {i} is at or above next_slot_id {next_id}")
        tenant = key[:length].decode("ascii")
        tombstoned = bool(dflags & _DICT_TOMBSTONED)
        if not tombstoned:
            if tenant in live:
                raise bad(rec_at, f"ids {live[tenant]} and {i} both hold live tenant {tenant!r}")
            live[tenant] = i
        dictionary[i] = DictRecord(tenant, tombstoned)
    return dictionary


# -- encoding --------------------------------------------------------------------------


def _check_fits(record: ReclaimRecord, geometry: Geometry) -> None:
    t, u = geometry.max_tenants, geometry.max_unlinks
    if not 0 <= record.generation <= _U64_MAX:
        raise UnencodableRecord(f"generation {record.generation} does not fit a u64")
    if record.flags & ~_HEADER_FLAGS:
        raise UnencodableRecord(f"unknown header_flags bits 0x{record.flags & ~_HEADER_FLAGS:x}")
    if record.consumer_mode not in _MODES:
        raise UnencodableRecord(f"unknown consumer_mode {record.consumer_mode!r}")
    check_dictionary(record.dictionary, record.next_slot_id, t)
    for i, entry in record.entries.items():
        rec_i = record.dictionary.get(i)
        if rec_i is None:
            raise UnencodableRecord(f"entry {i} has no dictionary record")
        if rec_i.tombstoned:
            raise UnencodableRecord(f"entry {i} belongs to tombstoned tenant {rec_i.tenant!r}")
        if entry.mode not in (ConsumerMode.KNOWN, ConsumerMode.NO_CONSUMER):
            raise UnencodableRecord(f"entry {i} has mode {entry.mode!r}; Known or NoConsumer")
    if len(record.planned) > u:
        raise UnencodableRecord(
            f"{len(record.planned)} planned records exceed max_unlinks_per_pass={u}"
        )
    seen: set[uuid.UUID] = set()
    for k, plan in enumerate(record.planned):
        if plan.segment in seen:
            raise UnencodableRecord(f"segment {plan.segment} is planned twice (position {k})")
        seen.add(plan.segment)
        for i in plan.pairs:
            if i not in record.dictionary:
                raise UnencodableRecord(
                    f"planned position {k} (segment {plan.segment}) has a pair for id {i}, "
                    f"which has no dictionary record"
                )


def encode_slot(record: ReclaimRecord, geometry: Geometry) -> bytes:
    """The slot's ``geometry.slot_len`` bytes, CRC sealed. Only occupied positions are
    packed into a zeroed buffer, so the cost is the buffer and the CRC, not T·U."""
    _check_fits(record, geometry)
    buf = bytearray(geometry.slot_len)
    _SLOT_HEAD.pack_into(
        buf,
        0,
        record.generation,
        len(record.entries),
        len(record.planned),
        record.flags,
        int(record.consumer_mode),
        record.next_slot_id,
    )
    pack_dictionary(buf, _SLOT_HEAD.size, record.dictionary)
    entries_at = geometry.entries_at
    try:
        for i, entry in record.entries.items():
            _ENTRY.pack_into(
                buf,
                entries_at + _ENTRY.size * i,
                _ENTRY_OCCUPIED,
                int(entry.mode),
                _Z4,
                entry.reclaimed_through.encode(),
            )
        stride = geometry.planned_stride
        for k, plan in enumerate(record.planned):
            at = geometry.planned_at + stride * k
            flags = _PLANNED_OCCUPIED | (_PLANNED_UNCERTAIN if plan.uncertain else 0)
            _PLANNED.pack_into(buf, at, plan.segment.bytes, len(plan.pairs), _Z4, flags, 0)
            for i, offset in plan.pairs.items():
                _PAIR.pack_into(
                    buf, at + _PLANNED.size + _PAIR.size * i, _PAIR_PRESENT, _Z6, offset.encode()
                )
    except struct.error as exc:
        raise UnencodableRecord(f"a WalOffset does not fit its u64 LSN: {exc}") from exc
    seal_slot(buf)
    return bytes(buf)


# -- decoding --------------------------------------------------------------------------


def decode_slot(data: bytes, geometry: Geometry, path: Path, index: int) -> ReclaimRecord:
    """Check and decode slot ``index``; any defect raises ``InvalidSlot`` (a CRC failure
    as ``TORN``/``EMPTY``, anything else as ``FORMAT``), never a partial record."""
    check_trailer(data, path, index, geometry.slot_len)
    t = geometry.max_tenants
    generation, entry_count, planned_count, flags, mode, next_id = _SLOT_HEAD.unpack_from(data)
    bad = format_defect(path, index, geometry.slot_len, generation)
    view = memoryview(data)
    if flags & ~_HEADER_FLAGS:
        raise bad(16, f"unknown header_flags bits 0x{flags & ~_HEADER_FLAGS:04x}")
    if mode not in _MODES:
        raise bad(18, f"unknown consumer_mode {mode}")
    if next_id > t:
        raise bad(20, f"next_slot_id {next_id} exceeds max_tenants={t}")

    dictionary = decode_dictionary(data, _SLOT_HEAD.size, t, next_id, bad)

    entries: dict[int, ReclaimEntry] = {}
    entries_at = geometry.entries_at
    entry_region = view[entries_at : geometry.planned_at]
    for i, (eflags, emode, reserved, raw) in enumerate(_ENTRY.iter_unpack(entry_region)):
        at = entries_at + _ENTRY.size * i
        if eflags == 0:
            if emode or reserved != _Z4 or raw != _Z24:
                raise bad(at, f"unoccupied entry {i} is not all zero")
            continue
        if eflags & ~_ENTRY_OCCUPIED:
            raise bad(at, f"entry {i}: unknown flags 0x{eflags:04x}")
        if emode not in (ConsumerMode.KNOWN, ConsumerMode.NO_CONSUMER):
            raise bad(at + 2, f"entry {i}: unknown mode {emode}")
        if reserved != _Z4:
            raise bad(at + 4, f"entry {i}: non-zero reserved bytes")
        owner = dictionary.get(i)
        if owner is None:
            raise bad(at, f"occupied entry {i} has no dictionary record (len 0)")
        if owner.tombstoned:
            raise bad(at, f"occupied entry {i} belongs to tombstoned tenant {owner.tenant!r}")
        entries[i] = ReclaimEntry(ConsumerMode(emode), WalOffset.decode(raw))
    if entry_count != len(entries):
        raise bad(8, f"entry_count {entry_count} but {len(entries)} entries are occupied")

    planned: list[PlannedUnlink] = []
    segments: dict[uuid.UUID, int] = {}
    stride = geometry.planned_stride
    zero_stride = bytes(stride)
    for k in range(geometry.max_unlinks):
        at = geometry.planned_at + stride * k
        raw_seg, tenant_count, reserved, pflags, reserved_b = _PLANNED.unpack_from(data, at)
        if not pflags & _PLANNED_OCCUPIED:
            if data[at : at + stride] != zero_stride:
                raise bad(at, f"unused planned record {k} is not all zero")
            continue
        if pflags & ~(_PLANNED_OCCUPIED | _PLANNED_UNCERTAIN):
            raise bad(at + 22, f"planned record {k}: unknown flags 0x{pflags:02x}")
        if reserved != _Z4:
            raise bad(at + 18, f"planned record {k}: non-zero reserved bytes")
        if reserved_b:
            raise bad(at + 23, f"planned record {k}: non-zero reserved byte")
        segment = uuid.UUID(bytes=raw_seg)
        if segment in segments:
            raise bad(at, f"segment {segment} is planned at {segments[segment]} and {k}")
        segments[segment] = k
        pairs: dict[int, WalOffset] = {}
        pairs_at = at + _PLANNED.size
        pair_region = view[pairs_at : at + stride]
        for i, (qflags, qreserved, qraw) in enumerate(_PAIR.iter_unpack(pair_region)):
            if qflags == 0:
                if qreserved != _Z6 or qraw != _Z24:
                    raise bad(pairs_at + _PAIR.size * i, f"planned {k}: absent pair {i} not zero")
                continue
            q_at = pairs_at + _PAIR.size * i
            if qflags & ~_PAIR_PRESENT:
                raise bad(q_at, f"planned {k} pair {i}: unknown flags 0x{qflags:04x}")
            if qreserved != _Z6:
                raise bad(q_at + 2, f"planned {k} pair {i}: non-zero reserved bytes")
            if i not in dictionary:
                raise bad(q_at, f"planned {k}: present pair {i} has no dictionary record")
            # A pair's offset is normally inside the planned segment: share its UUID.
            if qraw[:16] == raw_seg:
                pairs[i] = WalOffset(segment, int.from_bytes(qraw[16:], "little"))
            else:
                pairs[i] = WalOffset.decode(qraw)
        if tenant_count != len(pairs):
            raise bad(
                at + 16, f"planned {k}: tenant_count {tenant_count} but {len(pairs)} pairs present"
            )
        planned.append(PlannedUnlink(segment, pairs, bool(pflags & _PLANNED_UNCERTAIN)))
    if planned_count != len(planned):
        raise bad(12, f"planned_count {planned_count} but {len(planned)} records are occupied")

    return ReclaimRecord(
        generation, flags, ConsumerMode(mode), next_id, dictionary, entries, planned
    )


# -- the file --------------------------------------------------------------------------


class _Codec:
    """RECLAIM's half of its two-slot record file (``wal/two_slot_file.py``)."""

    name = NAME
    magic = MAGIC
    version = VERSION
    encode = staticmethod(encode_slot)
    decode = staticmethod(decode_slot)

    def slot_len(self, geometry: Geometry) -> int:
        return geometry.slot_len

    def capacities(self, geometry: Geometry) -> tuple[int, int]:
        return geometry.max_tenants, geometry.max_unlinks

    def geometry(self, capacities: tuple[int, int], path: Path) -> Geometry:
        t, u = capacities
        if not 1 <= t <= MAX_TENANTS:
            raise CorruptionError(path, 16, f"max_tenants {t} is outside 1..{MAX_TENANTS}")
        if u < 1:
            raise CorruptionError(path, 20, f"max_unlinks_per_pass {u} is below 1")
        return Geometry(t, u)

    def describe(self, geometry: Geometry) -> str:
        return f"max_tenants={geometry.max_tenants}, max_unlinks_per_pass={geometry.max_unlinks}"

    def covers(self, geometry: Geometry, other: Geometry) -> bool:
        return geometry.covers(other)


CODEC: Final = _Codec()


def encode_file_header(geometry: Geometry) -> bytes:
    return encode_header(CODEC, geometry)


class ReclaimFile(RecordFile[Geometry, ReclaimRecord]):
    """The RECLAIM file of a WAL root, open read-write for in-place slot writes; the
    lifecycle (create, load, write, rebuild, the newer-format refusal) is
    ``RecordFile``'s."""

    @classmethod
    def codec(cls) -> _Codec:
        return CODEC

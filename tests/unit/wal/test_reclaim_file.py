"""RECLAIM: golden layout, geometry, round trips, every refusal, slot choice, crash points
of the in-place write and of the geometry rebuild (RFC 0052 §3.2)."""

from __future__ import annotations

import errno
import os
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.walkit import faulty
from tests.unit.wal.golden import DATA, SEGMENT_A, SEGMENT_B
from tests.unit.wal.golden_reclaim import (
    GEOMETRY,
    golden_live_record,
    golden_older_record,
    golden_reclaim_file,
)
from wal import CorruptionError, OsFs, WalOffset
from wal.config import reclaim_file_bytes
from wal.errors import InvalidTenant
from wal.reclaim_file import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    FLAG_PUBLISHED_SEEDED_ARMED,
    FLAG_PUBLISHED_SEEDED_CONFIRMED,
    ConsumerMode,
    DictRecord,
    Geometry,
    PlannedUnlink,
    ReclaimEntry,
    ReclaimFile,
    ReclaimRecord,
    TenantCapacityExceeded,
    UnencodableRecord,
    decode_slot,
    encode_file_header,
    encode_slot,
)
from wal.slots import InvalidSlot, SlotDefect
from wal.testing import FaultyFs, SimulatedCrash

GOLDEN = "reclaim_v1_t4_u2.bin"
# Offsets of the T = 4, U = 2 slot, computed by hand from the pinned table.
SLOT_LEN = 992
DICT_AT = 24
ENTRIES_AT = 24 + 132 * 4  # 552
PLANNED_AT = 24 + 164 * 4  # 680
STRIDE = 24 + 32 * 4  # 152
TRAILER_AT = SLOT_LEN - 8  # 984
SLOT1_AT = 32 + SLOT_LEN  # 1024


def _install(root: Path, data: bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / ReclaimFile.NAME
    path.write_bytes(data)
    return path


def _load(root: Path, fs: OsFs | None = None) -> tuple[ReclaimFile, ReclaimRecord]:
    loaded = ReclaimFile.load(fs or OsFs(), root)
    assert loaded is not None
    return loaded


def _reseal(slot: bytearray) -> bytearray:
    struct.pack_into("<I", slot, TRAILER_AT, crc32c.crc32c(bytes(slot[:TRAILER_AT])))
    return slot


def _file(header: bytes, slot0: bytes, slot1: bytes) -> bytes:
    return header + slot0 + slot1


def _slots(raw: bytes) -> tuple[bytes, bytes, bytes]:
    return raw[:32], raw[32:SLOT1_AT], raw[SLOT1_AT:]


# -- golden bytes and geometry ---------------------------------------------------------


def test_golden_reclaim_bytes_are_stable(tmp_path: Path) -> None:
    raw = (DATA / GOLDEN).read_bytes()
    assert golden_reclaim_file() == raw
    _install(tmp_path, raw)
    f, record = _load(tmp_path)
    with f:
        assert record == golden_live_record()
        assert (f.live_index, f.generation, f.rejected) == (1, 7, None)
        assert f.geometry == GEOMETRY


def test_golden_fields_sit_at_the_pinned_offsets() -> None:
    """Read the golden file with literal offsets from the RFC's table, not the codec's."""
    raw = (DATA / GOLDEN).read_bytes()
    assert len(raw) == 32 + 2 * SLOT_LEN == 2016
    assert raw[0:4] == b"OWRC"
    assert struct.unpack_from("<HHQII", raw, 4) == (1, 0, SLOT_LEN, 4, 2)
    assert struct.unpack_from("<II", raw, 24) == (crc32c.crc32c(raw[:24]), 0)
    s = raw[SLOT1_AT:]
    assert struct.unpack_from("<QIIHHI", s, 0) == (7, 2, 1, 0b0111, 1, 3)
    # dictionary: id 1 tombstoned, id 2 a full 128-byte key, id 3 unused
    assert struct.unpack_from("<H", s, DICT_AT + 132)[0] == len("retired.tenant")
    assert struct.unpack_from("<H", s, DICT_AT + 132 + 130)[0] == 1
    assert s[DICT_AT + 264 : DICT_AT + 264 + 130] == struct.pack("<H", 128) + b"z" * 128
    assert s[DICT_AT + 396 : DICT_AT + 528] == bytes(132)
    # entry 2: occupied, NoConsumer, reserved, WalOffset
    entry2 = ENTRIES_AT + 64
    assert s[entry2 : entry2 + 8] == struct.pack("<HH4x", 1, 2)
    assert s[entry2 + 8 : entry2 + 32] == SEGMENT_A.bytes + struct.pack("<Q", 65_536)
    assert s[ENTRIES_AT + 32 : ENTRIES_AT + 64] == bytes(32)  # tombstoned id 1: no entry
    # planned 0: uuid, tenant_count 2, flags occupied|uncertain at 22; pair 2 present
    assert s[PLANNED_AT : PLANNED_AT + 16] == SEGMENT_B.bytes
    assert struct.unpack_from("<H4sBB", s, PLANNED_AT + 16) == (2, bytes(4), 0b11, 0)
    pair2 = PLANNED_AT + 24 + 64
    assert s[pair2 : pair2 + 8] == struct.pack("<H6x", 1)
    assert s[pair2 + 8 : pair2 + 32] == SEGMENT_B.bytes + struct.pack("<Q", (1 << 40) + 99)
    assert s[PLANNED_AT + STRIDE : TRAILER_AT] == bytes(STRIDE)  # position 1 unused
    assert struct.unpack_from("<II", s, TRAILER_AT) == (crc32c.crc32c(s[:TRAILER_AT]), 0)


def test_header_flag_bits_are_the_pinned_ones() -> None:
    assert (
        FLAG_CHECKPOINT_ARMED,
        FLAG_CHECKPOINT_SEEN,
        FLAG_PUBLISHED_SEEDED_ARMED,
        FLAG_PUBLISHED_SEEDED_CONFIRMED,
    ) == (1, 2, 4, 8)
    assert [int(m) for m in ConsumerMode] == [0, 1, 2]


def test_default_geometry_sizes(tmp_path: Path) -> None:
    g = Geometry(1024, 128)
    assert g.slot_len == 4_365_344
    assert g.file_size == 8_730_720 == reclaim_file_bytes(1024, 128)
    with ReclaimFile.create(OsFs(), tmp_path, g, ReclaimRecord()) as f:
        assert f.path.stat().st_size == 8_730_720
        assert f.rejected is None
    assert GEOMETRY.slot_len == SLOT_LEN


@pytest.mark.parametrize(
    ("tenants", "unlinks"),
    [
        pytest.param(0, 1, id="no_tenants"),
        pytest.param(65_537, 1, id="over_u16_ids"),
        pytest.param(1, 0, id="no_unlinks"),
    ],
)
def test_geometry_bounds(tenants: int, unlinks: int) -> None:
    with pytest.raises(ValueError):
        Geometry(tenants, unlinks)
    assert Geometry(65_536, 1).max_tenants == 65_536


def test_default_geometry_round_trips_empty_typical_and_full_records() -> None:
    """At T=1024, U=128 every shape of record survives encode and decode (the timing of
    the same work is reported by soak/bench/housekeeping.py, never asserted here)."""
    g = Geometry(1024, 128)
    for record in (
        ReclaimRecord(),
        _busy_record(g, planned=8, every=16),
        _busy_record(g, planned=128, every=1),
    ):
        data = encode_slot(record, g)
        assert len(data) == g.slot_len
        assert decode_slot(data, g, Path("RECLAIM"), 0) == record


def _busy_record(g: Geometry, *, planned: int, every: int) -> ReclaimRecord:
    record = ReclaimRecord(consumer_mode=ConsumerMode.KNOWN)
    for i in range(g.max_tenants):
        record.assign_slot(f"tenant-{i}", g.max_tenants)
        record.entries[i] = ReclaimEntry(ConsumerMode.KNOWN, WalOffset(SEGMENT_A, 1000 + i))
    for k in range(planned):
        seg = uuid.UUID(int=(SEGMENT_B.int + k))
        pairs = {i: WalOffset(seg, 5000 + i) for i in range(0, g.max_tenants, every)}
        record.planned.append(PlannedUnlink(seg, pairs))
    return record


# -- round trips -----------------------------------------------------------------------

_TENANT_CHARS = "".join(chr(b) for b in range(0x21, 0x7F) if chr(b) not in ":#/")
_offsets = st.builds(WalOffset, st.uuids(), st.integers(min_value=0, max_value=(1 << 64) - 1))


@st.composite
def _records(draw: st.DrawFn) -> tuple[Geometry, ReclaimRecord]:
    g = Geometry(draw(st.integers(1, 8)), draw(st.integers(1, 4)))
    next_id = draw(st.integers(0, g.max_tenants))
    ids = draw(st.sets(st.integers(0, max(next_id - 1, 0)), max_size=next_id)) if next_id else set()
    tenants = draw(
        st.lists(
            st.text(_TENANT_CHARS, min_size=1, max_size=128),
            min_size=len(ids),
            max_size=len(ids),
            unique=True,
        )
    )
    dictionary = {
        i: DictRecord(t, draw(st.booleans())) for i, t in zip(sorted(ids), tenants, strict=True)
    }
    live_ids = [i for i, r in dictionary.items() if not r.tombstoned]
    modes = st.sampled_from([ConsumerMode.KNOWN, ConsumerMode.NO_CONSUMER])
    entry_ids = draw(st.sets(st.sampled_from(live_ids))) if live_ids else set()
    entries = {i: ReclaimEntry(draw(modes), draw(_offsets)) for i in sorted(entry_ids)}
    segments = draw(st.lists(st.uuids(), max_size=g.max_unlinks, unique=True))
    planned = []
    for seg in segments:
        pair_ids = draw(st.sets(st.sampled_from(sorted(dictionary)))) if dictionary else set()
        planned.append(
            PlannedUnlink(seg, {i: draw(_offsets) for i in pair_ids}, draw(st.booleans()))
        )
    record = ReclaimRecord(
        generation=draw(st.integers(0, (1 << 64) - 1)),
        flags=draw(st.integers(0, 15)),
        consumer_mode=draw(st.sampled_from(list(ConsumerMode))),
        next_slot_id=next_id,
        dictionary=dictionary,
        entries=entries,
        planned=planned,
    )
    return g, record


@settings(max_examples=300, derandomize=True, deadline=None)
@given(_records())
def test_random_records_round_trip(case: tuple[Geometry, ReclaimRecord]) -> None:
    g, record = case
    data = encode_slot(record, g)
    assert len(data) == g.slot_len
    assert decode_slot(data, g, Path("RECLAIM"), 1) == record


def test_copy_shares_nothing_mutable() -> None:
    original = golden_live_record()
    clone = original.copy()
    assert clone == original
    clone.dictionary[3] = DictRecord("new")
    clone.dictionary[0].tombstoned = True
    clone.entries[0].reclaimed_through = WalOffset(SEGMENT_B, 1)
    clone.planned[0].pairs[1] = WalOffset(SEGMENT_B, 2)
    clone.planned[0].uncertain = False
    clone.planned.append(PlannedUnlink(SEGMENT_A))
    assert original == golden_live_record()


def test_slot_ids_are_assigned_once_and_never_reused() -> None:
    record = ReclaimRecord()
    assert record.assign_slot("a", 3) == 0
    assert record.assign_slot("b", 3) == 1
    assert record.assign_slot("a", 3) == 0
    assert record.slot_of("b") == 1 and record.slot_of("zz") is None
    record.dictionary[1].tombstoned = True
    assert record.slot_of("b") is None
    assert record.assign_slot("b", 3) == 2  # a tombstoned id is retired, not reused
    assert record.tenant_ids() == {"a": 0, "b": 2}
    with pytest.raises(TenantCapacityExceeded, match=r"'c'.*3 of max_tenants=3") as info:
        record.assign_slot("c", 3)
    assert (info.value.tenant, info.value.assigned, info.value.limit) == ("c", 3, 3)
    with pytest.raises(InvalidTenant):
        record.assign_slot("no/slash", 10)
    assert encode_slot(record, Geometry(3, 1))  # the tombstone and the new id both encode


# -- encoding refusals -----------------------------------------------------------------


def _id_beyond_max_tenants(record: ReclaimRecord) -> None:
    record.next_slot_id = 4
    record.dictionary[4] = DictRecord("x")


def _with(change: Callable[[ReclaimRecord], None]) -> ReclaimRecord:
    record = golden_live_record()
    change(record)
    return record


@pytest.mark.parametrize(
    ("record", "words"),
    [
        pytest.param(
            _with(lambda r: setattr(r, "next_slot_id", 5)), "next_slot_id 5", id="next_id_over_T"
        ),
        pytest.param(
            _with(lambda r: r.dictionary.__setitem__(3, DictRecord("late"))),
            "id 3 is not below next_slot_id=3",
            id="id_at_next_id",
        ),
        pytest.param(
            _with(_id_beyond_max_tenants),
            "id 4 is not below next_slot_id=4 \\(max_tenants=4\\)",
            id="id_beyond_max_tenants",
        ),
        pytest.param(
            _with(
                lambda r: r.planned.extend(
                    [PlannedUnlink(uuid.uuid4()), PlannedUnlink(uuid.uuid4())]
                )
            ),
            "3 planned records exceed max_unlinks_per_pass=2",
            id="too_many_planned",
        ),
        pytest.param(
            _with(lambda r: r.planned.append(PlannedUnlink(SEGMENT_B))),
            "planned twice",
            id="segment_planned_twice",
        ),
        pytest.param(
            _with(lambda r: r.entries.__setitem__(3, r.entries[0])),
            "entry 3 has no dictionary record",
            id="entry_without_dictionary",
        ),
        pytest.param(
            _with(lambda r: r.entries.__setitem__(1, r.entries[0])),
            "tombstoned",
            id="entry_on_tombstone",
        ),
        pytest.param(
            _with(lambda r: setattr(r.entries[0], "mode", ConsumerMode.UNRECORDED)),
            "mode",
            id="entry_mode_unrecorded",
        ),
        pytest.param(
            _with(lambda r: r.planned[0].pairs.__setitem__(3, WalOffset(SEGMENT_B, 1))),
            "pair for id 3",
            id="pair_without_dictionary",
        ),
        pytest.param(
            _with(lambda r: setattr(r.dictionary[2], "tenant", "x" * 129)),
            "invalid tenant",
            id="tenant_too_long",
        ),
        pytest.param(
            _with(lambda r: setattr(r.dictionary[2], "tenant", "caf\u00e9")),
            "invalid tenant",
            id="tenant_not_ascii",
        ),
        pytest.param(
            _with(lambda r: setattr(r.dictionary[2], "tenant", "acme")),
            "both hold live tenant 'acme'",
            id="duplicate_live_tenant",
        ),
        pytest.param(_with(lambda r: setattr(r, "flags", 16)), "header_flags", id="unknown_flag"),
        pytest.param(
            _with(
                lambda r: setattr(r.entries[0], "reclaimed_through", WalOffset(SEGMENT_A, 1 << 64))
            ),
            "u64",
            id="lsn_overflow",
        ),
    ],
)
def test_encode_refuses_what_the_geometry_or_format_cannot_hold(
    record: ReclaimRecord, words: str
) -> None:
    with pytest.raises(UnencodableRecord, match=words):
        encode_slot(record, GEOMETRY)


# -- decoding refusals: one slot invalid, then both ------------------------------------


def _put(at: int, fmt: str, *values: object) -> Callable[[bytearray], None]:
    return lambda s: struct.pack_into(fmt, s, at, *values)


def _raw(at: int, data: bytes) -> Callable[[bytearray], None]:
    def change(s: bytearray) -> None:
        s[at : at + len(data)] = data

    return change


def _both(*changes: Callable[[bytearray], None]) -> Callable[[bytearray], None]:
    def change(s: bytearray) -> None:
        for c in changes:
            c(s)

    return change


E0, E1, E3 = ENTRIES_AT, ENTRIES_AT + 32, ENTRIES_AT + 96
P0, P1 = PLANNED_AT, PLANNED_AT + STRIDE
PAIR0, PAIR1, PAIR3 = P0 + 24, P0 + 24 + 32, P0 + 24 + 96

# (change to the live slot, words the reason carries, reseal the CRC?)
SLOT_CORRUPTIONS = [
    pytest.param(_put(16, "<H", 0b1_0111), "header_flags", id="header_flag_bit4"),
    pytest.param(_put(16, "<H", 0x8007), "header_flags", id="header_flag_bit15"),
    pytest.param(_put(18, "<H", 3), "consumer_mode 3", id="unknown_consumer_mode"),
    pytest.param(_put(20, "<I", 5), "next_slot_id 5 exceeds", id="next_id_over_T"),
    pytest.param(_put(20, "<I", 2), "at or above next_slot_id 2", id="id_above_next_id"),
    pytest.param(_put(8, "<I", 3), "entry_count 3", id="entry_count_disagrees"),
    pytest.param(_put(12, "<I", 0), "planned_count 0", id="planned_count_disagrees"),
    pytest.param(_put(DICT_AT, "<H", 129), "len 129 > 128", id="dict_len_over_128"),
    pytest.param(_raw(DICT_AT + 2 + 4, b"x"), "padding", id="dict_key_padding_first"),
    pytest.param(_raw(DICT_AT + 129, b"\x01"), "padding", id="dict_key_padding_last"),
    pytest.param(_raw(DICT_AT + 3, b":"), "not a tenant id", id="dict_key_colon"),
    pytest.param(_raw(DICT_AT + 3, b"#"), "not a tenant id", id="dict_key_hash"),
    pytest.param(_raw(DICT_AT + 3, b"/"), "not a tenant id", id="dict_key_slash"),
    pytest.param(_raw(DICT_AT + 3, b" "), "not a tenant id", id="dict_key_space"),
    pytest.param(_raw(DICT_AT + 3, b"\x7f"), "not a tenant id", id="dict_key_del"),
    pytest.param(_raw(DICT_AT + 3, b"\x00"), "not a tenant id", id="dict_key_nul"),
    pytest.param(_put(DICT_AT + 130, "<H", 2), "unknown flags", id="dict_flag_bit1"),
    pytest.param(_raw(DICT_AT + 396 + 7, b"q"), "unused dictionary record 3", id="dict_unused_key"),
    pytest.param(_put(DICT_AT + 396 + 130, "<H", 1), "unused dictionary", id="dict_unused_flags"),
    pytest.param(
        _raw(DICT_AT + 264, struct.pack("<H", 4) + b"acme" + bytes(124)),
        "both hold live tenant 'acme'",
        id="dict_duplicate_live_tenant",
    ),
    pytest.param(_put(E0, "<H", 3), "entry 0: unknown flags", id="entry_flag_bit1"),
    pytest.param(_put(E0 + 2, "<H", 3), "entry 0: unknown mode 3", id="entry_mode_unknown"),
    pytest.param(_put(E0 + 2, "<H", 0), "entry 0: unknown mode 0", id="entry_mode_unrecorded"),
    pytest.param(_raw(E0 + 4, b"\x01"), "entry 0: non-zero reserved", id="entry_reserved_first"),
    pytest.param(_raw(E0 + 7, b"\x01"), "entry 0: non-zero reserved", id="entry_reserved_last"),
    pytest.param(
        _both(_put(E3, "<HH", 1, 1), _put(8, "<I", 3)),
        "entry 3 has no dictionary record",
        id="entry_without_dictionary",
    ),
    pytest.param(
        _both(_put(E1, "<HH", 1, 1), _put(8, "<I", 3)), "tombstoned", id="entry_on_tombstone"
    ),
    pytest.param(_raw(E3 + 20, b"\x01"), "unoccupied entry 3", id="entry_unoccupied_offset"),
    pytest.param(_put(E3 + 2, "<H", 1), "unoccupied entry 3", id="entry_unoccupied_mode"),
    pytest.param(
        _raw(P0 + 18, b"\x01"), "planned record 0: non-zero reserved", id="planned_reserved_18"
    ),
    pytest.param(
        _raw(P0 + 21, b"\x01"), "planned record 0: non-zero reserved", id="planned_reserved_21"
    ),
    pytest.param(_raw(P0 + 23, b"\x01"), "reserved byte", id="planned_reserved_23"),
    pytest.param(_raw(P0 + 22, b"\x07"), "planned record 0: unknown flags", id="planned_flag_bit2"),
    pytest.param(_raw(P0 + 22, b"\x83"), "planned record 0: unknown flags", id="planned_flag_bit7"),
    pytest.param(_put(P0 + 16, "<H", 1), "tenant_count 1", id="planned_tenant_count"),
    pytest.param(_raw(P1 + 3, b"\x01"), "unused planned record 1", id="planned_unused_uuid"),
    pytest.param(_raw(P1 + 22, b"\x01"), "unused planned record 1", id="planned_uncertain_only"),
    pytest.param(_raw(P1 + 24 + 40, b"\x01"), "unused planned record 1", id="planned_unused_pair"),
    pytest.param(
        _both(
            lambda s: s.__setitem__(slice(P1, P1 + STRIDE), s[P0 : P0 + STRIDE]),
            _put(12, "<I", 2),
        ),
        "planned at 0 and 1",
        id="planned_segment_twice",
    ),
    pytest.param(_put(PAIR0, "<H", 3), "pair 0: unknown flags", id="pair_flag_bit1"),
    pytest.param(_raw(PAIR0 + 2, b"\x01"), "pair 0: non-zero reserved", id="pair_reserved_first"),
    pytest.param(_raw(PAIR0 + 7, b"\x01"), "pair 0: non-zero reserved", id="pair_reserved_last"),
    pytest.param(
        _both(_put(PAIR3, "<H", 1), _put(P0 + 16, "<H", 3)),
        "pair 3 has no dictionary record",
        id="pair_without_dictionary",
    ),
    pytest.param(_raw(PAIR1 + 9, b"\x01"), "absent pair 1 not zero", id="pair_absent_offset"),
    pytest.param(_raw(PAIR1 + 4, b"\x01"), "absent pair 1 not zero", id="pair_absent_reserved"),
]


@pytest.mark.parametrize(("corrupt", "words"), SLOT_CORRUPTIONS)
def test_format_violation_makes_the_slot_invalid(
    corrupt: Callable[[bytearray], None], words: str
) -> None:
    slot = bytearray(encode_slot(golden_live_record(), GEOMETRY))
    corrupt(slot)
    with pytest.raises(InvalidSlot, match=words) as info:
        decode_slot(bytes(_reseal(slot)), GEOMETRY, Path("RECLAIM"), 1)
    assert info.value.defect is SlotDefect.FORMAT
    assert info.value.generation == 7
    assert SLOT1_AT <= info.value.offset < SLOT1_AT + SLOT_LEN


def test_non_zero_trailer_reserved_is_a_format_violation() -> None:
    slot = bytearray(encode_slot(golden_live_record(), GEOMETRY))
    slot[TRAILER_AT + 7] = 1  # outside the CRC's span, so the CRC still holds
    with pytest.raises(InvalidSlot, match="reserved trailer") as info:
        decode_slot(bytes(slot), GEOMETRY, Path("RECLAIM"), 0)
    assert (info.value.defect, info.value.offset) == (SlotDefect.FORMAT, 32 + TRAILER_AT + 4)


@pytest.mark.parametrize(("corrupt", "words"), SLOT_CORRUPTIONS)
def test_rfc0052_17_invalid_live_slot_falls_back_to_the_other(
    tmp_path: Path, corrupt: Callable[[bytearray], None], words: str
) -> None:
    header, older, live = _slots(golden_reclaim_file())
    slot = bytearray(live)
    corrupt(slot)
    _install(tmp_path, _file(header, older, bytes(_reseal(slot))))
    f, record = _load(tmp_path)
    with f:
        assert record == golden_older_record()
        assert f.live_index == 0
        assert f.rejected is not None and f.rejected.defect is SlotDefect.FORMAT
        assert words in f.rejected.reason


@pytest.mark.parametrize(("corrupt", "words"), SLOT_CORRUPTIONS)
def test_rfc0052_17_both_slots_invalid_fails_naming_the_file(
    tmp_path: Path, corrupt: Callable[[bytearray], None], words: str
) -> None:
    header, older, live = _slots(golden_reclaim_file())
    slot = bytearray(live)
    corrupt(slot)
    torn = bytearray(older)
    torn[100] ^= 0xFF
    path = _install(tmp_path, _file(header, bytes(torn), bytes(_reseal(slot))))
    with pytest.raises(CorruptionError) as info:
        ReclaimFile.load(OsFs(), tmp_path)
    assert info.value.path == path
    assert info.value.offset is not None
    message = str(info.value)
    assert "one slot fails its checksum and the other violates the format" in message
    assert words in message and "torn" in message and "format" in message


def test_both_slots_torn_is_reported_as_torn_not_a_format_violation(tmp_path: Path) -> None:
    header, older, live = _slots(golden_reclaim_file())
    path = _install(
        tmp_path, _file(header, older[:-9] + b"\x01" + older[-8:], live[:50] + b"\xee" + live[51:])
    )
    with pytest.raises(CorruptionError, match="both slots fail their checksum") as info:
        ReclaimFile.load(OsFs(), tmp_path)
    assert info.value.path == path and "stored 0x" in str(info.value)


def test_both_slots_violating_the_format_is_reported_as_such(tmp_path: Path) -> None:
    header, older, live = _slots(golden_reclaim_file())
    bad = [_reseal(bytearray(s)) for s in (older, live)]
    for s in bad:
        s[18] = 9
    _install(tmp_path, _file(header, *(bytes(_reseal(s)) for s in bad)))
    with pytest.raises(CorruptionError, match="both slots violate the format"):
        ReclaimFile.load(OsFs(), tmp_path)


def _header(**fields: int) -> bytes:
    values = {"version": 1, "reserved": 0, "slot_len": SLOT_LEN, "t": 4, "u": 2} | fields
    head = b"OWRC" + struct.pack(
        "<HHQII",
        values["version"],
        values["reserved"],
        values["slot_len"],
        values["t"],
        values["u"],
    )
    return head + struct.pack("<II", crc32c.crc32c(head), 0)


HEADER_CORRUPTIONS = [
    pytest.param(lambda h: b"OWCK" + h[4:], 0, "bad magic", id="bad_magic"),
    pytest.param(lambda h: _header(version=2), 4, "unknown version 2", id="version_2"),
    pytest.param(lambda h: _header(version=0), 4, "unknown version 0", id="version_0"),
    pytest.param(lambda h: h[:24] + b"\0\0\0\0" + h[28:], 24, "checksum", id="header_crc"),
    pytest.param(lambda h: h[:10] + b"\x01" + h[11:], 24, "checksum", id="header_bit_flip"),
    pytest.param(lambda h: _header(reserved=1), 6, "reserved", id="reserved_6"),
    pytest.param(lambda h: h[:31] + b"\x01", 28, "reserved", id="reserved_31"),
    pytest.param(lambda h: _header(t=0), 16, "max_tenants 0", id="no_tenants"),
    pytest.param(lambda h: _header(t=65_537), 16, "max_tenants 65537", id="tenants_over_u16"),
    pytest.param(lambda h: _header(u=0), 20, "max_unlinks_per_pass 0", id="no_unlinks"),
    pytest.param(lambda h: _header(slot_len=SLOT_LEN + 8), 8, "slot_len 1000", id="slot_len"),
    pytest.param(lambda h: _header(t=5), 8, "disagrees", id="capacity_vs_slot_len"),
]


@pytest.mark.parametrize(("corrupt", "offset", "words"), HEADER_CORRUPTIONS)
def test_bad_file_header_fails_naming_the_file_and_offset(
    tmp_path: Path, corrupt: Callable[[bytes], bytes], offset: int, words: str
) -> None:
    header, older, live = _slots(golden_reclaim_file())
    assert _header() == header
    path = _install(tmp_path, _file(corrupt(header), older, live))
    with pytest.raises(CorruptionError, match=words) as info:
        ReclaimFile.load(OsFs(), tmp_path)
    assert (info.value.path, info.value.offset) == (path, offset)


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(0, id="empty"),
        pytest.param(20, id="shorter_than_header"),
        pytest.param(2015, id="one_byte_short"),
        pytest.param(2017, id="one_byte_long"),
    ],
)
def test_wrong_file_size_fails_naming_the_file(tmp_path: Path, size: int) -> None:
    raw = golden_reclaim_file()
    path = _install(tmp_path, (raw + b"\0")[:size])
    with pytest.raises(CorruptionError, match=r"\d+ bytes") as info:
        ReclaimFile.load(OsFs(), tmp_path)
    assert info.value.path == path


# -- slot choice -----------------------------------------------------------------------


def test_torn_live_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    header, older, live = _slots(golden_reclaim_file())
    _install(tmp_path, _file(header, older, live[:500] + b"\x5a" + live[501:]))
    f, record = _load(tmp_path)
    with f:
        assert record == golden_older_record()
        assert f.rejected is not None and f.rejected.defect is SlotDefect.TORN
        assert "checksum mismatch" in f.rejected.reason


@pytest.mark.parametrize(
    ("gens", "winner"),
    [
        pytest.param((9, 4), 0, id="slot0_newer"),
        pytest.param((4, 9), 1, id="slot1_newer"),
        pytest.param((0, 1), 1, id="from_zero"),
        pytest.param(((1 << 64) - 1, 5), 0, id="u64_max"),
    ],
)
def test_higher_valid_generation_wins(tmp_path: Path, gens: tuple[int, int], winner: int) -> None:
    records = [golden_older_record(), golden_live_record()]
    for record, gen in zip(records, gens, strict=True):
        record.generation = gen
    _install(
        tmp_path, _file(encode_file_header(GEOMETRY), *(encode_slot(r, GEOMETRY) for r in records))
    )
    f, record = _load(tmp_path)
    with f:
        assert (f.live_index, f.generation, f.rejected) == (winner, gens[winner], None)
        assert record == records[winner]


def test_equal_generations_are_refused(tmp_path: Path) -> None:
    a, b = golden_older_record(), golden_live_record()
    a.generation = b.generation = 3
    _install(
        tmp_path,
        _file(encode_file_header(GEOMETRY), encode_slot(a, GEOMETRY), encode_slot(b, GEOMETRY)),
    )
    with pytest.raises(CorruptionError, match="same generation 3"):
        ReclaimFile.load(OsFs(), tmp_path)


def test_absent_file_loads_as_none(tmp_path: Path) -> None:
    assert ReclaimFile.load(OsFs(), tmp_path) is None


# -- create and write ------------------------------------------------------------------


def test_create_is_durable_and_the_second_slot_reads_as_never_written(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    record = golden_live_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, record)
    f.close()
    assert record.generation == 1
    fs.apply_crash()  # a power loss right after create keeps the file
    loaded, back = _load(root, fs)
    with loaded:
        assert back == record
        assert loaded.rejected is not None and loaded.rejected.defect is SlotDefect.EMPTY
    assert sorted(os.listdir(root)) == ["RECLAIM"]
    with pytest.raises(FileExistsError):
        ReclaimFile.create(fs, root, GEOMETRY, ReclaimRecord())


def test_rfc0052_17_create_on_a_full_volume_fails_at_open(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    fs.fail("fallocate", errno=errno.ENOSPC)
    with pytest.raises(OSError) as info:
        ReclaimFile.create(fs, root, Geometry(1024, 128), ReclaimRecord())
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(root) == []  # the temp is removed, RECLAIM never appeared
    assert ReclaimFile.load(fs, root) is None


def test_rfc0052_17_write_alternates_slots_and_never_allocates(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    record = golden_older_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, record)
    size = (root / "RECLAIM").stat().st_size
    start = len(fs.log)
    seen = []
    for i in range(4):
        record.entries.clear()
        record.dictionary[0].tenant = f"acme-{i}"
        f.write(record)
        seen.append((f.live_index, f.generation, record.generation))
        assert (root / "RECLAIM").stat().st_size == size == GEOMETRY.file_size
    assert seen == [(1, 2, 2), (0, 3, 3), (1, 4, 4), (0, 5, 5)]
    assert fs.log[start:] == [("pwrite", root / "RECLAIM"), ("fsync", root / "RECLAIM")] * 4
    f.close()
    loaded, back = _load(root, fs)
    with loaded:
        assert back == record and loaded.live_index == 0 and loaded.rejected is None


@pytest.mark.parametrize(
    ("op", "count"),
    [
        pytest.param("pwrite", 1, id="pwrite"),
        pytest.param("fsync", 1, id="fsync"),
        pytest.param("fsync", None, id="fsync_always"),
    ],
)
def test_rfc0052_17_failed_write_leaves_the_previous_record_live(
    tmp_path: Path, op: str, count: int | None
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    previous = golden_older_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, previous)
    f.write(previous)  # generation 2 in slot 1
    attempt = golden_live_record()
    attempt.generation = 41
    fs.fail(op, "RECLAIM", count=count)
    with pytest.raises(OSError):
        f.write(attempt)
    assert (f.live_index, f.generation, attempt.generation) == (1, 2, 41)
    fs.clear_faults()
    loaded, back = _load(root, fs)
    with loaded:
        assert back == previous and loaded.generation == 2
    # The writer goes on from where it was: the same inactive slot, live + 1.
    f.write(attempt)
    assert (f.live_index, f.generation, attempt.generation) == (0, 3, 3)
    f.close()
    loaded, back = _load(root, fs)
    with loaded:
        assert back == attempt


@pytest.mark.parametrize(
    "power_loss", [pytest.param(True, id="power_loss"), pytest.param(False, id="sigkill")]
)
@pytest.mark.parametrize(
    "torn_bytes",
    [
        pytest.param(0, id="nothing"),
        pytest.param(1, id="one_byte"),
        pytest.param(500, id="half"),
        pytest.param(SLOT_LEN - 8, id="all_but_trailer"),
        pytest.param(SLOT_LEN - 6, id="half_crc"),
    ],
)
def test_rfc0052_17_crash_inside_the_slot_write_keeps_the_previous_slot(
    tmp_path: Path, torn_bytes: int, power_loss: bool
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    previous = golden_older_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, previous)
    f.write(previous)
    f.write(previous)  # both slots hold a valid generation: 3 live in slot 0, 2 in slot 1
    fs.crash_at("pwrite", "RECLAIM", torn_bytes=torn_bytes)
    with pytest.raises(SimulatedCrash):
        f.write(golden_live_record())
    fs.apply_crash(power_loss=power_loss)
    loaded, back = _load(root, fs)
    with loaded:
        assert back == previous and (loaded.live_index, loaded.generation) == (0, 3)


@pytest.mark.parametrize(
    "power_loss", [pytest.param(True, id="power_loss"), pytest.param(False, id="sigkill")]
)
def test_rfc0052_17_crash_between_the_write_and_its_fsync(tmp_path: Path, power_loss: bool) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    root.mkdir()
    previous = golden_older_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, previous)
    fs.crash_at("fsync", "RECLAIM")
    with pytest.raises(SimulatedCrash):
        f.write(golden_live_record())
    fs.apply_crash(power_loss=power_loss)
    loaded, back = _load(root, fs)
    with loaded:
        if power_loss:  # the unsynced overwrite is undone: the previous slot is live
            assert back == previous and loaded.generation == 1
        else:  # the kernel kept the complete write: either answer is a whole record
            assert back == _gen(2)


# -- rebuild ---------------------------------------------------------------------------

BIGGER = Geometry(max_tenants=7, max_unlinks=3)


def _built(fs: FaultyFs, tmp_path: Path) -> tuple[Path, ReclaimFile, ReclaimRecord]:
    root = tmp_path / "wal"
    root.mkdir()
    record = golden_live_record()
    f = ReclaimFile.create(fs, root, GEOMETRY, record)
    f.write(record)  # generation 2, slot 1
    return root, f, record


def test_rfc0055_2_rebuild_keeps_every_id_entry_and_planned_record(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root, f, record = _built(fs, tmp_path)
    (root / ReclaimFile.NEW_NAME).write_bytes(b"leftover" * 100_000)  # truncated, not read
    g = f.geometry.grown_to(BIGGER)
    bigger = f.rebuild(g, record)
    assert f.closed
    assert (bigger.geometry, bigger.live_index, bigger.generation) == (BIGGER, 0, 2)
    assert sorted(os.listdir(root)) == ["RECLAIM"]
    assert (root / "RECLAIM").stat().st_size == BIGGER.file_size
    bigger.close()
    loaded, back = _load(root, fs)
    assert back == record == _gen(2)
    assert loaded.rejected is not None and loaded.rejected.defect is SlotDefect.EMPTY
    # the wider geometry holds what the old one could not
    back.assign_slot("fifth", BIGGER.max_tenants)
    back.planned.extend(
        [PlannedUnlink(SEGMENT_A, {3: WalOffset(SEGMENT_A, 7)}), PlannedUnlink(uuid.uuid4())]
    )
    loaded.write(back)
    loaded.close()
    again, final = _load(root, fs)
    with again:
        assert final == back and final.slot_of("fifth") == 3 and again.live_index == 1


def _gen(n: int) -> ReclaimRecord:
    return _with(lambda r: setattr(r, "generation", n))


def test_rebuild_never_shrinks(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    _, f, record = _built(fs, tmp_path)
    with f, pytest.raises(ValueError, match="never shrinks"):
        f.rebuild(Geometry(8, 1), record)


def test_failed_rebuild_before_the_rename_leaves_the_old_file_usable(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root, f, record = _built(fs, tmp_path)
    fs.fail("fallocate", "RECLAIM.new", errno=errno.ENOSPC)
    with pytest.raises(OSError, match="ENOSPC"):
        f.rebuild(BIGGER, record)
    assert sorted(os.listdir(root)) == ["RECLAIM"]
    f.write(record)
    f.close()
    loaded, back = _load(root, fs)
    with loaded:
        assert loaded.geometry == GEOMETRY and back == record and back.generation == 3


REBUILD_STEPS = [
    pytest.param("open", "RECLAIM.new", 1, False, id="open_new"),
    pytest.param("fallocate", "RECLAIM.new", 1, False, id="fallocate_new"),
    pytest.param("pwrite", "RECLAIM.new", 1, False, id="write_header"),
    pytest.param("pwrite", "RECLAIM.new", 2, False, id="write_slot0"),
    pytest.param("pwrite", "RECLAIM.new", 3, False, id="write_slot1"),
    pytest.param("fsync", "RECLAIM.new", 1, False, id="fsync_new"),
    pytest.param("rename", "RECLAIM", 1, False, id="rename"),
    pytest.param("fsync_dir", None, 1, False, id="parent_fsync"),
    pytest.param("open", "RECLAIM", 1, True, id="reopen"),
]


@pytest.mark.parametrize(
    "power_loss", [pytest.param(True, id="power_loss"), pytest.param(False, id="sigkill")]
)
@pytest.mark.parametrize(("op", "glob", "nth", "renamed_durably"), REBUILD_STEPS)
def test_rfc0055_2_crash_at_each_rebuild_step_leaves_a_complete_file(
    tmp_path: Path, op: str, glob: str | None, nth: int, renamed_durably: bool, power_loss: bool
) -> None:
    fs = faulty(tmp_path)
    root, f, record = _built(fs, tmp_path)
    expected = record.copy()
    fs.crash_at(op, glob, nth=nth)
    with pytest.raises(SimulatedCrash):
        f.rebuild(BIGGER, record)
    fs.apply_crash(power_loss=power_loss)
    loaded, back = _load(root, fs)
    with loaded:
        assert back == expected
        renamed = renamed_durably or (not power_loss and op in ("fsync_dir",))
        assert loaded.geometry == (BIGGER if renamed else GEOMETRY)
        assert (root / "RECLAIM").stat().st_size == loaded.geometry.file_size

"""``wal.slots``: the bytes around a two-slot file's slots — the header, the trailer, the
choice of the live slot, and the diff a write makes. The files built on it (RECLAIM,
PUBLISHED) are tested in ``test_reclaim_file.py``, ``test_published_file.py`` and
``test_two_slot_file.py``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from wal.errors import CorruptionError
from wal.slots import (
    FILE_HEADER_SIZE,
    TRAILER_SIZE,
    FileHeader,
    InvalidSlot,
    SlotDefect,
    check_trailer,
    dirty_runs,
    file_size,
    seal_slot,
    select_live,
    slot_offset,
    temp_path,
)

PATH = Path("/wal/RECLAIM")
SLOT = 64


def slot(generation: int) -> bytes:
    buf = bytearray(SLOT)
    struct.pack_into("<Q", buf, 0, generation)
    seal_slot(buf)
    return bytes(buf)


def decode(data: bytes, index: int) -> int:
    check_trailer(data, PATH, index, SLOT)
    return int(struct.unpack_from("<Q", data)[0])


def test_geometry() -> None:
    assert (slot_offset(0, SLOT), slot_offset(1, SLOT)) == (32, 32 + SLOT)
    assert file_size(SLOT) == 32 + 2 * SLOT
    with pytest.raises(ValueError, match="got 2"):
        slot_offset(2, SLOT)
    assert temp_path(PATH) == Path("/wal/RECLAIM.new")


def test_the_header_round_trips_and_names_each_defect_by_offset() -> None:
    header = FileHeader(b"OWRC", 1, SLOT, (1024, 64))
    data = header.encode()
    assert len(data) == FILE_HEADER_SIZE
    assert FileHeader.decode(data, PATH, magic=b"OWRC", version=1) == header
    cases = [
        (data[:10], 0, "shorter than its 32-byte header"),
        (data, 0, "bad magic"),  # read as another format
        (data, 4, "unknown version 1"),
        (data[:17] + b"\xff" + data[18:], 24, "checksum mismatch"),
        (data[:28] + b"\x01\x00\x00\x00", 28, "non-zero reserved"),
    ]
    for raw, offset, reason in cases:
        magic = b"OWPB" if reason == "bad magic" else b"OWRC"
        version = 2 if reason.startswith("unknown version") else 1
        with pytest.raises(CorruptionError, match=reason) as info:
            FileHeader.decode(raw, PATH, magic=magic, version=version)
        assert info.value.path == PATH and info.value.offset == offset


def test_a_sealed_slot_passes_and_a_damaged_one_is_torn_at_its_trailer() -> None:
    good = slot(5)
    check_trailer(good, PATH, 1, SLOT)
    bad = bytearray(good)
    bad[3] ^= 0x01
    with pytest.raises(InvalidSlot) as info:
        check_trailer(bytes(bad), PATH, 1, SLOT)
    assert info.value.defect is SlotDefect.TORN
    assert info.value.offset == slot_offset(1, SLOT) + SLOT - TRAILER_SIZE
    with pytest.raises(InvalidSlot) as empty:
        check_trailer(bytes(SLOT), PATH, 0, SLOT)
    assert empty.value.defect is SlotDefect.EMPTY  # never written, not damage
    with pytest.raises(InvalidSlot, match="expected 64"):
        check_trailer(good[:-1], PATH, 0, SLOT)


def test_the_live_slot_is_the_valid_one_with_the_greater_generation() -> None:
    live = select_live(PATH, [slot(3), slot(4)], decode, lambda g: g)
    assert (live.index, live.generation, live.rejected) == (1, 4, None)
    assert select_live(PATH, [slot(9), slot(4)], decode, lambda g: g).index == 0
    torn = bytearray(slot(9))
    torn[0] ^= 0xFF
    live = select_live(PATH, [bytes(torn), slot(4)], decode, lambda g: g)
    assert live.index == 1 and live.rejected is not None
    assert live.rejected.defect is SlotDefect.TORN


def test_no_live_slot_is_corruption_naming_the_file() -> None:
    with pytest.raises(CorruptionError, match="both slots fail their checksum") as info:
        select_live(PATH, [bytes(SLOT), b"\x01" * SLOT], decode, lambda g: g)
    assert info.value.path == PATH
    with pytest.raises(CorruptionError, match="same generation 7"):
        select_live(PATH, [slot(7), slot(7)], decode, lambda g: g)


def test_dirty_runs_are_chunk_aligned_and_coalesced() -> None:
    old = bytes(64 * 1024)
    new = bytearray(old)
    assert dirty_runs(bytes(new), old, chunk=4096) == []
    new[10] = 1
    new[4096 + 5] = 1  # the next chunk: one run with the first
    new[40_000] = 1
    assert dirty_runs(bytes(new), old, chunk=4096) == [(0, 8192), (36864, 40960)]
    tail = bytearray(old[:5000])
    tail[4999] = 1
    assert dirty_runs(bytes(tail), old[:5000], chunk=4096) == [(4096, 5000)]

"""HIGHWATER's format (issue 22 item 5, ``wal/highwater_file.py``): golden bytes, the
codec's refusals, and the two-slot choice after a torn write."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.wal.golden import DATA
from tests.unit.wal.golden_highwater import (
    golden_highwater_file,
    golden_live_record,
    golden_older_record,
)
from wal import CorruptionError, OsFs
from wal.highwater_file import (
    FILE_BYTES,
    NAME,
    SLOT_LEN,
    HighWaterFile,
    HighWaterRecord,
    decode_slot,
    encode_slot,
)
from wal.slots import FILE_HEADER_SIZE, InvalidSlot, SlotDefect, seal_slot
from wal.two_slot_file import UnencodableRecord

SEG = uuid.UUID("01890f3e-5000-7111-9222-333344445555")


def test_golden_highwater_bytes_are_stable() -> None:
    raw = (DATA / "highwater_v1.bin").read_bytes()
    assert golden_highwater_file() == raw
    assert len(raw) == FILE_BYTES == 32 + 2 * 56


def test_golden_file_reads_back_its_live_slot(tmp_path: Path) -> None:
    (tmp_path / NAME).write_bytes((DATA / "highwater_v1.bin").read_bytes())
    loaded = HighWaterFile.read_only(OsFs(), tmp_path)
    assert loaded is not None and loaded[1] == golden_live_record()
    older = decode_slot(
        golden_highwater_file()[FILE_HEADER_SIZE : FILE_HEADER_SIZE + SLOT_LEN],
        1,
        tmp_path / NAME,
        0,
    )
    assert older == golden_older_record()


def test_nothing_recorded_round_trips() -> None:
    empty = HighWaterRecord(3)
    assert decode_slot(encode_slot(empty, 1), 1, Path("HIGHWATER"), 0) == empty


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(HighWaterRecord(1, None, 0, 5), id="lsn_without_segment"),
        pytest.param(HighWaterRecord(1, SEG, 100, 99), id="below_base"),
        pytest.param(HighWaterRecord(1 << 64, SEG, 0, 1), id="generation_overflow"),
    ],
)
def test_a_record_the_format_cannot_say_is_refused_before_writing(
    record: HighWaterRecord,
) -> None:
    with pytest.raises(UnencodableRecord):
        encode_slot(record, 1)


def _resealed(edit: Callable[[bytearray], None]) -> bytes:
    slot = bytearray(encode_slot(HighWaterRecord(2, SEG, 100, 200), 1))
    edit(slot)
    seal_slot(slot)
    return bytes(slot)


def _at(offset: int, data: bytes) -> Callable[[bytearray], None]:
    def apply(slot: bytearray) -> None:
        slot[offset : offset + len(data)] = data

    return apply


@pytest.mark.parametrize(
    "edit, reason",
    [
        pytest.param(_at(40, b"\x01"), "reserved", id="reserved"),
        pytest.param(_at(8, uuid.uuid4().bytes), "UUIDv7", id="not_uuid7"),
        pytest.param(_at(32, (50).to_bytes(8, "little")), "below the segment", id="below_base"),
        pytest.param(_at(8, bytes(16)), "no segment named", id="base_without_segment"),
    ],
)
def test_a_slot_that_breaks_the_format_is_invalid(
    edit: Callable[[bytearray], None], reason: str
) -> None:
    with pytest.raises(InvalidSlot, match=reason) as caught:
        decode_slot(_resealed(edit), 1, Path("HIGHWATER"), 1)
    assert caught.value.defect is SlotDefect.FORMAT


def test_a_torn_live_slot_falls_back_to_the_other_and_both_torn_refuses(tmp_path: Path) -> None:
    fs = OsFs()
    file = HighWaterFile.create(fs, tmp_path, 1, HighWaterRecord())
    first = HighWaterRecord(0, SEG, 100, 150)
    file.write(first)  # slot 1, generation 2
    file.write(HighWaterRecord(0, SEG, 100, 250))  # slot 0, generation 3
    file.close()
    raw = bytearray((tmp_path / NAME).read_bytes())
    raw[FILE_HEADER_SIZE + 30] ^= 1  # slot 0 torn
    (tmp_path / NAME).write_bytes(bytes(raw))
    loaded = HighWaterFile.read_only(fs, tmp_path)
    assert loaded is not None and loaded[1].lsn == 150
    raw[FILE_HEADER_SIZE + SLOT_LEN + 30] ^= 1  # and slot 1
    (tmp_path / NAME).write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match=NAME):
        HighWaterFile.read_only(fs, tmp_path)

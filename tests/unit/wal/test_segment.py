"""Segment header: golden bytes, naming, and every refusal naming the file and offset."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from tests.unit.wal.golden import DATA, SEGMENT_UUID, golden_header
from wal import CorruptionError
from wal.segment import (
    HEADER_SIZE,
    PARTIAL_RE,
    SEGMENT_RE,
    SegmentHeader,
    segment_name,
    uuid7,
    uuid7_time,
)

P = Path("/wal/00000000000000123456.wal")


def test_golden_header_bytes_are_stable() -> None:
    assert golden_header().encode() == (DATA / "segment_header_v3.bin").read_bytes()
    decoded = SegmentHeader.decode((DATA / "segment_header_v3.bin").read_bytes(), P)
    assert decoded == golden_header()
    assert decoded.predecessor_sealed and decoded.has_predecessor
    assert decoded.prev_base_lsn == 100_000 and decoded.prev_high_water == 120_000


def test_a_version_2_header_is_refused_by_its_version() -> None:
    """Version 2 (48 bytes, no high-water) was never deployed: it is refused as an
    unknown version, naming it, whether read alone or followed by frame bytes."""
    v2 = (DATA / "segment_header_v2_refused.bin").read_bytes()
    assert len(v2) == 48 and v2[4:6] == b"\x02\x00"
    for data in (v2, v2 + b"\x00" * 64):
        with pytest.raises(CorruptionError) as info:
            SegmentHeader.decode(data, P)
        assert info.value.offset == 4 and "unknown segment version 2" in str(info.value)


def test_names_sort_in_log_order() -> None:
    bases = [0, 9, 10, 65_536, 10**12]
    names = [segment_name(b) for b in bases]
    assert sorted(names) == names
    assert all(SEGMENT_RE.match(n) for n in names)
    assert segment_name(123) == "00000000000000000123.wal"


def test_partial_shape_is_exact() -> None:
    u = uuid7(1.7e9)
    assert PARTIAL_RE.match(f"{u}.wal.partial")
    for other in ("foo.wal.partial", f"{u}.wal.partial.tmp", f"{u}.wal", "CHECKPOINT.tmp"):
        assert not PARTIAL_RE.match(other)


def test_uuid7_carries_the_clock() -> None:
    u = uuid7(1_700_000_000.25)
    assert u.version == 7 and uuid7_time(u) == 1_700_000_000.25


def _recrc(b: bytes) -> bytes:
    return b[:48] + struct.pack("<I", crc32c.crc32c(b[:48])) + b[52:]


def _set(b: bytes, at: int, value: bytes, fix_crc: bool = True) -> bytes:
    out = b[:at] + value + b[at + len(value) :]
    return _recrc(out) if fix_crc else out


GOOD = golden_header().encode()
NOT_V7 = uuid.UUID("01890f3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f")


@pytest.mark.parametrize(
    ("corrupt", "offset", "words"),
    [
        pytest.param(lambda b: b[:20], 0, "expected 56", id="short"),
        pytest.param(lambda b: _set(b, 0, b"XXXX"), 0, "magic", id="bad_magic"),
        pytest.param(
            lambda b: _set(b, 8, b"\x01", fix_crc=False), 48, "checksum", id="bad_checksum"
        ),
        pytest.param(lambda b: _set(b, 4, b"\x04\x00"), 4, "version 4", id="unknown_version"),
        pytest.param(lambda b: _set(b, 6, b"\x04\x00"), 6, "flags", id="unknown_flag"),
        pytest.param(lambda b: b[:52] + b"\x01\x00\x00\x00", 52, "reserved", id="reserved_nonzero"),
        pytest.param(lambda b: _set(b, 16, NOT_V7.bytes), 16, "UUIDv7", id="not_uuid7"),
        pytest.param(
            lambda b: _set(b, 40, struct.pack("<Q", 99_999)), 40, "outside", id="high_water_low"
        ),
        pytest.param(
            lambda b: _set(b, 40, struct.pack("<Q", 123_457)), 40, "outside", id="high_water_high"
        ),
        pytest.param(
            lambda b: _set(b, 6, b"\x01\x00"), 40, "clean rotation", id="clean_below_base"
        ),
        pytest.param(
            lambda b: _set(b, 6, b"\x00\x00"), 32, "without a predecessor", id="orphan_fields"
        ),
    ],
)
def test_header_refusals_name_file_and_offset(
    corrupt: Callable[[bytes], bytes], offset: int, words: str
) -> None:
    with pytest.raises(CorruptionError) as info:
        SegmentHeader.decode(corrupt(GOOD), P)
    assert info.value.path == P and info.value.offset == offset
    assert words in str(info.value) and str(P) in str(info.value)


def test_header_size() -> None:
    assert HEADER_SIZE == 56 and len(SegmentHeader(0, SEGMENT_UUID).encode()) == 56

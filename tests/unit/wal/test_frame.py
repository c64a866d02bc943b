"""Frame codec: layout, CRC, the 128-byte tenant bound on encode and decode."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tenants import INVALID_TENANTS
from tests.unit.wal.golden import DATA, golden_frame
from wal import CorruptionError, FrameTooLarge
from wal.errors import InvalidTenant
from wal.frame import PREFIX_SIZE, encode_frame, scan_frames, validate_tenant
from wal.types import FrameKind

P = Path("seg.wal")


def test_golden_frame_bytes_are_stable() -> None:
    assert golden_frame() == (DATA / "frame_tenant_batch.bin").read_bytes()


def test_frame_layout_is_len_crc_kind_tenant_payload() -> None:
    raw = encode_frame(FrameKind.TENANT_BATCH, b"t1", b"payload", max_payload=100)
    body_len, crc = struct.unpack_from("<II", raw)
    body = raw[PREFIX_SIZE:]
    assert body_len == len(body) == 2 + 2 + 7
    assert crc == crc32c.crc32c(body)
    assert body[0] == FrameKind.TENANT_BATCH and body[1] == 2
    assert body[2:4] == b"t1" and body[4:] == b"payload"


@pytest.mark.parametrize(
    "tenant",
    ["a", "x" * 128, "!$%&'()*+,-.;<=>?@[\\]^_`{|}~", "Tenant-01"],
)
def test_valid_tenants(tenant: str) -> None:
    assert validate_tenant(tenant) == tenant.encode()


@pytest.mark.parametrize("tenant", INVALID_TENANTS)
def test_invalid_tenants_are_refused_on_encode(tenant: str) -> None:
    with pytest.raises(InvalidTenant):
        validate_tenant(tenant)


def test_oversize_payload_is_refused_before_anything_is_written() -> None:
    with pytest.raises(FrameTooLarge) as info:
        encode_frame(FrameKind.TENANT_BATCH, b"t", b"x" * 101, max_payload=100)
    assert info.value.limit == 100 and info.value.size == 101


def _stream(n: int) -> bytes:
    return b"".join(
        encode_frame(FrameKind.TENANT_BATCH, b"t", f"p{i}".encode() * i, max_payload=1 << 16)
        for i in range(n)
    )


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(lambda b: b[:-3], "runs past", id="truncated_payload"),
        pytest.param(lambda b: b + b"\x01\x02", "shorter than a frame prefix", id="short_prefix"),
        pytest.param(lambda b: _flip(b, len(b) - 1), "checksum", id="bad_checksum"),
        pytest.param(lambda b: b + b"\x00" * 12, "out of range", id="zeroed_tail"),
    ],
)
def test_damage_stops_the_scan_and_is_reported(damage: object, reason: str) -> None:
    good = _stream(5)
    buf = damage(good)  # type: ignore[operator]
    frames, stop = scan_frames(buf, 0, path=P)
    assert stop.damaged and reason in stop.reason
    assert len(frames) in (4, 5)
    assert stop.valid_end == frames[-1].end


def test_clean_stream_scans_completely() -> None:
    good = _stream(7)
    frames, stop = scan_frames(good, 0, path=P)
    assert len(frames) == 7 and not stop.damaged and stop.valid_end == len(good)


def test_decoded_tenant_over_128_bytes_fails_naming_offset_and_length() -> None:
    """RFC0052.17: an overlong replayed tenant fails open; never truncated or dropped."""
    first = encode_frame(FrameKind.TENANT_BATCH, b"ok", b"x", max_payload=10)
    head = bytes([FrameKind.TENANT_BATCH, 200]) + b"t" * 200 + b"payload"
    bad = struct.pack("<II", len(head), crc32c.crc32c(head)) + head
    with pytest.raises(CorruptionError) as info:
        scan_frames(first + bad, 0, path=P, file_offset=48)
    assert info.value.offset == 48 + len(first)
    assert "200 bytes" in str(info.value) and str(PREFIX_SIZE + len(head)) in str(info.value)


def test_decoded_tenant_breaking_the_grammar_is_corruption() -> None:
    head = bytes([FrameKind.TENANT_BATCH, 3]) + b"a/b" + b"payload"
    bad = struct.pack("<II", len(head), crc32c.crc32c(head)) + head
    with pytest.raises(CorruptionError, match="invalid tenant"):
        scan_frames(bad, 0, path=P)


@settings(max_examples=200, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.text(
                alphabet=st.characters(
                    min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":#/"
                ),
                min_size=1,
                max_size=128,
            ),
            st.binary(max_size=300),
        ),
        max_size=20,
    )
)
def test_round_trip(frames: list[tuple[str, bytes]]) -> None:
    buf = b"".join(
        encode_frame(FrameKind.TENANT_BATCH, validate_tenant(t), p, max_payload=1000)
        for t, p in frames
    )
    got, stop = scan_frames(buf, 0, path=P)
    assert not stop.damaged
    assert [(f.tenant, buf[f.payload_start : f.end]) for f in got] == frames

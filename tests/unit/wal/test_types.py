"""``wal.types``: offsets encode as documented and order by LSN alone; a frame's span
gives back its mark; a cursor after a mark starts at it."""

from __future__ import annotations

import struct
import uuid

from wal.types import (
    OFFSET_SIZE,
    Frame,
    FrameCursor,
    FrameKind,
    FrameSpan,
    PublishedMarks,
    WalOffset,
)

SEG = uuid.UUID("12345678-1234-5678-1234-567812345678")
OTHER = uuid.UUID("87654321-4321-8765-4321-876543218765")


def test_an_offset_encodes_as_uuid_bytes_then_lsn_u64_le() -> None:
    off = WalOffset(SEG, 0x0102030405060708)
    data = off.encode()
    assert len(data) == OFFSET_SIZE == 24
    assert data[:16] == SEG.bytes
    assert data[16:] == struct.pack("<Q", 0x0102030405060708)
    assert data[16] == 0x08  # little-endian
    assert WalOffset.decode(data) == off
    assert WalOffset.decode(memoryview(data)) == off


def test_offsets_order_by_lsn_whatever_the_segment() -> None:
    low, high = WalOffset(OTHER, 10), WalOffset(SEG, 20)
    assert low < high and low <= high and high > low and high >= low
    assert not (high < low)
    assert WalOffset(SEG, 10) <= WalOffset(OTHER, 10) <= WalOffset(SEG, 10)
    assert WalOffset(SEG, 10) != WalOffset(OTHER, 10)  # equality is the whole position
    assert str(low) == f"10@{OTHER}"


def test_a_frames_span_gives_back_its_mark_and_size() -> None:
    frame = Frame(FrameKind.TENANT_BATCH, "t", b"payload", 100, WalOffset(SEG, 130))
    assert frame.size == 30
    span = FrameSpan.of(frame)
    assert span == FrameSpan(SEG, 100, 30)
    assert span.end == 130 and span.offset == frame.offset


def test_a_cursor_after_a_mark_starts_at_it() -> None:
    assert FrameCursor.after(WalOffset(SEG, 130)) == FrameCursor(SEG, 130)


def test_published_marks_are_publishing_only_with_an_intent() -> None:
    assert not PublishedMarks().publishing
    assert not PublishedMarks(records=WalOffset(SEG, 5), audit=WalOffset(SEG, 5)).publishing
    assert PublishedMarks(intent=WalOffset(SEG, 9)).publishing

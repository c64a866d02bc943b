"""Reading the log back (``wal/reading.py``): the bounded per-tenant reads settlement
uses (``Journal.read_frames_from``, ``Journal.oldest_frame``; RFC 0055 §9.5). Replay's
checks against the synced high-water are tested in ``test_high_water.py``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, payload
from wal import FrameCursor, FrameSpan, Journal, WalError, WalOffset


def _spread(j: Journal) -> dict[str, list[FrameSpan]]:
    """Frames of A and B interleaved across several segments; each tenant's spans."""
    spans: dict[str, list[FrameSpan]] = {"A": [], "B": []}
    for i in range(150):
        tenant = "A" if i % 3 else "B"
        data = payload(i, 1000)
        end = j.commit(tenant, data).offset
        size = 8 + 2 + len(tenant) + len(data)  # the frame's prefix, kind, tenant, payload
        spans[tenant].append(FrameSpan(end.segment, end.lsn - size, size))
    return spans


def test_rfc0055_9_5_read_frames_from_returns_the_range_in_bounded_calls(tmp_path: Path) -> None:
    """Started at ``after(from)``: the frame after ``from`` first, ``to`` last, only that
    tenant's frames; each call at most ``limit`` frames within one segment."""
    with Journal.open(tmp_path / "wal", SMALL) as j:
        spans = _spread(j)
        a = spans["A"]
        assert len({s.segment for s in a}) >= 3
        start, to = a[4], a[80]
        cursor: FrameCursor | None = FrameCursor.after(start.offset)
        got = []
        calls = 0
        while cursor is not None:
            frames, cursor = j.read_frames_from(cursor, to, "A", 7)
            calls += 1
            assert len(frames) <= 7 and len({f.offset.segment for f in frames}) <= 1
            got.extend(frames)
        assert [FrameSpan.of(f) for f in got] == a[5:81]
        assert all(f.tenant == "A" for f in got) and got[-1].offset == to.offset
        assert calls >= len(got) // 7
        first = j.oldest_frame("A")
        assert first is not None
        frames, _ = j.read_frames_from(first, to, "A", 1)
        assert [FrameSpan.of(f) for f in frames] == a[:1]  # the oldest surviving frame


def test_rfc0055_9_5_read_frames_from_releases_the_journal_between_calls(tmp_path: Path) -> None:
    """An append issued mid-replay lands between two calls (it would block forever if a
    call's hold outlived it)."""
    with Journal.open(tmp_path / "wal", SMALL) as j:
        spans = _spread(j)
        to = spans["A"][40]
        first = FrameCursor.after(spans["A"][0].offset)
        frames, cursor = j.read_frames_from(first, to, "A", 5)
        appended: list[WalOffset] = []
        writer = threading.Thread(
            target=lambda: appended.append(j.commit("B", payload(999, 300)).offset)
        )
        writer.start()
        writer.join(30)
        assert appended and not writer.is_alive()
        while cursor is not None:
            more, cursor = j.read_frames_from(cursor, to, "A", 5)
            frames.extend(more)
        assert [FrameSpan.of(f) for f in frames] == spans["A"][1:41]


def test_rfc0055_9_5_a_span_not_ending_on_a_frame_boundary_is_an_error(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "wal", SMALL) as j:
        spans = _spread(j)
        a, b = spans["A"], spans["B"]
        bad = FrameSpan(a[3].segment, a[3].start + 1, a[3].length)
        with pytest.raises(WalError, match="does not match the frame"):
            j.read_frames_from(FrameCursor.after(a[0].offset), bad, "A", 100)
        with pytest.raises(WalError, match="not a frame of tenant 'A'"):
            j.read_frames_from(FrameCursor.after(a[0].offset), b[2], "A", 100)

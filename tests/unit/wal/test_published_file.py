"""PUBLISHED (RFC 0055): golden layout, the codec's refusals, and the operator tools'
reading of it. The journal's side of it (``wal/frontiers.py``: the two write paths, the
id table shared with RECLAIM, geometry and the seeding flags) is tested in
``test_frontiers.py``; ``read_frames_from`` in ``test_reading.py``.

Every journal test reads the files back from disk (``PublishedFile.read_only``,
``ReclaimFile.read_only``) or restarts the journal, so the assertions are about bytes a
restart would find.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.walkit import payload
from tests.unit.wal.golden import DATA
from tests.unit.wal.golden_published import (
    MAX_TENANTS,
    golden_live_record,
    golden_older_record,
    golden_published_file,
)
from wal import (
    CorruptionError,
    Journal,
    OsFs,
    PublishedMarks,
    WalConfig,
)
from wal.published_file import (
    ENTRY_PUBLISHING,
    ENTRY_RECORDS_VALID,
    PublishedFile,
    decode_slot,
    published_file_bytes,
    published_slot_len,
)
from wal.slots import FILE_HEADER_SIZE, InvalidSlot, SlotDefect, seal_slot

CFG = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024, max_tenants=4)
SLOT_LEN = published_slot_len(MAX_TENANTS)
ENTRIES_AT = 24 + 132 * MAX_TENANTS


# -- golden bytes and the codec ---------------------------------------------------------


def test_golden_published_bytes_are_stable() -> None:
    raw = (DATA / "published_v1_t4.bin").read_bytes()
    assert golden_published_file() == raw
    assert len(raw) == published_file_bytes(MAX_TENANTS) == 32 + 2 * (24 + 188 * 4 + 8)


def test_golden_file_reads_back_its_live_slot(tmp_path: Path) -> None:
    (tmp_path / "PUBLISHED").write_bytes((DATA / "published_v1_t4.bin").read_bytes())
    loaded = PublishedFile.read_only(OsFs(), tmp_path)
    assert loaded is not None
    t, record = loaded
    assert t == MAX_TENANTS and record == golden_live_record()
    older = decode_slot(
        golden_published_file()[FILE_HEADER_SIZE : FILE_HEADER_SIZE + SLOT_LEN],
        MAX_TENANTS,
        tmp_path / "PUBLISHED",
        0,
    )
    assert older == golden_older_record()


def test_default_geometry_is_the_seeds_figure() -> None:
    assert published_slot_len(1024) == 192_544 and published_file_bytes(1024) == 385_120


def _corrupt(at: int, data: bytes) -> Callable[[bytearray], None]:
    def apply(slot: bytearray) -> None:
        slot[at : at + len(data)] = data

    return apply


CORRUPT_SLOTS = [
    pytest.param(_corrupt(16, b"\x01"), "reserved slot header", id="header_reserved"),
    pytest.param(
        _corrupt(ENTRIES_AT, struct.pack("<H", 1 << 4)), "unknown flags", id="entry_unknown_flag"
    ),
    pytest.param(_corrupt(ENTRIES_AT + 2, b"\x01"), "reserved bytes", id="entry_reserved"),
    pytest.param(
        _corrupt(ENTRIES_AT + 56 * 1, struct.pack("<H", ENTRY_RECORDS_VALID)),
        "tombstoned",
        id="entry_on_a_tombstone",
    ),
    pytest.param(
        _corrupt(ENTRIES_AT + 56 * 3 + 8, b"\x07"),
        "records_valid is clear",
        id="frontier_without_its_validity_bit",
    ),
    pytest.param(_corrupt(8, b"\x09"), "entry_count", id="entry_count_disagrees"),
    pytest.param(
        _corrupt(
            ENTRIES_AT + 56 * 2,
            struct.pack("<H", ENTRY_RECORDS_VALID | ENTRY_PUBLISHING) + bytes(30) + bytes(24),
        ),
        "publishing without the end of its span",
        id="intent_without_its_end",
    ),
]


@pytest.mark.parametrize(("corrupt", "reason"), CORRUPT_SLOTS)
def test_a_slot_breaking_the_format_is_invalid_and_the_other_slot_is_read(
    tmp_path: Path, corrupt: Callable[[bytearray], None], reason: str
) -> None:
    raw = bytearray(golden_published_file())
    live = bytearray(raw[FILE_HEADER_SIZE + SLOT_LEN :])
    corrupt(live)
    seal_slot(live)  # the checksum holds: only the format is broken
    with pytest.raises(InvalidSlot, match=reason) as info:
        decode_slot(bytes(live), MAX_TENANTS, tmp_path / "PUBLISHED", 1)
    assert info.value.defect is SlotDefect.FORMAT
    (tmp_path / "PUBLISHED").write_bytes(bytes(raw[: FILE_HEADER_SIZE + SLOT_LEN]) + bytes(live))
    loaded = PublishedFile.read_only(OsFs(), tmp_path)
    assert loaded is not None and loaded[1] == golden_older_record()


def test_both_slots_invalid_is_corruption_naming_the_file(tmp_path: Path) -> None:
    raw = bytearray(golden_published_file())
    raw[FILE_HEADER_SIZE + 10] ^= 0xFF
    raw[FILE_HEADER_SIZE + SLOT_LEN + 10] ^= 0xFF
    (tmp_path / "PUBLISHED").write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match="both slots fail their checksum") as info:
        PublishedFile.read_only(OsFs(), tmp_path)
    assert info.value.path == tmp_path / "PUBLISHED"


# -- the operator tools -------------------------------------------------------------


def test_the_operator_tools_read_the_frontiers_and_name_a_missing_published(
    tmp_path: Path,
) -> None:
    from wal.inspection import verify_root

    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        mark = j.commit("acme", payload(1, 200)).offset
        j.publish_marks({"acme": PublishedMarks(mark, None, terminal=True)})
        other = j.commit("globex", payload(2, 200)).offset
        j.publish_marks({"globex": PublishedMarks(None, None, intent=other)})
    report = verify_root(root)
    assert report.ok and report.published is not None
    assert report.published.frontiers == {
        "acme": (mark, None, "terminal"),
        "globex": (None, None, "publishing"),
    }
    assert report.published.intents == {"globex": other}
    (root / "PUBLISHED").unlink()
    missing = verify_root(root)
    assert [p.path.name for p in missing.problems] == ["PUBLISHED"]

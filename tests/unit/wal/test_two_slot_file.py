"""The two-slot record file RECLAIM and PUBLISHED are each a codec over
(``wal/two_slot_file.py``): what its lifecycle does alike for both formats, through both.

Each format's bytes, refusals and crash points are tested beside it (test_reclaim_file.py,
test_published_file.py). Here: a newer slot that this build cannot read refuses the open,
naming the file, the slot and the byte, and an older one does not.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support.walkit import payload
from wal import CorruptionError, Journal, OsFs, PublishedMarks, WalConfig
from wal.published_file import PublishedFile
from wal.reclaim_file import ReclaimFile
from wal.slots import FILE_HEADER_SIZE, seal_slot

CFG = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024, max_tenants=4)

#: (file class, offset in a slot, bytes that break the format there, the reason's words)
FORMATS = [
    pytest.param(ReclaimFile, 16, b"\x10\x00", "header_flags", id="RECLAIM_unknown_flag"),
    pytest.param(PublishedFile, 16, b"\x01", "reserved", id="PUBLISHED_reserved_byte"),
]


def _root(tmp_path: Path) -> tuple[Path, PublishedMarks]:
    """A root whose RECLAIM and PUBLISHED both hold two valid slots, so a broken one is
    the only reason either slot loses."""
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        mark = j.commit("acme", payload(1, 200)).offset
        j.checkpoint(mark, {"acme": PublishedMarks(mark, mark)})
    reclaim = ReclaimFile.load(OsFs(), root)
    assert reclaim is not None
    with reclaim[0] as file:
        file.write(reclaim[1])
    published = PublishedFile.load(OsFs(), root)
    assert published is not None
    with published[0] as pfile:
        pfile.write(published[1])
    return root, PublishedMarks(mark, mark)


def _break(path: Path, index: int, at: int, data: bytes) -> int:
    """Overwrite bytes of slot ``index`` and reseal it: the checksum holds, the format
    breaks. Returns the file offset of the broken bytes."""
    raw = bytearray(path.read_bytes())
    slot_len: int = struct.unpack_from("<Q", raw, 8)[0]
    start = FILE_HEADER_SIZE + index * slot_len
    slot = bytearray(raw[start : start + slot_len])
    slot[at : at + len(data)] = data
    seal_slot(slot)
    raw[start : start + slot_len] = slot
    path.write_bytes(bytes(raw))
    return start + at


def _live_index(cls: type[ReclaimFile] | type[PublishedFile], root: Path) -> int:
    loaded = cls.load(OsFs(), root)
    assert loaded is not None
    with loaded[0] as file:
        assert file.rejected is None  # both slots valid before the break
        return file.live_index


@pytest.mark.parametrize(("cls", "at", "data", "words"), FORMATS)
def test_a_newer_slot_breaking_the_format_refuses_the_open_naming_file_slot_and_byte(
    tmp_path: Path,
    cls: type[ReclaimFile] | type[PublishedFile],
    at: int,
    data: bytes,
    words: str,
) -> None:
    root, _ = _root(tmp_path)
    path = root / cls.NAME
    live = _live_index(cls, root)
    offset = _break(path, live, at, data)
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}

    loaded = cls.load(OsFs(), root)
    assert loaded is not None
    file = loaded[0]
    with pytest.raises(CorruptionError, match=f"newer slot {live} is unreadable") as info:
        file.refuse_newer()
    assert (info.value.path, info.value.offset) == (path, offset) and words in str(info.value)
    assert file.closed

    with pytest.raises(
        CorruptionError, match=f"newer slot {live} is unreadable: .*{words}"
    ) as info:
        Journal.open(root, CFG)
    assert (info.value.path, info.value.offset) == (path, offset)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(("cls", "at", "data", "words"), FORMATS)
def test_an_older_slot_breaking_the_format_is_the_previous_record_and_the_open_goes_on(
    tmp_path: Path,
    cls: type[ReclaimFile] | type[PublishedFile],
    at: int,
    data: bytes,
    words: str,
) -> None:
    root, marks = _root(tmp_path)
    live = _live_index(cls, root)
    _break(root / cls.NAME, 1 - live, at, data)
    loaded = cls.load(OsFs(), root)
    assert loaded is not None
    with loaded[0] as file:
        assert file.rejected is not None and words in file.rejected.reason
        file.refuse_newer()  # the live slot is the newer one: nothing to refuse
    with Journal.open(root, CFG) as j:
        assert j.published_marks() == {"acme": marks}

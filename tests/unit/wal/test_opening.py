"""Open: empty shapes, structural refusals (each naming files and offsets), torn tails
sealed rather than appended behind, and the actionable halt of RFC0052.11."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload, replay_all
from wal import CorruptionError, Journal, WalConfig
from wal.errors import OpenError
from wal.segment import HEADER_SIZE, SegmentHeader, segment_name, uuid7


def _fill(
    root: Path, n: int, config: WalConfig = SMALL, size: int = 9000, *, killed: bool = False
) -> Ledger:
    """``n`` acknowledged frames, then a clean close — or, ``killed``, the process dies
    (nothing after the last acknowledgement runs: no close records the high-water)."""
    ledger = Ledger()
    fs = faulty(root.parent)
    j = Journal.open(root, config, fs=fs)
    for i in range(n):
        assert ledger.commit(j, f"t{i % 3}", payload(i, size))
    if killed:
        fs.crash_now()
        fs.apply_crash(power_loss=False)
    else:
        j.close()
    return ledger


def _segments(root: Path) -> list[Path]:
    return sorted(root.glob("*.wal"))


# -- segment-set seed deliverable 8: empty shapes are not errors --------------------


def test_missing_directory_is_created_as_a_fresh_root(tmp_path: Path) -> None:
    root = tmp_path / "a" / "wal"
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and j.open_report.fresh
        assert j.segment_names() == [segment_name(0)]
    assert replay_all(root) == []


def test_empty_directory_is_a_fresh_root(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    root.mkdir()
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and j.open_report.fresh


def test_header_only_segment_reopens_and_is_appended_to(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    Journal.open(root, SMALL).close()
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and not j.open_report.fresh
        j.commit("t", payload(1))
        assert j.segment_names() == [segment_name(0)]


def test_wal_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    path.write_bytes(b"not a directory")
    with pytest.raises(OpenError, match="not a directory"):
        Journal.open(path, SMALL)


def test_files_outside_the_allow_list_are_ignored(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    ledger = _fill(root, 3)
    for name in ("notes.txt", "foo.wal.partial", "123.wal", "CHECKPOINT.tmp"):
        (root / name).write_bytes(b"junk")
    assert_recovers(root, ledger)


# -- deliverable 7: structural refusals ---------------------------------------------


def test_name_header_disagreement_names_both_numbers(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    segs = _segments(root)
    renamed = root / segment_name(int(segs[1].name[:20]) + 5)
    os.rename(segs[1], renamed)
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, SMALL)
    assert info.value.path == renamed
    assert "name/header disagreement" in str(info.value)
    assert str(int(segs[1].name[:20])) in str(info.value)


def test_duplicate_base_names_both_files(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    segs = _segments(root)
    copy = root / segment_name(int(segs[-1].name[:20]) + 10**9)
    copy.write_bytes(segs[1].read_bytes())  # a restored copy declaring the same base
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, SMALL)
    assert "duplicate base" in str(info.value)
    assert segs[1].name in str(info.value) and copy.name in str(info.value)


def test_overlap_names_both_files_and_the_lsns(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    segs = _segments(root)
    base = int(segs[1].name[:20])
    # a segment declaring a base inside segs[1]'s bytes
    header = SegmentHeader(base + 100, uuid7(1.8e9))
    intruder = root / segment_name(base + 100)
    intruder.write_bytes(header.encode())
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, SMALL)
    assert "overlap" in str(info.value)
    assert segs[1].name in str(info.value) and str(base + 100) in str(info.value)


def test_truncated_middle_segment_is_refused_at_replay(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    segs = _segments(root)
    with open(segs[1], "r+b") as f:
        f.truncate(os.path.getsize(segs[1]) - 9000 - 8 - 4)  # lose one whole frame
    with Journal.open(root, SMALL) as j, pytest.raises(CorruptionError) as info:
        list(j.replay())
    assert info.value.path == segs[1]
    assert "truncated" in str(info.value) and segs[2].name in str(info.value)


def test_damaged_middle_segment_is_refused_at_replay(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    segs = _segments(root)
    data = bytearray(segs[1].read_bytes())
    data[HEADER_SIZE + 100] ^= 0x01
    segs[1].write_bytes(bytes(data))
    with Journal.open(root, SMALL) as j, pytest.raises(CorruptionError) as info:
        list(j.replay())
    assert info.value.path == segs[1] and info.value.offset == HEADER_SIZE
    assert "clean rotation" in str(info.value)


def test_checkpoint_beyond_the_log_end_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        for i in range(20):
            mark = j.commit("t", payload(i, 9000)).offset
        j.checkpoint(mark)
    newest = _segments(root)[-1]
    newest.unlink()
    with pytest.raises(CorruptionError, match="beyond the end of the log"):
        Journal.open(root, SMALL)


def test_checkpoint_without_segments_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        j.checkpoint(j.commit("t", payload(1)).offset)
    for seg in _segments(root):
        seg.unlink()
    with pytest.raises(CorruptionError, match="no segment"):
        Journal.open(root, SMALL)


# -- deliverable 9: a torn tail is sealed, never appended behind ---------------------


def test_torn_tail_is_sealed_and_kept_and_a_second_restart_works(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    ledger = _fill(root, 5, size=500, killed=True)
    seg = _segments(root)[-1]
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.truncate(size - 17)
    torn_size = os.path.getsize(seg)
    lost = ledger.acked.pop()  # the truncated frame is gone; it was the last one
    ledger.attempted.discard(lost[1])
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and j.open_report.sealed_newest
        assert list(f.payload for f in j.replay())[-1] == ledger.acked[-1][1]
        assert ledger.commit(j, "t", payload(99, 500))
        assert len(j.segment_names()) == 2  # the append started a new segment
    assert os.path.getsize(seg) == torn_size  # the fragment is still on disk
    assert_recovers(root, ledger)
    with Journal.open(root, SMALL) as j:  # second restart: the sealed segment is legal
        assert j.open_report is not None and not j.open_report.sealed_newest
        assert ledger.commit(j, "t", payload(100, 500))
    assert_recovers(root, ledger)


def test_torn_tail_in_an_otherwise_empty_segment(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    Journal.open(root, SMALL).close()
    seg = _segments(root)[0]
    with open(seg, "ab") as f:
        f.write(b"\x05\x00")  # a torn prefix, no valid frame
    ledger = Ledger()
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and j.open_report.sealed_newest
        assert ledger.commit(j, "t", payload(1))
        names = j.segment_names()
    assert len(names) == 2 and names[1] != names[0]
    assert_recovers(root, ledger)


# -- RFC0052.11: an unreadable newest segment halts actionably, nothing unlinked -----


@pytest.mark.parametrize("keep", [0, 7, 30, 47])
def test_rfc0052_11_partial_newest_header_halts_actionably(tmp_path: Path, keep: int) -> None:
    root = tmp_path / "wal"
    _fill(root, 20)
    before = sorted(p.name for p in root.iterdir())
    newest_base = int(_segments(root)[-1].name[:20]) + 10**6
    orphan = root / segment_name(newest_base)
    orphan.write_bytes(SegmentHeader(newest_base, uuid7(1.9e9)).encode()[:keep])
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, SMALL)
    message = str(info.value)
    assert info.value.path == orphan and orphan.name in message
    assert "newest segment, unreadable header" in message
    assert "one way" in message and "failed" in message  # a possible cause, not a claim
    assert orphan.exists() and orphan.stat().st_size == keep  # nothing unlinked
    assert sorted(p.name for p in root.iterdir()) == sorted(before + [orphan.name])

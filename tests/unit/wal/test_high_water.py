"""The synced high-water (issue 18 item 5): damage inside acknowledged frames is
corruption, not a torn tail.

A segment's successor records, in its header, the LSN up to which the segment's frames
were fsynced when the successor was created; the checkpoint mark is one more such bound
in its own segment. Damage (or the end of the valid frames) below the high-water refuses
recovery naming the file, the offset and the high-water; ``ourios wal verify`` reports
it; ``ourios wal quarantine`` is the operator's way on. Damage above it — a write that
never completed, frames a power loss cut after their fsync failed — stays a legal torn
tail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import wal as walcli
from tests.support.highwater import SIZE
from tests.support.highwater import flip as _flip
from tests.support.highwater import frame_starts as _frame_starts
from tests.support.highwater import run_cli as _run
from tests.support.highwater import sealed_after_a_failed_fsync as _sealed_after_a_failed_fsync
from tests.support.highwater import segment_header as _header
from tests.support.highwater import segments as _segments
from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload
from wal import CorruptionError, Journal
from wal.frame import scan_frames
from wal.segment import HEADER_SIZE


def test_nowedge_5_a_bit_flip_below_the_high_water_refuses_recovery_and_quarantine_recovers(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    ledger = Ledger()
    high_water = _sealed_after_a_failed_fsync(root, faulty(tmp_path), ledger)
    sealed, successor = _segments(root)
    # The high-water is the end of the fifth frame: what the last good fsync covered.
    assert high_water == ledger.acked[4][2]
    starts = _frame_starts(sealed)
    assert len(starts) == 6  # the unacknowledged sixth frame is in the file, intact
    damage_at = starts[1]
    _flip(sealed, damage_at + 40)  # inside the second frame; frames after it verify

    # Recovery refuses, naming the file, the offset and the high-water.
    with Journal.open(root, SMALL) as j, pytest.raises(CorruptionError) as refused:
        list(j.replay())
    err = refused.value
    assert err.path == sealed and err.offset == damage_at and err.high_water == high_water
    assert f"high-water {high_water}" in str(err) and f"at byte {damage_at}" in str(err)
    assert "not a torn tail" in str(err)

    # `ourios wal verify` reports it.
    code, text = _run(walcli.verify, root)
    assert code == walcli.EXIT_PROBLEM, text
    assert f"PROBLEM: {sealed.name} at byte {damage_at}" in text
    assert f"high-water {high_water}" in text

    code, text = _run(walcli.inspect, root)
    assert code == walcli.EXIT_OK
    assert f"high-water {high_water} (recorded by its successor {successor.name})" in text

    # `ourios wal quarantine` of that segment lets the WAL open and replay, the loss named.
    code, text = _run(walcli.quarantine, sealed, now=1.8e9)
    assert code == walcli.EXIT_OK, text
    assert f"high-water {high_water}" in text
    record = json.loads((root / "quarantine" / f"{sealed.name}.json").read_text())
    assert record["high_water_lsn"] == high_water
    assert record["damage_offset"] == damage_at
    # frames 3-5 (acknowledged, below the high-water) and 6 (never acknowledged) verify
    assert record["frames_after_damage"] == 4
    assert record["frames_after_damage_below_high_water"] == 3
    events: list[tuple[str, dict[str, object]]] = []
    with Journal.open(root, SMALL, events=lambda n, f: events.append((n, dict(f)))) as j:
        replayed = [f.payload for f in j.replay()]
    assert replayed == [p for t, p, _ in ledger.acked if t == "u"]
    quarantined = [f for n, f in events if n == "wal.segment.quarantined"]
    assert len(quarantined) == 1 and quarantined[0]["segment"] == sealed.name
    assert f"high-water {high_water}" in str(quarantined[0]["loss"])


@pytest.mark.parametrize("fault", ["fsync_then_power_loss", "torn_write"])
def test_nowedge_5_damage_above_the_high_water_stays_a_legal_torn_tail(
    tmp_path: Path, fault: str
) -> None:
    """What was never acknowledged may be torn or missing: a power loss cuts the frames an
    fsync failed to cover, a failed write leaves a fragment. Both lie at or above the
    high-water the successor records, so recovery replays every acknowledged frame."""
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    ledger = Ledger()
    j = Journal.open(root, SMALL, fs=fs)
    for i in range(5):
        assert ledger.commit(j, "t", payload(i, SIZE))
    if fault == "torn_write":
        fs.fail("write", "*.wal", torn_bytes=37)
    else:
        fs.fail("fsync", "*.wal")
    assert not ledger.commit(j, "t", payload(5, SIZE))
    for i in range(6, 9):
        assert ledger.commit(j, "u", payload(i, SIZE))
    if fault == "fsync_then_power_loss":
        fs.crash_now()  # the process dies here; the sixth frame was never fsynced
        fs.apply_crash(power_loss=True)
    else:
        j.close()
    sealed, successor = _segments(root)
    high_water = _header(successor).prev_high_water
    assert high_water == ledger.acked[4][2]
    _, stop = scan_frames(sealed.read_bytes(), HEADER_SIZE, path=sealed)
    if fault == "torn_write":
        assert stop.damaged  # the fragment is there, above the high-water
    else:
        assert sealed.stat().st_size - HEADER_SIZE + int(sealed.name[:20]) == high_water
    assert_recovers(root, ledger)
    code, text = _run(walcli.verify, root)
    assert code == walcli.EXIT_OK, text


def test_nowedge_5_damage_below_the_checkpoint_in_the_newest_segment_refuses_open(
    tmp_path: Path,
) -> None:
    """The newest segment has no successor yet: its high-water is the checkpoint mark (an
    acknowledged frame's end, so fsynced) when HIGHWATER records less (the node was
    killed before its cadence came round, and a clean close would have recorded the
    whole segment). Damage below it refuses the open instead of being sealed as a torn
    tail; damage above it is still sealed."""
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    j = Journal.open(root, SMALL, fs=fs)
    offsets = [j.commit("t", payload(i, SIZE)).offset for i in range(6)]
    j.checkpoint(offsets[3])
    fs.crash_now()  # killed: no clean close
    fs.apply_crash(power_loss=False)
    (newest,) = _segments(root)
    starts = _frame_starts(newest)
    original = newest.read_bytes()

    _flip(newest, starts[1] + 40)
    with pytest.raises(CorruptionError) as refused:
        Journal.open(root, SMALL)
    err = refused.value
    assert err.path == newest and err.offset == starts[1]
    assert err.high_water == offsets[3].lsn and f"high-water {offsets[3].lsn}" in str(err)
    assert newest.read_bytes()[: starts[1]] == original[: starts[1]]  # nothing was touched

    code, text = _run(walcli.verify, root)
    assert code == walcli.EXIT_PROBLEM and f"high-water {offsets[3].lsn}" in text

    newest.write_bytes(original)
    _flip(newest, starts[4] + 40)  # above the mark: a torn tail, sealed
    code, text = _run(walcli.verify, root)
    assert code == walcli.EXIT_OK, text  # a note, which says a frame after it verifies
    assert "torn tail in the newest segment" in text and "1 frame(s) after it" in text
    with Journal.open(root, SMALL) as j:
        assert j.open_report is not None and j.open_report.sealed_newest
        assert len(list(j.replay())) == 4


def test_nowedge_5_rotation_records_the_synced_end_as_the_high_water(tmp_path: Path) -> None:
    """A clean rotation records the predecessor's whole length (it was fsynced first); a
    segment open sealed for a torn tail records the end of its valid frames."""
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        for i in range(40):
            j.commit("t", payload(i, 9000))
    segs = _segments(root)
    assert len(segs) >= 3
    for prev, nxt in zip(segs, segs[1:], strict=False):
        header = _header(nxt)
        assert not header.predecessor_sealed and header.prev_base_lsn == int(prev.name[:20])
        # clean: synced to the very end, which is where the successor begins
        prev_end = int(prev.name[:20]) + prev.stat().st_size - HEADER_SIZE
        assert header.prev_high_water == header.base_lsn == prev_end
    newest = segs[-1]
    valid_end = int(newest.name[:20]) + newest.stat().st_size - HEADER_SIZE
    with open(newest, "ab") as f:
        f.write(b"\x40\x00\x00\x00torn")
    with Journal.open(root, SMALL) as j:
        j.commit("t", payload(99, 100))
    header = _header(_segments(root)[-1])
    assert header.predecessor_sealed and header.prev_high_water == valid_end
    assert header.base_lsn == valid_end + 8  # the torn bytes' range is never reused

"""The crash matrix: a power loss at each step of a rotation, of a group commit and of a
checkpoint write recovers to exactly the acknowledged frames (plus possibly
unacknowledged ones, never fewer), and the WAL opens and appends afterwards.

The crash is ``FaultyFs``'s: the thread that reaches the point raises
``SimulatedCrash``, every later operation raises too, and ``apply_crash()`` rewrites the
directory to what a power loss leaves (unsynced bytes cut, undurable names reverted).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload
from wal import AppendError, CheckpointError, Journal, WalOffset
from wal.testing import SimulatedCrash

FRAME = 9000
PER_SEGMENT = 7

# (op, glob, nth, torn_bytes): where the crash lands. Rotation steps first.
ROTATION_POINTS = {
    "old_segment_fsync": ("fsync", "*.wal", 1, None),
    "create_partial": ("open", "*.wal.partial", 1, None),
    "header_write": ("write", "*.wal.partial", 1, None),
    "header_write_torn": ("write", "*.wal.partial", 1, 20),
    "header_fsync": ("fsync", "*.wal.partial", 1, None),
    "rename": ("rename", "*.wal", 1, None),
    "reopen_final": ("open", "*.wal", 1, None),
    "parent_fsync": ("fsync_dir", None, 1, None),
    "first_frame_write": ("write", "*.wal", 1, None),
    "first_frame_torn": ("write", "*.wal", 1, 33),
    "first_frame_fsync": ("fsync", "*.wal", 2, None),
}


def _commit_or_crash(j: Journal, ledger: Ledger, i: int) -> bool:
    """True when the crash happened."""
    try:
        ledger.commit(j, f"t{i % 3}", payload(i, FRAME))
    except SimulatedCrash:
        return True
    return False


@pytest.mark.parametrize("point", sorted(ROTATION_POINTS))
def test_crash_during_rotation_recovers_the_acknowledged_frames(tmp_path: Path, point: str) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    j = Journal.open(root, SMALL, fs=fs)
    for i in range(PER_SEGMENT):
        assert ledger.commit(j, "t", payload(i, FRAME))
    op, glob, nth, torn = ROTATION_POINTS[point]
    fs.crash_at(op, glob, nth=nth, torn_bytes=torn)
    crashed = False
    for i in range(PER_SEGMENT, PER_SEGMENT + 3):
        if _commit_or_crash(j, ledger, i):
            crashed = True
            break
    assert crashed, f"the crash point {point} was never reached"
    fs.apply_crash(power_loss=True)
    replayed = assert_recovers(root, ledger)
    assert len(replayed) >= PER_SEGMENT
    with Journal.open(root, SMALL) as again:  # and it appends afterwards
        assert ledger.commit(again, "t", payload(99, FRAME))
    assert_recovers(root, ledger)


GROUP_POINTS = {
    "discharge_open_obligation": ("fsync_dir", None, 1, None),
    "frame_write": ("write", "*.wal", 3, None),
    "frame_write_torn": ("write", "*.wal", 3, 17),
    "data_fsync": ("fsync", "*.wal", 2, None),
    "data_fsync_later": ("fsync", "*.wal", 6, None),
}


@pytest.mark.parametrize("point", sorted(GROUP_POINTS))
def test_crash_during_group_commit_recovers_the_acknowledged_frames(
    tmp_path: Path, point: str
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    lock = threading.Lock()
    j = Journal.open(root, SMALL, fs=fs)
    op, glob, nth, torn = GROUP_POINTS[point]
    fs.crash_at(op, glob, nth=nth, torn_bytes=torn)

    def work(t: int) -> None:
        for i in range(40):
            data = payload(t * 1000 + i, 700)
            with lock:
                ledger.attempted.add(data)
            try:
                out = j.commit(f"t{t}", data)
            except (SimulatedCrash, AppendError):
                return
            with lock:
                ledger.acked.append((f"t{t}", data, out.offset.lsn))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fs.crashed or any(o == op for o, _ in fs.log), (
        f"the crash point {point} was never reached"
    )
    fs.apply_crash(power_loss=True)
    ledger.acked.sort(key=lambda a: a[2])
    assert_recovers(root, ledger)


@pytest.mark.parametrize("power_loss", [True, False], ids=["power_loss", "sigkill"])
@pytest.mark.parametrize(
    "point",
    [
        ("open", "CHECKPOINT.tmp"),
        ("write", "CHECKPOINT.tmp"),
        ("fsync", "CHECKPOINT.tmp"),
        ("link", "CHECKPOINT.spare"),
        ("rename", "CHECKPOINT"),
        ("fsync_dir", None),
    ],
    ids=["open_tmp", "write_tmp", "fsync_tmp", "link_spare", "rename", "parent_fsync"],
)
def test_crash_during_checkpoint_write_leaves_the_old_or_the_new_mark(
    tmp_path: Path, point: tuple[str, str | None], power_loss: bool
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    j = Journal.open(root, SMALL, fs=fs)
    old = j.commit("t", payload(1)).offset
    j.checkpoint(old)
    new = j.commit("t", payload(2)).offset
    fs.crash_at(point[0], point[1])
    with pytest.raises((SimulatedCrash, CheckpointError)):
        j.checkpoint(new)
    fs.apply_crash(power_loss=power_loss)
    with Journal.open(root, SMALL) as again:
        mark: WalOffset | None = again.last_checkpoint
        assert mark in (old, new)
        if power_loss:
            assert mark == old  # nothing after the rename was made durable
        # the next write works whatever the crash left (a spare sharing the live inode)
        later = again.commit("t", payload(3)).offset
        assert again.checkpoint(later)
    with Journal.open(root, SMALL) as third:
        assert third.last_checkpoint == later

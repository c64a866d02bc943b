"""A full disk at every step of the WAL (issue 8; segment-set seed §6, deliverable 14).

- ENOSPC at a write, an fsync or any rotation step is transient for the client: nothing
  covered by the failure is acknowledged, nothing is appended behind a possibly torn
  frame, and the WAL latches — every later append is refused without touching the disk
  (so the rotation budget is not spent append by append) until the owner reports free
  space (``clear_no_space``), after which appends resume without a restart.
- On a real full filesystem (a size-limited tmpfs) the checkpoint can still be written
  (its spare is preallocated) and housekeeping still reclaims (RECLAIM is preallocated).
- A full disk at open fails naming the file that could not be allocated; the same root
  opens once space is freed.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from tests.support.tmpfs import TmpfsMounts, fill_volume, free_bytes
from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload, seeded
from wal import AppendError, Journal, KnownHorizons, OsFs, RotationFailing, WalConfig, WalOffset
from wal.checkpoint_file import SPARE_NAME
from wal.errors import OpenIoError, WalNoSpace
from wal.types import RotationHealthy

FRAME = 9000


# -- seed deliverable 14: an injected ENOSPC at fsync acknowledges nothing after it -------


def test_seg14_enospc_at_fsync_acknowledges_nothing_after_the_failure(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    rng = seeded(14)
    j = Journal.open(root, SMALL, fs=fs)
    for i in range(5):
        assert ledger.commit(j, "t", payload(i, rng.randint(100, 4000)))
    before = len(ledger.acked)
    fs.fail("fsync", "*.wal", errno=errno.ENOSPC, count=None)
    outcomes: dict[int, BaseException | None] = {}
    lock = threading.Lock()

    def writer(k: int) -> None:
        data = payload(100 + k, rng.randint(100, 4000))
        ledger.attempted.add(data)
        try:
            out = j.commit(f"t{k % 3}", data)
        except AppendError as exc:
            with lock:
                outcomes[k] = exc
            return
        with lock:
            outcomes[k] = None
            ledger.acked.append((f"t{k % 3}", data, out.offset.lsn))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, WalNoSpace) for e in outcomes.values()), outcomes
    assert len(ledger.acked) == before, "a frame was acknowledged after the failed fsync"
    latch = j.no_space
    assert latch is not None and latch.op == "fsync"
    # Latched: a later append touches nothing on disk and spends no rotation budget.
    ops = len(fs.log)
    with pytest.raises(WalNoSpace) as refused:
        j.commit("t", payload(999, 100))
    assert refused.value.latched and "no free space has been reported" in str(refused.value)
    assert fs.log[ops:] == [] and j.rotation_state == RotationHealthy()
    fs.clear_faults()
    assert j.clear_no_space(latch.seq) == latch
    assert ledger.commit(j, "t", payload(1000, 100))  # resumes without a restart
    fs.crash_now()
    fs.apply_crash(power_loss=True)
    assert_recovers(root, ledger)


@pytest.mark.parametrize(
    ("op", "glob", "torn"),
    [
        pytest.param("write", "*.wal", 300, id="write_torn"),
        pytest.param("write", "*.wal", None, id="write"),
        pytest.param("fsync", "*.wal", None, id="fsync"),
        pytest.param("open", "*.wal.partial", None, id="rotation_create"),
        pytest.param("write", "*.wal.partial", None, id="rotation_header"),
        pytest.param("fsync", "*.wal.partial", None, id="rotation_header_fsync"),
        pytest.param("fsync_dir", None, None, id="rotation_dir_fsync"),
    ],
)
def test_enospc_at_any_step_is_transient_and_resumes_when_space_returns(
    tmp_path: Path, op: str, glob: str | None, torn: int | None
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    with Journal.open(root, SMALL, fs=fs) as j:
        for i in range(3):
            assert ledger.commit(j, "t", payload(i, 1000))
        if glob is not None and glob.endswith(".partial") or op == "fsync_dir":
            j.rotate()  # rotation steps: make the next commit rotate
            assert ledger.commit(j, "t", payload(3, 1000))
            for _ in range(7):  # fill the segment so the failing commit must rotate
                assert ledger.commit(j, "t", payload(len(ledger.attempted), 9000))
        fs.fail(op, glob, errno=errno.ENOSPC, torn_bytes=torn)
        failed = False
        for k in range(10):  # the first commit that meets the fault fails
            if not ledger.commit(j, "t", payload(100 + k, 9000)):
                failed = True
                break
        assert failed, "the injected ENOSPC was never met"
        latch = j.no_space
        assert latch is not None, "ENOSPC did not latch"
        # A rotation failure counted at most once; never terminal.
        assert isinstance(j.rotation_state, RotationHealthy | RotationFailing)
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(500, 100))
        fs.clear_faults()
        j.clear_no_space(latch.seq)
        assert ledger.commit(j, "t", payload(501, 100))
        state = j.rotation_state
        assert (
            isinstance(state, RotationHealthy) or state.attempts == 1
        )  # one attempt, not one each
        j.rotate()  # the owed or the next rotation succeeds once there is room
        assert j.rotation_state == RotationHealthy()
        assert ledger.commit(j, "t", payload(502, 100))
    assert_recovers(root, ledger)


def test_a_latch_newer_than_the_observation_is_not_cleared(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        fs.fail("write", "*.wal", errno=errno.ENOSPC, count=None)
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(1, 100))
        first = j.no_space
        assert first is not None
        assert j.clear_no_space(first.seq + 1) is None and j.no_space == first
        assert j.clear_no_space(first.seq) == first
        with pytest.raises(WalNoSpace):  # still full: a new latch, a new number
            j.commit("t", payload(2, 100))
        second = j.no_space
        assert second is not None and second.seq == first.seq + 1


def test_eio_does_not_latch(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        fs.fail("write", "*.wal", errno=errno.EIO)
        with pytest.raises(AppendError):
            j.commit("t", payload(1, 100))
        assert j.no_space is None
        j.commit("t", payload(2, 100))


# -- a real full filesystem ---------------------------------------------------------------

#: Small enough to fill in well under a second, large enough for RECLAIM (max_tenants=4,
#: cap 8: ~12 KiB) and a few 64 KiB segments.
TMPFS_BYTES = 1 << 20
TINY = WalConfig(
    segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024, max_tenants=4, max_unlinks_per_pass=8
)


@pytest.fixture
def full_root(small_tmpfs: TmpfsMounts) -> Path:
    mount = small_tmpfs(TMPFS_BYTES)
    return mount / "wal"


def test_a_full_filesystem_still_checkpoints_and_reclaims(full_root: Path) -> None:
    acked: list[tuple[bytes, WalOffset]] = []
    with Journal.open(full_root, TINY) as j:
        for i in range(10_000):
            data = payload(i, FRAME)
            try:
                acked.append((data, j.commit("t", data).offset))
            except WalNoSpace:
                break
        assert len(acked) > 10 and free_bytes(full_root) < FRAME
        latch = j.no_space
        assert latch is not None and latch.op == "write"
        with pytest.raises(WalNoSpace):  # nothing else is attempted while latched
            j.commit("t", payload(10_001, 100))
        # The checkpoint needs no new block (its spare), the pass none (RECLAIM).
        mark = acked[-1][1]
        assert j.checkpoint(mark)
        progress = j.maintain(KnownHorizons({"t": mark}), 8)
        assert progress.removed_segments > 0
        assert free_bytes(full_root) > 4 * FRAME
        assert j.clear_no_space(latch.seq) == latch
        after = payload(20_000, FRAME)
        j.commit("t", after)  # no restart needed
    with Journal.open(full_root, TINY) as again:
        replayed = [f.payload for f in again.replay()]
    assert replayed[-1] == after  # reclaimed only what the mark covered; nothing after it


def test_a_full_disk_at_open_names_the_file_and_opens_once_space_is_freed(
    full_root: Path,
) -> None:
    full_root.mkdir()
    ballast = full_root.parent / "ballast"
    fill_volume(ballast)
    with pytest.raises(OpenIoError) as info:
        Journal.open(full_root, TINY)
    # PUBLISHED is the first sidecar a fresh root allocates (then RECLAIM)
    assert info.value.path.name == "PUBLISHED" and "allocate" in str(info.value)
    assert os.listdir(full_root) == []  # nothing half-made is left behind
    ballast.unlink()
    with Journal.open(full_root, TINY) as j:
        j.commit("t", payload(1, 100))
    # An existing root whose spare was lost opens on a full disk only if it can make one.
    (full_root / SPARE_NAME).unlink()
    fill_volume(ballast)
    with pytest.raises(OpenIoError) as info:
        Journal.open(full_root, TINY)
    assert info.value.path.name == SPARE_NAME and "checkpoint spare" in str(info.value)
    ballast.unlink()
    with Journal.open(full_root, TINY) as j:
        assert [f.payload for f in j.replay()] == [payload(1, 100)]


class _FillAfterRename(OsFs):
    """The real filesystem, plus one outside writer: armed, the first directory fsync of
    the WAL root after a CHECKPOINT rename (no temp left) first fills every free block
    of the volume — another writer taking the block the rename may just have freed."""

    def __init__(self, root: Path, ballast: Path) -> None:
        self.root = root
        self.ballast = ballast
        self.armed = False

    def fsync_dir(self, path: Path) -> None:
        if self.armed and path == self.root and not (path / "CHECKPOINT.tmp").exists():
            self.armed = False
            fill_volume(self.ballast)
        super().fsync_dir(path)


def test_nowedge_2_a_checkpoint_keeps_its_spare_when_another_writer_takes_the_freed_block(
    full_root: Path,
) -> None:
    """Issue 18 item 2: at 0 free bytes ``writing CHECKPOINT … failed: [Errno 28]``
    although a spare exists. The spare used to be allocated after the rename over
    CHECKPOINT, from the block that rename freed; a writer filling the volume in between
    took it, and every later checkpoint had to create its temp on a full disk. The old
    mark's inode is now linked as the next spare before the rename, so no block is ever
    given up."""
    fs = _FillAfterRename(full_root, full_root.parent / "ballast")
    with Journal.open(full_root, TINY, fs=fs) as j:
        marks = [j.commit("t", payload(i, 100)).offset for i in range(5)]
        assert j.checkpoint(marks[0])
        fs.armed = True
        assert j.checkpoint(marks[1])
        assert not fs.armed and free_bytes(full_root) == 0
        for mark in marks[2:]:  # every later checkpoint on the full volume
            assert j.checkpoint(mark)
        assert j.last_checkpoint == marks[-1]
        assert (full_root / SPARE_NAME).stat().st_size == 32
    with Journal.open(full_root, TINY) as again:  # the spare is not the live mark
        assert again.last_checkpoint == marks[-1]

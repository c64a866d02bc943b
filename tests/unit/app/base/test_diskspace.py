"""``app.base.diskspace``: free space as of the last write, and the emergency reserve (issue 18
items 1 and 2; DESIGN.md §7, §12).

- The figure is the last sample less what the node wrote since — the WAL's frames and a
  block per segment file it created (and one for the tail), what other writers report
  in whole blocks — less the reserve while it is owed; the counters' baseline is read
  before the sample, so a write racing it is counted, not lost.
- Admission refuses at stop water by that figure on the request path (no tick needed)
  and only a tick whose figure reaches the resume point lifts it.
- The reserve is allocated at start-up, released by the first ENOSPC a writer reports
  (the writer retries once), owed meanwhile, and allocated again when a sample shows
  room for it and stop water beside it; each transition is one event.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from app.base.diskspace import DiskSpace, Reserve, ReserveState
from app.base.rejections import Unavailable
from app.cadence.housekeeping import Housekeeper
from app.ingest.admission import Admission, Bound, DiskLevel
from app.ingest.mining.template_ids import FileTemplateIdAllocator
from app.ingest.snapshot_store import SnapshotLedger, SnapshotState, SnapshotStore
from tests.support.admissionkit import Events
from tests.support.tmpfs import TmpfsMounts, fill_volume
from tests.support.walkit import SMALL, faulty, payload
from wal import Journal, WalOffset
from wal.errors import WalNoSpace

# cast(T, obj.prop) below: mypy keeps a property narrowed by an earlier assert across the
# call that changes it; the cast restores the property's declared type.
BLOCK = 4096
MiB = 1 << 20
STOP, LOW = 2 * MiB, 8 * MiB
RESERVE = 1 * MiB
SEG = uuid.UUID("01900000-0000-7000-8000-000000000001")


class Volume:
    """What a test says statvfs answers; ``during`` runs inside the sample (a racing
    write)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.during: list[object] = []

    def __call__(self, path: Path) -> int:
        while self.during:
            action = self.during.pop()
            action()  # type: ignore[operator]
        return self.free


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal.open(tmp_path / "wal", SMALL, fs=faulty(tmp_path))
    yield j
    j.close()


def test_nowedge_1_the_figure_is_the_last_sample_less_what_the_node_wrote_since(
    journal: Journal,
) -> None:
    volume = Volume(100 * MiB)
    space = DiskSpace(journal.root, journal, measure=volume, block=BLOCK)
    unsampled = space.free_bytes  # a local: an assert on the property would narrow it
    assert unsampled is None  # nothing sampled yet
    assert space.sample() == 100 * MiB and space.free_bytes == 100 * MiB
    # frames: their bytes and one block for the tail they may open
    lsn = journal.end_lsn
    journal.commit("t", payload(1, 5000))
    grown = journal.end_lsn - lsn
    assert space.free_bytes == 100 * MiB - grown - BLOCK
    # a rotation: one more block for the new segment file (header and first page)
    files = journal.segments_created
    for i in range(30):  # 64 KiB segments: several rotations
        journal.commit("t", payload(2 + i, 9000))
    rotations = journal.segments_created - files
    assert rotations >= 3
    grown = journal.end_lsn - lsn
    assert space.free_bytes == 100 * MiB - grown - (rotations + 1) * BLOCK
    # other writers report in whole blocks; what they replace comes back
    space.wrote(1)
    space.wrote(BLOCK + 1)
    space.freed(BLOCK)
    assert space.free_bytes == 100 * MiB - grown - (rotations + 1) * BLOCK - 2 * BLOCK
    # a new sample is the new baseline
    volume.free = 50 * MiB
    space.sample()
    assert space.free_bytes == 50 * MiB and space.written_since_sample() == 0
    # a write racing the sample is counted, not lost: the baseline is read before statvfs
    volume.during.append(lambda: journal.commit("t", payload(99, 2000)))
    lsn = journal.end_lsn
    space.sample()
    assert space.written_since_sample() == journal.end_lsn - lsn + BLOCK


def test_nowedge_1_admission_refuses_at_stop_water_by_the_figure_between_two_ticks(
    journal: Journal,
) -> None:
    events = Events()
    volume = Volume(STOP + 200_000)
    space = DiskSpace(journal.root, journal, measure=volume, block=BLOCK)
    a = Admission(
        journal,
        low_water_bytes=LOW,
        stop_water_bytes=STOP,
        retry_after_secs=7,
        events=events,
        space=space,
    )
    hk = Housekeeper(journal, SnapshotLedger(), every=7, cap=8, admission=a)
    assert hk.space is space
    hk.observe_disk()
    assert a.level is DiskLevel.LOW_WATER
    admitted = 0
    with pytest.raises(Unavailable) as info:
        while True:  # no tick in between: only what the WAL wrote moves the figure
            size = 20_000
            a.check("t", size)
            journal.commit("t", payload(admitted, size))
            admitted += 1
    r = info.value
    assert (r.http_status, r.retry_after, r.error_type) == (503, 7, "disk_stop_water")
    assert "disk below stop water" in r.message and f"disk.stop_water_bytes={STOP}" in r.message
    assert "as of the last append" in r.message
    figure = space.free_bytes
    assert figure is not None and figure >= STOP  # the last admitted batch fitted above it
    assert 0 < admitted <= 10
    assert events.names() == ["disk.low_water", "disk.stop_water"]
    assert "as of the last append" in str(events.last("disk.stop_water")["cause"])
    # the tick's sample is the truth: still below the resume point, still refused
    volume.free = figure
    hk.observe_disk()
    with pytest.raises(Unavailable):
        a.check("t", 100)
    assert a.refusing == (Bound.DISK_STOP_WATER,)
    # reclaimed past the resume point: the tick alone lifts it
    volume.free = a.resume_bytes + 1
    hk.observe_disk()
    a.check("t", 100)
    assert events.names()[-1] == "disk.recovered"


def test_nowedge_1_a_store_writing_to_the_volume_reports_what_it_adds(tmp_path: Path) -> None:
    from sink.store import LocalStore

    space = DiskSpace(tmp_path, measure=Volume(10 * MiB), block=BLOCK)
    space.sample()
    store = LocalStore(tmp_path / "objects")
    store.on_write = space.wrote
    store.put_if_absent("records/a.parquet", b"x" * 5000)
    store.put("records/b.parquet", b"y" * 10)
    assert space.free_bytes == 10 * MiB - 2 * BLOCK - BLOCK


# -- the reserve ----------------------------------------------------------------------------


def test_nowedge_2_the_reserve_is_made_at_start_released_on_enospc_and_made_again(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    events = Events()
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs, events=events)
    volume = Volume(3 * MiB)
    space = DiskSpace(tmp_path, reserve=reserve, headroom=STOP, measure=volume, block=BLOCK)
    # start-up: allocated for real (blocks, not a sparse file)
    assert reserve.ensure() and reserve.state is ReserveState.IN_PLACE
    st = os.stat(reserve.path)
    assert st.st_size == RESERVE and st.st_blocks * 512 >= RESERVE
    assert space.sample() == 3 * MiB and space.free_bytes == 3 * MiB and space.owed == 0
    assert events.names() == []
    # a writer's ENOSPC releases it: the file is gone, the figure owes it
    assert space.no_space("writing the snapshot of tenant 't': [Errno 28]")
    assert not reserve.path.exists() and space.owed == RESERVE
    assert space.free_bytes == 3 * MiB - RESERVE
    released = events.last("disk.reserve.released")
    assert released["bytes"] == RESERVE and "snapshot" in str(released["cause"])
    assert not space.no_space("again")  # nothing more to release: no retry, no event
    assert events.names() == ["disk.reserve.released"]
    # a sample without room for it and stop water beside it leaves it owed
    volume.free = RESERVE + STOP - 1
    space.sample()
    assert not reserve.path.exists() and space.free_bytes == STOP - 1
    # room again: allocated, and the figure is what is left beside it
    volume.free = RESERVE + STOP
    space.sample()
    assert reserve.path.stat().st_size == RESERVE and reserve.state is ReserveState.IN_PLACE
    assert events.names() == ["disk.reserve.released", "disk.reserve.restored"]
    assert events.last("disk.reserve.restored")["free_bytes"] == RESERVE + STOP
    # a failed re-creation (the volume refilled meanwhile) leaves nothing half-made
    space.no_space("the WAL's write failed")
    fs.fail("fallocate", "*disk-reserve", errno=errno.ENOSPC)
    space.sample()
    assert not reserve.path.exists() and cast(ReserveState, reserve.state) is ReserveState.RELEASED
    space.sample()
    assert reserve.path.exists() and events.names()[-1] == "disk.reserve.restored"


def test_nowedge_2_a_reserve_that_cannot_be_allocated_at_start_is_owed(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    events = Events()
    fs.fail("fallocate", "*disk-reserve", errno=errno.ENOSPC)
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs, events=events)
    assert not reserve.ensure()
    assert not reserve.path.exists() and reserve.owed == RESERVE
    assert "start-up" in str(events.last("disk.reserve.released")["cause"])
    # a whole reserve left by the previous run is kept as it is; another size is redone
    assert reserve.ensure()
    ino = os.stat(reserve.path).st_ino
    again = Reserve(reserve.path, RESERVE, fs=fs)
    assert again.ensure() and os.stat(reserve.path).st_ino == ino
    bigger = Reserve(reserve.path, 2 * RESERVE, fs=fs)
    assert bigger.ensure() and os.stat(reserve.path).st_size == 2 * RESERVE
    off = Reserve(reserve.path, 0, fs=fs)
    assert off.ensure() and not reserve.path.exists() and off.owed == 0


def test_every_state_3_a_reserve_whose_clean_up_fails_too_raises_nothing(tmp_path: Path) -> None:
    """ENOSPC on the reserve's fallocate, then EIO removing the half-made file: the
    failure that once escaped the housekeeping tick and killed its thread. ``ensure``
    stays owed and raises nothing; the next one, with room, makes the reserve."""
    fs = faulty(tmp_path)
    fs.fail("fallocate", "*disk-reserve", errno=errno.ENOSPC)
    fs.fail("unlink", "*disk-reserve", errno=errno.EIO)
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs)
    assert not reserve.ensure()
    assert reserve.state is ReserveState.RELEASED and reserve.owed == RESERVE
    assert reserve.ensure() and reserve.owed == 0


def test_nowedge_2_the_wal_filling_the_volume_releases_the_reserve_at_the_next_tick(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    events = Events()
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs, events=events)
        reserve.ensure()
        volume = Volume(LOW * 4)
        space = DiskSpace(j.root, j, reserve=reserve, headroom=STOP, measure=volume)
        a = Admission(j, low_water_bytes=LOW, stop_water_bytes=STOP, events=events, space=space)
        hk = Housekeeper(j, SnapshotLedger(), every=7, cap=8, admission=a)
        hk.observe_disk()
        fs.fail("write", "*.wal", errno=errno.ENOSPC, count=None)
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(1, 100))
        volume.free = 0
        hk.observe_disk()
        assert not reserve.path.exists()
        assert "the WAL's write" in str(events.last("disk.reserve.released")["cause"])
        hk.observe_disk()  # the same latch releases nothing twice
        assert events.names().count("disk.reserve.released") == 1
        # room for the reserve but not stop water beside it: owed, still refusing
        fs.clear_faults()
        volume.free = RESERVE + STOP // 2
        hk.observe_disk()
        assert not reserve.path.exists() and a.refusing == (Bound.DISK_FULL,)
        # room for both and the resume point: allocated first, then admission resumes
        volume.free = RESERVE + a.resume_bytes
        hk.observe_disk()
        assert reserve.path.exists() and cast(tuple[Bound, ...], a.refusing) == ()
        names = events.names()
        assert names.index("disk.reserve.restored") < names.index("disk.recovered")
        j.commit("t", payload(2, 100))


def test_nowedge_2_a_snapshot_install_on_a_full_volume_takes_the_reserve(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    events = Events()
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs, events=events)
    reserve.ensure()
    space = DiskSpace(tmp_path, reserve=reserve, measure=Volume(0), block=BLOCK)
    space.sample()
    store = SnapshotStore(tmp_path / "snapshots", fs=fs, space=space, events=events)
    snap = SnapshotState("t", WalOffset(SEG, 100), b"m" * 6000)
    fs.fail("write", "*.snap.tmp", errno=errno.ENOSPC)  # the volume is full: once
    assert store.install(snap).installed
    assert events.names() == ["disk.reserve.released"]
    assert "snapshot of tenant 't'" in str(events.last("disk.reserve.released")["cause"])
    assert not list((tmp_path / "snapshots").glob("*.tmp"))
    # what it added is reported (the reserve it took is owed separately)
    assert space.free_bytes == -(2 * BLOCK) - RESERVE
    # a bigger one replaces it: only the difference is added
    store.install(SnapshotState("t", WalOffset(SEG, 200), b"m" * 9000))
    assert space.free_bytes == -(3 * BLOCK) - RESERVE


def test_nowedge_2_failing_installs_are_one_event_per_tenant_not_one_per_cut(
    tmp_path: Path,
) -> None:
    """The snapshot-install warning flood (8 a second on a full volume) is a transition."""
    fs = faulty(tmp_path)
    events = Events()
    store = SnapshotStore(tmp_path / "snapshots", fs=fs, events=events)
    fs.fail("write", "*.snap.tmp", errno=errno.ENOSPC, count=None)
    for lsn in range(100, 2100, 100):  # twenty cuts
        outcome = store.install(SnapshotState("t", WalOffset(SEG, lsn), b"m"))
        assert not outcome.installed and "ENOSPC" in outcome.reason
    assert events.names() == ["snapshot.install.failed"]
    assert "ENOSPC" in str(events.last("snapshot.install.failed")["error"])
    assert store.failing == {"t": 20}
    fs.clear_faults()
    assert store.install(SnapshotState("t", WalOffset(SEG, 5000), b"m")).installed
    assert events.names() == ["snapshot.install.failed", "snapshot.install.recovered"]
    assert events.last("snapshot.install.recovered")["failures"] == 20
    assert store.failing == {}


def test_nowedge_2_the_template_id_file_takes_the_reserve_on_a_full_volume(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    events = Events()
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, fs=fs, events=events)
    reserve.ensure()
    space = DiskSpace(tmp_path, reserve=reserve)
    allocator = FileTemplateIdAllocator(tmp_path / "template-ids", 0, block=4, fs=fs)
    allocator.on_no_space = space.no_space
    fs.fail("write", "*template-ids.tmp", errno=errno.ENOSPC)
    first = allocator.allocate()
    assert first and allocator.high_water == 4
    assert events.names() == ["disk.reserve.released"]


def test_nowedge_2_the_embedded_store_on_a_full_volume_takes_the_reserve(
    small_tmpfs: TmpfsMounts,
) -> None:
    """A real full tmpfs: the store's put fails with ENOSPC, releases the reserve beside
    it and succeeds on its one retry; without a reserve to give, it fails as before."""
    from sink.store import LocalStore, StoreError

    mount = small_tmpfs(4 * MiB)
    events = Events()
    reserve = Reserve(mount / "disk-reserve", RESERVE, events=events)
    assert reserve.ensure()
    space = DiskSpace(mount, reserve=reserve)
    store = LocalStore(mount / "objects")
    store.on_write, store.on_no_space = space.wrote, space.no_space
    store.put_if_absent("records/warm.parquet", b"w")  # its directories exist now
    fill_volume(mount / "outside")
    data = os.urandom(256 * 1024)
    assert store.put_if_absent("records/a.parquet", data)
    assert store.get("records/a.parquet") == data
    assert "the store's write" in str(events.last("disk.reserve.released")["cause"])
    fill_volume(mount / "outside")
    with pytest.raises(StoreError) as info:
        store.put("records/b.parquet", data)
    assert info.value.error_type == "local_no_space"
    assert events.names() == ["disk.reserve.released"]


def test_nowedge_2_a_reserve_removed_by_hand_is_owed_and_made_again(tmp_path: Path) -> None:
    events = Events()
    reserve = Reserve(tmp_path / "disk-reserve", RESERVE, events=events)
    reserve.ensure()
    volume = Volume(RESERVE + STOP + RESERVE)
    space = DiskSpace(tmp_path, reserve=reserve, headroom=STOP, measure=volume)
    reserve.path.unlink()  # an operator freeing space the quick way
    volume.free = STOP  # not enough to make it again yet
    space.sample()
    assert space.owed == RESERVE and space.free_bytes == STOP - RESERVE
    assert "outside the node" in str(events.last("disk.reserve.released")["cause"])
    volume.free = RESERVE + STOP
    space.sample()
    assert reserve.path.exists() and events.names()[-1] == "disk.reserve.restored"


def test_nowedge_1_only_writers_on_the_watched_volume_count(
    tmp_path: Path, small_tmpfs: TmpfsMounts
) -> None:
    mount = small_tmpfs(1 * MiB)
    space = DiskSpace(mount)
    assert space.on_volume(mount / "objects" / "not" / "yet")  # its parent is the volume
    assert not space.on_volume(tmp_path / "objects")  # another filesystem


def test_every_state_2_a_volume_too_small_for_reserve_and_stop_water_is_refused(
    tmp_path: Path,
) -> None:
    from app.base.diskspace import VolumeTooSmall, check_volume

    wal = tmp_path / "wal"  # not made yet: its parent's volume is the one measured
    with pytest.raises(VolumeTooSmall) as info:
        check_volume(
            wal,
            tmp_path,
            reserve_bytes=RESERVE,
            stop_water_bytes=STOP,
            measure=lambda p: RESERVE + STOP,
        )
    message = str(info.value)
    assert f"holds {RESERVE + STOP} bytes" in message
    assert f"disk.reserve_bytes={RESERVE}" in message
    assert f"disk.stop_water_bytes={STOP}" in message
    check_volume(
        wal,
        tmp_path,
        reserve_bytes=RESERVE,
        stop_water_bytes=STOP,
        measure=lambda p: RESERVE + STOP + 1,
    )
    check_volume(wal, tmp_path, reserve_bytes=0, stop_water_bytes=0, measure=lambda p: 0)


def test_every_state_2_a_start_up_write_without_space_takes_the_reserve_once(
    tmp_path: Path,
) -> None:
    from app.base.diskspace import from_reserve, start_reserve

    events = Events()
    reserve = start_reserve(tmp_path / "wal", tmp_path, RESERVE, events)
    assert reserve.state is ReserveState.IN_PLACE
    tries: list[int] = []

    def open_once_full() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("open failed") from OSError(errno.ENOSPC, "full")
        return "opened"

    assert from_reserve(reserve, "opening X", open_once_full) == "opened"
    assert len(tries) == 2 and not reserve.path.exists()
    assert "opening X at start-up failed" in str(events.last("disk.reserve.released")["cause"])

    def always_full() -> str:
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(OSError):  # nothing left to give: raised as it was
        from_reserve(reserve, "opening Y", always_full)

    def broken() -> str:
        raise OSError(errno.EIO, "io")

    again = start_reserve(tmp_path / "wal", tmp_path, RESERVE, events)
    with pytest.raises(OSError):  # not a lack of space: the reserve stays
        from_reserve(again, "opening Z", broken)
    assert again.state is ReserveState.IN_PLACE and again.path.exists()

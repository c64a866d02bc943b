"""The housekeeper (``app/cadence/housekeeping.py``) against RFC0052.1 on a ``NodeRig``
(``tests/support/noderig.py``): a housekeeping pass that raises is counted
``cadence_panic`` and the next pass re-plans; a latched barrier stops the checkpoint,
not housekeeping; the tick samples the disk into admission, asks for a cut below low
water and runs a follow-up pass when that cut ends, and a failed sample changes nothing.
The disk monitor's figure and reserve are tested in ``tests/unit/app/base/test_diskspace.py``.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.base.events import _LEVELS
from app.cadence.housekeeping import Housekeeper, hurry_words
from app.ingest.admission import DiskLevel
from app.ingest.pipeline import LATCH_CLEAR
from app.ingest.snapshot_store import SnapshotLedger
from tests.support.admissionkit import CADENCE, LOW, STOP, Events, admission, faulty_journal
from tests.support.noderig import NodeRig, checkpoint, rig_factory, step
from wal import AppendError, FloorMin, FloorPinned, Journal, ReclamationProgress, WalConfig

SEGMENT_AGE = WalConfig().segment_age_secs


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    yield from faulty_journal(tmp_path)


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    yield from rig_factory(tmp_path)


def test_rfc0052_1_raising_housekeeping_pass_counts_and_the_next_pass_replans(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig()
    a = rig.ingest("t", "a")
    rig.clock.advance(SEGMENT_AGE + 1)
    assert step(rig).checkpointed  # the idle segment rotated: the first one is eligible
    first, second = rig.journal.segment_names()
    real_unlink = rig.fs.unlink
    raised: list[Path] = []

    def unlink(path: Path) -> None:
        if path.name == first and not raised:
            raised.append(path)
            raise RuntimeError("injected housekeeping failure")  # in the file half
        real_unlink(path)

    monkeypatch.setattr(rig.fs, "unlink", unlink)

    assert rig.housekeeper.step() is None

    assert raised and rig.housekeeper.runs[("error", "cadence_panic")] == 1
    assert checkpoint(rig) == a
    assert first in rig.journal.segment_names()

    rig.housekeeper.step()  # re-plans the uncommitted plan

    assert rig.housekeeper.runs[("ok", "")] == 1
    assert rig.journal.segment_names() == [second] and checkpoint(rig) == a


def test_rfc0052_1_housekeeping_keeps_sweeping_while_the_barrier_is_latched(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A latch stops the checkpoint, not housekeeping: partials of failed rotations are
    swept and what the last good checkpoint and snapshots cover is still reclaimed."""
    rig = make_rig()
    rig.ingest("good", "a")
    rig.clock.advance(SEGMENT_AGE + 1)
    assert step(rig).checkpointed  # the idle first segment rotated and is covered
    first = rig.journal.segment_names()[0]
    rig.ingest("good", "x")
    rig.barrier.tick_failed(RuntimeError("injected barrier tick failure"))  # latches
    assert rig.pipeline.failed_epoch != LATCH_CLEAR
    # a rotation whose rename fails leaves a partial behind; the next append retries it
    rig.fs.fail("rename", "*.wal")  # the seam sees a rename by its destination
    with pytest.raises(AppendError):
        rig.journal.rotate()
    debris = rig.journal.stale_partials
    assert len(debris) == 1 and debris[0].exists()
    rig.ingest("good", "b")
    assert step(rig).latched

    progress = rig.housekeeper.step()

    assert progress is not None and progress.removed_partials == 1
    assert not debris[0].exists() and rig.journal.stale_partials == []
    assert first not in rig.journal.segment_names()
    assert rig.housekeeper.runs[("ok", "")] == 1


def test_the_housekeeping_tick_samples_and_hurries(journal: Journal) -> None:
    events = Events()
    wake = threading.Event()  # built before both, as the node does
    a = admission(journal, events, (wake, hurry_words(CADENCE, cuts=True)))
    free = [LOW * 4]
    cuts: list[int] = []
    passes: list[bool] = []
    hk = Housekeeper(
        journal,
        SnapshotLedger(),
        every=CADENCE,
        cap=8,
        events=events,
        admission=a,
        request_cut=lambda: cuts.append(1),
        disk_free=lambda path: free[0],
        wake=wake,
    )
    original_step = hk.step

    def step(*, follow_up: bool = False) -> ReclamationProgress | None:
        passes.append(follow_up)
        return original_step(follow_up=follow_up)

    hk.step = step  # type: ignore[method-assign]
    hk.step()
    assert cuts == [] and a.level is DiskLevel.HEALTHY
    free[0] = LOW - 1
    hk.step()
    assert cuts == [1] and "requests a barrier cut" in str(events.last("disk.low_water")["action"])
    # the requested cut ends: the barrier's hook runs the follow-up pass at once
    ran = threading.Event()
    hk.on_pass = lambda seconds: ran.set()
    hk.start()
    try:
        hk.after_cut()
        assert ran.wait(10)
    finally:
        hk.close()
    assert passes[-1] is True and cuts == [1]  # the follow-up requests no further cut
    assert hk.disk_free_bytes == LOW - 1


def test_a_failed_sample_changes_nothing(journal: Journal) -> None:
    a = admission(journal, Events())

    def broken(path: Path) -> int:
        raise OSError(errno.EIO, "statvfs failed")

    hk = Housekeeper(journal, SnapshotLedger(), every=CADENCE, cap=8, admission=a, disk_free=broken)
    a.observe(STOP - 1, None)
    hk.step()
    assert a.level is DiskLevel.STOP_WATER  # not lifted by a missing figure


def floor_events(rig: NodeRig) -> list[str]:
    return [name for name, _ in rig.events if name.startswith("wal.floor.")]


def test_clone_6_a_new_tenant_waiting_for_its_first_cut_is_pinned_without_a_warning(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A tenant's frames above the checkpoint and no snapshot yet: the floor is Pinned
    (the gauges say so) but nothing a cut released is held, so no event — a healthy node
    between its first batch and its first cut warns nothing."""
    rig = make_rig()
    rig.ingest("old", "a")
    assert step(rig).checkpointed  # "old" has its snapshot
    rig.ingest("new", "a")
    for _ in range(3):
        progress = rig.housekeeper.step()
        assert progress is not None and isinstance(progress.floor, FloorPinned)
        assert progress.floor.pinned == ("new",)
    assert floor_events(rig) == []
    assert step(rig).checkpointed  # installs "new"'s snapshot
    progress = rig.housekeeper.step()
    assert progress is not None and isinstance(progress.floor, FloorMin)
    assert floor_events(rig) == []


def test_clone_6_a_pin_the_checkpoint_passed_warns_once_then_lifts(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A cut ran and the tenant's snapshot install failed: the checkpoint passed its
    frames, so the pin now holds what the cut released — one ``wal.floor.pinned``
    (a warning) however many passes see it, one ``wal.floor.lifted`` when it ends."""
    rig = make_rig()
    rig.ingest("new", "a")
    rig.housekeeper.step()  # waiting for its first cut: nothing yet
    assert floor_events(rig) == []
    rig.fs.fail("open", "new.*.snap.tmp", count=1)
    assert step(rig).checkpointed  # the install failed; the stamp went on
    for _ in range(3):
        rig.housekeeper.step()
    assert floor_events(rig) == ["wal.floor.pinned"]
    (pinned,) = [f for n, f in rig.events if n == "wal.floor.pinned"]
    assert pinned["example_tenants"] == ["new"] and pinned["checkpoint"] == str(checkpoint(rig))
    assert _LEVELS["wal.floor.pinned"] == "warning"
    rig.ingest("new", "b")
    assert step(rig).checkpointed  # this install succeeds
    rig.housekeeper.step()
    assert floor_events(rig) == ["wal.floor.pinned", "wal.floor.lifted"]

"""The housekeeper (``app/cadence/housekeeping.py``) against RFC0052.1 on a ``NodeRig``
(``tests/support/noderig.py``): a housekeeping pass that raises is counted
``cadence_panic`` and the next pass re-plans; a latched barrier stops the checkpoint,
not housekeeping. Its disk-sampling tick is tested with admission
(``tests/unit/app/ingest/test_admission.py``) and with the disk monitor
(``tests/unit/app/node/test_diskspace.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.ingest.pipeline import LATCH_CLEAR
from tests.support.noderig import NodeRig, checkpoint, rig_factory, step
from wal import AppendError, WalConfig

SEGMENT_AGE = WalConfig().segment_age_secs


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

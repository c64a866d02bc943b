"""The collector policy (``app.base.gc_policy``): captures run with automatic collection off and
restore it whatever happens; start-up's heap is frozen out of the generations."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.base.gc_policy import collection_deferred, freeze_long_lived_heap
from app.ingest.cuts import Cut
from tests.support.noderig import NodeRig


@pytest.fixture(autouse=True)
def _gc_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_collection_is_off_inside_and_restored_after_even_on_an_exception() -> None:
    assert gc.isenabled()
    with collection_deferred():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_deferred():
        raise RuntimeError("inside a capture")
    assert gc.isenabled()


def test_a_collector_already_off_is_left_off() -> None:
    gc.disable()
    with collection_deferred():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_freeze_moves_the_live_heap_out_of_the_generations() -> None:
    gc.unfreeze()  # whatever an earlier in-process start froze
    assert gc.get_freeze_count() == 0
    freeze_long_lived_heap()
    assert gc.get_freeze_count() > 1000


def test_both_capture_paths_run_with_collection_off(tmp_path: Path) -> None:
    rig = NodeRig(tmp_path / "node")
    seen: list[bool] = []
    real: Callable[[str], Cut] = rig.pipeline.cuts.capture_cut_locked

    def capture(reason: str) -> Cut:
        seen.append(gc.isenabled())
        return real(reason)

    rig.pipeline.cuts.capture_cut_locked = capture  # type: ignore[method-assign]
    try:
        rig.ingest("t", "a")
        rig.barrier.step()  # the timer's capture
        rig.journal.rotate()
        rig.ingest("t", "b")  # this turn observes the rotation: the turn's capture
        assert rig.barrier.pending is not None
    finally:
        rig.close()
    assert seen == [False, False]
    assert gc.isenabled()

"""The age sweep (``app/cadence/sweep.py``) on a ``NodeRig``: it publishes the partitions
older than its age and leaves the rest, counts a run ``ok`` only when each one reached
the store, and puts back what it could not write. Its interleavings with a cut are
tested in ``test_barrier.py`` and ``test_barrier_never_wedges.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.cadence.sweep import AgeSweep
from tests.support.noderig import NodeRig, rids, rig_factory


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    yield from rig_factory(tmp_path)


def test_only_partitions_older_than_the_age_are_published(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    runs: list[tuple[str, str]] = []
    sweep = AgeSweep(rig.pipeline, 5, 1, lambda o, e: runs.append((o, e)))
    rig.ingest("old", "a")
    rig.clock.advance(10)
    rig.ingest("young", "b")
    assert sweep.sweep_once() == 2  # old's records and its template events
    assert sorted(rig.published_rids()) == sorted(rids("a"))
    assert not rig.buffers.empty()  # young's rows wait for their age
    assert runs == [("ok", "")]
    assert sweep.sweep_once() == 0 and runs == [("ok", "")]  # nothing aged: not a run


def test_a_failed_publish_is_put_back_and_the_run_refused(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    runs: list[tuple[str, str]] = []
    sweep = AgeSweep(rig.pipeline, 5, 1, lambda o, e: runs.append((o, e)))
    rig.ingest("t", "a")
    rig.clock.advance(10)
    rig.store.fail(ops=("put",), always=True)
    assert sweep.sweep_once() == 2
    assert runs == [("refused", "publish_failed")]
    assert rig.published_rids() == [] and rig.buffers.parked_partitions >= 1
    assert len(rig.buffers.in_flight) == 0  # nothing left registered
    rig.store.clear()
    assert sweep.sweep_once() >= 1
    assert runs[-1] == ("ok", "") and sorted(rig.published_rids()) == sorted(rids("a"))


def test_the_sweep_thread_runs_on_its_tick_and_stops(make_rig: Callable[..., NodeRig]) -> None:
    rig = make_rig()
    ran = threading.Event()
    sweep = AgeSweep(rig.pipeline, 0.0, 0.01, lambda o, e: ran.set())
    rig.ingest("t", "a")
    sweep.start()
    try:
        assert ran.wait(10)
    finally:
        sweep.close()
    assert sorted(rig.published_rids()) == sorted(rids("a"))

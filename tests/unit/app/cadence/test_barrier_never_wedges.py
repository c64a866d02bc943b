"""Issue 18 item 0: the barrier never hangs on a failed audit publish.

The wedge seen in a store outage under load: an audit partition's publish failed and
its events went back into the buffers; a rotation-fired cut captured inside an ingest
turn drained them again, under a new in-flight id, into the barrier's pending slot. The
cut the barrier thread was running — captured before the requeue, so its records
partitions depend on those events — then waited in ``Publisher._events_durable`` for
that new id, which only the barrier thread itself would publish, after the running cut:
it waited for good, and every age sweep whose records depended on the same events
joined it. The publisher thread sat idle; no cut completed again.

The rule now (``sink/publisher.py``): a publish waits only for a publish another thread
is executing; an audit partition registered in flight that nobody is writing yet (in a
pending cut, in the publisher's queue) is claimed and written by whoever needs it, and
its owner later finds it settled. A failed dependency refuses (requeues) its dependants
and releases every waiter.

Each test drives a ``NodeRig`` (real journal, pipeline, buffers, publisher, barrier, age
sweep) with named sync points and store holds; every wait is bounded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import points
from app.base.config import load_settings
from app.cadence.sweep import AgeSweep
from app.node.metrics import Metrics
from app.receive.otlp import decode_request, flatten
from tests.support.noderig import NodeRig, request, rids
from tests.support.threads import Worker
from tests.unit.app.cadence.test_barrier import BIG, fill_to_rotation
from wal import ObjectKind

#: every bounded wait in this file
WAIT_S = 10.0
#: how long a step that should return at once may take before it is called a hang
HANG_S = 5.0


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    rigs: list[NodeRig] = []

    def make(**kwargs: object) -> NodeRig:
        rig = NodeRig(tmp_path / f"node{len(rigs)}", **kwargs)  # type: ignore[arg-type]
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        unstick(rig)
        rig.close()


def unstick(rig: NodeRig) -> None:
    """Put back whatever is still registered in flight (a test that failed left a waiter
    behind): the waiters wake and the threads end, so the failure is the assertion, not a
    leaked thread."""
    rig.store.clear()
    pending = rig.barrier.pending
    if pending is not None:
        rig.pipeline.cuts.abandon_cut(pending, "test_unstick")
    for item in rig.buffers.in_flight.pending_upto(sys.maxsize):
        rig.buffers.requeue(item.detached, "test_unstick")


def published(rig: NodeRig) -> list[str]:
    return sorted(rig.published_rids())


def ingest_as(rig: NodeRig, tenant: str, *, bodies_of: str, tag: str) -> None:
    """Records whose bodies are ``request(bodies_of)``'s (so they mine to the templates
    that one made, with no new template events) and whose ``rid``s carry ``tag``."""
    req = request(bodies_of)
    for i, rec in enumerate(req.resource_logs[0].scope_logs[0].log_records):
        rec.attributes[0].value.string_value = f"{tag}/{i}"
    data = req.SerializeToString()
    rig.pipeline.ingest(
        tenant, data, flatten(decode_request(data, "application/x-protobuf"), tenant), "test"
    )


@pytest.mark.parametrize("store", ["back", "still_down"])
def test_nowedge_0_a_failed_audit_publish_redrained_by_a_pending_cut_releases_every_waiter(
    make_rig: Callable[..., NodeRig], store: str
) -> None:
    rig = make_rig()
    sweep = AgeSweep(rig.pipeline, 0.0, 1.0)  # every buffered partition is "aged"
    rig.ingest("t", "a")  # template events (created) and records of tenant t

    # 1. The age sweep writes t's audit partition; the store holds that put, then fails it.
    held = rig.store.hold(ops=("put",), nth=1)
    rig.store.fail(ops=("put",), nth=1)
    first_sweep = Worker("sweep-1", sweep.sweep_once)
    assert held.reached.wait(WAIT_S)

    # 2. More of t's records (the same bodies: they reference those events and make no
    #    new ones), then a cut captured while the audit publish is still in the store:
    #    the records are in the cut, the events are not (in flight, registered before).
    ingest_as(rig, "t", bodies_of="a", tag="b")
    with points.hold("barrier.before_flush") as before_flush:
        barrier = Worker("barrier", rig.barrier.step)
        assert before_flush.reached.wait(WAIT_S)
        assert rig.buffers.in_flight.audit_upto("t", sys.maxsize)  # the sweep's, held

        # 3. The audit put fails: its events go back into the buffers, and the sweep's
        #    records that depend on them are refused (requeued) with it.
        held.release()
        assert first_sweep.join() == 2
        assert rig.publisher.stats.failures[("audit", "injected")] == 1
        assert rig.publisher.stats.failures[("records", "audit_not_durable")] == 1

        # 4. A rotation: the turn that observes it captures a cut, which drains the
        #    requeued events again, under a new id, into the barrier's pending slot.
        fill = fill_to_rotation(rig, "t", "f")
        pending = rig.barrier.pending
        assert pending is not None and pending.reason == "rotation"
        redrained = [d for d in pending.batches if d.partition.kind is ObjectKind.AUDIT]
        assert redrained and min(d.partition.first_seq for d in redrained) == 1
        # t's only template events in flight: the running cut holds records alone
        flying = rig.buffers.in_flight.audit_upto("t", sys.maxsize)
        assert {i.detached.id for i in flying} == {d.id for d in redrained}

        if store == "still_down":
            rig.store.fail(ops=("put",), always=True)
        # 5. An age sweep whose records (the rotating turn's) depend on those events...
        second_sweep = Worker("sweep-2", sweep.sweep_once)
        # 6. ...and the running cut's flush, whose records depend on them too.
        before_flush.release()
        swept = second_sweep.finished(HANG_S)
        cut_done = barrier.finished(HANG_S)

    assert (swept, cut_done) == (True, True), (
        "waited for good on the pending cut's audit partition: "
        f"age sweep returned {swept}, barrier returned {cut_done}"
    )
    out = barrier.join()
    assert out is not None and not out.ok  # the failed events were not in its drain
    second_sweep.join()
    assert len(rig.buffers.in_flight) == 0  # nothing is left registered: no waiter remains
    if store == "still_down":
        # the events failed again: every dependant was refused and requeued, nothing lost
        assert published(rig) == []
        assert rig.publisher.stats.failures[("records", "audit_not_durable")] >= 3
        rig.store.clear()

    # The barrier completes cuts again: the next one publishes everything and stamps.
    again = rig.barrier.step()
    assert again is not None and again.ok and again.checkpointed
    assert rig.buffers.empty() and len(rig.buffers.in_flight) == 0
    tags = [*fill.closed, fill.rotating]
    expected = sorted([*rids("a"), *rids("b"), *(r for t in tags for r in rids(t, BIG))])
    assert published(rig) == expected
    events = [(r["template_id"], r["template_version"]) for r in rig.audit_rows()]
    assert len(events) == len(set(events)), "a template event was published twice"


def test_nowedge_0_a_cut_writes_the_prior_publishes_nobody_is_writing(
    make_rig: Callable[..., NodeRig],
) -> None:
    """Publishes registered before the capture that no thread is writing (queued for a
    publisher thread that is not running) used to be waited for without a bound: the
    cut writes them itself, and the publisher thread later skips them."""
    rig = make_rig(flush_bytes=1)  # every partition a turn makes is detached and queued
    a = rig.ingest("t", "a")
    assert rig.publisher.queue_depth >= 2 and len(rig.buffers.in_flight) >= 2

    barrier = Worker("barrier", rig.barrier.step)
    assert barrier.finished(HANG_S), "the cut waited for a publish nobody was writing"
    out = barrier.join()

    assert out is not None and out.complete and rig.journal.last_checkpoint == a
    assert published(rig) == sorted(rids("a")) and len(rig.buffers.in_flight) == 0
    objects = len(rig.memory.snapshot())
    rig.publisher.start()
    assert rig.publisher.close(WAIT_S)  # the queue drains: each entry already settled
    assert len(rig.memory.snapshot()) == objects  # nothing written twice


def test_nowedge_0_a_wait_for_another_threads_write_is_bounded(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A store call that hangs beyond its own bounds holds only the thread making it: a
    cut whose records need those template events waits ``wait_secs``, refuses the cut
    (the records requeued), and the next cut stamps once the call returns."""
    rig = make_rig(publish_wait_secs=0.3)
    sweep = AgeSweep(rig.pipeline, 0.0, 1.0)
    rig.ingest("t", "a")
    held = rig.store.hold(ops=("put",), nth=1, timeout=4 * WAIT_S)
    sweeper = Worker("sweep", sweep.sweep_once)
    assert held.reached.wait(WAIT_S)  # the sweep's audit put hangs in the store
    b = rig.ingest("t", "b")

    barrier = Worker("barrier", rig.barrier.step)
    assert barrier.finished(HANG_S), "the cut waited without a bound"
    out = barrier.join()
    assert out is not None and not out.ok and not out.checkpointed
    assert rig.publisher.stats.failures[("records", "audit_not_durable")] >= 1
    assert published(rig) == []

    held.release()
    assert sweeper.join() == 2
    again = rig.barrier.step()
    assert again is not None and again.complete and rig.journal.last_checkpoint == b
    assert published(rig) == sorted([*rids("a"), *rids("b")])


# -- issue 18 item 2: a failed cut is never counted with outcome ok -------------------


def cadence_counts(metrics: Metrics, cadence: str) -> dict[tuple[str, str], float]:
    """``ourios_cadence_runs_total`` for ``cadence``, by (outcome, error_type)."""
    out: dict[tuple[str, str], float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "ourios_cadence_runs_total" and labels["cadence"] == cadence:
                out[(labels["outcome"], labels["error_type"])] = sample.value
    return out


@pytest.fixture
def metrics(tmp_path: Path) -> Metrics:
    return Metrics(load_settings({"OURIOS_SERVER_DATA_DIR": str(tmp_path / "m")}))


@pytest.mark.parametrize(
    ("op", "name", "error_type"),
    [
        ("rename", "CHECKPOINT", "checkpoint_write"),
        ("fsync", "CHECKPOINT.tmp", "checkpoint_write"),
        ("fsync", "PUBLISHED", "published_write"),
    ],
)
def test_nowedge_2_a_cut_whose_stamp_failed_is_counted_as_an_error_never_ok(
    make_rig: Callable[..., NodeRig], metrics: Metrics, op: str, name: str, error_type: str
) -> None:
    rig = make_rig()
    rig.barrier.runner.on_run = metrics.cadence_observer("barrier")
    rig.ingest("t", "a")
    first = rig.barrier.step()
    assert first is not None and first.checkpointed
    assert cadence_counts(metrics, "barrier") == {("ok", ""): 1}
    ok_at = rig.barrier.last_ok_at

    b = rig.ingest("t", "b")
    rig.fs.fail(op, name)
    out = rig.barrier.step()

    assert cadence_counts(metrics, "barrier") == {("ok", ""): 1, ("error", error_type): 1}
    # RFC0052.1: the barrier reports success (its flush did) — but the cut is not complete
    assert out is not None and out.ok and not out.complete
    assert out.checkpoint_error_type == error_type
    assert rig.barrier.last_ok_at == ok_at  # not a good cut

    again = rig.barrier.step()  # the fault was one-shot: the next cut stamps
    assert again is not None and again.complete and rig.journal.last_checkpoint == b
    assert cadence_counts(metrics, "barrier")[("ok", "")] == 2


def test_nowedge_2_no_cadence_counts_a_failed_run_ok(
    make_rig: Callable[..., NodeRig], metrics: Metrics
) -> None:
    """The barrier's refused flush, the age sweep's failed publish and a housekeeping
    pass whose RECLAIM write failed each count as what they were; none as ok."""
    rig = make_rig()
    rig.barrier.runner.on_run = metrics.cadence_observer("barrier")
    rig.housekeeper.on_run = metrics.cadence_observer("housekeeping")
    sweep = AgeSweep(rig.pipeline, 0.0, 1.0, metrics.cadence_observer("age_sweep"))

    rig.ingest("t", "a")
    rig.store.fail(ops=("put",), nth=1)
    assert sweep.sweep_once() == 2
    rig.store.fail(ops=("put",), nth=1)
    out = rig.barrier.step()
    assert out is not None and not out.ok
    rig.fs.fail("fsync", "RECLAIM")
    rig.housekeeper.step()

    assert cadence_counts(metrics, "age_sweep") == {("refused", "publish_failed"): 1}
    assert cadence_counts(metrics, "barrier") == {("refused", "flush_failed"): 1}
    housekeeping = cadence_counts(metrics, "housekeeping")
    assert ("ok", "") not in housekeeping and sum(housekeeping.values()) == 1

"""The publisher's write order: records never reach the store ahead of the template
events they reference (RFC 0052 §3.1's ``write_ordered`` rule, ``sink/publisher.py``).

Each test builds the buffers by hand so the interleaving is exact: which audit partition
is buffered, detached by the size trigger and not yet queued, queued, parked or failed
when a records partition that depends on it is published.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sink.buffers import Buffers, Detached
from sink.publisher import Publisher
from sink.testing import FailingStore, MemoryStore
from tests.support.sinkrows import frame_rows
from wal import ObjectKind

DAY = 20_000
DAY_NS = DAY * 86_400 * 1_000_000_000
WAIT_S = 10.0


def add_events(buffers: Buffers, tenant: str, n: int, lsn: int) -> list[Detached]:
    events = [(lsn * 100 + k, 1, f"template {lsn} <*> {k}", "created", DAY_NS) for k in range(n)]
    return buffers.add_audit(tenant, events, lsn)


def add_rows(buffers: Buffers, tenant: str, n: int, lsn: int, nbytes: int = 10) -> Detached | None:
    rows = frame_rows(tenant, DAY, lsn, n, template_id=lsn * 100, params=True)
    return buffers.add_records(tenant, DAY, rows, wal_lsn=lsn, nbytes=nbytes)


def one_event_and_its_records(
    make: Callable[[int], tuple[Buffers, Publisher]],
) -> tuple[Buffers, Publisher, Detached, Detached]:
    """A publisher whose every partition detaches at once, with one audit partition (one
    template event, frame 1) and the records partition that references it, neither
    offered yet."""
    buffers, publisher = make(1)
    (audit,) = add_events(buffers, "t", 1, lsn=1)
    records = add_rows(buffers, "t", 3, lsn=1)
    assert records is not None
    return buffers, publisher, audit, records


def events_and_records_drained(
    make: Callable[[int], tuple[Buffers, Publisher]], cause: str
) -> tuple[Buffers, Publisher, Detached, Detached]:
    """A publisher under its size trigger holding two template events and the three
    records that reference them (frame 1), drained by ``cause``: the audit partition
    first, as every drain is, then the records."""
    buffers, publisher = make(1 << 20)
    add_events(buffers, "t", 2, lsn=1)
    add_rows(buffers, "t", 3, lsn=1)
    audit, records = buffers.drain_all(cause)
    assert audit.partition.kind is ObjectKind.AUDIT
    return buffers, publisher, audit, records


def kinds_in_put_order(store: MemoryStore) -> list[str]:
    return [key.split("/", 1)[0] for key in store.snapshot()]


@pytest.fixture
def memory() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def failing(memory: MemoryStore) -> FailingStore:
    return FailingStore(memory)


@pytest.fixture
def make(failing: FailingStore) -> Iterator[Callable[[int], tuple[Buffers, Publisher]]]:
    publishers: list[Publisher] = []

    def build(flush_bytes: int) -> tuple[Buffers, Publisher]:
        buffers = Buffers(flush_bytes=flush_bytes, clock=time.monotonic, epoch=lambda: 1)
        publisher = Publisher(failing, buffers, node="t-0", queue_depth=4)
        publishers.append(publisher)
        return buffers, publisher

    yield build
    for p in publishers:
        p.close(WAIT_S)


def test_buffered_events_are_written_ahead_of_the_records_that_reference_them(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    buffers, publisher = make(1 << 20)
    add_events(buffers, "t", 2, lsn=1)  # buffered (under the size trigger)
    records = add_rows(buffers, "t", 3, lsn=1, nbytes=1 << 20)  # the size trigger
    assert records is not None

    assert publisher.publish(records).ok

    assert kinds_in_put_order(memory) == ["audit", "records"]
    assert buffers.empty() and len(buffers.in_flight) == 0


def test_records_without_new_events_do_not_wait_for_anything(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    buffers, publisher = make(1 << 20)
    add_events(buffers, "other", 1, lsn=1)  # another tenant's events are no dependency
    records = add_rows(buffers, "t", 3, lsn=2, nbytes=1 << 20)  # no event of its own
    assert records is not None and records.partition.audit_watermark == 0

    assert publisher.publish(records).ok

    assert kinds_in_put_order(memory) == ["records"]
    assert buffers.partitions == 1  # the other tenant's events stay buffered


def test_a_refused_audit_write_refuses_its_records_and_both_requeue(
    make: Callable[[int], tuple[Buffers, Publisher]],
    failing: FailingStore,
    memory: MemoryStore,
) -> None:
    buffers, publisher, audit, records = events_and_records_drained(make, "barrier")
    failing.fail(ops=("put",), nth=1)

    assert not publisher.publish(audit).ok
    outcome = publisher.publish(records)

    assert not outcome.ok and outcome.error_type == "audit_not_durable"
    assert memory.snapshot() == {}
    assert publisher.stats.failures[("records", "audit_not_durable")] == 1
    assert buffers.partitions == 2 and len(buffers.in_flight) == 0
    # the next drain writes both, in order
    for d in buffers.drain_all("barrier"):
        assert publisher.publish(d).ok
    assert kinds_in_put_order(memory) == ["audit", "records"]


def test_a_synchronous_publish_waits_for_events_another_caller_is_writing(
    make: Callable[[int], tuple[Buffers, Publisher]],
    failing: FailingStore,
    memory: MemoryStore,
) -> None:
    buffers, publisher, audit, records = events_and_records_drained(make, "age")
    held = failing.hold(ops=("put",))
    writer = threading.Thread(target=publisher.publish, args=(audit,))
    writer.start()
    assert held.reached.wait(WAIT_S)  # the audit put is in the store, unanswered

    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(publisher.publish(records).ok))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and memory.snapshot() == {}  # waiting, nothing written
    held.release()
    writer.join(WAIT_S)
    waiter.join(WAIT_S)

    assert result == [True]
    assert kinds_in_put_order(memory) == ["audit", "records"]


def test_the_publisher_thread_writes_events_queued_behind_their_records_first(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    """The records reach the queue before their events (a turn offers what it detached
    after the turn): the publisher thread writes the events itself, first, and skips them
    when they come up in the queue — never waiting for them, never writing them twice."""
    buffers, publisher = make(1)  # every partition detaches at once
    (audit,) = add_events(buffers, "t", 1, lsn=1)  # detached by a turn, not yet offered
    records = add_rows(buffers, "t", 3, lsn=1)
    assert records is not None and records.partition.audit_watermark == 1
    publisher.start()

    assert publisher.offer(records)  # the records reach the queue first
    # Both settle (each partition's registration in flight wakes its waiters then).
    assert audit.flight is not None and records.flight is not None
    assert audit.flight.wait(WAIT_S) and records.flight.wait(WAIT_S), "both to settle"
    assert kinds_in_put_order(memory) == ["audit", "records"]
    assert publisher.offer(audit)  # the turn offers its events after all
    assert publisher.close(WAIT_S)

    assert kinds_in_put_order(memory) == ["audit", "records"]  # written once
    assert publisher.queue_depth == 0 and not publisher.stats.failures
    assert buffers.empty()


def test_a_park_of_events_another_thread_already_wrote_puts_nothing_back(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    buffers, publisher, audit, records = one_event_and_its_records(make)
    assert publisher.publish(records).ok  # wrote the events on the way

    publisher.park(audit)  # the turn found the queue full: its events were written already

    assert buffers.empty() and buffers.parked_partitions == 0
    assert kinds_in_put_order(memory) == ["audit", "records"]


def test_a_park_of_the_events_refuses_their_records_and_both_requeue(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    buffers, publisher, audit, records = one_event_and_its_records(make)

    publisher.park(audit)  # the turn found the queue full: the events go back, parked
    outcome = publisher.publish(records)

    assert not outcome.ok and outcome.error_type == "audit_not_durable"  # refused with them
    assert memory.snapshot() == {}
    assert buffers.partitions == 2 and buffers.parked_partitions == 2
    assert len(buffers.in_flight) == 0
    for d in buffers.drain_all("barrier"):  # the next drain writes both, in order
        assert publisher.publish(d).ok
    assert kinds_in_put_order(memory) == ["audit", "records"]


def test_close_leaves_nothing_registered(
    make: Callable[[int], tuple[Buffers, Publisher]], memory: MemoryStore
) -> None:
    buffers, publisher, audit, records = one_event_and_its_records(make)
    publisher.start()
    assert publisher.offer(records)

    assert publisher.close(WAIT_S)  # the audit partition was never offered: written anyway

    assert len(buffers.in_flight) == 0 and buffers.empty()
    assert kinds_in_put_order(memory) == ["audit", "records"]


def test_nowedge_0_a_failed_audit_publish_releases_its_waiter_and_requeues_the_records(
    make: Callable[[int], tuple[Buffers, Publisher]],
    failing: FailingStore,
    memory: MemoryStore,
) -> None:
    """The audit publish another caller is writing is held in the store, then fails: the
    records publish waiting for it is released at once, refused and requeued with it."""
    buffers, publisher, audit, records = events_and_records_drained(make, "age")
    held = failing.hold(ops=("put",))
    failing.fail(ops=("put",))
    writer = threading.Thread(target=publisher.publish, args=(audit,), daemon=True)
    writer.start()
    assert held.reached.wait(WAIT_S)

    result: list[str] = []
    waiter = threading.Thread(
        target=lambda: result.append(publisher.publish(records).error_type), daemon=True
    )
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waiting for the write another thread is executing
    held.release()  # ...which now fails
    writer.join(WAIT_S)
    waiter.join(WAIT_S)

    assert not waiter.is_alive() and result == ["audit_not_durable"]
    assert memory.snapshot() == {} and len(buffers.in_flight) == 0
    assert buffers.partitions == 2 and buffers.parked_partitions == 2  # both back, parked

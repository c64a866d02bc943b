"""Settlement's handoff in the sink (RFC 0055 §9.4): ``drop_tenant`` drops the discarded
tree's buffered rows and starts the tenant's next generation; a partition of an older
generation still in flight never reaches the store without its template events, and is
discarded rather than requeued — with no thread waiting for another's publish."""

from __future__ import annotations

import time

from sink.buffers import Buffers, Detached
from sink.publisher import Publisher
from sink.testing import MemoryStore
from tests.support.sinkrows import frame_rows

DAY = 20_000
DAY_NS = DAY * 86_400 * 1_000_000_000


def rows(buffers: Buffers, lsn: int, nbytes: int) -> Detached | None:
    return buffers.add_records(
        "T", DAY, frame_rows("T", DAY, lsn, 1, template_id=lsn), wal_lsn=lsn, nbytes=nbytes
    )


def setup() -> tuple[MemoryStore, Buffers, Publisher]:
    store = MemoryStore()
    buffers = Buffers(flush_bytes=10_000, clock=time.monotonic, epoch=lambda: 1)
    return store, buffers, Publisher(store, buffers, node="n-0")


def test_an_old_generation_records_partition_whose_events_were_dropped_is_discarded() -> None:
    store, buffers, publisher = setup()
    buffers.add_audit("T", [(7, 1, "t <*>", "created", DAY_NS)], 100)
    detached = rows(buffers, 100, 20_000)  # the size trigger: records in flight alone
    assert detached is not None
    assert buffers.drop_tenant("T") == 1  # the swap drops the buffered event

    outcome = publisher.publish(detached)

    assert not outcome.ok and store.snapshot() == {}  # no row without its event
    assert buffers.empty() and buffers.superseded_rows == 2  # discarded, never requeued


def test_an_old_generation_partition_with_durable_events_still_publishes() -> None:
    store, buffers, publisher = setup()
    buffers.add_audit("T", [(7, 1, "t <*>", "created", DAY_NS)], 100)
    (audit,) = buffers.drain_all("barrier")
    assert publisher.publish(audit).ok
    detached = rows(buffers, 100, 20_000)
    assert detached is not None
    buffers.drop_tenant("T")

    assert publisher.publish(detached).ok  # at most a second copy of what is re-emitted
    assert len(store.snapshot()) == 2


def test_new_generation_rows_are_unaffected() -> None:
    store, buffers, publisher = setup()
    buffers.add_audit("T", [(7, 1, "t <*>", "created", DAY_NS)], 100)
    buffers.drop_tenant("T")
    buffers.add_audit("T", [(8, 1, "u <*>", "created", DAY_NS)], 200)
    fresh = rows(buffers, 200, 20_000)
    assert fresh is not None
    assert publisher.publish(fresh).ok  # its own event was written ahead of it
    assert len(store.snapshot()) == 2

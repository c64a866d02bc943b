"""``sink.buffers``: partitions detach by size, age, tenant or all at once, each
registered in flight as it leaves; a failed publish puts its rows back, and a
settlement's generation change discards what the old tree produced."""

from __future__ import annotations

from sink.buffers import NANOS_PER_DAY, Buffers, PublishOutcome
from tests.support.sinkrows import frame_rows
from wal import ObjectKind

DAY = 20_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(flush_bytes: int = 1_000, clock: Clock | None = None, epoch: int = 1) -> Buffers:
    return Buffers(flush_bytes=flush_bytes, clock=clock or Clock(), epoch=lambda: epoch)


def event(template_id: int, day: int = DAY) -> tuple[int, int, str, str, int]:
    return (template_id, 1, f"op {template_id} <*>", "changed", day * NANOS_PER_DAY)


def test_records_detach_when_the_size_trigger_is_reached() -> None:
    buffers = make(flush_bytes=1_000)
    assert buffers.add_records("t", DAY, frame_rows("t", DAY, 10), wal_lsn=10, nbytes=600) is None
    assert buffers.buffered_bytes == 600
    d = buffers.add_records("t", DAY, frame_rows("t", DAY, 20), wal_lsn=20, nbytes=400)
    assert d is not None and d.reason == "size" and d.epoch == 1
    assert d.partition.rows == 4 and d.partition.max_lsn == 20
    assert buffers.buffered_bytes == 0 and buffers.empty()
    assert len(buffers.in_flight) == 1  # registered in the detaching section
    assert buffers.last_id == d.id


def test_partitions_are_tenant_by_day() -> None:
    buffers = make()
    buffers.add_records("a", DAY, frame_rows("a", DAY, 1), wal_lsn=1, nbytes=1)
    buffers.add_records("a", DAY + 1, frame_rows("a", DAY + 1, 2), wal_lsn=2, nbytes=1)
    buffers.add_records("b", DAY, frame_rows("b", DAY, 3), wal_lsn=3, nbytes=1)
    assert buffers.partitions == 3
    assert buffers.unpublished_rows() == (6, 0)


def test_drain_all_puts_template_events_ahead_of_records() -> None:
    buffers = make()
    buffers.add_records("t", DAY, frame_rows("t", DAY, 5), wal_lsn=5, nbytes=1)
    buffers.add_audit("t", [event(1), event(2)], wal_lsn=5)
    out = buffers.drain_all("barrier")
    assert [d.partition.kind for d in out] == [ObjectKind.AUDIT, ObjectKind.RECORDS]
    assert {d.reason for d in out} == {"barrier"}
    assert buffers.empty()
    assert buffers.unpublished_rows() == (2, 2)  # in flight, not settled: still unpublished


def test_drain_aged_takes_only_partitions_old_enough() -> None:
    clock = Clock()
    buffers = make(clock=clock)
    buffers.add_records("old", DAY, frame_rows("old", DAY, 1), wal_lsn=1, nbytes=1)
    clock.now += 30
    buffers.add_records("new", DAY, frame_rows("new", DAY, 2), wal_lsn=2, nbytes=1)
    out = buffers.drain_aged(30)
    assert [(d.partition.tenant, d.reason) for d in out] == [("old", "age")]
    assert buffers.partitions == 1


def test_drain_tenant_leaves_other_tenants() -> None:
    buffers = make()
    buffers.add_records("a", DAY, frame_rows("a", DAY, 1), wal_lsn=1, nbytes=1)
    buffers.add_records("b", DAY, frame_rows("b", DAY, 2), wal_lsn=2, nbytes=1)
    out = buffers.drain_tenant("a", "settlement")
    assert [d.partition.tenant for d in out] == ["a"]
    assert buffers.unpublished_rows() == (4, 0)


def test_a_requeue_puts_the_rows_back_older_first_and_settles() -> None:
    buffers = make(epoch=7)
    buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=10)
    (d,) = buffers.drain_all("barrier")
    buffers.add_records("t", DAY, frame_rows("t", DAY, 2), wal_lsn=2, nbytes=10)
    outcome = buffers.requeue(d, "store_5xx")
    assert outcome == PublishOutcome(d.id, False, 7, "store_5xx")
    assert len(buffers.in_flight) == 0
    assert buffers.parked_partitions == 1 and buffers.partitions == 1
    assert buffers.buffered_bytes == 20
    (again,) = buffers.drain_all("barrier")
    records = again.partition.records
    assert records is not None
    lsns = [lsn for b in records.batches for lsn in b.column("wal_lsn").to_pylist()]
    assert lsns == [1, 1, 2, 2]
    assert buffers.in_flight.failures_upto(d.id) == [outcome]


def test_a_publish_claimed_elsewhere_is_not_put_back() -> None:
    buffers = make()
    buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=1)
    (d,) = buffers.drain_all("barrier")
    assert buffers.in_flight.claim(d)  # the publisher writing it
    assert not buffers.in_flight.claim(d)
    assert buffers.requeue(d, "parked") is None
    assert buffers.empty() and len(buffers.in_flight) == 1


def test_an_ambiguous_failure_keeps_its_name_as_a_unit_of_its_own() -> None:
    buffers = make()
    buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=1)
    (d,) = buffers.drain_all("barrier")
    buffers.requeue(d, "store_timeout", identity="t/records/x.parquet")
    buffers.add_records("t", DAY, frame_rows("t", DAY, 2), wal_lsn=2, nbytes=1)
    out = buffers.drain_all("barrier")
    assert [(p.partition.identity, p.partition.rows) for p in out] == [
        ("t/records/x.parquet", 2),
        (None, 2),
    ]


def test_drop_tenant_starts_a_generation_and_a_requeue_of_the_old_one_discards() -> None:
    buffers = make()
    buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=1)
    (old,) = buffers.drain_all("barrier")
    buffers.add_records("t", DAY, frame_rows("t", DAY, 2, n=3), wal_lsn=2, nbytes=1)
    assert buffers.drop_tenant("t") == 3
    assert buffers.empty() and buffers.superseded_rows == 3
    outcome = buffers.requeue(old, "store_5xx")
    assert outcome is not None and outcome.error_type == "superseded"
    assert buffers.empty() and buffers.superseded_rows == 5


def test_staged_rows_never_size_trigger_and_seal_into_units() -> None:
    buffers = make(flush_bytes=1)
    assert (
        buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=100, staged=True)
        is None
    )
    assert buffers.add_audit("t", [event(1)], wal_lsn=1, staged=True) == []
    assert buffers.seal_staged("t") == 2
    out = buffers.drain_all("barrier")
    assert [(d.partition.kind, d.partition.deterministic) for d in out] == [
        (ObjectKind.AUDIT, True),
        (ObjectKind.RECORDS, True),
    ]


def test_audit_pending_until_the_events_publish_settles() -> None:
    buffers = make()
    buffers.add_audit("t", [event(1), event(2)], wal_lsn=4)
    assert buffers.audit_pending("t", 1)
    assert not buffers.audit_pending("t", 0)
    (d,) = buffers.drain_all("barrier")
    assert buffers.audit_pending("t", 2)  # in flight, not settled
    buffers.in_flight.settle(PublishOutcome(d.id, True))
    assert not buffers.audit_pending("t", 2)


def test_records_refused_behind_a_parked_audit_partition() -> None:
    buffers = make()
    buffers.add_audit("t", [event(1)], wal_lsn=1)
    (audit,) = buffers.drain_all("barrier")
    buffers.requeue(audit, "store_5xx")  # parked: its events are not durable
    records = buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=1_000)
    assert records is not None and records.partition.audit_watermark == 1
    taken, refused = buffers.audit_dependencies(records)
    assert refused and taken == []


def test_a_records_publish_takes_its_buffered_template_events_first() -> None:
    buffers = make()
    buffers.add_audit("t", [event(1)], wal_lsn=1)
    records = buffers.add_records("t", DAY, frame_rows("t", DAY, 1), wal_lsn=1, nbytes=1_000)
    assert records is not None
    taken, refused = buffers.audit_dependencies(records)
    assert not refused
    assert [(d.partition.kind, d.reason) for d in taken] == [(ObjectKind.AUDIT, "ordered")]
    assert buffers.empty()

"""A settlement's intent span in the sink (issue 18 item 6, RFC 0055 §9.4;
``sink/buffers.py`` "staged", ``sink/publisher.py`` "deterministic").

The span's records and the events of templates known before the rebuild are buffered
staged: partitions of their own that the size trigger never detaches, sealed into units
that are never merged, published under names their rows derive with the conditional
create — so a second attempt at the same span (another process's, after a crash) writes
the same keys and finds them there.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator

import pytest

from sink.buffers import Buffers, Detached
from sink.keys import audit_name_bytes, audit_object_name, retry_name_bytes
from sink.publisher import Publisher
from sink.testing import FailingStore, MemoryStore
from tests.support.sinkrows import frame_rows
from tests.unit.sink.test_publisher import DAY_NS, WAIT_S
from wal import ObjectKind

EVENTS = [(7, 2, "op <*> step <*>", "changed", DAY_NS), (7, 3, "op <*> <*> <*>", "changed", DAY_NS)]


def add_rows(buffers: Buffers, lsn: int, n: int = 3, *, staged: bool) -> Detached | None:
    return buffers.add_records(
        "t",
        20_000,
        # another attempt's ids may differ: not part of the name
        frame_rows("t", 20_000, lsn, n, template_id=lsn, params=True),
        wal_lsn=lsn,
        nbytes=1 << 20,  # over the size trigger every time
        staged=staged,
    )


def stage_span(buffers: Buffers) -> None:
    """Two frames of the span: records and known-template events, staged."""
    for lsn in (100, 200):
        assert add_rows(buffers, lsn, staged=True) is None
    buffers.add_audit("t", EVENTS, 200, staged=True)


@pytest.fixture
def node() -> Iterator[Callable[[FailingStore], tuple[Buffers, Publisher]]]:
    publishers: list[Publisher] = []

    def build(store: FailingStore) -> tuple[Buffers, Publisher]:
        buffers = Buffers(flush_bytes=1024, clock=time.monotonic, epoch=lambda: 1)
        publisher = Publisher(store, buffers, node="t-0", queue_depth=4)
        publishers.append(publisher)
        return buffers, publisher

    yield build
    for p in publishers:
        p.close(WAIT_S)


def test_nowedge_6_staged_rows_are_never_size_triggered_and_drain_as_units_audit_first(
    node: Callable[[FailingStore], tuple[Buffers, Publisher]],
) -> None:
    buffers, _ = node(FailingStore(MemoryStore()))
    stage_span(buffers)
    assert add_rows(buffers, 300, staged=False) is not None  # an ordinary row: detached
    assert buffers.partitions == 2 and buffers.unpublished_rows() == (9, 2)
    assert buffers.seal_staged("t") == 2
    out = buffers.drain_all("barrier")
    assert [(d.partition.kind, d.partition.deterministic) for d in out] == [
        (ObjectKind.AUDIT, True),
        (ObjectKind.RECORDS, True),
    ]
    assert out[1].partition.records is not None
    assert out[1].partition.records.lsn_bounds() == (100, 200, 0, 2)


def test_nowedge_6_a_second_attempt_at_the_span_writes_the_same_keys_and_nothing_twice(
    node: Callable[[FailingStore], tuple[Buffers, Publisher]],
) -> None:
    """The first attempt wrote its template events and failed on the records; a second
    node (a restart) stages the same span: its events are found, its records written,
    and nothing is under a key the first attempt did not also derive."""
    memory = MemoryStore()
    first = FailingStore(memory)
    buffers, publisher = node(first)
    stage_span(buffers)
    first.fail(prefix="records/", always=True)
    results = [publisher.publish(d).ok for d in buffers.drain_all("settlement")]
    assert results == [True, False]
    requeued = buffers.drain_all("barrier")  # the records unit went back as itself
    assert [d.partition.deterministic for d in requeued] == [True]
    assert requeued[0].partition.identity is not None
    first_keys = set(memory.list(""))
    records_key = f"records/tenant=t/date={_day()}/{requeued[0].partition.identity}.parquet"

    again, publisher2 = node(FailingStore(memory))
    stage_span(again)
    assert all(publisher2.publish(d).ok for d in again.drain_all("recovery"))
    assert publisher2.stats.already_present == 1  # the events
    assert set(memory.list("")) == first_keys | {records_key}
    assert len(memory.list("audit/")) == 1 and len(memory.list("records/")) == 1


def test_nowedge_6_records_wait_for_a_staged_span_s_template_events(
    node: Callable[[FailingStore], tuple[Buffers, Publisher]],
) -> None:
    """An ordinary records partition whose rows follow the span's events is not written
    before them: while the span is being filled it is refused (requeued); once sealed the
    events are written first."""
    memory = MemoryStore()
    buffers, publisher = node(FailingStore(memory))
    stage_span(buffers)
    later = add_rows(buffers, 300, staged=False)
    assert later is not None and later.partition.audit_watermark == 2
    assert not publisher.publish(later).ok and memory.list("") == []
    buffers.seal_staged("t")
    (records,) = [d for d in buffers.drain_all("barrier") if not d.partition.deterministic]
    assert publisher.publish(records).ok
    assert [k.split("/")[0] for k in memory.snapshot()] == ["audit", "records"]


def _day() -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=20_000)).isoformat()


NAME_ROWS = [
    (7, 2, "op <*> step <*>", "changed", 100, 5),
    (7, 3, "op <*> <*> <*>", "changed", 200, 6),
]


def test_nowedge_6_the_audit_name_is_pinned_and_follows_the_rows() -> None:
    """The derivation is normative (a changed one would name the next attempt's objects
    differently from those already stored): pinned bytes and name; any row differing
    gives another name; the u16 0 lead keeps it apart from every records name."""
    day = dt.date(2024, 5, 1)
    raw = audit_name_bytes("acme", day, NAME_ROWS)
    assert raw[:24].hex() == "0000040061636d650f00646174653d323032342d30352d30"
    assert len(raw) == 2 + 2 + 4 + 2 + 15 + 32
    assert audit_object_name("ourios-0", "acme", day, NAME_ROWS) == (
        "ourios-0-e96bddba-110b-5e82-891a-4636055a4650"
    )
    row: tuple[int | str, ...] = NAME_ROWS[1]
    for i, field in enumerate(row):
        changed = list(row)
        changed[i] = field + 1 if isinstance(field, int) else field + "x"
        other = [NAME_ROWS[0], tuple(changed)]
        assert audit_object_name("ourios-0", "acme", day, other) != audit_object_name(  # type: ignore[arg-type]
            "ourios-0", "acme", day, NAME_ROWS
        )
    assert raw[:2] != retry_name_bytes("acme", day, 1, 2, 0, 0)[:2]

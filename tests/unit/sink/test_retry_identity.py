"""RFC 0055 §9.2/§9.3: a records publish retried after an ambiguous failure keeps its
identity — its own unit, never merged with rows that arrived meanwhile, written under
the deterministic UUIDv5 name its rows derive, with the store's conditional create — and
a clean failure merges freely.

The store double ``FailingStore.lose_reply`` is "the PUT reached the store, the reply
was lost": the object exists, and the publisher is told the call failed ambiguously.
"""

from __future__ import annotations

import datetime as dt
import io
import time
import uuid

import pyarrow.parquet as pq
import pytest

from sink.buffers import Buffers, Detached
from sink.keys import (
    RETRY_NAMESPACE,
    KeyFormatError,
    parse_object_key,
    records_key,
    retry_name_bytes,
    retry_object_name,
)
from sink.publisher import Publisher
from sink.testing import FailingStore, MemoryStore
from tests.support.sinkrows import frame_rows

DAY = 20_000
DAY_NS = DAY * 86_400 * 1_000_000_000


def add_rows(buffers: Buffers, tenant: str, lsn: int, n: int = 2) -> Detached | None:
    rows = frame_rows(tenant, DAY, lsn, n, template_id=7, params=True, rids=True)
    return buffers.add_records(tenant, DAY, rows, wal_lsn=lsn, nbytes=10)


def rids_by_object(memory: MemoryStore) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, data in memory.snapshot().items():
        table = pq.read_table(io.BytesIO(data))
        out[key] = [dict(a)["rid"] for a in table.column("attributes").to_pylist()]
    return out


def rig() -> tuple[MemoryStore, FailingStore, Buffers, Publisher]:
    memory = MemoryStore()
    store = FailingStore(memory)
    buffers = Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: 1)
    return memory, store, buffers, Publisher(store, buffers, node="ourios-0")


# -- the name ----------------------------------------------------------------------------


def test_rfc0055_9_2_the_name_is_uuid5_over_the_normative_serialisation() -> None:
    day = dt.date(2024, 5, 1)
    raw = retry_name_bytes("acme", day, 4096, 8192, 3, 17)
    assert raw == (
        b"\x04\x00acme"
        + b"\x0f\x00date=2024-05-01"
        + (4096).to_bytes(8, "little")
        + (8192).to_bytes(8, "little")
        + (3).to_bytes(4, "little")
        + (17).to_bytes(4, "little")
    )
    assert str(RETRY_NAMESPACE) == "6f757269-6f73-5055-424c-000000000001"
    assert RETRY_NAMESPACE.bytes[:6] == b"ourios" and RETRY_NAMESPACE.bytes[6:10] == b"PUBL"
    name = retry_object_name("ourios-0", "acme", day, 4096, 8192, 3, 17)
    # a fixed vector: a change to the derivation changes it
    assert name == "ourios-0-2ba7b304-0a61-5064-bc34-ba94d81d4af3"
    assert uuid.UUID(name[len("ourios-0-") :]).version == 5
    key = records_key("acme", day, name)
    assert parse_object_key(key).name == name


@pytest.mark.parametrize(
    "other",
    [
        ("acmf", dt.date(2024, 5, 1), 4096, 8192, 3, 17),
        ("acme", dt.date(2024, 5, 2), 4096, 8192, 3, 17),
        ("acme", dt.date(2024, 5, 1), 4097, 8192, 3, 17),
        ("acme", dt.date(2024, 5, 1), 4096, 8193, 3, 17),
        ("acme", dt.date(2024, 5, 1), 4096, 8192, 4, 17),
        ("acme", dt.date(2024, 5, 1), 4096, 8192, 3, 18),
    ],
    ids=["tenant", "day", "first_frame", "last_frame", "first_index", "last_index"],
)
def test_every_field_enters_the_name(other: tuple[str, dt.date, int, int, int, int]) -> None:
    base = retry_object_name("ourios-0", "acme", dt.date(2024, 5, 1), 4096, 8192, 3, 17)
    assert retry_object_name("ourios-0", *other) != base
    assert retry_object_name("ourios-1", "acme", dt.date(2024, 5, 1), 4096, 8192, 3, 17) != base


def test_a_range_that_is_not_a_range_is_refused() -> None:
    with pytest.raises(KeyFormatError):
        retry_name_bytes("acme", dt.date(2024, 5, 1), 10, 9, 0, 0)


# -- the retry ---------------------------------------------------------------------------


def test_rfc0055_9_3_an_ambiguous_retry_keeps_its_identity_and_never_merges_with_new_rows() -> None:
    """From its ambiguous failure on, the rows are one unit under the name the failed
    attempt used (the publish intent recorded it before the PUT), written with the
    conditional create: however many retries land, the store holds the rows once (issue
    16: RFC 0055 §9.2's one accepted extra object is gone), and the rows that arrived
    meanwhile publish as their own object after it."""
    memory, store, buffers, publisher = rig()
    add_rows(buffers, "acme", 100)
    add_rows(buffers, "acme", 200)
    (first,) = buffers.drain_all("barrier")
    store.lose_reply(ops=["put"])  # the store accepted it; the reply was lost
    assert not publisher.publish(first).ok
    add_rows(buffers, "acme", 300)  # arrived during the in-flight PUT

    batches = buffers.drain_all("barrier")

    assert [sorted(set(d.partition.records.wal_lsn)) for d in batches] == [  # type: ignore[union-attr]
        [100, 200],
        [300],
    ]  # the unit first and alone, then the new rows
    store.lose_reply(ops=["put_if_absent"])  # the retry lands too, its reply lost again
    assert not publisher.publish(batches[0]).ok
    assert publisher.publish(batches[1]).ok
    (third,) = buffers.drain_all("barrier")
    assert publisher.publish(third).ok
    assert publisher.stats.already_present == 1  # the third attempt found its own object

    objects = rids_by_object(memory)
    unit = ["100/0", "100/1", "200/0", "200/1"]
    assert sorted(objects.values()) == [unit, ["300/0", "300/1"]]  # each row once
    (first_key,) = [k for op, k in store.calls if op == "put"][:1]
    assert objects[first_key] == unit
    assert [k for op, k in store.calls if op == "put_if_absent"] == [first_key] * 2


def test_rfc0055_9_3_every_later_attempt_uses_the_same_key() -> None:
    memory, store, buffers, publisher = rig()
    add_rows(buffers, "acme", 100)
    (d,) = buffers.drain_all("barrier")
    store.fail(ops=["put"], ambiguous=True)  # a timeout after sending: nothing landed
    assert not publisher.publish(d).ok
    store.fail(ops=["put_if_absent"])  # a clean failure of the retry: still the same key
    (retry,) = buffers.drain_all("barrier")
    assert not publisher.publish(retry).ok
    (again,) = buffers.drain_all("barrier")
    assert publisher.publish(again).ok
    keys = [k for op, k in store.calls if op == "put_if_absent"]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert list(memory.snapshot()) == [keys[0]]


def test_rfc0055_9_3_a_clean_failure_merges_with_new_rows() -> None:
    memory, store, buffers, publisher = rig()
    add_rows(buffers, "acme", 100)
    (d,) = buffers.drain_all("barrier")
    store.fail(ops=["put"])  # refused before anything was written
    assert not publisher.publish(d).ok
    add_rows(buffers, "acme", 200)
    (merged,) = buffers.drain_all("barrier")
    assert merged.partition.identity is None
    assert publisher.publish(merged).ok
    assert sorted(rids_by_object(memory).values()) == [["100/0", "100/1", "200/0", "200/1"]]


def test_rfc0055_9_2_a_second_put_of_the_same_key_never_replaces_different_rows() -> None:
    memory, store, buffers, publisher = rig()
    add_rows(buffers, "acme", 100)
    (d,) = buffers.drain_all("barrier")
    store.fail(ops=["put"], ambiguous=True)
    assert not publisher.publish(d).ok
    (retry,) = buffers.drain_all("barrier")
    assert retry.partition.identity is not None
    key = records_key(
        "acme", dt.date(1970, 1, 1) + dt.timedelta(days=DAY), retry.partition.identity
    )
    memory.put(key, b"other bytes already under this key")
    assert publisher.publish(retry).ok
    assert memory.get(key) == b"other bytes already under this key"  # never replaced

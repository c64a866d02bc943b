"""FailingStore: failing the k-th call once or always, lost replies, and held calls."""

from __future__ import annotations

import threading

import pytest

from sink.store import ObjectStore, StoreError
from sink.testing import FailingStore, MemoryStore, StoreFaultKind


@pytest.fixture
def inner() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def store(inner: MemoryStore) -> FailingStore:
    return FailingStore(inner)


def test_is_an_object_store_and_passes_calls_through(store: FailingStore) -> None:
    assert isinstance(store, ObjectStore)
    store.put("a", b"1")
    assert store.put_if_absent("b", b"2") is True
    assert store.get("a") == b"1" and store.list("") == ["a", "b"]
    store.delete("a")
    assert store.calls == [
        ("put", "a"),
        ("put_if_absent", "b"),
        ("get", "a"),
        ("list", ""),
        ("delete", "a"),
    ]
    assert store.describe().startswith("failing(memory://")


def test_fail_the_kth_call_once(store: FailingStore, inner: MemoryStore) -> None:
    fault = store.fail(nth=2)
    store.put("k1", b"1")
    with pytest.raises(StoreError) as info:
        store.put("k2", b"2")
    assert (info.value.op, info.value.key, info.value.error_type) == ("put", "k2", "injected")
    assert not info.value.ambiguous
    store.put("k3", b"3")
    assert inner.list("") == ["k1", "k3"]  # the failed put never reached the inner store
    assert (fault.seen, fault.fired) == (3, 1) and fault.reached.is_set()


def test_fail_always_from_the_kth_call(store: FailingStore, inner: MemoryStore) -> None:
    store.fail(nth=2, always=True, error_type="s3_5xx", ambiguous=True)
    store.put("k1", b"1")
    for key in ("k2", "k3", "k4"):
        with pytest.raises(StoreError) as info:
            store.put_if_absent(key, b"x")
        assert info.value.error_type == "s3_5xx" and info.value.ambiguous
    assert inner.list("") == ["k1"]


def test_faults_only_match_their_operations(store: FailingStore) -> None:
    store.put("k", b"v")
    store.fail(ops=["get"], always=True)
    store.put("k2", b"v")  # writes unaffected
    with pytest.raises(StoreError):
        store.get("k")
    store.clear()
    assert store.get("k") == b"v"


def test_lose_reply_stores_the_object_then_fails_ambiguously(
    store: FailingStore, inner: MemoryStore
) -> None:
    fault = store.lose_reply()
    assert fault.kind is StoreFaultKind.LOSE_REPLY
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    assert info.value.ambiguous
    assert inner.get("k") == b"v"  # the PUT reached the server; only the reply was lost
    # a conditional retry now finds its own object
    assert store.put_if_absent("k", b"v") is False


def test_hold_blocks_a_call_until_released(store: FailingStore, inner: MemoryStore) -> None:
    hold = store.hold()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            store.put("k", b"v")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        assert hold.reached.wait(10), "the put never reached the hold"
        assert inner.list("") == []  # held before the inner store
        store.put("other", b"x")  # only the first matching call is held
        assert inner.list("") == ["other"]
    finally:
        hold.release()
        thread.join()
    assert errors == [] and inner.get("k") == b"v"


def test_hold_then_fail_combine(store: FailingStore, inner: MemoryStore) -> None:
    hold = store.hold()
    store.fail()
    raised: list[StoreError] = []

    def publish() -> None:
        try:
            store.put("k", b"v")
        except StoreError as exc:
            raised.append(exc)

    thread = threading.Thread(target=publish)
    thread.start()
    assert hold.reached.wait(10)
    hold.release()
    thread.join()
    assert [e.error_type for e in raised] == ["injected"] and inner.list("") == []


def test_an_unreleased_hold_times_out_instead_of_hanging(store: FailingStore) -> None:
    store.hold(timeout=0.01)
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    assert info.value.error_type == "hold_timeout"


def test_nth_counts_from_one(store: FailingStore) -> None:
    with pytest.raises(ValueError):
        store.fail(nth=0)

"""``app.node.storeprobe`` (issue 22 item 8): the start-up probe's classification, the
health every store call reports, and the re-probe while the store is down. The real
SeaweedFS cases are ``tests/integration/test_store_probe_serve.py``."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest

from app.node.storeprobe import (
    StoreHealth,
    StoreProbe,
    StoreUnusable,
    WatchedStore,
    permanent,
    probe_at_start,
)
from sink.store import LocalStore, StoreError
from sink.testing import FailingStore, MemoryStore


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []
        self.arrived = threading.Event()

    def __call__(self, name: str, fields: Mapping[str, object], level: str) -> None:
        self.seen.append((name, dict(fields)))
        self.arrived.set()

    def names(self) -> list[str]:
        return [n for n, _ in self.seen]


def _health(store: FailingStore | MemoryStore, events: Events) -> StoreHealth:
    return StoreHealth(store, events, "probe/node-0")


@pytest.mark.parametrize(
    "error_type", ["s3_no_such_bucket", "s3_access_denied", "s3_auth", "s3_credentials"]
)
def test_every_state_8_a_permanent_error_refuses_naming_bucket_endpoint_and_code(
    error_type: str,
) -> None:
    store = FailingStore(MemoryStore())
    store.fail(ops=("list", "put"), always=True, error_type=error_type)
    events = Events()
    with pytest.raises(StoreUnusable) as refused:
        probe_at_start(_health(store, events), "logs", "http://s3.example:9000")
    fields = refused.value.fields()
    assert fields["bucket"] == "logs" and fields["endpoint"] == "http://s3.example:9000"
    assert fields["store_error_type"] == error_type
    assert "logs" in str(refused.value)


@pytest.mark.parametrize("error_type", ["s3_connection", "s3_timeout", "s3_5xx", "s3_throttled"])
def test_every_state_8_a_transient_error_starts_with_the_store_down(error_type: str) -> None:
    store = FailingStore(MemoryStore())
    fault = store.fail(ops=("list",), always=True, error_type=error_type)
    events = Events()
    health = _health(store, events)
    probe_at_start(health, "logs", "http://s3.example:9000")  # no refusal
    assert not health.up and events.names() == ["store.unavailable"]
    fault.release()
    store.clear()
    WatchedStore(store, health).put("records/x.parquet", b"x")  # a publish succeeds
    assert cast(bool, health.up)  # mypy keeps the narrowing above across the call
    assert events.names() == ["store.unavailable", "store.available"]


def test_a_local_store_is_never_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("the store's parent is a file")
    store = LocalStore(blocker / "objects")
    health = StoreHealth(store, Events(), "probe/node-0")
    probe_at_start(health, "", "")
    assert not health.up
    error = StoreError("put", "k", "local_io", "x")
    assert not permanent(store, error)


def test_answers_are_not_failures_and_a_refused_delete_is_not_held_against_the_start() -> None:
    store = FailingStore(MemoryStore())
    store.fail(ops=("delete",), always=True, error_type="s3_access_denied")
    events = Events()
    health = _health(store, events)
    probe_at_start(health, "logs", "e")
    assert health.up and events.names() == ["store.probe_not_deleted"]
    watched = WatchedStore(store, health)
    assert not watched.exists("records/missing.parquet")
    store.fail(ops=("get",), error_type="s3_not_found")
    with pytest.raises(StoreError):
        watched.get("records/missing.parquet")
    assert health.up


def test_the_prober_finds_the_store_back_while_nothing_is_published() -> None:
    store = FailingStore(MemoryStore())
    fault = store.fail(ops=("list",), always=True, error_type="s3_connection")
    events = Events()
    health = _health(store, events)
    probe_at_start(health, "logs", "e")
    prober = StoreProbe(health, 0.01)
    prober.start()
    try:
        events.arrived.clear()
        fault.release()
        store.clear()
        assert events.arrived.wait(30) and events.names()[-1] == "store.available"
        assert health.up
    finally:
        assert prober.close()

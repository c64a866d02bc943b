"""``app.receive.api``: the seam's values refuse what cannot be, a bind failure names the
address, and ``StubPort`` records each call before it answers as told."""

from __future__ import annotations

import threading

import pytest

from app.receive.api import (
    NO_OBSERVER,
    IngestCall,
    IngestOutcome,
    ListenerBindError,
    StubPort,
)
from app.receive.otlp import FlatBatch, Unavailable, flatten
from tests.support.noderig import request


def batch(n: int) -> FlatBatch:
    return flatten(request("api", n), "t")


def test_an_outcome_refuses_negative_counts() -> None:
    assert IngestOutcome(3, 1, "one refused").rejected == 1
    with pytest.raises(ValueError, match="records=-1 rejected=0"):
        IngestOutcome(-1)
    with pytest.raises(ValueError, match="records=0 rejected=-2"):
        IngestOutcome(0, -2)


def test_a_bind_error_names_transport_address_and_cause() -> None:
    exc = ListenerBindError("grpc", "0.0.0.0", 4317, "address in use")
    assert str(exc) == "cannot listen for grpc on 0.0.0.0:4317: address in use"
    assert (exc.transport, exc.host, exc.port, exc.reason) == (
        "grpc",
        "0.0.0.0",
        4317,
        "address in use",
    )
    assert isinstance(exc, OSError)


def test_the_stub_accepts_every_record_by_default_and_records_the_call() -> None:
    port = StubPort()
    rows = batch(4)
    assert port.ingest("t", b"frame", rows, "http") == IngestOutcome(4)
    assert port.calls == [IngestCall("t", b"frame", rows, "http")]
    port.calls.clear()  # a copy: the stub's own record is unchanged
    assert len(port.calls) == 1


def test_the_stub_raises_its_error_after_recording_the_call() -> None:
    port = StubPort(error=Unavailable("wal down"))
    with pytest.raises(Unavailable):
        port.ingest("t", b"x", batch(1), "grpc")
    assert [c.transport for c in port.calls] == ["grpc"]


def test_the_stub_returns_a_fixed_outcome_and_runs_its_hook_first() -> None:
    seen: list[str] = []
    port = StubPort(
        outcome=IngestOutcome(1, 2, "partial"), on_ingest=lambda c: seen.append(c.tenant)
    )
    assert port.ingest("tenant-a", b"x", batch(3), "http") == IngestOutcome(1, 2, "partial")
    assert seen == ["tenant-a"]


def test_the_stub_can_hold_a_caller_in_its_hook() -> None:
    entered, go = threading.Event(), threading.Event()

    def hold(call: IngestCall) -> None:
        entered.set()
        assert go.wait(10)

    port = StubPort(on_ingest=hold)
    results: list[IngestOutcome] = []
    thread = threading.Thread(
        target=lambda: results.append(port.ingest("t", b"x", batch(2), "http"))
    )
    thread.start()
    assert entered.wait(10)
    assert results == [] and len(port.calls) == 1  # recorded, not yet answered
    go.set()
    thread.join(10)
    assert results == [IngestOutcome(2)]


def test_readiness_flags_and_the_null_observer() -> None:
    port = StubPort(ready=False)
    assert not port.ready and port.alive
    port.ready = True
    assert port.ready
    NO_OBSERVER.observe("http", "ok", "", 3, 0.01)  # accepted and ignored: nothing to count

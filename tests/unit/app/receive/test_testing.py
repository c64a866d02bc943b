"""``app.receive.testing``: ``StubPort`` records each call before it answers as told."""

from __future__ import annotations

import threading

import pytest

from app.base.batch import FlatBatch
from app.base.rejections import Unavailable
from app.receive.api import IngestOutcome
from app.receive.otlp import flatten
from app.receive.testing import IngestCall, StubPort
from tests.support.noderig import request


def batch(n: int) -> FlatBatch:
    return flatten(request("api", n), "t")


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


def test_readiness_flags_are_attributes_a_test_flips() -> None:
    port = StubPort(ready=False)
    assert not port.ready and port.alive
    port.ready = True
    assert port.ready

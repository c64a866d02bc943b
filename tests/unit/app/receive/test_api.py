"""``app.receive.api``: the seam's values refuse what cannot be, a bind failure names the
address, and the null observer ignores
what it is told."""

from __future__ import annotations

import pytest

from app.base.batch import FlatBatch
from app.receive.api import NO_OBSERVER, IngestOutcome, ListenerBindError
from app.receive.otlp import flatten
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


def test_the_null_observer_accepts_and_ignores() -> None:
    NO_OBSERVER.observe("http", "ok", "", 3, 0.01)  # accepted and ignored: nothing to count

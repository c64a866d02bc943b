"""Test doubles shipped with the receivers (as ``wal.testing`` ships the WAL's).

``StubPort`` is an ``IngestPort`` (``app.receive.api``) double: it records every call
(an ``IngestCall``) and answers with a fixed outcome or raises a given error, so receiver
tests need no patching. Production code never imports this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from app.base.batch import FlatBatch
from app.receive.api import IngestOutcome

__all__ = ["IngestCall", "StubPort"]


@dataclass(frozen=True, slots=True)
class IngestCall:
    """One `IngestPort.ingest` call as `StubPort` saw it."""

    tenant: str
    payload: bytes
    batch: FlatBatch
    transport: str


class StubPort:
    """An `IngestPort` double: records calls, then raises `error` if set, else returns
    `outcome` (default: every record accepted). `on_ingest` runs first, in the caller's
    thread (a test holds calls there with an `Event` or a `Barrier`). `ready` and
    `alive` are plain attributes a test flips."""

    def __init__(
        self,
        *,
        outcome: IngestOutcome | None = None,
        error: BaseException | None = None,
        on_ingest: Callable[[IngestCall], object] | None = None,
        ready: bool = True,
        alive: bool = True,
    ) -> None:
        self.outcome = outcome
        self.error = error
        self.on_ingest = on_ingest
        self.ready = ready
        self.alive = alive
        self.health_detail = ""
        self._lock = threading.Lock()
        self._calls: list[IngestCall] = []

    @property
    def calls(self) -> list[IngestCall]:
        """A copy of the calls so far, in arrival order."""
        with self._lock:
            return list(self._calls)

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        call = IngestCall(tenant, payload, batch, transport)
        with self._lock:
            self._calls.append(call)
        if self.on_ingest is not None:
            self.on_ingest(call)
        if self.error is not None:
            raise self.error
        return self.outcome if self.outcome is not None else IngestOutcome(len(batch))

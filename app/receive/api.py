"""The seam between the receivers (`app.receive.otlp_http`, `app.receive.otlp_grpc`) and the
ingest pipeline (`app.ingest.pipeline`).

A receiver decodes, validates and authorizes a request, then hands the pipeline three
things: the tenant, the WAL payload (the protobuf `ExportLogsServiceRequest` bytes the
frame stores) and the flattened rows. `IngestPort.ingest` blocks until the covering fsync
and the ingest turn are done, so a return value is the acknowledgement DESIGN.md §5.1
requires ("WAL before ack") and a raised `app.base.rejections.IngestRejection` is what the client
is told. Any other exception is a bug in the pipeline: the receivers answer it with
500 / INTERNAL, log it, and keep serving.

Receivers never call `ingest` for a request with zero records: OTLP says an empty
request is valid, and there is nothing to make durable, so it is acknowledged without a
WAL frame.

Readiness and liveness (DESIGN.md §13) are properties of the pipeline, read by
`GET /readyz` and `GET /healthz`.

The package ships an `IngestPort` double, `app.receive.testing.StubPort`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.base.batch import FlatBatch

__all__ = [
    "NO_OBSERVER",
    "IngestObserver",
    "IngestOutcome",
    "IngestPort",
    "ListenerBindError",
]


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    """What an acknowledged request did: `records` made durable, `rejected` refused
    within an otherwise accepted request (OTLP partial success; `message` says why)."""

    records: int
    rejected: int = 0
    message: str = ""

    def __post_init__(self) -> None:
        if self.records < 0 or self.rejected < 0:
            raise ValueError(
                f"record counts must be >= 0, got records={self.records} rejected={self.rejected}"
            )


class IngestObserver(Protocol):
    """Told about every finished ``POST /v1/logs`` / ``Export`` (the metrics).

    ``outcome`` is ``ok`` (acknowledged), ``refused`` (an ``IngestRejection``, whose
    ``error_type`` rides along) or ``error`` (an unexpected exception, ``internal``);
    ``records`` is what was acknowledged, or for a refusal the records of the refused
    request when it was decoded (0 otherwise); ``seconds`` from the request's arrival to
    its answer."""

    def observe(
        self, transport: str, outcome: str, error_type: str, records: int, seconds: float
    ) -> None: ...


class _NoObserver:
    def observe(
        self, transport: str, outcome: str, error_type: str, records: int, seconds: float
    ) -> None:
        return None


NO_OBSERVER: IngestObserver = _NoObserver()


class IngestPort(Protocol):
    """What the receivers need from the ingest pipeline."""

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        """Append `payload` as one WAL frame for `tenant`, wait for the group-commit
        fsync covering it, and run the ingest turn over `batch`.

        Blocking; the HTTP receiver calls it from a worker thread, the gRPC receiver
        from its handler thread. `transport` is ``"http"`` or ``"grpc"`` (a metrics
        label). Raises `app.base.rejections.IngestRejection` subclasses for refusals:
        `PayloadTooLarge` for a frame over `max_frame_bytes`, `Unavailable` for WAL
        failures and backpressure (`retry_after` set where DESIGN.md §7 gives a hint),
        `BadRequest`.
        """
        ...

    @property
    def ready(self) -> bool:
        """Recovery is done and the WAL accepts appends (not in the terminal state)."""
        ...

    @property
    def alive(self) -> bool:
        """The process is able to serve; stays true in the terminal rotation state, false
        once one of its threads stopped for good."""
        ...

    @property
    def health_detail(self) -> str:
        """Why the process is not alive, for `/healthz`'s body ("" while it is)."""
        ...


class ListenerBindError(OSError):
    """A receiver could not listen on its address; names the address and the cause."""

    def __init__(self, transport: str, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen for {transport} on {host}:{port}: {reason}")
        self.transport = transport
        self.host = host
        self.port = port
        self.reason = reason

"""Tests for app/receive/otlp_grpc.py: LogsService/Export through real grpcio stubs against
the real server on 127.0.0.1, with `StubPort` in place of the pipeline.

Every refusal test checks that nothing reached the pipeline; every server a test starts
is stopped (the suite fails a test that leaves its handler pool running).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge, Unavailable
from app.ingest.tenants import SettlementInProgress, TenantCapacity, TenantUnrecoverable
from app.receive.api import IngestOutcome, ListenerBindError
from app.receive.auth import Authenticator
from app.receive.inflight import InflightBudget, ReceiverBounds
from app.receive.otlp import RequestLimits
from app.receive.otlp_grpc import EXPORT_METHOD, create_grpc_server
from app.receive.testing import StubPort
from tests.support.decode_slots import WatchedBudget, watch

KiB = 1 << 10
MiB = 1 << 20
LIMIT = 64 * KiB
TOKENS = {"tok-acme": frozenset({"acme"}), "tok-multi": frozenset({"acme", "globex"})}
STATUS_DETAILS = "grpc-status-details-bin"


def make_request(records: int = 3, *, body_text: str = "hello") -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    for i in range(records):
        sl.log_records.append(
            logs_pb2.LogRecord(
                time_unix_nano=1_700_000_000_000_000_000 + i,
                body=common_pb2.AnyValue(string_value=f"{body_text} {i}"),
            )
        )
    return req


@dataclass
class Client:
    stub: logs_service_pb2_grpc.LogsServiceStub
    raw: grpc.UnaryUnaryMultiCallable  # bytes in, bytes out
    pipeline: StubPort
    port: int

    def export(
        self,
        req: ExportLogsServiceRequest,
        metadata: Sequence[tuple[str, str]] = (),
        compression: grpc.Compression | None = None,
    ) -> ExportLogsServiceResponse:
        response: ExportLogsServiceResponse = self.stub.Export(
            req, metadata=tuple(metadata), compression=compression, timeout=30
        )
        return response

    def refused(
        self,
        req: ExportLogsServiceRequest | bytes,
        metadata: Sequence[tuple[str, str]] = (),
        compression: grpc.Compression | None = None,
    ) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            if isinstance(req, bytes):
                self.raw(req, metadata=tuple(metadata), compression=compression, timeout=30)
            else:
                self.export(req, metadata, compression)
        error: grpc.RpcError = info.value
        return error


@dataclass
class Harness:
    pipeline: StubPort
    stack: list[tuple[grpc.Server, grpc.Channel]]

    def start(
        self,
        *,
        tokens: dict[str, frozenset[str]] | None = None,
        max_frame_bytes: int = LIMIT,
        max_workers: int = 8,
        bounds: ReceiverBounds | None = None,
    ) -> Client:
        server, port = create_grpc_server(
            self.pipeline,
            max_frame_bytes=max_frame_bytes,
            authenticator=Authenticator(tokens),
            host="127.0.0.1",
            port=0,
            max_workers=max_workers,
            bounds=bounds,
        )
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stack.append((server, channel))
        raw = channel.unary_unary(EXPORT_METHOD)
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
        return Client(stub, raw, self.pipeline, port)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(StubPort(), [])
    try:
        yield h
    finally:
        for server, channel in reversed(h.stack):
            channel.close()
            assert server.stop(None).wait(timeout=10)


@pytest.fixture
def client(harness: Harness) -> Client:
    return harness.start()


def status_details(error: grpc.RpcError) -> status_pb2.Status | None:
    for key, value in error.trailing_metadata() or ():
        if key == STATUS_DETAILS:
            return status_pb2.Status.FromString(value)
    return None


# ── success ─────────────────────────────────────────────────────────────────────────


def test_export_success_stores_the_message_bytes(client: Client) -> None:
    req = make_request(5)
    response = client.export(req, [("x-ourios-tenant", "team-a")])
    assert response == ExportLogsServiceResponse()
    assert not response.HasField("partial_success")
    (only,) = client.pipeline.calls
    assert only.tenant == "team-a"
    assert only.payload == req.SerializeToString()
    assert only.transport == "grpc"
    assert only.batch.bodies == [f"hello {i}" for i in range(5)]


def test_open_mode_default_tenant(client: Client) -> None:
    client.export(make_request(1))
    assert [c.tenant for c in client.pipeline.calls] == ["default"]


def test_partial_success(client: Client) -> None:
    client.pipeline.outcome = IngestOutcome(records=1, rejected=2, message="2 too old")
    response = client.export(make_request(3))
    assert response.partial_success.rejected_log_records == 2
    assert response.partial_success.error_message == "2 too old"


def test_gzip_request_is_stored_decompressed(client: Client) -> None:
    req = make_request(20)
    assert client.export(req, compression=grpc.Compression.Gzip) == ExportLogsServiceResponse()
    assert client.pipeline.calls[0].payload == req.SerializeToString()


@pytest.mark.parametrize(
    "req",
    [
        pytest.param(ExportLogsServiceRequest(), id="empty"),
        pytest.param(make_request(0), id="no_records"),
    ],
)
def test_empty_request_is_acknowledged_without_a_wal_frame(
    client: Client, req: ExportLogsServiceRequest
) -> None:
    assert client.export(req) == ExportLogsServiceResponse()
    assert client.pipeline.calls == []


def test_handler_threads_wait_in_the_pipeline_together(harness: Harness) -> None:
    workers = 16
    barrier = threading.Barrier(workers, timeout=20)
    harness.pipeline.on_ingest = lambda call: barrier.wait()
    client = harness.start(max_workers=workers)
    pending = [client.stub.Export.future(make_request(1), timeout=30) for _ in range(workers)]
    assert [f.result() for f in pending] == [ExportLogsServiceResponse()] * workers
    assert len(harness.pipeline.calls) == workers


# ── DESIGN.md §7, pipeline refusals ─────────────────────────────────────────────────

SECTION7_PIPELINE_ROWS = [
    pytest.param(BadRequest("frame rejected"), grpc.StatusCode.INVALID_ARGUMENT, id="bad_request"),
    pytest.param(PayloadTooLarge(LIMIT), grpc.StatusCode.RESOURCE_EXHAUSTED, id="frame_too_large"),
    pytest.param(
        Unavailable("WAL fsync failed: EIO; retrying"), grpc.StatusCode.UNAVAILABLE, id="transient"
    ),
    pytest.param(
        Unavailable("WAL terminal state rotation_exhausted; first error: ENOSPC"),
        grpc.StatusCode.UNAVAILABLE,
        id="terminal",
    ),
    pytest.param(
        TenantCapacity("x", 1024, 1024), grpc.StatusCode.UNAVAILABLE, id="tenant_capacity"
    ),
    pytest.param(
        SettlementInProgress("x", 5), grpc.StatusCode.UNAVAILABLE, id="settling_retry_info"
    ),
    pytest.param(
        TenantUnrecoverable("x", "below reclaimed_through"),
        grpc.StatusCode.UNAVAILABLE,
        id="unrecoverable",
    ),
    pytest.param(
        Unavailable("disk below stop-water", retry_after=60),
        grpc.StatusCode.UNAVAILABLE,
        id="disk_retry_info",
    ),
]


@pytest.mark.parametrize(("error", "code"), SECTION7_PIPELINE_ROWS)
def test_section7_pipeline_refusals(
    client: Client, error: IngestRejection, code: grpc.StatusCode
) -> None:
    client.pipeline.error = error
    refused = client.refused(make_request(2))
    assert refused.code() == code
    assert refused.details() == error.message
    details = status_details(refused)
    if error.retry_after is None:
        assert details is None
    else:
        assert details is not None
        assert details.code == code.value[0]
        assert details.message == error.message
        (detail,) = details.details
        info = error_details_pb2.RetryInfo()
        assert detail.Unpack(info)
        assert info.retry_delay.seconds == error.retry_after
    assert len(client.pipeline.calls) == 1


def test_unexpected_exception_is_internal_and_the_server_stays_up(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.pipeline.error = RuntimeError("boom")
    refused = client.refused(make_request(1))
    assert refused.code() == grpc.StatusCode.INTERNAL
    assert "boom" not in refused.details()
    assert any(r.name == "ourios.grpc" and r.exc_info for r in caplog.records)
    client.pipeline.error = None
    assert client.export(make_request(1)) == ExportLogsServiceResponse()


# ── DESIGN.md §7, receiver refusals: nothing reaches the pipeline ───────────────────


def _bad_trace_id() -> ExportLogsServiceRequest:
    req = make_request(1)
    req.resource_logs[0].scope_logs[0].log_records[0].trace_id = b"\x01" * 5
    return req


@pytest.mark.parametrize(
    ("req", "metadata"),
    [
        pytest.param(b"\xff\xff\xff", [], id="undecodable"),
        pytest.param(_bad_trace_id(), [], id="bad_trace_id"),
        pytest.param(make_request(1), [("x-ourios-tenant", "a:b")], id="bad_tenant"),
        pytest.param(
            make_request(1), [("x-ourios-tenant", "a"), ("x-ourios-tenant", "b")], id="two_tenants"
        ),
    ],
)
def test_invalid_argument(
    client: Client, req: ExportLogsServiceRequest | bytes, metadata: list[tuple[str, str]]
) -> None:
    refused = client.refused(req, metadata)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details()
    assert status_details(refused) is None
    assert client.pipeline.calls == []


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param([("x-ourios-tenant", "acme")], id="missing"),
        pytest.param([("authorization", "Bearer wrong")], id="wrong"),
        pytest.param([("authorization", "Basic tok-acme")], id="wrong_scheme"),
    ],
)
def test_unauthenticated(harness: Harness, metadata: list[tuple[str, str]]) -> None:
    client = harness.start(tokens=TOKENS)
    refused = client.refused(make_request(1), metadata)
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "tok-acme" not in refused.details()
    assert harness.pipeline.calls == []


def test_permission_denied_for_another_tenant(harness: Harness) -> None:
    client = harness.start(tokens=TOKENS)
    refused = client.refused(
        make_request(1), [("authorization", "Bearer tok-acme"), ("x-ourios-tenant", "globex")]
    )
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'globex'" in refused.details()
    assert "tok-acme" not in refused.details()
    assert harness.pipeline.calls == []


def test_token_tenants(harness: Harness) -> None:
    client = harness.start(tokens=TOKENS)
    client.export(make_request(1), [("authorization", "Bearer tok-acme")])
    missing = client.refused(make_request(1), [("authorization", "bearer tok-multi")])
    assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT
    client.export(
        make_request(1), [("authorization", "bearer tok-multi"), ("x-ourios-tenant", "globex")]
    )
    assert [c.tenant for c in harness.pipeline.calls] == ["acme", "globex"]


def test_message_over_the_limit_is_resource_exhausted(client: Client) -> None:
    req = make_request(1, body_text="x" * LIMIT)
    assert req.ByteSize() > LIMIT
    refused = client.refused(req)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_details(refused) is None  # no RetryInfo: resending fails the same way
    assert client.pipeline.calls == []


def test_gzip_message_inflating_past_the_limit_is_resource_exhausted(client: Client) -> None:
    # Compressed it is a few hundred bytes; grpcio checks the decompressed size too.
    req = make_request(1, body_text="\x00" * (16 * MiB))
    refused = client.refused(req, compression=grpc.Compression.Gzip)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Decompressed message larger than max" in refused.details()
    assert status_details(refused) is None
    assert client.pipeline.calls == []


def test_a_message_of_exactly_the_limit_is_accepted(client: Client) -> None:
    pad = LIMIT
    req = make_request(1, body_text="x" * pad)
    while req.ByteSize() != LIMIT:
        pad -= req.ByteSize() - LIMIT
        req = make_request(1, body_text="x" * pad)
    client.export(req)
    client.export(req, compression=grpc.Compression.Gzip)
    assert len(client.pipeline.calls) == 2


def test_other_methods_are_unimplemented(client: Client) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{client.port}")
    try:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(f"/{EXPORT_METHOD.split('/')[1]}/Other")(b"", timeout=30)
    finally:
        channel.close()
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


# ── the server object ───────────────────────────────────────────────────────────────


def test_a_taken_port_is_refused(harness: Harness, client: Client) -> None:
    with pytest.raises(ListenerBindError, match=f"127.0.0.1:{client.port}"):
        create_grpc_server(
            harness.pipeline,
            max_frame_bytes=LIMIT,
            authenticator=Authenticator(None),
            host="127.0.0.1",
            port=client.port,
        )


def test_stop_with_grace_waits_for_the_pool(harness: Harness) -> None:
    entered = threading.Event()
    release = threading.Event()

    def hold(call: object) -> None:
        entered.set()
        release.wait(10)

    harness.pipeline.on_ingest = hold
    server, port = create_grpc_server(
        harness.pipeline,
        max_frame_bytes=LIMIT,
        authenticator=Authenticator(None),
        host="127.0.0.1",
        port=0,
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
        pending = stub.Export.future(make_request(1), timeout=30)
        assert entered.wait(10)
        stopped = server.stop(grace=10)
        assert not stopped.is_set()  # the RPC in flight is still running
        release.set()
        assert pending.result() == ExportLogsServiceResponse()
        assert stopped.wait(10)
        assert server.stop(None).is_set()  # a second stop returns the same event
    finally:
        release.set()
        channel.close()
        server.stop(None).wait(10)


def test_create_grpc_server_refuses_bad_bounds(harness: Harness) -> None:
    for kwargs in ({"max_frame_bytes": 0}, {"max_workers": 0}):
        with pytest.raises(ValueError):
            create_grpc_server(
                harness.pipeline,
                **{"max_frame_bytes": LIMIT, **kwargs},  # type: ignore[arg-type]
                authenticator=Authenticator(None),
                host="127.0.0.1",
                port=0,
            )


# ── the in-flight bound, the receive timeout, the expansion limits (issue 21 item 3) ──


def bounds(
    requests: int = 256, *, timeout: float = 30.0, rpcs: int = 256, **limits: int
) -> ReceiverBounds:
    return ReceiverBounds(
        RequestLimits(**limits), InflightBudget(requests, 64 * MiB), timeout, rpcs
    )


def hold_pipeline(pipeline: StubPort) -> tuple[threading.Event, threading.Event]:
    entered, release = threading.Event(), threading.Event()

    def hold(call: object) -> None:
        entered.set()
        assert release.wait(20)

    pipeline.on_ingest = hold
    return entered, release


def test_bounded_3_grpc_authenticates_before_receiving_the_message(harness: Harness) -> None:
    # Far over grpcio's receive bound: were the message received first, grpcio itself
    # would answer RESOURCE_EXHAUSTED after inflating it.
    client = harness.start(tokens=TOKENS)
    refused = client.refused(b"\x00" * (5 * LIMIT), compression=grpc.Compression.Gzip)
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert harness.pipeline.calls == []


def refused_behind_one_held(
    harness: Harness, limits: ReceiverBounds
) -> tuple[Client, grpc.RpcError]:
    """Start the server with ``limits``; while one Export is held in the pipeline, a
    second is refused: the client and that refusal (the held one answered after)."""
    entered, release = hold_pipeline(harness.pipeline)
    client = harness.start(bounds=limits)
    first = client.stub.Export.future(make_request(1), timeout=30)
    try:
        assert entered.wait(20)
        refused = client.refused(make_request(1))
    finally:
        release.set()
    first.result()
    return client, refused


def test_bounded_3_grpc_inflight_bound_is_resource_exhausted_with_retry_info(
    harness: Harness,
) -> None:
    client, refused = refused_behind_one_held(harness, bounds(requests=1))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server.max_inflight_requests=1" in refused.details()
    details = status_details(refused)
    assert details is not None
    retry = error_details_pb2.RetryInfo()
    assert details.details[0].Unpack(retry) and retry.retry_delay.seconds == 1
    assert len(harness.pipeline.calls) == 1
    client.export(make_request(1))  # returned once answered


def test_bounded_3_grpc_concurrent_rpcs_are_bounded(harness: Harness) -> None:
    _, refused = refused_behind_one_held(harness, bounds(rpcs=1))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(harness.pipeline.calls) == 1


def test_bounded_3_grpc_slow_message_is_cancelled_after_the_read_timeout(
    harness: Harness,
) -> None:
    client = harness.start(bounds=bounds(timeout=1.0))
    channel = harness.stack[-1][1]
    never = threading.Event()

    def messages() -> Iterator[bytes]:
        never.wait(30)  # the client never sends its message
        yield make_request(1).SerializeToString()

    call = channel.stream_unary(EXPORT_METHOD)
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(messages(), timeout=30)
    finally:
        never.set()
    assert info.value.code() == grpc.StatusCode.CANCELLED
    assert harness.pipeline.calls == []
    client.export(make_request(1))  # the server goes on serving


def test_native_1_grpc_decodes_natively_in_a_decode_slot(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = WatchedBudget(256, 64 * MiB, 1)
    seen = watch(monkeypatch, budget)
    client = harness.start(bounds=ReceiverBounds(RequestLimits(), budget, 30.0, 256))
    client.export(make_request(3))
    assert seen == [(1, True)]  # the native decoder answered, holding the one slot
    assert budget.requests == 0 and budget.bytes == 0  # the ticket was returned
    assert len(harness.pipeline.calls) == 1


def test_bounded_3_grpc_expansion_limit_is_invalid_argument_naming_it(harness: Harness) -> None:
    client = harness.start(bounds=bounds(records=2))
    refused = client.refused(make_request(3))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "over server.max_request_records=2" in refused.details()
    assert status_details(refused) is None
    assert harness.pipeline.calls == []

"""Tests for app/receive/otlp_http.py: POST /v1/logs, the probes, /metrics, the server.

Most tests drive the ASGI app in-process through `_call`, a minimal ASGI client that
also counts how many body chunks the app pulled (so "refused without reading the body"
is observable). A second group runs the app on a real uvicorn (uvloop + httptools) on
127.0.0.1 with `http.client` and raw asyncio sockets. `StubPort` stands in for the
pipeline; every refusal test also checks that nothing reached it.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import http.client
import json
import logging
import socket
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from fastapi import FastAPI
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from app.base.batch import FlatBatch
from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge, Unavailable
from app.ingest.tenants import SettlementInProgress, TenantCapacity, TenantUnrecoverable
from app.receive import otlp_http as http_receiver
from app.receive.api import IngestOutcome, ListenerBindError
from app.receive.auth import BEARER_CHALLENGE, Authenticator
from app.receive.inflight import InflightBudget, ReceiverBounds
from app.receive.otlp import RequestLimits, decode_request, to_wal_payload
from app.receive.otlp_http import (
    DISCARD_BYTES,
    create_http_app,
    http_server,
    raw_body_cap,
    start_in_thread,
    stop_in_thread,
)
from app.receive.testing import StubPort
from tests.support.decode_slots import WatchedBudget, watch

PB = "application/x-protobuf"
JSON = "application/json"
KiB = 1 << 10
MiB = 1 << 20
LIMIT = 1 * MiB
TOKENS = {"tok-acme": frozenset({"acme"}), "tok-multi": frozenset({"acme", "globex"})}
METRICS = (b"# HELP ourios_up 1\nourios_up 1\n", "text/plain; version=0.0.4; charset=utf-8")


# ── requests ────────────────────────────────────────────────────────────────────────


def make_request(records: int = 3, *, body_text: str = "hello") -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="service.name", value=common_pb2.AnyValue(string_value="svc"))
    sl = rl.scope_logs.add()
    sl.scope.name = "test"
    for i in range(records):
        sl.log_records.append(
            logs_pb2.LogRecord(
                time_unix_nano=1_700_000_000_000_000_000 + i,
                severity_number=logs_pb2.SEVERITY_NUMBER_INFO,
                body=common_pb2.AnyValue(string_value=f"{body_text} {i}"),
            )
        )
    return req


def pb_body(records: int = 3) -> bytes:
    data: bytes = make_request(records).SerializeToString()
    return data


def json_body(records: int = 3) -> bytes:
    return json.dumps(json_format.MessageToDict(make_request(records))).encode()


def sized_request(size: int) -> bytes:
    """A valid one-record protobuf request of exactly `size` bytes."""
    pad = size
    for _ in range(8):
        data: bytes = make_request(1, body_text="x" * pad).SerializeToString()
        if len(data) == size:
            return data
        pad -= len(data) - size
    raise AssertionError(f"could not build a request of {size} bytes")


def gzip_zeros(total: int, block: int = MiB) -> bytes:
    """A valid gzip stream of `total` zero bytes, built without holding them.

    After a full flush deflate's state no longer depends on earlier input, so each
    further block of zeros compresses to the same bytes; the trailer (CRC-32, size) is
    computed over the blocks as a stream."""
    assert total % block == 0
    zeros = bytes(block)
    deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeat = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush(zlib.Z_FINISH)[:-8]  # the final block without the trailer
    crc = 0
    for _ in range(total // block):
        crc = zlib.crc32(zeros, crc)
    trailer = struct.pack("<II", crc, total & 0xFFFFFFFF)
    return first + repeat * (total // block - 1) + end + trailer


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return gzip_zeros(1 << 30)  # 1 GiB of zeros, about 1 MiB compressed


def test_gzip_zeros_is_a_valid_stream() -> None:
    assert gzip.decompress(gzip_zeros(4 * MiB)) == bytes(4 * MiB)


# ── an in-process ASGI client ───────────────────────────────────────────────────────


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks_pulled: int = 0

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def status_message(self) -> status_pb2.Status:
        status = status_pb2.Status()
        if self.content_type.startswith(JSON):
            json_format.Parse(self.body, status)
        else:
            assert self.content_type == PB
            status.ParseFromString(self.body)
        return status

    def export_response(self) -> ExportLogsServiceResponse:
        response = ExportLogsServiceResponse()
        if self.content_type.startswith(JSON):
            json_format.Parse(self.body, response)
        else:
            assert self.content_type == PB
            response.ParseFromString(self.body)
        return response


async def _asgi_call(
    app: FastAPI,
    method: str,
    path: str,
    headers: Iterable[tuple[str, str]],
    chunks: Iterable[bytes],
) -> Reply:
    source = iter(chunks)
    pending = next(source, None)
    pulled = 0
    done = asyncio.Event()
    started: dict[str, object] = {}
    parts: list[bytes] = []

    async def receive() -> dict[str, object]:
        nonlocal pending, pulled
        if pending is None:
            await done.wait()
            return {"type": "http.disconnect"}
        chunk, pending = pending, next(source, None)
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pending is not None}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))  # type: ignore[arg-type]
            if not message.get("more_body"):
                done.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 4318),
        "state": {},
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    raw_headers = started["headers"]
    assert isinstance(raw_headers, list)
    return Reply(
        status=int(started["status"]),  # type: ignore[call-overload]
        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers},
        body=b"".join(parts),
        chunks_pulled=pulled,
    )


def call(
    app: FastAPI,
    body: bytes | Iterable[bytes] = b"",
    *,
    method: str = "POST",
    path: str = "/v1/logs",
    content_type: str | None = PB,
    headers: Iterable[tuple[str, str]] = (),
    content_length: bool = True,
) -> Reply:
    all_headers = list(headers)
    if content_type is not None:
        all_headers.append(("content-type", content_type))
    if isinstance(body, bytes):
        if content_length:
            all_headers.append(("content-length", str(len(body))))
        chunks: Iterable[bytes] = [body]
    else:
        chunks = body
    return asyncio.run(_asgi_call(app, method, path, all_headers, chunks))


@pytest.fixture
def pipeline() -> StubPort:
    return StubPort()


def make_app(
    pipeline: StubPort,
    *,
    tokens: dict[str, frozenset[str]] | None = None,
    max_frame_bytes: int = LIMIT,
    metrics_text: Callable[[], tuple[bytes, str]] = lambda: METRICS,
    ingest_concurrency: int = 256,
    bounds: ReceiverBounds | None = None,
) -> FastAPI:
    return create_http_app(
        pipeline,
        max_frame_bytes=max_frame_bytes,
        authenticator=Authenticator(tokens),
        metrics_text=metrics_text,
        ingest_concurrency=ingest_concurrency,
        bounds=bounds,
    )


@pytest.fixture
def app(pipeline: StubPort) -> FastAPI:
    return make_app(pipeline)


class LoopPort(StubPort):
    """A pipeline that answers on the event loop (a worker's ``RemotePort``): its
    blocking ``ingest`` must not be called, and each awaited call records the thread."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        raise AssertionError("the blocking ingest was called on an event-loop pipeline")

    async def ingest_async(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        self.threads.append(threading.get_ident())
        return super().ingest(tenant, payload, batch, transport)


def test_an_event_loop_pipeline_is_awaited_without_a_thread_per_request() -> None:
    pipeline = LoopPort()
    app = make_app(pipeline)
    for body, headers in (
        (pb_body(3), []),  # decoded on the loop
        (gzip.compress(pb_body(4)), [("content-encoding", "gzip")]),  # inflated on a thread
    ):
        reply = call(app, body, headers=[("x-ourios-tenant", "team-a"), *headers])
        assert reply.status == 200, reply.body
    assert [len(c.batch) for c in pipeline.calls] == [3, 4]
    assert pipeline.calls[1].payload == pb_body(4)  # the WAL keeps the inflated body
    # Awaited on the test's event loop thread both times: no hop to a worker thread.
    assert pipeline.threads == [threading.get_ident()] * 2


def assert_status(reply: Reply, http_status: int, code: grpc.StatusCode, *, as_json: bool) -> None:
    assert reply.status == http_status, reply.body
    assert reply.content_type == (JSON if as_json else PB)
    assert reply.status_message().code == code.value[0]


# ── success ─────────────────────────────────────────────────────────────────────────


def test_protobuf_success_stores_the_body_as_received(app: FastAPI, pipeline: StubPort) -> None:
    body = pb_body(5)
    reply = call(app, body, headers=[("x-ourios-tenant", "team-a")])
    assert reply.status == 200
    assert reply.content_type == PB
    assert reply.body == b""  # an empty ExportLogsServiceResponse
    assert not reply.export_response().HasField("partial_success")
    assert "retry-after" not in reply.headers
    (only,) = pipeline.calls
    assert only.tenant == "team-a"
    assert only.payload == body
    assert only.transport == "http"
    assert len(only.batch) == 5
    assert only.batch.bodies == [f"hello {i}" for i in range(5)]


def test_json_success_stores_the_protobuf_it_parsed_to(app: FastAPI, pipeline: StubPort) -> None:
    reply = call(app, json_body(4), content_type="application/json; charset=utf-8")
    assert reply.status == 200
    assert reply.content_type == JSON
    assert json.loads(reply.body) == {}
    (only,) = pipeline.calls
    assert only.tenant == "default"
    assert only.payload == to_wal_payload(make_request(4))
    assert ExportLogsServiceRequest.FromString(only.payload) == make_request(4)
    assert len(only.batch) == 4


@pytest.mark.parametrize("media_type", sorted(http_receiver._PROTOBUF_MEDIA_TYPES))
def test_protobuf_media_types_agree_with_the_decoder(
    app: FastAPI, pipeline: StubPort, media_type: str
) -> None:
    decode_request(b"", media_type)  # the decoder reads it as protobuf too
    assert call(app, pb_body(1), content_type=media_type).status == 200
    assert len(pipeline.calls) == 1


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_partial_success_reports_rejected_records(pipeline: StubPort, as_json: bool) -> None:
    pipeline.outcome = IngestOutcome(records=2, rejected=3, message="3 records too old")
    app = make_app(pipeline)
    body, ctype = (json_body(5), JSON) if as_json else (pb_body(5), PB)
    reply = call(app, body, content_type=ctype)
    assert reply.status == 200
    assert reply.content_type == ctype
    partial = reply.export_response().partial_success
    assert partial.rejected_log_records == 3
    assert partial.error_message == "3 records too old"


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_gzip_body_is_inflated_and_stored_decompressed(
    app: FastAPI, pipeline: StubPort, as_json: bool
) -> None:
    raw, ctype = (json_body(3), JSON) if as_json else (pb_body(3), PB)
    reply = call(
        app, gzip.compress(raw), content_type=ctype, headers=[("content-encoding", "gzip")]
    )
    assert reply.status == 200
    (only,) = pipeline.calls
    assert only.payload == (to_wal_payload(make_request(3)) if as_json else raw)


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        pytest.param(b"", PB, id="empty_protobuf"),
        pytest.param(b"{}", JSON, id="empty_json"),
        pytest.param(pb_body(0), PB, id="groups_without_records"),
        pytest.param(gzip.compress(b""), PB, id="empty_gzip"),
    ],
)
def test_empty_request_is_acknowledged_without_a_wal_frame(
    app: FastAPI, pipeline: StubPort, body: bytes, ctype: str
) -> None:
    headers = [("content-encoding", "gzip")] if body[:2] == b"\x1f\x8b" else []
    reply = call(app, body, content_type=ctype, headers=headers)
    assert reply.status == 200
    assert reply.export_response() == ExportLogsServiceResponse()
    assert pipeline.calls == []


def test_chunked_body_is_reassembled(app: FastAPI, pipeline: StubPort) -> None:
    body = pb_body(50)
    chunks = [body[i : i + 100] for i in range(0, len(body), 100)]
    reply = call(app, chunks)
    assert reply.status == 200
    assert pipeline.calls[0].payload == body


def test_a_body_of_exactly_the_limit_is_accepted(pipeline: StubPort) -> None:
    app = make_app(pipeline, max_frame_bytes=64 * KiB)
    body = sized_request(64 * KiB)
    assert call(app, body).status == 200
    gz = call(app, gzip.compress(body), headers=[("content-encoding", "gzip")])
    assert gz.status == 200
    assert [c.payload for c in pipeline.calls] == [body, body]


def test_the_registered_route_answers_like_the_fast_path(app: FastAPI, pipeline: StubPort) -> None:
    # POST /v1/logs is dispatched before FastAPI's stack; the router's copy (what a
    # mounted app would use) must behave the same.
    router_path = functools.partial(FastAPI.__call__, app)
    for target in (app, router_path):
        ok = call(target, pb_body(2))  # type: ignore[arg-type]
        assert (ok.status, ok.content_type, ok.body) == (200, PB, b"")
        bad = call(target, b"{", content_type=JSON)  # type: ignore[arg-type]
        assert_status(bad, 400, grpc.StatusCode.INVALID_ARGUMENT, as_json=True)
    assert len(pipeline.calls) == 2


def test_many_requests_wait_in_the_pipeline_at_once(pipeline: StubPort) -> None:
    # More than anyio's default 40 worker threads: a group commit acknowledges many
    # waiters with one fsync, so they must all be able to wait at the same time.
    waiting = 64
    barrier = threading.Barrier(waiting, timeout=20)
    pipeline.on_ingest = lambda call: barrier.wait()
    app = make_app(pipeline, ingest_concurrency=waiting)
    body = pb_body(1)
    headers = [("content-type", PB), ("content-length", str(len(body)))]

    async def all_at_once() -> list[Reply]:
        return await asyncio.gather(
            *(_asgi_call(app, "POST", "/v1/logs", headers, [body]) for _ in range(waiting))
        )

    replies = asyncio.run(all_at_once())
    assert [r.status for r in replies] == [200] * waiting
    assert len(pipeline.calls) == waiting


def test_success_logs_nothing(
    app: FastAPI, pipeline: StubPort, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert call(app, pb_body(2)).status == 200
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert [r for r in caplog.records if r.name.startswith("ourios")] == []


# ── DESIGN.md §7, pipeline refusals ─────────────────────────────────────────────────

SECTION7_PIPELINE_ROWS = [
    pytest.param(BadRequest("frame rejected: tenant"), 400, None, id="400_bad_request"),
    pytest.param(PayloadTooLarge(LIMIT), 413, None, id="413_frame_over_max_frame_bytes"),
    pytest.param(Unavailable("WAL fsync failed: EIO; retrying"), 503, None, id="503_transient_wal"),
    pytest.param(
        Unavailable("rotation retrying (attempt 2 of 3)"), 503, None, id="503_rotation_retrying"
    ),
    pytest.param(
        Unavailable("WAL terminal state rotation_exhausted; first error: ENOSPC"),
        503,
        None,
        id="503_terminal",
    ),
    pytest.param(TenantCapacity("x", 1024, 1024), 503, None, id="503_tenant_capacity"),
    pytest.param(SettlementInProgress("x", 5), 503, 5, id="503_settling_retry"),
    pytest.param(
        TenantUnrecoverable("x", "below reclaimed_through"), 503, None, id="503_unrecoverable"
    ),
    pytest.param(
        Unavailable("disk below stop-water 1 GiB", retry_after=60), 503, 60, id="503_disk_retry"
    ),
]


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
@pytest.mark.parametrize(("error", "http_status", "retry_after"), SECTION7_PIPELINE_ROWS)
def test_section7_pipeline_refusals(
    pipeline: StubPort,
    error: IngestRejection,
    http_status: int,
    retry_after: int | None,
    as_json: bool,
) -> None:
    pipeline.error = error
    app = make_app(pipeline)
    body, ctype = (json_body(2), JSON) if as_json else (pb_body(2), PB)
    reply = call(app, body, content_type=ctype)
    assert_status(reply, http_status, error.grpc_code, as_json=as_json)
    status = reply.status_message()
    assert status.message == error.message
    if retry_after is None:
        assert "retry-after" not in reply.headers
        assert list(status.details) == []
    else:
        assert reply.headers["retry-after"] == str(retry_after)
        (detail,) = status.details
        info = error_details_pb2.RetryInfo()
        assert detail.Unpack(info)
        assert info.retry_delay.seconds == retry_after
    assert len(pipeline.calls) == 1


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_unexpected_exception_is_500_internal_and_logged(
    pipeline: StubPort, as_json: bool, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline.error = RuntimeError("boom: secret detail")
    app = make_app(pipeline)
    body, ctype = (json_body(1), JSON) if as_json else (pb_body(1), PB)
    with caplog.at_level(logging.ERROR, logger="ourios.http"):
        reply = call(app, body, content_type=ctype)
    assert_status(reply, 500, grpc.StatusCode.INTERNAL, as_json=as_json)
    assert "boom" not in reply.status_message().message
    assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)
    pipeline.error = None
    assert call(app, body, content_type=ctype).status == 200


# ── DESIGN.md §7, receiver refusals: nothing reaches the pipeline ───────────────────


@pytest.mark.parametrize(
    ("body", "ctype", "headers"),
    [
        pytest.param(b"\xff\xff\xff", PB, [], id="undecodable_protobuf"),
        pytest.param(b"{not json", JSON, [], id="bad_json"),
        pytest.param(b"[]", JSON, [], id="json_not_an_object"),
        pytest.param(pb_body(1), PB, [("x-ourios-tenant", "a/b")], id="bad_tenant"),
        pytest.param(pb_body(1), PB, [("x-ourios-tenant", "")], id="empty_tenant"),
        pytest.param(
            pb_body(1), PB, [("x-ourios-tenant", "a"), ("x-ourios-tenant", "b")], id="two_tenants"
        ),
        pytest.param(b"\x1f\x8bnot gzip", PB, [("content-encoding", "gzip")], id="bad_gzip"),
        pytest.param(
            gzip.compress(pb_body(1))[:-4], PB, [("content-encoding", "gzip")], id="truncated_gzip"
        ),
    ],
)
def test_400_invalid_argument(
    app: FastAPI,
    pipeline: StubPort,
    body: bytes,
    ctype: str,
    headers: list[tuple[str, str]],
) -> None:
    reply = call(app, body, content_type=ctype, headers=headers)
    assert_status(reply, 400, grpc.StatusCode.INVALID_ARGUMENT, as_json=ctype == JSON)
    assert reply.status_message().message
    assert pipeline.calls == []


@pytest.mark.parametrize(
    ("authorization", "challenge"),
    [
        pytest.param(None, BEARER_CHALLENGE, id="missing"),
        pytest.param("Bearer wrong", f'{BEARER_CHALLENGE}, error="invalid_token"', id="wrong"),
        pytest.param("tok-acme", f'{BEARER_CHALLENGE}, error="invalid_request"', id="no_scheme"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_401_unauthenticated_with_challenge(
    pipeline: StubPort, authorization: str | None, challenge: str, as_json: bool
) -> None:
    app = make_app(pipeline, tokens=TOKENS)
    headers = [("x-ourios-tenant", "acme")]
    if authorization is not None:
        headers.append(("authorization", authorization))
    body, ctype = (json_body(1), JSON) if as_json else (pb_body(1), PB)
    reply = call(app, body, content_type=ctype, headers=headers)
    assert_status(reply, 401, grpc.StatusCode.UNAUTHENTICATED, as_json=as_json)
    assert reply.headers["www-authenticate"] == challenge
    assert "tok-acme" not in reply.body.decode("latin-1")
    assert pipeline.calls == []


def test_403_another_tenants_token(pipeline: StubPort) -> None:
    app = make_app(pipeline, tokens=TOKENS)
    reply = call(
        app,
        pb_body(1),
        headers=[("authorization", "Bearer tok-acme"), ("x-ourios-tenant", "globex")],
    )
    assert_status(reply, 403, grpc.StatusCode.PERMISSION_DENIED, as_json=False)
    message = reply.status_message().message
    assert "'globex'" in message
    assert "tok-acme" not in message
    assert "www-authenticate" not in reply.headers
    assert pipeline.calls == []


def test_token_with_one_tenant_defaults_to_it(pipeline: StubPort) -> None:
    app = make_app(pipeline, tokens=TOKENS)
    assert call(app, pb_body(1), headers=[("authorization", "Bearer tok-acme")]).status == 200
    reply = call(app, pb_body(1), headers=[("authorization", "bearer tok-multi")])
    assert_status(reply, 400, grpc.StatusCode.INVALID_ARGUMENT, as_json=False)
    ok = call(
        app,
        pb_body(1),
        headers=[("authorization", "bearer tok-multi"), ("x-ourios-tenant", "globex")],
    )
    assert ok.status == 200
    assert [c.tenant for c in pipeline.calls] == ["acme", "globex"]


def test_auth_comes_before_reading_the_body(pipeline: StubPort, gzip_bomb: bytes) -> None:
    app = make_app(pipeline, tokens=TOKENS)
    reply = call(
        app,
        iter([gzip_bomb]),
        headers=[("content-encoding", "gzip"), ("content-length", str(len(gzip_bomb)))],
    )
    assert reply.status == 401
    assert reply.chunks_pulled == 0
    unknown_type = call(app, pb_body(1), content_type="text/plain")
    assert unknown_type.status == 401
    assert pipeline.calls == []


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/xml", "", None], ids=["text", "xml", "empty", "missing"]
)
def test_415_unknown_content_type_is_a_json_status(
    app: FastAPI, pipeline: StubPort, ctype: str | None
) -> None:
    reply = call(app, iter([pb_body(1)]), content_type=ctype)
    assert_status(reply, 415, grpc.StatusCode.INVALID_ARGUMENT, as_json=True)
    assert "Content-Type" in reply.status_message().message
    assert reply.chunks_pulled == 0
    assert pipeline.calls == []


def test_415_unknown_content_encoding(app: FastAPI, pipeline: StubPort) -> None:
    reply = call(app, pb_body(1), headers=[("content-encoding", "br")])
    assert_status(reply, 415, grpc.StatusCode.INVALID_ARGUMENT, as_json=False)
    assert "Content-Encoding" in reply.status_message().message
    assert pipeline.calls == []


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_405_other_methods_on_logs(app: FastAPI, pipeline: StubPort, method: str) -> None:
    reply = call(app, b"", method=method)
    assert reply.status == 405
    assert "POST" in reply.headers["allow"]
    assert pipeline.calls == []


# ── 413: the raw cap and the decompressed limit ─────────────────────────────────────


def test_raw_body_cap() -> None:
    assert raw_body_cap(LIMIT, None) == LIMIT
    assert raw_body_cap(LIMIT, "identity") == LIMIT
    assert raw_body_cap(LIMIT, " GZIP ") == LIMIT + LIMIT // 1024 + 64 * KiB
    # Deflate's worst case (stored blocks) for a limit-sized body is within the cap.
    incompressible = bytes(range(256)) * (LIMIT // 256)
    worst = zlib.compressobj(0, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    stored = worst.compress(incompressible) + worst.flush()
    assert LIMIT < len(stored) <= raw_body_cap(LIMIT, "gzip")


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_413_declared_length_over_the_cap_discards_the_body_then_answers(
    app: FastAPI, pipeline: StubPort, encoding: str | None
) -> None:
    """A client that writes its whole body before reading must read the 413 (a reset
    would make it retry): the body is read and thrown away, never buffered."""
    headers = [("content-length", str(raw_body_cap(LIMIT, encoding) + 1))]
    if encoding:
        headers.append(("content-encoding", encoding))
    reply = call(app, iter([b"x" * KiB] * 2000), headers=headers)
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert str(LIMIT) in reply.status_message().message
    assert "retry-after" not in reply.headers
    assert reply.chunks_pulled == 2000
    assert pipeline.calls == []


def test_413_declared_length_over_the_cap_waiting_for_100_continue_reads_nothing(
    app: FastAPI, pipeline: StubPort
) -> None:
    headers = [("content-length", str(LIMIT + 1)), ("expect", "100-continue")]
    reply = call(app, iter([b"x" * KiB] * 2000), headers=headers)
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert reply.chunks_pulled == 0
    assert pipeline.calls == []


def test_413_declared_length_beyond_the_discard_bound_reads_nothing(
    app: FastAPI, pipeline: StubPort
) -> None:
    headers = [("content-length", str(LIMIT + DISCARD_BYTES + 1))]
    reply = call(app, iter([b"x" * KiB] * 2000), headers=headers)
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert reply.chunks_pulled == 0


def test_413_streamed_body_is_discarded_past_the_cap_up_to_the_bound(
    app: FastAPI, pipeline: StubPort
) -> None:
    chunk = 64 * KiB
    within = call(app, iter([b"\x00" * chunk] * 1000), content_type=JSON)
    assert_status(within, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=True)
    assert within.chunks_pulled == 1000
    beyond = call(app, iter([b"\x00" * chunk] * 2000), content_type=JSON)
    assert_status(beyond, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=True)
    assert beyond.chunks_pulled == (LIMIT + DISCARD_BYTES) // chunk + 1
    assert pipeline.calls == []


def test_413_identity_body_one_byte_over(pipeline: StubPort) -> None:
    app = make_app(pipeline, max_frame_bytes=64 * KiB)
    reply = call(app, sized_request(64 * KiB + 1))
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert reply.chunks_pulled == 1
    assert pipeline.calls == []


def test_413_gzip_body_that_inflates_past_the_limit(pipeline: StubPort) -> None:
    app = make_app(pipeline, max_frame_bytes=64 * KiB)
    body = gzip.compress(sized_request(64 * KiB + 1))
    assert len(body) < 64 * KiB
    reply = call(app, body, headers=[("content-encoding", "gzip")])
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert pipeline.calls == []


def test_413_gzip_bomb_is_refused_quickly_in_bounded_memory(
    app: FastAPI, pipeline: StubPort, gzip_bomb: bytes
) -> None:
    # 1 GiB of zeros in about 1 MiB of gzip; the raw cap lets it in, the inflater stops
    # one byte past the 1 MiB limit.
    assert len(gzip_bomb) < raw_body_cap(LIMIT, "gzip")
    chunks = [gzip_bomb[i : i + 64 * KiB] for i in range(0, len(gzip_bomb), 64 * KiB)]
    tracemalloc.start()
    try:
        started = time.monotonic()
        reply = call(app, chunks, headers=[("content-encoding", "gzip")], content_length=False)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_status(reply, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert peak < 16 * MiB, f"peak traced memory {peak} bytes"
    assert elapsed < 5.0
    assert pipeline.calls == []


# ── probes and metrics ──────────────────────────────────────────────────────────────


def test_healthz(app: FastAPI, pipeline: StubPort) -> None:
    reply = call(app, method="GET", path="/healthz", content_type=None)
    assert (reply.status, reply.body) == (200, b"ok\n")
    pipeline.alive = False
    pipeline.health_detail = "thread turn stopped: RuntimeError: x"
    reply = call(app, method="GET", path="/healthz", content_type=None)
    assert (reply.status, reply.body) == (503, b"not alive: thread turn stopped: RuntimeError: x\n")


def test_healthz_stays_up_when_not_ready(app: FastAPI, pipeline: StubPort) -> None:
    pipeline.ready = False  # e.g. the terminal rotation state (DESIGN.md §13)
    assert call(app, method="GET", path="/healthz", content_type=None).status == 200


def test_readyz(app: FastAPI, pipeline: StubPort) -> None:
    ready = call(app, method="GET", path="/readyz", content_type=None)
    assert ready.status == 200
    pipeline.ready = False
    not_ready = call(app, method="GET", path="/readyz", content_type=None)
    assert not_ready.status == 503
    text = not_ready.body.decode()
    assert text.startswith("not ready") and text.count("\n") == 1
    pipeline.ready = True
    assert call(app, method="GET", path="/readyz", content_type=None).status == 200


def test_metrics(pipeline: StubPort) -> None:
    asked: list[int] = []

    def metrics_text() -> tuple[bytes, str]:
        asked.append(1)
        return METRICS

    app = make_app(pipeline, metrics_text=metrics_text)
    reply = call(app, method="GET", path="/metrics", content_type=None)
    assert reply.status == 200
    assert reply.body == METRICS[0]
    assert reply.content_type == METRICS[1]
    assert asked == [1]


def test_create_http_app_refuses_bad_bounds(pipeline: StubPort) -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        make_app(pipeline, max_frame_bytes=0)
    with pytest.raises(ValueError, match="ingest_concurrency"):
        make_app(pipeline, ingest_concurrency=0)


# ── through a real uvicorn ──────────────────────────────────────────────────────────


@dataclass
class RealServer:
    port: int
    pipeline: StubPort
    extra: list[str] = field(default_factory=list)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)


@pytest.fixture
def real_server(pipeline: StubPort) -> Iterator[RealServer]:
    server, thread, port = start_in_thread(http_server(make_app(pipeline), "127.0.0.1", 0))
    try:
        yield RealServer(port, pipeline)
    finally:
        stop_in_thread(server, thread)


def _post(
    conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn.request("POST", "/v1/logs", body, {"Content-Type": PB, **(headers or {})})
    response = conn.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_real_server_serves_and_survives_a_pipeline_bug(real_server: RealServer) -> None:
    assert real_server.port != 0
    conn = real_server.connection()
    try:
        status, headers, body = _post(conn, pb_body(100), {"X-Ourios-Tenant": "t1"})
        assert (status, body) == (200, b"")
        assert headers["content-type"] == PB
        real_server.pipeline.error = RuntimeError("bug")
        status, headers, body = _post(conn, pb_body(1))
        assert status == 500
        assert status_pb2.Status.FromString(body).code == grpc.StatusCode.INTERNAL.value[0]
        real_server.pipeline.error = Unavailable("settling", retry_after=7)
        status, headers, body = _post(conn, pb_body(1))
        assert (status, headers["retry-after"]) == (503, "7")
        real_server.pipeline.error = None
        status, _, _ = _post(conn, pb_body(2), {"Content-Encoding": "gzip"})
        assert status == 400  # not gzip: refused, and the connection is still usable
        status, _, _ = _post(conn, gzip.compress(pb_body(2)), {"Content-Encoding": "gzip"})
        assert status == 200
        for path, expected in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200)):
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            assert response.status == expected
    finally:
        conn.close()
    calls = real_server.pipeline.calls
    assert [c.tenant for c in calls] == ["t1", "default", "default", "default"]
    assert len(calls[0].batch) == 100


def test_real_server_declared_length_over_cap_refused_before_the_body(
    real_server: RealServer,
) -> None:
    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", real_server.port)
        try:
            writer.write(
                b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Expect: 100-continue\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(
                next(
                    line.split(b":", 1)[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
            )
            return head + await reader.readexactly(length)
        finally:
            writer.close()
            await writer.wait_closed()

    raw = asyncio.run(exchange())
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    status = json_format.Parse(body, status_pb2.Status())
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert real_server.pipeline.calls == []


def test_real_server_a_client_writing_its_whole_oversize_body_first_reads_the_413(
    real_server: RealServer,
) -> None:
    """A plain blocking client (as urllib, requests and the OTel exporter are) writes the
    whole body before it reads: it must read the 413 — a connection reset is retried."""
    body = b"\x00" * (10 * MiB)
    with socket.create_connection(("127.0.0.1", real_server.port), 30) as sock:
        sock.sendall(
            b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        response = http.client.HTTPResponse(sock)
        response.begin()
        payload = response.read()
    assert response.status == 413
    status = status_pb2.Status.FromString(payload)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert str(LIMIT) in status.message
    assert real_server.pipeline.calls == []


def test_real_server_refuses_a_gzip_bomb(real_server: RealServer, gzip_bomb: bytes) -> None:
    conn = real_server.connection()
    try:
        status, _, body = _post(conn, gzip_bomb, {"Content-Encoding": "gzip"})
    finally:
        conn.close()
    assert status == 413
    assert status_pb2.Status.FromString(body).code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert real_server.pipeline.calls == []


class SlowHealth(StubPort):
    """A port whose state takes as long as a test holds it (``gate``), as a worker's
    does while the core is slow to answer its STATE call."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.asked = threading.Event()
        super().__init__()

    @property
    def ready(self) -> bool:
        self.asked.set()
        self.gate.wait(30)
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value


def test_a_slow_readyz_does_not_hold_the_event_loop() -> None:
    # /readyz, /healthz and /metrics read their answer on a thread: a probe waiting on
    # a slow core must not stop the same process's ingest requests.
    port = SlowHealth()
    server, thread, bound = start_in_thread(http_server(make_app(port), "127.0.0.1", 0))
    probe: list[int] = []

    def ask() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", bound, timeout=60)
        conn.request("GET", "/readyz")
        probe.append(conn.getresponse().status)
        conn.close()

    prober = threading.Thread(target=ask)
    try:
        prober.start()
        assert port.asked.wait(10)  # the probe is waiting on the port's state
        conn = http.client.HTTPConnection("127.0.0.1", bound, timeout=10)
        status, _, body = _post(conn, pb_body(3), {"X-Ourios-Tenant": "t1"})
        conn.close()
        assert (status, body) == (200, b"")  # answered while the probe still waits
        assert probe == [] and prober.is_alive()
    finally:
        port.gate.set()
        prober.join(30)
        stop_in_thread(server, thread)
    assert probe == [200]


def test_start_in_thread_refuses_a_taken_port(real_server: RealServer) -> None:
    with pytest.raises(ListenerBindError, match=f"127.0.0.1:{real_server.port}"):
        start_in_thread(http_server(make_app(real_server.pipeline), "127.0.0.1", real_server.port))


def test_stopped_server_closes_its_port(pipeline: StubPort) -> None:
    server, thread, port = start_in_thread(http_server(make_app(pipeline), "127.0.0.1", 0))
    stop_in_thread(server, thread)
    assert not thread.is_alive()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 5):
        pass


def test_clone_9_a_cut_content_type_shows_an_ellipsis(app: FastAPI, pipeline: StubPort) -> None:
    # curl -d sends application/x-www-form-urlencoded (33 characters): the 415 names
    # its first 32 and says it cut the rest, as every other echo of a client's value does
    reply = call(app, iter([pb_body(1)]), content_type="application/x-www-form-urlencoded")
    assert_status(reply, 415, grpc.StatusCode.INVALID_ARGUMENT, as_json=True)
    message = reply.status_message().message
    assert message.startswith("unsupported Content-Type 'application/x-www-form-urlencode'...; ")
    short = call(app, iter([pb_body(1)]), content_type="text/plain")
    assert short.status_message().message.startswith("unsupported Content-Type 'text/plain'; ")


# ── the in-flight bound, the body read timeout, the expansion limits (issue 21 item 3) ──


def bounds(
    requests: int = 256, size: int = 64 * MiB, timeout: float = 30.0, **limits: int
) -> ReceiverBounds:
    return ReceiverBounds(otlp_limits(**limits), InflightBudget(requests, size), timeout, 256)


def otlp_limits(**limits: int) -> RequestLimits:
    return RequestLimits(**limits)


def test_bounded_3_http_inflight_bound_refuses_503_before_reading_the_body(
    pipeline: StubPort,
) -> None:
    entered, release = threading.Event(), threading.Event()

    def hold(call: object) -> None:
        entered.set()
        assert release.wait(20)

    pipeline.on_ingest = hold
    app = make_app(pipeline, bounds=bounds(requests=1))
    body = pb_body(1)
    headers = [("content-type", PB), ("content-length", str(len(body)))]
    waiting = [*headers, ("expect", "100-continue")]

    async def scenario() -> tuple[Reply, Reply, Reply]:
        first = asyncio.ensure_future(_asgi_call(app, "POST", "/v1/logs", headers, [body]))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 20)
        refused = await _asgi_call(app, "POST", "/v1/logs", waiting, [body])
        discarded = await _asgi_call(app, "POST", "/v1/logs", headers, [body])
        release.set()
        return await first, refused, discarded

    first, refused, discarded = asyncio.run(scenario())
    assert first.status == 200
    for reply in (refused, discarded):
        assert_status(reply, 503, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
        assert reply.headers["retry-after"] == "1"
        assert "server.max_inflight_requests=1" in reply.status_message().message
        retry = error_details_pb2.RetryInfo()
        assert reply.status_message().details[0].Unpack(retry)
    assert refused.chunks_pulled == 0  # it waited for 100 Continue: no body was asked for
    assert discarded.chunks_pulled == 1  # read and dropped, so the client reads the 503
    assert len(pipeline.calls) == 1
    # Everything is returned once answered: the next request is admitted.
    assert call(app, body).status == 200


def test_bounded_3_http_inflight_bytes_count_the_declared_length(pipeline: StubPort) -> None:
    app = make_app(pipeline, max_frame_bytes=LIMIT, bounds=bounds(size=LIMIT - 1))
    body = sized_request(LIMIT)
    reply = call(app, body, headers=[("expect", "100-continue")])
    assert_status(reply, 503, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert "server.max_inflight_bytes" in reply.status_message().message
    assert reply.chunks_pulled == 0
    assert pipeline.calls == []


def test_bounded_3_http_gzip_inflation_stops_at_the_inflight_bytes(pipeline: StubPort) -> None:
    app = make_app(pipeline, max_frame_bytes=16 * MiB, bounds=bounds(size=3 * MiB))
    body = gzip.compress(sized_request(8 * MiB))
    reply = call(app, body, headers=[("content-encoding", "gzip")])
    assert_status(reply, 503, grpc.StatusCode.RESOURCE_EXHAUSTED, as_json=False)
    assert reply.headers["retry-after"] == "1"
    assert pipeline.calls == []


def test_bounded_3_http_expansion_limit_is_400_naming_the_setting(pipeline: StubPort) -> None:
    app = make_app(pipeline, bounds=bounds(records=2))
    reply = call(app, pb_body(3))
    assert_status(reply, 400, grpc.StatusCode.INVALID_ARGUMENT, as_json=False)
    assert "is 3, over server.max_request_records=2" in reply.status_message().message
    assert "retry-after" not in reply.headers
    assert pipeline.calls == []


def test_native_1_http_decodes_natively_in_a_decode_slot(
    pipeline: StubPort, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = WatchedBudget(256, 64 * MiB, 1)
    seen = watch(monkeypatch, budget)
    app = make_app(pipeline, bounds=ReceiverBounds(RequestLimits(), budget, 30.0, 256))
    reply = call(app, pb_body(3))
    assert reply.status == 200, reply.body
    assert seen == [(1, True)]  # the native decoder answered, holding the one slot
    assert budget.requests == 0 and budget.bytes == 0  # the ticket was returned
    assert len(pipeline.calls) == 1


def test_bounded_3_http_slow_body_is_408_after_the_read_timeout(pipeline: StubPort) -> None:
    app = make_app(pipeline, bounds=bounds(timeout=1.0))
    server, thread, port = start_in_thread(http_server(app, "127.0.0.1", 0))
    try:
        with socket.create_connection(("127.0.0.1", port), 30) as sock:
            sock.sendall(
                b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf"
                b"\r\nContent-Length: 1000\r\n\r\n" + b"\x0a" * 10
            )
            response = http.client.HTTPResponse(sock)
            response.begin()  # the server answers without the rest of the body
            payload = response.read()
        assert response.status == 408
        status = status_pb2.Status.FromString(payload)
        assert "server.body_read_timeout_secs=1 s" in status.message
        # /healthz kept answering meanwhile and afterwards
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        stop_in_thread(server, thread)
    assert pipeline.calls == []

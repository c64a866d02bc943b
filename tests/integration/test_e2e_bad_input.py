"""Bad input against a real `ourios serve` (DESIGN.md §3 tenants and auth, §7 errors).

One server in token mode (`OURIOS_AUTH_TOKENS_FILE`) with `OURIOS_WAL_MAX_FRAME_BYTES`
= 64 KiB takes every bad request of the tables below, over HTTP and, where the
transport applies, gRPC. Each case must get its documented status (and gRPC code),
a `google.rpc.Status` body encoded like the request, no `Retry-After`, and must leave
the WAL without a frame: this module's shared server never receives a valid batch, so
its WAL holds zero frames throughout (`wal_frame_count`, a read-only CRC walk).

The last test starts a fresh server, sends the whole table again, checks the WAL is
still empty and the node healthy and ready, then sends valid batches through the OTel
SDK's exporters and checks they are acknowledged and published exactly once.

Bodies are requests that would be accepted but for the one thing each case breaks
(the auth and tenant cases carry a valid body), so a refusal is for that reason only.
"""

from __future__ import annotations

import functools
import http.client
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk.resources import Resource

from tests.support.otel import (
    ExportReport,
    decode_status,
    grpc_client,
    grpc_export,
    gzip_bomb,
    gzip_bytes,
    http_client,
    otlp_json,
    sample_request,
    wal_batches,
    wal_frame_count,
)
from tests.support.parquet_read import read_store
from tests.support.procmem import status_kib
from tests.support.serve import ServeProcess

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_FRAME = 65536
#: grpcio's receive bound is MAX_FRAME + this (app/receive/otlp_grpc.py)
GRPC_SLACK = 65536
TOKEN_A = "tok-a-3f9c1e"  # tenants: bad-input, acme+prod
TOKEN_B = "tok-b-77d0aa"  # tenant: beta (only one, so it names the tenant itself)
TENANT = "bad-input"
TOKENS_YAML = f"{TOKEN_A}: [{TENANT}, acme+prod]\n{TOKEN_B}: [beta]\n"
MiB = 1024 * 1024

OK_HEADERS: dict[str, str] = {
    "Content-Type": PROTOBUF,
    "Authorization": f"Bearer {TOKEN_A}",
    "X-Ourios-Tenant": TENANT,
}
OK_METADATA: dict[str, str] = {"authorization": f"Bearer {TOKEN_A}", "x-ourios-tenant": TENANT}


# ── bodies (built once: the bomb costs ~0.4 s) ──────────────────────────────────────


@functools.cache
def valid_request() -> ExportLogsServiceRequest:
    return sample_request("bad", 3, time_base_ns=1_700_000_000_000_000_000)


def valid_protobuf() -> bytes:
    data: bytes = valid_request().SerializeToString()
    return data


@functools.cache
def random_bytes() -> bytes:
    data = random.Random(0x0BAD).randbytes(4096)
    # The case's premise: these bytes are not an ExportLogsServiceRequest.
    with pytest.raises(DecodeError):
        ExportLogsServiceRequest().ParseFromString(data)
    return data


def truncated_protobuf() -> bytes:
    data = valid_protobuf()
    cut = data[: len(data) // 2]
    with pytest.raises(DecodeError):
        ExportLogsServiceRequest().ParseFromString(cut)
    return cut


def bad_trace_id() -> bytes:
    req = ExportLogsServiceRequest()
    req.CopyFrom(valid_request())
    req.resource_logs[0].scope_logs[0].log_records[0].trace_id = b"\x01" * 5
    data: bytes = req.SerializeToString()
    return data


@functools.cache
def oversize_request() -> ExportLogsServiceRequest:
    """A valid request whose encoding is well over MAX_FRAME."""
    req = sample_request("big", 600, time_base_ns=1_700_000_000_000_000_000)
    assert len(req.SerializeToString()) > 2 * MAX_FRAME
    return req


@functools.cache
def just_over_request() -> ExportLogsServiceRequest:
    """A valid request just over MAX_FRAME, within grpcio's receive bound (MAX_FRAME +
    64 KiB), so the handler itself refuses it, naming the limit."""
    n = 1
    while len(sample_request("over", n, time_base_ns=1).SerializeToString()) <= MAX_FRAME:
        n += 1
    req = sample_request("over", n, time_base_ns=1_700_000_000_000_000_000)
    assert MAX_FRAME < len(req.SerializeToString()) <= MAX_FRAME + GRPC_SLACK
    return req


@functools.cache
def oversize_gzip() -> bytes:
    """Compressed under the raw-body cap, over MAX_FRAME once inflated."""
    body = gzip_bytes(oversize_request().SerializeToString())
    assert len(body) < MAX_FRAME, len(body)
    return body


@functools.cache
def bomb_1gib() -> bytes:
    body = gzip_bomb(1024 * MiB)
    # ~1 MiB, a gzip header, and a trailer saying 1 GiB inflated.
    assert len(body) < 2 * MiB and body[:2] == b"\x1f\x8b"
    assert int.from_bytes(body[-4:], "little") == 1024 * MiB % 2**32
    return body


@functools.cache
def bomb_64mib() -> bytes:
    """Small enough (~65 KiB) to pass the raw cap, so only the inflate limit stops it."""
    body = gzip_bomb(64 * MiB)
    assert len(body) < 2 * MAX_FRAME
    return body


def corrupt_gzip() -> bytes:
    body = bytearray(gzip_bytes(valid_protobuf() * 4))
    for i in range(len(body) // 3, len(body) // 3 + 8):
        body[i] ^= 0x5A
    return bytes(body)


# ── the HTTP table ──────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class HttpCase:
    """A request (`headers` override OK_HEADERS; None removes one) and its refusal."""

    body: Callable[[], bytes]
    status: int
    code: grpc.StatusCode
    reply_type: str = PROTOBUF
    headers: Mapping[str, str | None] = field(default_factory=dict)
    message: str = "tenant"  # a substring the Status message must hold (says what is wrong)
    bomb: bool = False  # also check the server's peak memory did not grow


BAD_REQUEST = grpc.StatusCode.INVALID_ARGUMENT
TOO_LARGE = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
LIMIT = str(MAX_FRAME)
AS_JSON: Mapping[str, str | None] = {"Content-Type": JSON}
GZIP: Mapping[str, str | None] = {"Content-Encoding": "gzip"}


def _tenant(value: str | None) -> Mapping[str, str | None]:
    return {"X-Ourios-Tenant": value}


def _bearer(token: str) -> Mapping[str, str | None]:
    return {"Authorization": f"Bearer {token}"}


def _json(text: str) -> Callable[[], bytes]:
    return lambda: text.encode()


def _record_json(record: str) -> Callable[[], bytes]:
    return _json('{"resourceLogs": [{"scopeLogs": [{"logRecords": [' + record + "]}]}]}")


HTTP_CASES: dict[str, HttpCase] = {
    # undecodable or invalid bodies: 400 / INVALID_ARGUMENT
    "random-bytes": HttpCase(random_bytes, 400, BAD_REQUEST, message="protobuf"),
    "truncated-protobuf": HttpCase(truncated_protobuf, 400, BAD_REQUEST, message="protobuf"),
    "protobuf-trace-id-5-bytes": HttpCase(bad_trace_id, 400, BAD_REQUEST, message="trace_id"),
    "random-bytes-as-json": HttpCase(random_bytes, 400, BAD_REQUEST, JSON, AS_JSON, "JSON"),
    "invalid-json": HttpCase(
        _json('{"resourceLogs": [{"scopeLogs": '), 400, BAD_REQUEST, JSON, AS_JSON, "JSON"
    ),
    "json-not-utf8": HttpCase(
        lambda: b'{"resourceLogs": "\xff\xfe"}', 400, BAD_REQUEST, JSON, AS_JSON, "UTF-8"
    ),
    "json-top-level-array": HttpCase(_json("[]"), 400, BAD_REQUEST, JSON, AS_JSON, "object"),
    "json-resource-logs-is-a-string": HttpCase(
        _json('{"resourceLogs": "many"}'), 400, BAD_REQUEST, JSON, AS_JSON, "resourceLogs"
    ),
    "json-body-is-a-bare-string": HttpCase(
        _record_json('{"body": "text"}'), 400, BAD_REQUEST, JSON, AS_JSON, "body"
    ),
    "json-time-is-a-boolean": HttpCase(
        _record_json('{"timeUnixNano": true}'), 400, BAD_REQUEST, JSON, AS_JSON, "OTLP/JSON"
    ),
    "json-time-out-of-range": HttpCase(
        _record_json('{"timeUnixNano": "-5"}'), 400, BAD_REQUEST, JSON, AS_JSON, "OTLP/JSON"
    ),
    "json-trace-id-not-hex": HttpCase(
        _record_json('{"traceId": "zz"}'), 400, BAD_REQUEST, JSON, AS_JSON, "traceId"
    ),
    # media types and codings: 415 (a Status in JSON when the type was not understood)
    "content-type-text-plain": HttpCase(
        valid_protobuf, 415, BAD_REQUEST, JSON, {"Content-Type": "text/plain"}, "Content-Type"
    ),
    "content-type-missing": HttpCase(
        valid_protobuf, 415, BAD_REQUEST, JSON, {"Content-Type": None}, "Content-Type"
    ),
    "content-encoding-br": HttpCase(
        valid_protobuf, 415, BAD_REQUEST, PROTOBUF, {"Content-Encoding": "br"}, "Content-Encoding"
    ),
    # size: 413 / RESOURCE_EXHAUSTED, naming the limit
    "oversize-protobuf": HttpCase(
        lambda: oversize_request().SerializeToString(), 413, TOO_LARGE, message=LIMIT
    ),
    "oversize-json": HttpCase(
        lambda: otlp_json(oversize_request()), 413, TOO_LARGE, JSON, AS_JSON, LIMIT
    ),
    "oversize-after-gunzip": HttpCase(oversize_gzip, 413, TOO_LARGE, headers=GZIP, message=LIMIT),
    "gzip-bomb-1gib": HttpCase(bomb_1gib, 413, TOO_LARGE, headers=GZIP, message=LIMIT, bomb=True),
    "gzip-bomb-64mib-under-raw-cap": HttpCase(
        bomb_64mib, 413, TOO_LARGE, headers=GZIP, message=LIMIT, bomb=True
    ),
    # corrupt codings: 400
    "gzip-corrupt": HttpCase(corrupt_gzip, 400, BAD_REQUEST, headers=GZIP, message="gzip"),
    "gzip-truncated": HttpCase(
        lambda: gzip_bytes(valid_protobuf())[:-8], 400, BAD_REQUEST, headers=GZIP, message="gzip"
    ),
    "gzip-trailing-garbage": HttpCase(
        lambda: gzip_bytes(valid_protobuf()) + b"not gzip",
        400,
        BAD_REQUEST,
        headers=GZIP,
        message="gzip",
    ),
    "gzip-header-on-identity-body": HttpCase(
        valid_protobuf, 400, BAD_REQUEST, headers=GZIP, message="gzip"
    ),
    # tenants: 400 / INVALID_ARGUMENT (validated before the token's tenant list)
    "tenant-129-bytes": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("t" * 129)),
    "tenant-with-slash": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("a/b")),
    "tenant-empty": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("")),
    "tenant-with-space": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("a b")),
    "tenant-with-colon": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("a:b")),
    "tenant-not-ascii": HttpCase(valid_protobuf, 400, BAD_REQUEST, headers=_tenant("caf\xe9")),
    "tenant-missing-for-multi-tenant-token": HttpCase(
        valid_protobuf, 400, BAD_REQUEST, headers=_tenant(None)
    ),
    # auth: 401 / UNAUTHENTICATED, 403 / PERMISSION_DENIED
    "token-missing": HttpCase(
        valid_protobuf, 401, UNAUTHENTICATED, headers={"Authorization": None}, message="Bearer"
    ),
    "token-wrong": HttpCase(
        valid_protobuf, 401, UNAUTHENTICATED, headers=_bearer("tok-a-3f9c1f"), message="token"
    ),
    "token-wrong-scheme": HttpCase(
        valid_protobuf,
        401,
        UNAUTHENTICATED,
        headers={"Authorization": f"Basic {TOKEN_A}"},
        message="Bearer",
    ),
    "token-wrong-before-bad-body": HttpCase(
        random_bytes, 401, UNAUTHENTICATED, headers=_bearer("nope"), message="token"
    ),
    "token-of-another-tenant": HttpCase(
        valid_protobuf, 403, PERMISSION_DENIED, headers=_bearer(TOKEN_B), message=TENANT
    ),
}


# ── the gRPC table ──────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class GrpcCase:
    body: Callable[[], bytes]
    code: grpc.StatusCode
    metadata: Mapping[str, str | None] = field(default_factory=dict)
    gzip: bool = False
    message: str = "tenant"  # a substring the details must hold


GRPC_CASES: dict[str, GrpcCase] = {
    "random-bytes": GrpcCase(random_bytes, BAD_REQUEST, message="protobuf"),
    "truncated-protobuf": GrpcCase(truncated_protobuf, BAD_REQUEST, message="protobuf"),
    "protobuf-trace-id-5-bytes": GrpcCase(bad_trace_id, BAD_REQUEST, message="trace_id"),
    "tenant-129-bytes": GrpcCase(valid_protobuf, BAD_REQUEST, {"x-ourios-tenant": "t" * 129}),
    "tenant-with-slash": GrpcCase(valid_protobuf, BAD_REQUEST, {"x-ourios-tenant": "a/b"}),
    "tenant-empty": GrpcCase(valid_protobuf, BAD_REQUEST, {"x-ourios-tenant": ""}),
    "tenant-missing-for-multi-tenant-token": GrpcCase(
        valid_protobuf, BAD_REQUEST, {"x-ourios-tenant": None}
    ),
    "token-missing": GrpcCase(
        valid_protobuf, UNAUTHENTICATED, {"authorization": None}, message="Bearer"
    ),
    "token-wrong": GrpcCase(
        valid_protobuf, UNAUTHENTICATED, {"authorization": "Bearer wrong"}, message="token"
    ),
    "token-of-another-tenant": GrpcCase(
        valid_protobuf, PERMISSION_DENIED, {"authorization": f"Bearer {TOKEN_B}"}, message=TENANT
    ),
    # beyond grpcio's receive bound grpcio refuses, naming the size and its bound
    "oversize": GrpcCase(
        lambda: oversize_request().SerializeToString(),
        TOO_LARGE,
        message=f"vs. {MAX_FRAME + GRPC_SLACK})",
    ),
    "oversize-after-gunzip": GrpcCase(
        lambda: oversize_request().SerializeToString(),
        TOO_LARGE,
        gzip=True,
        message="Decompressed message larger than max",
    ),
    # within it, the handler, naming the limit
    "just-over": GrpcCase(
        lambda: just_over_request().SerializeToString(), TOO_LARGE, message=LIMIT
    ),
}


# ── running a case ──────────────────────────────────────────────────────────────────


def _merge(base: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def post_exactly(
    server: ServeProcess, body: bytes, headers: Mapping[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    """POST /v1/logs with exactly `headers` (`ServeProcess.post_logs` would add a
    protobuf Content-Type when the case removed it)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v1/logs", body=body, headers=dict(headers))
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def run_http_case(server: ServeProcess, name: str) -> None:
    case = HTTP_CASES[name]
    body = case.body()
    assert server.proc is not None
    peak_before = status_kib(server.proc.pid, "VmHWM")
    status, reply, headers = post_exactly(server, body, _merge(OK_HEADERS, case.headers))
    assert status == case.status, (name, reply)
    assert headers.get("content-type") == case.reply_type, (name, headers)
    decoded = decode_status(reply, case.reply_type)
    assert decoded.code == case.code.value[0], (name, decoded)
    assert decoded.message and case.message in decoded.message, (name, decoded.message)
    assert "retry-after" not in headers, "none of these is worth retrying"
    if case.status == 401:
        assert headers.get("www-authenticate", "").startswith('Bearer realm="ourios"')
        assert TOKEN_A not in decoded.message, "a 401 never quotes a token"
    if case.bomb:
        grown = status_kib(server.proc.pid, "VmHWM") - peak_before
        assert grown < 32 * 1024, f"peak RSS grew by {grown} KiB inflating a bomb"


def run_grpc_case(server: ServeProcess, name: str) -> None:
    case = GRPC_CASES[name]
    metadata = _merge(OK_METADATA, case.metadata)
    reply = grpc_export(
        server.grpc_port,
        case.body(),
        list(metadata.items()),
        compression=grpc.Compression.Gzip if case.gzip else None,
    )
    assert reply.code is case.code, (name, reply)
    assert case.message in reply.details, (name, reply.details)


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    path.write_text(TOKENS_YAML)
    return path


def server_env(tokens_file: Path) -> dict[str, str]:
    return {
        "OURIOS_AUTH_TOKENS_FILE": str(tokens_file),
        "OURIOS_WAL_MAX_FRAME_BYTES": str(MAX_FRAME),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tokens_file: Path) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("bad-input"), server_env(tokens_file)) as proc:
        yield proc


def assert_untouched(server: ServeProcess) -> None:
    assert server.proc is not None and server.proc.poll() is None, server.tail()
    assert wal_frame_count(server.data_dir / "wal") == 0, "a refused request reached the WAL"


@pytest.mark.parametrize("name", sorted(HTTP_CASES))
def test_http_bad_input_is_refused_before_the_wal(server: ServeProcess, name: str) -> None:
    assert_untouched(server)
    run_http_case(server, name)
    assert_untouched(server)


@pytest.mark.parametrize("name", sorted(GRPC_CASES))
def test_grpc_bad_input_is_refused_before_the_wal(server: ServeProcess, name: str) -> None:
    assert_untouched(server)
    run_grpc_case(server, name)
    assert_untouched(server)


def test_grpc_decompressed_oversize_names_the_limit(server: ServeProcess) -> None:
    reply = grpc_export(
        server.grpc_port,
        just_over_request().SerializeToString(),
        list(OK_METADATA.items()),
        compression=grpc.Compression.Gzip,
    )
    assert reply.code is grpc.StatusCode.RESOURCE_EXHAUSTED, reply
    assert str(MAX_FRAME) in reply.details, reply.details


# ── afterwards: healthy, and a valid batch is acknowledged and published ────────────


def _emit(port: int, transport: str, headers: dict[str, str], uids: list[str]) -> ExportReport:
    resource = Resource({"service.name": f"after-bad-input-{transport}"})
    make = http_client if transport == "http" else grpc_client
    with make(port, headers=headers, resource=resource) as client:
        logger = client.provider.get_logger("after-bad-input")
        for uid in uids:
            logger.emit(
                timestamp=time.time_ns(),
                body=f"recovered request {uid} handled",
                attributes={"test.uid": uid},
            )
        return client.flush()


def test_server_healthy_and_publishing_after_bad_input(tmp_path: Path, tokens_file: Path) -> None:
    data_dir = tmp_path / "data"
    with ServeProcess(data_dir, server_env(tokens_file)) as proc:
        for name in sorted(HTTP_CASES):
            run_http_case(proc, name)
        for name in sorted(GRPC_CASES):
            run_grpc_case(proc, name)
        assert wal_frame_count(data_dir / "wal") == 0, "after the whole table: no frame"
        assert proc.get("/healthz")[0] == 200
        assert proc.get("/readyz")[0] == 200

        # Control: the cases' base request and headers are accepted on both transports,
        # so every refusal above was for the one thing its case changed.
        status, reply, _ = post_exactly(proc, valid_protobuf(), OK_HEADERS)
        assert status == 200, reply
        ok = grpc_export(proc.grpc_port, valid_protobuf(), list(OK_METADATA.items()))
        assert ok.code is grpc.StatusCode.OK, ok

        run = uuid.uuid4().hex[:8]
        http_uids = [f"http-{run}-{i}" for i in range(5)]
        grpc_uids = [f"grpc-{run}-{i}" for i in range(5)]
        http_report = _emit(
            proc.http_port,
            "http",
            {"Authorization": f"Bearer {TOKEN_A}", "X-Ourios-Tenant": "acme+prod"},
            http_uids,
        )
        # TOKEN_B has one tenant, so no tenant header: the token names it.
        grpc_report = _emit(
            proc.grpc_port, "grpc", {"authorization": f"Bearer {TOKEN_B}"}, grpc_uids
        )
        assert http_report.ok and http_report.records_acknowledged == 5, http_report
        assert grpc_report.ok and grpc_report.records_acknowledged == 5, grpc_report
        assert proc.terminate() == 0

    frames = wal_batches(data_dir / "wal")
    assert sorted(f.tenant for f in frames) == ["acme+prod", TENANT, TENANT, "beta"], (
        "only the valid batches are in the WAL"
    )
    objects = data_dir / "objects"
    duck, arrow = read_store(objects, "duckdb"), read_store(objects, "pyarrow")
    assert duck == arrow
    got = sorted((r["tenant"], r["attributes"]["test.uid"]) for r in duck.records)
    control = [(TENANT, f"bad-{i}") for i in range(3)] * 2  # one copy per transport
    want = sorted(
        [("acme+prod", u) for u in http_uids] + [("beta", u) for u in grpc_uids] + control
    )
    assert got == want, "each accepted record published exactly once, under its tenant"

"""End to end: real OpenTelemetry clients → a real `ourios serve` → Parquet read back
with DuckDB and with pyarrow (DESIGN.md §3, §7).

Four groups, each on as few server processes as the assertions allow:

- **SDK → local store** (one server, `sdk_run`): the OTel Python SDK's OTLP/HTTP and
  OTLP/gRPC log exporters each send `N` distinct records (unique `test.uid`) with
  bodies of three shapes, every severity, non-string attributes, resource attributes,
  span contexts (and some records without a span or a timestamp); after `terminate()`
  (which flushes every partition) each test checks one promise about what landed in
  the store and in the WAL.
- **SDK → S3**: the same through a real SeaweedFS S3 server under a key prefix, with
  gzip on both exporters and the smallest size trigger (so the publisher thread writes
  during ingest); objects downloaded with boto3 and read locally (DuckDB's httpfs
  cannot be installed here).
- **OTLP spec cases on a live server** (`spec_server`): empty requests (200/OK, no
  frame), the success body (an empty `ExportLogsServiceResponse`), the error `Status`
  encoded like the request, gzip stored decompressed.
- **Spec cases published** (`publish_run`, terminated then read): one request in every
  encoding (protobuf, the JSON spellings, gzip, gRPC, gRPC gzip) stores the same WAL
  bytes and publishes identical rows; empty requests publish nothing; records split
  by UTC day; the longest tenant with escaped characters round-trips through the key.

No test sleeps: the SDK's `force_flush()` return value and every export's recorded
result say a batch was acknowledged, and `terminate()` publishes everything buffered.

"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry._logs import SeverityNumber
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from sink.keys import decode_tenant, encode_tenant
from tests.support import S3Bucket
from tests.support.otel import (
    ExportReport,
    SdkClient,
    WalBatch,
    decode_status,
    grpc_client,
    grpc_export,
    gzip_bytes,
    http_client,
    otlp_json,
    sample_request,
    wal_batches,
    wal_frame_count,
)
from tests.support.parquet_read import Published, Row, download_prefix, read_store
from tests.support.serve import ServeProcess

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

#: Records each SDK client sends, and its batch size: 3 exports (10, 10, 4) per client.
N = 24
BATCH = 10
HTTP_TENANT = "acme+prod"
GRPC_TENANT = "ops=eu!1"
KEY_RE = re.compile(
    r"(records|audit)/tenant=[A-Za-z0-9%._~-]+/date=\d{4}-\d{2}-\d{2}/[^/]+\.parquet"
)

_SEVERITIES = (
    (SeverityNumber.INFO, "INFO"),
    (SeverityNumber.WARN, "WARN"),
    (SeverityNumber.ERROR, "ERROR"),
    (SeverityNumber.DEBUG2, "DEBUG2"),
    (SeverityNumber.FATAL, "FATAL"),
)


# ── what was sent ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Sent:
    """One record as a client sent it, in the form the record columns must hold it."""

    uid: str
    tenant: str
    body: str
    severity_number: int
    severity_text: str
    attributes: dict[str, str]
    resource_attributes: dict[str, str]
    scope_name: str
    trace_id: str | None
    span_id: str | None
    time_unix_nano: int


def utc_day(time_unix_nano: int) -> str:
    """The UTC day of a nanosecond timestamp (integer arithmetic: a float would round
    23:59:59.999999999 into the next day)."""
    day = dt.date(1970, 1, 1) + dt.timedelta(days=time_unix_nano // 86_400_000_000_000)
    return day.isoformat()


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def emit_records(
    client: SdkClient,
    tracer_provider: TracerProvider,
    *,
    transport: str,
    tenant: str,
    resource_attributes: dict[str, str],
    n: int = N,
) -> list[Sent]:
    """Emit `n` records through `client`; every fifth outside any span (null ids)."""
    run = uuid.uuid4().hex[:8]
    scope = f"e2e.{transport}"
    logger = client.provider.get_logger(scope)
    tracer = tracer_provider.get_tracer("e2e")
    base = time.time_ns()
    sent: list[Sent] = []
    for i in range(n):
        uid = f"{transport}-{run}-{i:03d}"
        body: Any
        if i % 3 == 0:
            body = f"user u{i} logged in from 10.0.{i}.7 session {uid}"
            body_text = body
        elif i % 3 == 1:
            body = f"payment of {i * 3} EUR declined for order {uid} reason insufficient_funds"
            body_text = body
        else:
            body = {"event": "cache.miss", "uid": uid, "shard": i}
            body_text = _compact(body)
        number, text = _SEVERITIES[i % len(_SEVERITIES)]
        ratio = (i + 1) / 4
        attributes: dict[str, Any] = {
            "test.uid": uid,
            "test.seq": i,
            "test.ratio": ratio,
            "test.ok": i % 2 == 0,
            "test.tags": ["a", f"t{i}"],
            "test.nums": [i, i + 1],
        }
        expected_attributes = {
            "test.uid": uid,
            "test.seq": str(i),
            "test.ratio": repr(ratio),
            "test.ok": "true" if i % 2 == 0 else "false",
            "test.tags": _compact(["a", f"t{i}"]),
            "test.nums": _compact([i, i + 1]),
        }
        # Every seventh record leaves the timestamp to the receiver, as many apps do:
        # it is stored as 0 and partitioned by its observed time.
        ts = 0 if i % 7 == 6 else base + i * 1_000
        trace_id = span_id = None
        if i % 5 == 4:
            logger.emit(
                timestamp=ts or None,
                severity_number=number,
                severity_text=text,
                body=body,
                attributes=attributes,
            )
        else:
            with tracer.start_as_current_span(f"{transport}-op-{i}") as span:
                ctx = span.get_span_context()
                trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
                logger.emit(
                    timestamp=ts or None,
                    severity_number=number,
                    severity_text=text,
                    body=body,
                    attributes=attributes,
                )
        sent.append(
            Sent(
                uid,
                tenant,
                body_text,
                number.value,
                text,
                expected_attributes,
                resource_attributes,
                scope,
                trace_id,
                span_id,
                ts,
            )
        )
    return sent


SDK_RESOURCE: dict[str, Any] = {
    "service.version": "1.2.3",
    "host.cores": 8,
    "deployment.canary": True,
    "load": 0.5,
}


def sdk_resource(transport: str) -> tuple[Resource, dict[str, str]]:
    """A resource without SDK defaults (exact control) and its expected string map."""
    attrs = {"service.name": f"e2e-{transport}", **SDK_RESOURCE}
    expected = {
        "service.name": f"e2e-{transport}",
        "service.version": "1.2.3",
        "host.cores": "8",
        "deployment.canary": "true",
        "load": "0.5",
    }
    return Resource(attrs), expected


@dataclass
class SdkRun:
    """Everything one SDK scenario produced, read after `terminate()`."""

    sent: list[Sent]
    reports: dict[str, ExportReport]  # tenant -> its client's exports
    duck: Published
    arrow: Published
    frames: list[WalBatch]
    exit_code: int
    keys: list[str]


def run_sdk_scenario(
    server: ServeProcess, *, http_gzip: bool = False, grpc_gzip: bool = False
) -> tuple[list[Sent], dict[str, ExportReport], int]:
    """Send `N` records per transport through the SDK clients, flush, terminate."""
    tracer_provider = TracerProvider()
    sent: list[Sent] = []
    reports: dict[str, ExportReport] = {}
    try:
        # the same records through each transport: only the client and its header differ
        transports = (
            ("http", http_client, server.http_port, "X-Ourios-Tenant", HTTP_TENANT, http_gzip),
            ("grpc", grpc_client, server.grpc_port, "x-ourios-tenant", GRPC_TENANT, grpc_gzip),
        )
        for transport, client_for, port, header, tenant, gzip in transports:
            resource, expected = sdk_resource(transport)
            with client_for(
                port, headers={header: tenant}, resource=resource, gzip=gzip, batch_size=BATCH
            ) as client:
                sent += emit_records(
                    client,
                    tracer_provider,
                    transport=transport,
                    tenant=tenant,
                    resource_attributes=expected,
                )
                reports[tenant] = client.flush()
    finally:
        tracer_provider.shutdown()
    return sent, reports, server.terminate()


@pytest.fixture(scope="module")
def sdk_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SdkRun]:
    data_dir = tmp_path_factory.mktemp("sdk-local")
    with ServeProcess(data_dir, {"OURIOS_SINK_FLUSH_AGE_SECS": "300"}) as server:
        sent, reports, code = run_sdk_scenario(server)
    objects = data_dir / "objects"
    duck = read_store(objects, "duckdb")
    yield SdkRun(
        sent,
        reports,
        duck,
        read_store(objects, "pyarrow"),
        wal_batches(data_dir / "wal"),
        code,
        duck.keys,
    )


# ── checks shared by the local and the S3 scenario ──────────────────────────────────


def by_uid(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        out[row["attributes"].get("test.uid", "")].append(row)
    return out


def check_exports(run: SdkRun) -> None:
    assert run.exit_code == 0
    expected_exports = math.ceil(N / BATCH)
    for tenant, report in run.reports.items():
        assert report.ok, f"{tenant}: {report}"
        assert report.exports == expected_exports, report
        assert report.records_acknowledged == N, report
        frames = [f for f in run.frames if f.tenant == tenant]
        assert len(frames) == expected_exports, "one WAL frame per acknowledged export"


def check_exactly_once(run: SdkRun) -> None:
    rows = by_uid(run.duck.records)
    sent = {s.uid for s in run.sent}
    assert len(sent) == 2 * N
    missing = sorted(sent - rows.keys())
    extra = sorted(rows.keys() - sent)
    duplicated = sorted(uid for uid, found in rows.items() if len(found) > 1)
    assert not missing and not extra and not duplicated, (missing, extra, duplicated)
    assert len(run.duck.records) == 2 * N


def check_columns(run: SdkRun) -> None:
    rows = by_uid(run.duck.records)
    for s in run.sent:
        (row,) = rows[s.uid]
        got = {
            "tenant": row["tenant"],
            "body": row["body"],
            "severity_number": row["severity_number"],
            "severity_text": row["severity_text"],
            "attributes": row["attributes"],
            "resource_attributes": row["resource_attributes"],
            "scope_name": row["scope_name"],
            "trace_id": row["trace_id"],
            "span_id": row["span_id"],
            "time_unix_nano": row["time_unix_nano"],
        }
        want = {
            "tenant": s.tenant,
            "body": s.body,
            "severity_number": s.severity_number,
            "severity_text": s.severity_text,
            "attributes": s.attributes,
            "resource_attributes": s.resource_attributes,
            "scope_name": s.scope_name,
            "trace_id": s.trace_id,
            "span_id": s.span_id,
            "time_unix_nano": s.time_unix_nano,
        }
        assert got == want, s.uid
        for ident in (row["trace_id"], row["span_id"]):
            assert ident is None or re.fullmatch(r"[0-9a-f]+", ident), ident
        assert row["observed_time_unix_nano"] > 0
        assert isinstance(row["template_id"], int) and row["template_id"] != 0
        assert isinstance(row["template_params"], list)
        assert row["wal_lsn"] > 0 and row["record_index"] >= 0
        when = s.time_unix_nano or row["observed_time_unix_nano"]
        assert row["date"] == utc_day(when), "partitioned by the record's (or observed) day"


def check_partitions(run: SdkRun) -> None:
    assert encode_tenant(HTTP_TENANT) == "acme%2Bprod"
    assert encode_tenant(GRPC_TENANT) == "ops%3Deu%211"
    for row in run.duck.records + run.duck.audit:
        assert row["tenant_segment"] == encode_tenant(row["tenant"]), row["key"]
        assert decode_tenant(row["tenant_segment"]) == row["tenant"]
        assert row["partition_tenant"] == row["tenant"], "the reader decodes the partition"
    segments = {r["tenant_segment"] for r in run.duck.records}
    assert segments == {"acme%2Bprod", "ops%3Deu%211"}
    assert {r["tenant_segment"] for r in run.duck.audit} == segments
    assert run.keys and all(KEY_RE.fullmatch(k) for k in run.keys), run.keys


def _renders(template: str, params: list[str], body: str) -> bool:
    tokens = template.split()
    values = iter(params)
    if tokens.count("<*>") != len(params):
        return False
    return [next(values) if t == "<*>" else t for t in tokens] == body.split()


def check_templates(run: SdkRun) -> None:
    audit = run.duck.audit
    created = Counter((a["tenant"], a["template_id"]) for a in audit if a["change"] == "created")
    assert created, "no created audit events"
    assert all(c == 1 for c in created.values()), f"a template created twice: {created}"
    assert {a["change"] for a in audit} <= {"created", "changed"}
    for a in audit:
        if a["change"] == "created":
            assert a["template_version"] == 1, a
    versions: dict[tuple[str, int], list[str]] = defaultdict(list)
    for a in audit:
        versions[(a["tenant"], a["template_id"])].append(a["template"])
    for row in run.duck.records:
        key = (row["tenant"], row["template_id"])
        assert key in created, f"template {key} of {row['body']!r} has no created event"
        assert any(_renders(t, row["template_params"], row["body"]) for t in versions[key]), (
            f"no version of template {key} {versions[key]} with params"
            f" {row['template_params']} renders {row['body']!r}"
        )
    # A created event names the frame that created the template: a record of that
    # template was in it.
    seen = {(r["tenant"], r["template_id"], r["wal_lsn"]) for r in run.duck.records}
    for a in audit:
        if a["change"] == "created":
            assert (a["tenant"], a["template_id"], a["wal_lsn"]) in seen, a
    # Templates are per tenant: no id is shared between the two tenants.
    tenants_of: dict[int, set[str]] = defaultdict(set)
    for tenant, template_id in created:
        tenants_of[template_id].add(tenant)
    assert all(len(t) == 1 for t in tenants_of.values())


def check_wal_links(run: SdkRun) -> None:
    frames = {f.end_lsn: f for f in run.frames}
    for row in run.duck.records:
        frame = frames.get(row["wal_lsn"])
        assert frame is not None, f"wal_lsn {row['wal_lsn']} is not a frame end"
        assert frame.tenant == row["tenant"]
        record = frame.records()[row["record_index"]]
        uid = {kv.key: kv.value.string_value for kv in record.attributes}["test.uid"]
        assert uid == row["attributes"]["test.uid"], "(wal_lsn, record_index) → this record"
    assert sum(len(f.records()) for f in run.frames) == len(run.duck.records)
    for a in run.duck.audit:
        assert a["wal_lsn"] in frames and frames[a["wal_lsn"]].tenant == a["tenant"], a


def check_readers_agree(run: SdkRun) -> None:
    assert run.duck.records == run.arrow.records
    assert run.duck.audit == run.arrow.audit
    assert run.duck.keys == run.arrow.keys
    assert len(run.arrow.records) == 2 * N


ALL_CHECKS: tuple[Callable[[SdkRun], None], ...] = (
    check_exports,
    check_exactly_once,
    check_columns,
    check_partitions,
    check_templates,
    check_wal_links,
    check_readers_agree,
)


# ── SDK → local store ───────────────────────────────────────────────────────────────


def test_sdk_exports_are_acknowledged_one_frame_each(sdk_run: SdkRun) -> None:
    check_exports(sdk_run)


def test_sdk_records_published_exactly_once(sdk_run: SdkRun) -> None:
    check_exactly_once(sdk_run)


def test_sdk_record_columns_hold_what_was_sent(sdk_run: SdkRun) -> None:
    check_columns(sdk_run)


def test_sdk_tenant_partitions_are_percent_encoded(sdk_run: SdkRun) -> None:
    check_partitions(sdk_run)


def test_sdk_template_ids_have_created_audit_events(sdk_run: SdkRun) -> None:
    check_templates(sdk_run)


def test_sdk_rows_point_back_to_their_wal_frame(sdk_run: SdkRun) -> None:
    check_wal_links(sdk_run)


def test_sdk_duckdb_and_pyarrow_read_the_same_rows(sdk_run: SdkRun) -> None:
    check_readers_agree(sdk_run)


# ── SDK → S3 ────────────────────────────────────────────────────────────────────────


def test_sdk_to_s3_store(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    prefix = "e2e/ourios"
    # The smallest size trigger: partitions are detached during ingest and written by
    # the publisher thread (the local scenario publishes only in the shutdown flush).
    env = {
        **s3_bucket.env(),
        "OURIOS_STORE_URL": s3_bucket.url(prefix),
        "OURIOS_SINK_FLUSH_BYTES": "1024",
    }
    with ServeProcess(tmp_path / "data", env) as server:
        # gzip on both real clients here; the local scenario sends identity.
        sent, reports, code = run_sdk_scenario(server, http_gzip=True, grpc_gzip=True)
    assert not (tmp_path / "data" / "objects").exists(), "an S3 node wrote locally"
    root = tmp_path / "downloaded"
    keys = download_prefix(s3_bucket.server.client(), s3_bucket.name, prefix, root)
    assert keys, "nothing published to the bucket"
    assert all(k.startswith(prefix + "/") for k in keys), f"keys outside {prefix}/: {keys}"
    duck = read_store(root, "duckdb")
    run = SdkRun(
        sent,
        reports,
        duck,
        read_store(root, "pyarrow"),
        wal_batches(tmp_path / "data" / "wal"),
        code,
        duck.keys,
    )
    assert [f"{prefix}/{k}" for k in duck.keys] == keys
    records_objects = [k for k in duck.keys if k.startswith("records/")]
    # Each frame's rows are over the trigger, so each became an object of its own.
    assert len(records_objects) >= 2 * math.ceil(N / BATCH), records_objects
    for check in ALL_CHECKS:
        check(run)


# ── OTLP spec cases on a live server ────────────────────────────────────────────────


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("spec")) as server:
        yield server


def _empty_groups() -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.add(key="service.name").value.string_value = "idle"
    rl.scope_logs.add().scope.name = "nothing"
    req.resource_logs.add()
    return req


def _post(
    server: ServeProcess,
    body: bytes,
    content_type: str,
    tenant: str,
    *,
    gzip: bool = False,
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Content-Type": content_type, "X-Ourios-Tenant": tenant}
    if gzip:
        headers["Content-Encoding"] = "gzip"
        body = gzip_bytes(body)
    return server.post_logs(body, headers)


def _assert_empty_success(body: bytes, content_type: str) -> None:
    """An empty ExportLogsServiceResponse in the given encoding, nothing else."""
    if content_type == JSON:
        assert json.loads(body) == {}, body
    else:
        assert body == b"", body
        response = ExportLogsServiceResponse()
        response.ParseFromString(body)
        assert not response.HasField("partial_success")


EMPTY_BODIES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "http-protobuf-empty-body": (PROTOBUF, lambda: b""),
    "http-protobuf-empty-groups": (PROTOBUF, lambda: _empty_groups().SerializeToString()),
    "http-json-empty-object": (JSON, lambda: b"{}"),
    "http-json-empty-list": (JSON, lambda: b'{"resourceLogs": []}'),
    "http-json-empty-groups": (JSON, lambda: otlp_json(_empty_groups())),
    "grpc-empty-body": ("grpc", lambda: b""),
    "grpc-empty-groups": ("grpc", lambda: _empty_groups().SerializeToString()),
}


@pytest.mark.parametrize("case", sorted(EMPTY_BODIES))
def test_empty_request_is_ok_without_a_wal_frame(spec_server: ServeProcess, case: str) -> None:
    transport, make = EMPTY_BODIES[case]
    wal = spec_server.data_dir / "wal"
    before = wal_frame_count(wal)
    if transport == "grpc":
        reply = grpc_export(spec_server.grpc_port, make(), [("x-ourios-tenant", "empty")])
        assert reply.code is grpc.StatusCode.OK, reply
        assert reply.response is not None
        _assert_empty_success(reply.response, PROTOBUF)
    else:
        status, body, headers = _post(spec_server, make(), transport, "empty")
        assert status == 200, body
        assert headers["content-type"] == transport
        _assert_empty_success(body, transport)
    assert wal_frame_count(wal) == before, "an empty request wrote a WAL frame"


@pytest.mark.parametrize("transport", ["http-protobuf", "http-json", "grpc"])
def test_success_response_is_an_empty_export_response(
    spec_server: ServeProcess, transport: str
) -> None:
    tenant = f"ok-{transport}"
    req = sample_request(tenant, 3, time_base_ns=time.time_ns())
    wal = spec_server.data_dir / "wal"
    if transport == "grpc":
        reply = grpc_export(
            spec_server.grpc_port, req.SerializeToString(), [("x-ourios-tenant", tenant)]
        )
        assert reply.code is grpc.StatusCode.OK, reply
        assert reply.response is not None
        _assert_empty_success(reply.response, PROTOBUF)
    else:
        content_type = JSON if transport == "http-json" else PROTOBUF
        body = otlp_json(req) if content_type == JSON else req.SerializeToString()
        status, reply_body, headers = _post(spec_server, body, content_type, tenant)
        assert status == 200, reply_body
        assert headers["content-type"] == content_type
        _assert_empty_success(reply_body, content_type)
    assert wal_frame_count(wal, tenant) == 1


ERROR_CASES = {
    # content type sent, body, expected status, reply content type
    "x-protobuf": (PROTOBUF, b"\x0a\xff\xff\xff\x0f", 400, PROTOBUF),
    "protobuf-alias": ("application/protobuf", b"\x0a\x05abc", 400, PROTOBUF),
    "x-protobuf-with-params": (PROTOBUF + "; proto=otlp", b"\xff", 400, PROTOBUF),
    "json": (JSON, b'{"resourceLogs": [', 400, JSON),
    "json-charset": (JSON + "; charset=utf-8", b'{"resourceLogs": 7}', 400, JSON),
    "unsupported-type": ("text/plain", b"hello", 415, JSON),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_status_is_encoded_like_the_request(spec_server: ServeProcess, case: str) -> None:
    content_type, body, want_status, reply_type = ERROR_CASES[case]
    wal = spec_server.data_dir / "wal"
    before = wal_frame_count(wal)
    status, reply, headers = spec_server.post_logs(
        body, {"Content-Type": content_type, "X-Ourios-Tenant": "errors"}
    )
    assert status == want_status, reply
    assert headers["content-type"] == reply_type
    decoded = decode_status(reply, reply_type)
    assert decoded.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert decoded.message, "the Status says what is wrong"
    # And it is not the other encoding by accident.
    if reply_type == PROTOBUF:
        with pytest.raises(ValueError):
            json.loads(reply)
    else:
        assert json.loads(reply)["message"] == decoded.message
        with pytest.raises((DecodeError, ValueError)):
            decode_status(reply[:-1] + b"\xff", PROTOBUF)
    assert wal_frame_count(wal) == before


@pytest.mark.parametrize("transport", ["http-protobuf", "http-json", "grpc"])
def test_gzip_request_is_stored_decompressed(spec_server: ServeProcess, transport: str) -> None:
    tenant = f"gzip-{transport}"
    req = sample_request(tenant, 4, time_base_ns=time.time_ns())
    raw = req.SerializeToString()
    if transport == "grpc":
        reply = grpc_export(
            spec_server.grpc_port,
            raw,
            [("x-ourios-tenant", tenant)],
            compression=grpc.Compression.Gzip,
        )
        assert reply.code is grpc.StatusCode.OK, reply
    else:
        content_type = JSON if transport == "http-json" else PROTOBUF
        body = otlp_json(req) if content_type == JSON else raw
        status, reply_body, _ = _post(spec_server, body, content_type, tenant, gzip=True)
        assert status == 200, reply_body
        _assert_empty_success(reply_body, content_type)
    frames = [f for f in wal_batches(spec_server.data_dir / "wal") if f.tenant == tenant]
    assert [f.payload for f in frames] == [raw], "the WAL holds the decoded protobuf"


# ── publication of the spec cases (one server, terminated, then read) ───────────────

#: One request sent in each of these ways; every way must store and publish the same.
ENCODINGS: dict[str, dict[str, Any]] = {
    "http-protobuf": {},
    "http-json": {"json": {}},
    "http-json-enum-names": {"json": {"enum_names": True}},
    "http-json-int64-numbers": {"json": {"int64_as_numbers": True}},
    "http-json-upper-case-ids": {"json": {"upper_hex": True}},
    "http-gzip-protobuf": {"gzip": True},
    "http-gzip-json": {"gzip": True, "json": {}},
    "grpc": {"grpc": True},
    "grpc-gzip": {"grpc": True, "gzip": True},
}
EQUIV = "equiv"
DAYS = "days"
#: The longest tenant (128 bytes), full of characters the key encoding must escape.
LONG_TENANT = ("a%b=c+d!~" * 15)[:128]


def _send_encoding(
    server: ServeProcess, how: Mapping[str, Any], req: ExportLogsServiceRequest, tenant: str
) -> None:
    if how.get("grpc"):
        reply = grpc_export(
            server.grpc_port,
            req.SerializeToString(),
            [("x-ourios-tenant", tenant)],
            compression=grpc.Compression.Gzip if how.get("gzip") else None,
        )
        assert reply.code is grpc.StatusCode.OK, (how, reply)
        return
    if "json" in how:
        content_type, body = JSON, otlp_json(req, **how["json"])
    else:
        content_type, body = PROTOBUF, req.SerializeToString()
    status, reply_body, _ = _post(server, body, content_type, tenant, gzip=how.get("gzip", False))
    assert status == 200, (how, reply_body)


def _ns(when: str) -> int:
    return int(dt.datetime.fromisoformat(when).timestamp()) * 1_000_000_000


def _days_request() -> tuple[ExportLogsServiceRequest, list[str]]:
    """Records on three UTC days, out of order, one with only an observed time and
    one with a repeated attribute key; returns the request and each record's day."""
    req = ExportLogsServiceRequest()
    records = req.resource_logs.add().scope_logs.add().log_records
    plan = [
        (_ns("2024-02-29T23:59:59+00:00") + 999_999_999, 0, "2024-02-29"),
        (_ns("2024-03-01T00:00:00+00:00"), 0, "2024-03-01"),
        (0, _ns("2023-12-31T12:00:00+00:00"), "2023-12-31"),
        (_ns("2024-02-29T12:00:00+00:00"), 0, "2024-02-29"),
        (_ns("2024-03-01T05:00:00+00:00"), 0, "2024-03-01"),
    ]
    for i, (t, observed, _) in enumerate(plan):
        lr = records.add(time_unix_nano=t, observed_time_unix_nano=observed)
        lr.body.string_value = f"rollover check {i} passed"
        lr.attributes.add(key="test.uid").value.string_value = f"days-{i}"
        if i == 4:
            lr.attributes.add(key="dup").value.string_value = "first"
            lr.attributes.add(key="dup").value.string_value = "last"
    return req, [day for _, _, day in plan]


@dataclass
class PublishRun:
    req: ExportLogsServiceRequest
    days: list[str]
    frames: list[WalBatch]
    duck: Published
    arrow: Published


@pytest.fixture(scope="module")
def publish_run(tmp_path_factory: pytest.TempPathFactory) -> PublishRun:
    data_dir = tmp_path_factory.mktemp("publish")
    req = sample_request(EQUIV, 8, time_base_ns=time.time_ns())
    days_req, days = _days_request()
    with ServeProcess(data_dir) as server:
        for how in ENCODINGS.values():
            _send_encoding(server, how, req, EQUIV)
        # Empty requests on both transports, to a tenant that must never appear.
        assert _post(server, b"", PROTOBUF, "empty")[0] == 200
        assert _post(server, b"{}", JSON, "empty")[0] == 200
        assert _post(server, _empty_groups().SerializeToString(), PROTOBUF, "empty")[0] == 200
        assert grpc_export(server.grpc_port, b"", [("x-ourios-tenant", "empty")]).response == b""
        _send_encoding(server, {}, days_req, DAYS)
        _send_encoding(server, {"json": {}}, sample_request("long", 2, time_base_ns=1), LONG_TENANT)
        server.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert server.terminate() == 0
    objects = data_dir / "objects"
    return PublishRun(
        req,
        days,
        wal_batches(data_dir / "wal"),
        read_store(objects, "duckdb"),
        read_store(objects, "pyarrow"),
    )


def test_published_spec_rows_read_the_same_in_duckdb_and_pyarrow(publish_run: PublishRun) -> None:
    assert publish_run.duck == publish_run.arrow
    assert {r["tenant"] for r in publish_run.duck.records} == {EQUIV, DAYS, LONG_TENANT}


def test_every_encoding_stores_the_same_wal_payload(publish_run: PublishRun) -> None:
    frames = [f for f in publish_run.frames if f.tenant == EQUIV]
    assert len(frames) == len(ENCODINGS)
    raw = publish_run.req.SerializeToString()
    assert all(f.payload == raw for f in frames), "every encoding stores the same bytes"


def test_every_encoding_publishes_identical_rows(publish_run: PublishRun) -> None:
    frames = [f for f in publish_run.frames if f.tenant == EQUIV]
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in publish_run.duck.records_of(EQUIV):
        groups[row["wal_lsn"]].append(row)
    assert sorted(groups) == [f.end_lsn for f in frames], "one group of rows per frame"
    drop = frozenset({"wal_lsn", "key"})
    first, *rest = (
        [_content(r, drop) for r in sorted(g, key=lambda r: r["record_index"])]
        for _, g in sorted(groups.items())
    )
    assert len(first) == 8 and len(rest) == len(ENCODINGS) - 1
    # The first frame is mined while its templates are still being widened, so its
    # early rows carry fewer parameters; every later frame meets the settled templates.
    params = frozenset({"template_params"})
    for other in rest:
        assert [_content(r, params) for r in other] == [_content(r, params) for r in first]
        assert other == rest[0], "frames after the first are identical, parameters too"
    expected = _expected_rows(publish_run.req, EQUIV)
    assert [{k: r[k] for k in expected[0]} for r in first] == expected
    # The same bodies again and again: each template is created once, in the first frame.
    created = [a for a in publish_run.duck.audit_of(EQUIV) if a["change"] == "created"]
    assert len({a["template_id"] for a in created}) == len(created)
    assert {r["template_id"] for r in first} <= {a["template_id"] for a in created}
    assert all(a["wal_lsn"] == frames[0].end_lsn for a in created)


def test_empty_requests_publish_nothing(publish_run: PublishRun) -> None:
    assert "empty" not in {f.tenant for f in publish_run.frames}
    assert not [k for k in publish_run.duck.keys if "tenant=empty" in k]


def test_records_are_partitioned_by_their_utc_day(publish_run: PublishRun) -> None:
    rows = sorted(publish_run.duck.records_of(DAYS), key=lambda r: r["record_index"])
    assert [r["attributes"]["test.uid"] for r in rows] == [f"days-{i}" for i in range(5)]
    assert [r["date"] for r in rows] == publish_run.days
    assert [r["record_index"] for r in rows] == list(range(5)), "positions in the frame"
    assert len({r["wal_lsn"] for r in rows}) == 1, "one frame, split across partitions"
    for row in rows:
        assert f"/date={row['date']}/" in row["key"]
    assert len({r["key"] for r in rows}) == 3, "one object per day"
    assert rows[4]["attributes"] == {"test.uid": "days-4", "dup": "last"}, "last value wins"


def test_audit_rows_are_partitioned_by_their_utc_day(publish_run: PublishRun) -> None:
    audit = publish_run.duck.audit_of(DAYS)
    assert {a["change"] for a in audit} == {"created", "changed"}, audit
    misplaced = [
        (a["change"], a["time_unix_nano"], a["date"])
        for a in publish_run.duck.audit
        if a["date"] != utc_day(a["time_unix_nano"])
    ]
    assert not misplaced, f"audit rows under another day's partition: {misplaced}"


def test_longest_tenant_round_trips_through_the_key(publish_run: PublishRun) -> None:
    assert len(LONG_TENANT) == 128
    rows = publish_run.duck.records_of(LONG_TENANT)
    assert len(rows) == 2
    for row in rows + publish_run.duck.audit_of(LONG_TENANT):
        assert row["tenant_segment"] == encode_tenant(LONG_TENANT)
        assert row["partition_tenant"] == LONG_TENANT, "both readers decode %XX"
    assert "%25" in encode_tenant(LONG_TENANT) and "%2B" in encode_tenant(LONG_TENANT)


def _expected_rows(req: ExportLogsServiceRequest, tenant: str) -> list[dict[str, Any]]:
    """What `sample_request`'s records must become, derived from how it built them."""
    out: list[dict[str, Any]] = []
    index = 0
    for rl in req.resource_logs:
        resource = {kv.key: kv.value for kv in rl.resource.attributes}
        resource_text = {
            k: (
                v.string_value
                if v.HasField("string_value")
                else str(v.int_value)
                if v.HasField("int_value")
                else "true"
                if v.bool_value
                else "false"
            )
            for k, v in resource.items()
        }
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                i = lr.attributes[1].value.int_value  # test.seq
                uid = lr.attributes[0].value.string_value
                body = (
                    _compact({"event": "checkout", "uid": uid, "items": i})
                    if i % 4 == 3
                    else lr.body.string_value
                )
                out.append(
                    {
                        "tenant": tenant,
                        "record_index": index,
                        "time_unix_nano": lr.time_unix_nano,
                        "observed_time_unix_nano": lr.observed_time_unix_nano,
                        "severity_number": lr.severity_number,
                        "severity_text": lr.severity_text,
                        "body": body,
                        "attributes": {
                            "test.uid": uid,
                            "test.seq": str(i),
                            "test.ratio": repr(i / 4),
                            "test.ok": "true" if i % 2 == 0 else "false",
                            "test.raw": _compact(base64.b64encode(bytes([i % 256, 0xFF])).decode()),
                            "test.list": _compact(["a", i]),
                            "test.map": _compact({"k": "v", "n": i}),
                        },
                        "resource_attributes": resource_text,
                        "scope_name": sl.scope.name,
                        "trace_id": lr.trace_id.hex() if i % 2 == 0 else None,
                        "span_id": lr.span_id.hex() if i % 2 == 0 else None,
                    }
                )
                index += 1
    return out


def _content(row: Row, drop: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in drop}

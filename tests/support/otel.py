"""OpenTelemetry clients, raw OTLP bodies and WAL evidence for end-to-end tests against
a real `ourios serve` (`tests.support.serve.ServeProcess`).

Real SDK clients::

    with http_client(port, headers={"X-Ourios-Tenant": "acme"}, resource=...) as client:
        logger = client.provider.get_logger("scope")
        logger.emit(body=..., attributes=...)
        report = client.flush()      # force_flush + every export's result
        assert report.ok, report

`http_client` / `grpc_client` build an SDK `LoggerProvider` whose
`BatchLogRecordProcessor` exports through the SDK's own OTLP/HTTP or OTLP/gRPC log
exporter. The processor swallows export results (a refused batch is only logged), so
the exporter is wrapped in a `RecordingExporter` that keeps each result: a test knows
every batch was acknowledged, not merely that the queue drained.

Raw bodies: `sample_request` builds an `ExportLogsServiceRequest` with every value
kind the record columns convert; `otlp_json` encodes one as OTLP/JSON (hex ids,
integer enums), independently of the server's decoder; `gzip_bytes` and `gzip_bomb`
(streamed, never holding the inflated bytes) compress. `grpc_export` makes one raw
`LogsService/Export` call and returns the status code instead of raising.

WAL evidence: `wal_frame_count` (read-only `wal.inspection.verify_root`, safe against a
running server) and `wal_batches` (every frame's tenant, end LSN and payload; read-only,
consistent once the server is stopped or idle).
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.resources import Resource

from tests.support.closing import ClosedOnExit
from wal import FrameKind
from wal.frame import iter_payloads
from wal.fs import OsFs
from wal.inspection import verify_root
from wal.scan import list_root, scan_segment
from wal.segment import HEADER_SIZE

__all__ = [
    "ClientTls",
    "EXPORT_METHOD",
    "ExportReport",
    "GrpcReply",
    "RecordingExporter",
    "SdkClient",
    "WalBatch",
    "any_value",
    "decode_status",
    "grpc_client",
    "grpc_export",
    "gzip_bomb",
    "gzip_bytes",
    "http_client",
    "otlp_json",
    "sample_request",
    "wal_batches",
    "wal_frame_count",
]

#: DESIGN.md §3: the gRPC method, spelled out so the tests do not import the server's.
EXPORT_METHOD: Final = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
_FLUSH_TIMEOUT_MS: Final = 30_000
_MiB: Final = 1024 * 1024


# ── SDK clients ─────────────────────────────────────────────────────────────────────


class RecordingExporter(LogRecordExporter):
    """Delegates to a real exporter and keeps every `export` result (thread-safe: the
    batch processor exports from its worker thread)."""

    def __init__(self, inner: LogRecordExporter) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._results: list[tuple[int, LogRecordExportResult]] = []

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        result = self.inner.export(batch)
        with self._lock:
            self._results.append((len(batch), result))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = _FLUSH_TIMEOUT_MS) -> bool:
        return self.inner.force_flush(timeout_millis)

    @property
    def results(self) -> list[tuple[int, LogRecordExportResult]]:
        """(records in the batch, result) per export call, in call order."""
        with self._lock:
            return list(self._results)


@dataclass(frozen=True)
class ExportReport:
    """What a flush achieved: `flushed` is force_flush's return value."""

    flushed: bool
    results: list[tuple[int, LogRecordExportResult]]

    @property
    def exports(self) -> int:
        return len(self.results)

    @property
    def records_acknowledged(self) -> int:
        return sum(n for n, r in self.results if r is LogRecordExportResult.SUCCESS)

    @property
    def ok(self) -> bool:
        """Flushed in time, and every export call succeeded."""
        return self.flushed and all(r is LogRecordExportResult.SUCCESS for _, r in self.results)


@dataclass
class SdkClient(ClosedOnExit):
    """A LoggerProvider exporting through `exporter`; use as a context manager (shuts
    the provider down, which joins the processor's thread and closes the channel)."""

    provider: LoggerProvider
    exporter: RecordingExporter
    _closed: bool = field(default=False, repr=False)

    def flush(self, timeout_millis: int = _FLUSH_TIMEOUT_MS) -> ExportReport:
        flushed = self.provider.force_flush(timeout_millis)
        return ExportReport(flushed, self.exporter.results)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.provider.shutdown()


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (`ca_file`) and, for mutual TLS, the certificate it shows."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def grpc(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            read(self.ca_file), read(self.key_file), read(self.cert_file)
        )


def _sdk_client(exporter: LogRecordExporter, resource: Resource, batch_size: int) -> SdkClient:
    recording = RecordingExporter(exporter)
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    # A long delay: exports happen when a batch fills or on force_flush, never on a
    # timer, so the number of export calls (and WAL frames) is deterministic.
    provider.add_log_record_processor(
        BatchLogRecordProcessor(
            recording,
            schedule_delay_millis=600_000,
            max_export_batch_size=batch_size,
            max_queue_size=max(2048, batch_size),
        )
    )
    return SdkClient(provider, recording)


def http_client(
    port: int,
    *,
    headers: Mapping[str, str],
    resource: Resource,
    gzip: bool = False,
    batch_size: int = 512,
    tls: ClientTls | None = None,
) -> SdkClient:
    """The SDK's OTLP/HTTP (protobuf) log exporter pointed at `127.0.0.1:port/v1/logs`
    (https with `tls`)."""
    exporter = HttpLogExporter(
        endpoint=f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/logs",
        certificate_file=str(tls.ca_file) if tls else None,
        client_certificate_file=str(tls.cert_file) if tls and tls.cert_file else None,
        client_key_file=str(tls.key_file) if tls and tls.key_file else None,
        headers=dict(headers),
        timeout=30,
        compression=HttpCompression.Gzip if gzip else HttpCompression.NoCompression,
    )
    return _sdk_client(exporter, resource, batch_size)


def grpc_client(
    port: int,
    *,
    headers: Mapping[str, str],
    resource: Resource,
    gzip: bool = False,
    batch_size: int = 512,
    tls: ClientTls | None = None,
) -> SdkClient:
    """The SDK's OTLP/gRPC log exporter pointed at `127.0.0.1:port` (plaintext, or TLS
    with `tls`); `headers` become metadata (keys must be lower case)."""
    exporter = GrpcLogExporter(
        endpoint=f"{'https' if tls else 'http'}://127.0.0.1:{port}",
        insecure=tls is None,
        credentials=tls.grpc() if tls else None,
        headers=dict(headers),
        timeout=30,
        compression=grpc.Compression.Gzip if gzip else grpc.Compression.NoCompression,
    )
    return _sdk_client(exporter, resource, batch_size)


# ── raw bodies ──────────────────────────────────────────────────────────────────────

AnyValueLike = str | bool | int | float | bytes | Sequence[Any] | Mapping[str, Any] | None


def any_value(value: AnyValueLike) -> AnyValue:
    """A Python value as an OTLP AnyValue (None is an unset value)."""
    out = AnyValue()
    if value is None:
        return out
    if isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, Mapping):
        out.kvlist_value.values.extend(_key_values(value))
    else:
        out.array_value.values.extend(any_value(v) for v in value)
    return out


def _key_values(values: Mapping[str, AnyValueLike]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in values.items()]


def sample_request(
    tag: str,
    n: int,
    *,
    time_base_ns: int,
    resource: Mapping[str, AnyValueLike] | None = None,
    scope: str = "raw-client",
) -> ExportLogsServiceRequest:
    """`n` records whose bodies and `test.uid` attributes are `<tag>-<i>`, covering
    every value kind: string/int/double/bool/bytes/array/kvlist attributes, a kvlist
    body every fourth record (the string bodies end in a non-ASCII character),
    trace/span ids on even records only, varied severity.
    Two resources (the second holds the last record) so resource grouping is visible."""
    req = ExportLogsServiceRequest()
    first = req.resource_logs.add()
    first.resource.attributes.extend(
        _key_values(resource or {"service.name": f"raw-{tag}", "host.cores": 4, "canary": True})
    )
    second = req.resource_logs.add()
    second.resource.attributes.extend(_key_values({"service.name": f"raw-{tag}-b"}))
    scope_a = first.scope_logs.add()
    scope_a.scope.name = scope
    scope_b = second.scope_logs.add()
    scope_b.scope.name = f"{scope}-b"
    severities = ((9, "INFO"), (13, "WARN"), (17, "ERROR"), (5, "DEBUG"))
    for i in range(n):
        target = scope_b if i == n - 1 and n > 1 else scope_a
        lr: LogRecord = target.log_records.add()
        uid = f"{tag}-{i}"
        lr.time_unix_nano = time_base_ns + i
        lr.observed_time_unix_nano = time_base_ns + 1_000 + i
        lr.severity_number, lr.severity_text = severities[i % len(severities)]  # type: ignore[assignment]
        if i % 4 == 3:
            lr.body.CopyFrom(any_value({"event": "checkout", "uid": uid, "items": i}))
        else:
            lr.body.CopyFrom(any_value(f"worker {i % 3} finished job {uid} in {10 + i} ms ✓"))
        lr.attributes.extend(
            _key_values(
                {
                    "test.uid": uid,
                    "test.seq": i,
                    "test.ratio": i / 4,
                    "test.ok": i % 2 == 0,
                    "test.raw": bytes([i % 256, 0xFF]),
                    "test.list": ["a", i],
                    "test.map": {"k": "v", "n": i},
                }
            )
        )
        if i % 2 == 0:
            lr.trace_id = bytes([0xA0 + (i % 16)] * 15 + [i % 256])
            lr.span_id = bytes([0xB0] * 7 + [i % 256])
    return req


_INT64_JSON_FIELDS: Final = frozenset({"timeUnixNano", "observedTimeUnixNano", "intValue"})


def otlp_json(
    req: ExportLogsServiceRequest,
    *,
    enum_names: bool = False,
    int64_as_numbers: bool = False,
    upper_hex: bool = False,
) -> bytes:
    """`req` in the OTLP/JSON encoding: lowerCamelCase names, trace/span ids as hex (not
    proto3 JSON's base64), enums as integers and 64-bit integers as strings. The options
    pick the other spellings a receiver must also read: enum names, 64-bit integers as
    JSON numbers, upper-case hex ids."""
    doc = json_format.MessageToDict(req, use_integers_for_enums=not enum_names)
    for rl, rl_doc in zip(req.resource_logs, doc.get("resourceLogs", []), strict=True):
        for sl, sl_doc in zip(rl.scope_logs, rl_doc.get("scopeLogs", []), strict=True):
            for lr, lr_doc in zip(sl.log_records, sl_doc.get("logRecords", []), strict=True):
                for name, value in (("traceId", lr.trace_id), ("spanId", lr.span_id)):
                    if value:
                        lr_doc[name] = value.hex().upper() if upper_hex else value.hex()
    if int64_as_numbers:
        doc = _int64_numbers(doc)
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def _int64_numbers(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: int(v) if k in _INT64_JSON_FIELDS and isinstance(v, str) else _int64_numbers(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_int64_numbers(v) for v in node]
    return node


def gzip_bytes(data: bytes, level: int = 6) -> bytes:
    """`data` as one gzip member."""
    c = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def gzip_bomb(inflated_bytes: int, chunk: int = _MiB) -> bytes:
    """One gzip member that inflates to `inflated_bytes` zero bytes (a multiple of
    `chunk`); 1 GiB gives ~1 MiB. Streamed: the inflated bytes are never held, and only
    two chunks are compressed. After a full flush deflate starts afresh and byte-aligned,
    so every further zero chunk compresses to the same bytes, which are repeated; the
    CRC-32 is computed over the real zero stream."""
    if inflated_bytes <= 0 or inflated_bytes % chunk:
        raise ValueError(f"inflated_bytes must be a positive multiple of {chunk}")
    zeros = bytes(chunk)
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 9, zlib.Z_RLE)  # raw deflate
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    if c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) != again:
        raise AssertionError("deflate output after a full flush is not repeatable")
    final = c.flush(zlib.Z_FINISH)  # an empty last block
    count = inflated_bytes // chunk
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, mtime 0
    trailer = crc.to_bytes(4, "little") + (inflated_bytes % 2**32).to_bytes(4, "little")
    return header + first + again * (count - 1) + final + trailer


def decode_status(body: bytes, content_type: str) -> status_pb2.Status:
    """A `google.rpc.Status` error body in the encoding `content_type` names; raises if
    the body is not one (ValueError / DecodeError)."""
    status = status_pb2.Status()
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json":
        json_format.Parse(body.decode("utf-8"), status)
    elif media in ("application/x-protobuf", "application/protobuf"):
        status.ParseFromString(body)
    else:
        raise ValueError(f"a Status body has no content type {content_type!r}")
    return status


# ── raw gRPC ────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class GrpcReply:
    """One `Export` call's outcome: `response` is the reply bytes on OK, else None."""

    code: grpc.StatusCode
    details: str
    response: bytes | None


def grpc_export(
    port: int,
    body: bytes,
    metadata: Sequence[tuple[str, str]] = (),
    *,
    compression: grpc.Compression | None = None,
    timeout_s: float = 30.0,
    tls: ClientTls | None = None,
) -> GrpcReply:
    """Send `body` (raw ExportLogsServiceRequest bytes, unvalidated) to `Export` (over
    TLS with `tls`)."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    target = f"127.0.0.1:{port}"
    with (
        grpc.secure_channel(target, tls.grpc(), options=options)
        if tls is not None
        else grpc.insecure_channel(target, options=options)
    ) as channel:
        call = channel.unary_unary(EXPORT_METHOD)
        try:
            response = call(
                body, metadata=tuple(metadata), compression=compression, timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return GrpcReply(exc.code(), exc.details() or "", None)
    return GrpcReply(grpc.StatusCode.OK, "", bytes(response))


# ── WAL evidence ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class WalBatch:
    """One tenant-batch frame: `end_lsn` is the mark rows carry as `wal_lsn`."""

    tenant: str
    end_lsn: int
    payload: bytes

    @property
    def request(self) -> ExportLogsServiceRequest:
        req = ExportLogsServiceRequest()
        req.ParseFromString(self.payload)
        return req

    def records(self) -> list[LogRecord]:
        """The frame's log records in request order (what `record_index` counts)."""
        return [
            lr for rl in self.request.resource_logs for sl in rl.scope_logs for lr in sl.log_records
        ]


def wal_frame_count(wal_dir: Path, tenant: str | None = None) -> int:
    """Frames in the WAL (of `tenant` when given), by a read-only CRC walk that is
    safe while the server runs. Fails the caller on any problem in the root."""
    report = verify_root(wal_dir)
    assert report.ok, [str(p) for p in report.problems]
    if tenant is None:
        return sum(s.frames for s in report.segments)
    return sum(s.tenants.get(tenant, 0) for s in report.segments)


def wal_batches(wal_dir: Path) -> list[WalBatch]:
    """Every tenant-batch frame, oldest first (read-only; consistent when the server is
    stopped, or idle: every acknowledged frame is fsynced before its reply)."""
    out: list[WalBatch] = []
    fs = OsFs()
    for segment in list_root(fs, wal_dir).segments:
        scan = scan_segment(fs, segment)
        for frame, payload in iter_payloads(scan.data, scan.frames):
            if frame.kind is FrameKind.TENANT_BATCH:
                end = segment.base + frame.end - HEADER_SIZE
                out.append(WalBatch(frame.tenant, end, payload))
    return out

"""OTLP/HTTP and OTLP/gRPC logs: request bodies in, record columns and wire replies out.

Pure functions, no I/O: the receivers (`POST /v1/logs`, `LogsService/Export`) call them
in this order::

    decompress(body, content_encoding, limit)  -> bytes        (identity | gzip)
    decode_request(data, content_type, limits) -> ExportLogsServiceRequest, validated
    to_wal_payload(req)                        -> bytes        (JSON input only)
    flatten(req, tenant, limits)               -> FlatBatch    (the sink's record columns)
    decode_batch(data, content_type, tenant, limits)  -> the three above, in one call
                                               (protobuf: decode_flat, the native decoder)
    status_body(rejection, json) / success_body(rejected, message, json)
    parse_tenant(header, open_mode)            -> tenant

Invariant: every request that `decode_request` accepts can be stored in the WAL and,
after a crash, re-parsed and flattened to the same rows. Recovery re-reads the frame
payload, so a request that parsed once but cannot be replayed would wedge the node or
lose acknowledged records. That decides what is validated here and what is passed
through.

Refused with `BadRequest` (400 / INVALID_ARGUMENT):

- protobuf the parser rejects: corrupt wire format, a string field that is not UTF-8,
  nesting deeper than the parser's depth limit. The WAL payload of protobuf input is
  the decompressed body as received, so it re-parses exactly as it parsed here.
- JSON that is not UTF-8/valid JSON, a top level that is not an object, a field of the
  wrong JSON type (including a message-typed field holding anything but an object or
  null, which json_format alone would read as an empty message), an integer out of
  its field's range, an unpaired surrogate.
  JSON input is stored as `to_wal_payload(req)`: the protobuf the JSON parsed to, which
  the JSON parser's depth limit keeps within the protobuf parser's (tested).
- a `trace_id` that is not 0 or 16 bytes, a `span_id` that is not 0 or 8 bytes (in
  JSON: not 32/16 hex digits or empty). The sink stores ids as hex strings that trace
  stores join on; an id of another length cannot be one, and the OTLP spec defines no
  other length. The OpenTelemetry Collector refuses them too.
- a content or transfer coding that is corrupt (bad gzip, truncated, trailing bytes).

Passed through, because the OTLP spec lets receivers accept them or gives them meaning:
an empty request or empty groups (zero rows); all-zero ids (invalid per the spec, but
they are the sender's data); `time_unix_nano` 0 (unknown); severity numbers outside
the enum (proto3 enums are open); empty, duplicated or unusual attribute keys (last
wins when flattened); unknown protobuf fields (kept in the WAL bytes, ignored);
unknown JSON fields and unknown enum names (ignored, as the OTLP/JSON spec requires);
enum values as names as well as integers; 64-bit integers as JSON strings or numbers;
upper-case hex ids; fields the record columns do not carry (`flags`, `event_name`,
`dropped_attributes_count`, `schema_url`, scope version/attributes): kept in the WAL,
not flattened.

The refusals are the `IngestRejection` family (`app.base.rejections`: its docstring
maps each to its HTTP status and gRPC code). What one request may expand to is
`RequestLimits`: every decoder enforces that one object (its docstring).
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from app.base.batch import FlatBatch
from app.base.malloc_arenas import release_freed_memory
from app.base.rejections import (
    BadRequest,
    IngestRejection,
    PayloadTooLarge,
    RequestLimitExceeded,
    UnsupportedMediaType,
)
from app.receive import native
from sink import FLAT_SCHEMA
from wal import TENANT_RULE, bad_tenant_char, is_valid_tenant

__all__ = [
    "DEFAULT_TENANT",
    "JSON_CONTENT_TYPE",
    "PROTOBUF_CONTENT_TYPE",
    "RequestLimits",
    "count_records",
    "decode_batch",
    "decode_flat",
    "decode_request",
    "decompress",
    "empty_batch",
    "flatten",
    "parse_tenant",
    "status_body",
    "success_body",
    "to_wal_payload",
    "validate_request",
]

PROTOBUF_CONTENT_TYPE: Final = "application/x-protobuf"
JSON_CONTENT_TYPE: Final = "application/json"
DEFAULT_TENANT: Final = "default"

_PROTOBUF_MEDIA_TYPES: Final = frozenset({PROTOBUF_CONTENT_TYPE, "application/protobuf"})
_GZIP_CODINGS: Final = frozenset({"gzip", "x-gzip"})
_IDENTITY_CODINGS: Final = frozenset({"", "identity"})
_GZIP_MAGIC: Final = b"\x1f\x8b"
# Error messages quote at most this much of anything the client sent.
_ECHO_CHARS: Final = 32
_STR_MAP: Final = FLAT_SCHEMA.field("attributes").type
_EMPTY: Final = pa.RecordBatch.from_arrays(
    [pa.array([], field.type) for field in FLAT_SCHEMA], schema=FLAT_SCHEMA
)
# A parser's message can nest one clause per level; the client needs the first few.
_MAX_MESSAGE_CHARS: Final = 512


# ── request limits ──────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may expand to (DESIGN.md §7; the ``server.max_*`` settings).

    Every decoder enforces the same object: `decode_request` counts records, groups and
    attribute entries on the parsed message (or the parsed JSON document) before
    anything is built from them (`check_counts`, `_check_json_counts`); `flatten`
    checks key and value lengths and the values nested in arrays and kvlists as it
    walks, which it does only after the counts passed. The native decoder takes this
    object too (``app.receive.native``) and, past a limit, hands the request to the
    upb path, whose `refuse` words the error, so the two cannot disagree on a limit.

    - ``records``: log records in the request; resource and scope groups are bounded by
      it too (an empty group costs as much to parse as a record);
    - ``attributes_per_record``: attributes of one record, and of one resource;
    - ``attributes_per_request``: the attribute map entries the batch will hold — each
      record's own plus its resource's, which every row of the resource repeats — and,
      separately, the values nested in array and kvlist bodies and attribute values;
    - ``key_bytes`` / ``value_bytes``: one attribute key / value in UTF-8 bytes (a
      non-string value as the JSON text it is stored as);
    - ``expanded_bytes``: the string bytes the request's rows hold — each record's
      severity text, body and attributes, plus its resource's attributes and its scope's
      name, which every row of the resource (scope) repeats — in UTF-8 as the columns
      hold them (duplicated keys merged). The counts bound entries, not bytes: a small
      body of long resource values over many records would otherwise flatten to
      gigabytes. `flatten` sums it from sizes known once a resource's attributes are
      read, before anything is copied per row.

    Replay passes no limits: a frame already in the WAL is replayed whatever the
    limits are now.
    """

    records: int = 131_072
    attributes_per_record: int = 4_096
    attributes_per_request: int = 1_048_576
    key_bytes: int = 4_096
    value_bytes: int = 1 << 20
    expanded_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in _SETTING_OF:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def refuse(self, name: str, value: int, what: str) -> RequestLimitExceeded:
        """The refusal of limit ``name`` (the setting's name without ``server.``)."""
        return RequestLimitExceeded(_SETTING_OF[name], getattr(self, name), value, what)

    def check_counts(self, req: ExportLogsServiceRequest) -> None:
        """Refuse a parsed request over the count limits. Reads only lengths (no element
        is materialised), in O(groups + records) steps, each group count checked
        before its elements are visited."""
        resource_logs = req.resource_logs
        if len(resource_logs) > self.records:
            raise self.refuse("records", len(resource_logs), "the number of resource_logs")
        per_record = self.attributes_per_record
        records = groups = entries = 0
        for i, rl in enumerate(resource_logs):
            shared = len(rl.resource.attributes)
            if shared > per_record:
                raise self.refuse(
                    "attributes_per_record", shared, f"resource_logs[{i}].resource's attributes"
                )
            scopes = rl.scope_logs
            groups += len(scopes)
            if groups > self.records:
                raise self.refuse("records", groups, "the number of scope_logs")
            for j, sl in enumerate(scopes):
                logs = sl.log_records
                records += len(logs)
                if records > self.records:
                    raise self.refuse("records", records, "the number of log records")
                entries += shared * len(logs)
                for k, lr in enumerate(logs):
                    own = len(lr.attributes)
                    if own > per_record:
                        raise self.refuse(
                            "attributes_per_record",
                            own,
                            f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]'s attributes",
                        )
                    entries += own
                if entries > self.attributes_per_request:
                    raise self.refuse(
                        "attributes_per_request",
                        entries,
                        "the number of attributes (each record's own and its resource's)",
                    )


_SETTING_OF: Final = {
    "records": "max_request_records",
    "attributes_per_record": "max_attributes_per_record",
    "attributes_per_request": "max_attributes_per_request",
    "key_bytes": "max_attribute_key_bytes",
    "value_bytes": "max_attribute_value_bytes",
    "expanded_bytes": "max_expanded_bytes",
}


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def _echo(value: str) -> str:
    """A client-supplied value, quoted and escaped, cut to a bounded prefix."""
    if len(value) <= _ECHO_CHARS:
        return ascii(value)
    return ascii(value[:_ECHO_CHARS]) + "..."


# ── request bodies ──────────────────────────────────────────────────────────────────


def decompress(
    body: bytes,
    content_encoding: str | None,
    limit: int,
    grow: Callable[[int], object] | None = None,
) -> bytes:
    """The request body with its content coding removed, at most `limit` bytes.

    `identity` (or no header) and `gzip`/`x-gzip` are accepted; anything else is
    `UnsupportedMediaType`. The limit applies to the decompressed size and gzip is
    inflated incrementally against it, at most `INFLATE_STEP` bytes per step, so a gzip
    bomb costs at most `limit` bytes of memory before `PayloadTooLarge`. `grow` is told
    each step's output size before the next step runs (the receivers' in-flight budget,
    which may refuse: inflating stops there). Concatenated gzip members are one body
    (RFC 1952 §2.2); anything else after the last member is `BadRequest`.
    """
    coding = (content_encoding or "").strip().lower()
    if coding in _IDENTITY_CODINGS:
        if len(body) > limit:
            raise PayloadTooLarge(limit)
        return body
    if coding in _GZIP_CODINGS:
        return _gunzip(body, limit, grow)
    raise UnsupportedMediaType(
        f"unsupported Content-Encoding {_echo(content_encoding or '')}; accepted: gzip, identity"
    )


#: Output bytes of one inflate step (`decompress`).
INFLATE_STEP: Final = 1 << 20


def _gunzip(body: bytes, limit: int, grow: Callable[[int], object] | None) -> bytes:
    chunks: list[bytes] = []
    total = 0
    pending = body
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
        while True:
            # One byte over the remaining budget is enough to know the limit is
            # exceeded, and bounds what zlib may allocate for this call.
            step = min(limit - total + 1, INFLATE_STEP)
            try:
                chunk = inflater.decompress(pending, step)
            except zlib.error as exc:
                raise BadRequest(f"body is not valid gzip: {exc}") from exc
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(limit)
            if grow is not None and chunk:
                grow(len(chunk))
            chunks.append(chunk)
            if inflater.eof:
                break
            pending = inflater.unconsumed_tail
            if not pending and len(chunk) < step:
                # The step's output was not filled, so zlib stopped for want of input.
                raise BadRequest("gzip body is truncated")
        pending = inflater.unused_data
        if not pending:
            return b"".join(chunks)
        if pending[:2] != _GZIP_MAGIC:
            raise BadRequest(f"{len(pending)} bytes after the end of the gzip stream")


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def decode_request(
    data: bytes, content_type: str, limits: RequestLimits | None = None
) -> ExportLogsServiceRequest:
    """Parse and validate a decompressed `/v1/logs` body.

    `application/x-protobuf` or `application/protobuf` is the protobuf encoding,
    `application/json` the OTLP/JSON encoding; parameters (`; charset=utf-8`) are
    ignored. Any other type is `UnsupportedMediaType`; a body that does not parse or
    fails `validate_request` is `BadRequest`. For protobuf input the WAL stores `data`
    itself; for JSON input it stores `to_wal_payload(req)`. With `limits`, a request
    over a count limit is `RequestLimitExceeded`, before anything is built from it.
    """
    media_type = _media_type(content_type)
    if media_type in _PROTOBUF_MEDIA_TYPES:
        req = _decode_protobuf(data)
        if limits is not None:
            limits.check_counts(req)
    elif media_type == JSON_CONTENT_TYPE:
        req = _decode_json(data, limits)
    else:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {_echo(content_type)}; accepted: "
            f"{PROTOBUF_CONTENT_TYPE}, application/protobuf, {JSON_CONTENT_TYPE}"
        )
    validate_request(req)
    return req


def to_wal_payload(req: ExportLogsServiceRequest) -> bytes:
    """The protobuf encoding of a request decoded from JSON, as the WAL stores it."""
    payload: bytes = req.SerializeToString()
    return payload


def _decode_protobuf(data: bytes) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    try:
        req.ParseFromString(data)
    except DecodeError as exc:
        raise BadRequest(_bounded(f"invalid OTLP protobuf: {exc}")) from exc
    return req


def _decode_json(data: bytes, limits: RequestLimits | None) -> ExportLogsServiceRequest:
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise BadRequest(f"JSON body is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except ValueError as exc:
        # e.g. an integer literal longer than the interpreter's digit limit
        raise BadRequest(_bounded(f"invalid JSON: {exc}")) from exc
    except RecursionError as exc:
        raise BadRequest("invalid JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise BadRequest(f"an OTLP/JSON request is a JSON object, got {_json_type_name(doc)}")
    if limits is not None:
        _check_json_counts(doc, limits)
    _prepare_json(doc)
    req = ExportLogsServiceRequest()
    try:
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise BadRequest(_bounded(f"invalid OTLP/JSON: {exc}")) from exc
    return req


def _json_list(obj: object, camel: str, snake: str) -> list[Any]:
    """A repeated field of a JSON object under either name; anything but a list is
    left for `_prepare_json` and json_format to report, and counts as empty here."""
    if not isinstance(obj, dict):
        return []
    value = obj.get(camel, obj.get(snake))
    return value if isinstance(value, list) else []


def _check_json_counts(doc: dict[str, Any], limits: RequestLimits) -> None:
    """`RequestLimits.check_counts` on the parsed JSON document, before json_format
    builds a message from it (which costs far more per element than the document)."""
    resource_logs = _json_list(doc, "resourceLogs", "resource_logs")
    if len(resource_logs) > limits.records:
        raise limits.refuse("records", len(resource_logs), "the number of resource_logs")
    per_record = limits.attributes_per_record
    records = groups = entries = 0
    for i, rl in enumerate(resource_logs):
        resource = rl.get("resource") if isinstance(rl, dict) else None
        shared = len(_json_list(resource, "attributes", "attributes"))
        if shared > per_record:
            raise limits.refuse(
                "attributes_per_record", shared, f"resource_logs[{i}].resource's attributes"
            )
        scopes = _json_list(rl, "scopeLogs", "scope_logs")
        groups += len(scopes)
        if groups > limits.records:
            raise limits.refuse("records", groups, "the number of scope_logs")
        for j, sl in enumerate(scopes):
            logs = _json_list(sl, "logRecords", "log_records")
            records += len(logs)
            if records > limits.records:
                raise limits.refuse("records", records, "the number of log records")
            entries += shared * len(logs)
            for k, lr in enumerate(logs):
                own = len(_json_list(lr, "attributes", "attributes"))
                if own > per_record:
                    raise limits.refuse(
                        "attributes_per_record",
                        own,
                        f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]'s attributes",
                    )
                entries += own
            if entries > limits.attributes_per_request:
                raise limits.refuse(
                    "attributes_per_request",
                    entries,
                    "the number of attributes (each record's own and its resource's)",
                )


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# The OTLP/JSON encoding writes these `bytes` fields as hex, where the proto3 JSON
# mapping that json_format implements expects base64: field full name -> hex digits.
_JSON_HEX_IDS: Final = {
    "opentelemetry.proto.logs.v1.LogRecord.trace_id": 32,
    "opentelemetry.proto.logs.v1.LogRecord.span_id": 16,
}
_HEX_RE: Final = re.compile(r"[0-9a-fA-F]*")
# json_format's own nesting limit (in messages); checked here too so the walk below
# cannot recurse further than the parser would.
_MAX_JSON_DEPTH: Final = 100


class _JsonFieldError(Exception):
    """A shape error inside the JSON walk; the path is assembled while unwinding, so
    the walk builds no path strings for a valid document."""

    def __init__(self, problem: str, segment: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments = [segment]


# What the walk needs of a field: the message it holds (None for a hex id), whether it
# is repeated, and the hex digits of an id (0 otherwise).
_JsonField = tuple[Any, bool, int]


@functools.cache
def _json_fields(descriptor: Any) -> dict[str, _JsonField]:
    """A message's message-typed and hex-id fields by both names OTLP/JSON may use,
    lowerCamelCase and the original snake_case; other fields are json_format's."""
    fields: dict[str, _JsonField] = {}
    for fd in descriptor.fields:
        digits = _JSON_HEX_IDS.get(fd.full_name, 0)
        if fd.message_type is not None or digits:
            # `is_repeated` replaced `label` in protobuf 6; pyproject allows 5.
            repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == 3
            fields[fd.name] = fields[fd.json_name] = (fd.message_type, repeated, digits)
    return fields


def _prepare_json(doc: dict[str, Any]) -> None:
    """Check a JSON request against the messages it encodes, before json_format sees it.

    json_format accepts a string (or anything iterable) where a message belongs and
    reads its characters as field names, which `ignore_unknown_fields` then drops, so a
    body of `"text"` would silently become an empty record; here every message-typed
    field must hold an object (or null). Hex ids are rewritten in place as base64.
    Scalar values are left for json_format to check and report.
    """
    try:
        _prepare_object(doc, ExportLogsServiceRequest.DESCRIPTOR, 0)
    except _JsonFieldError as exc:
        where = "".join(reversed(exc.segments)).lstrip(".")
        raise BadRequest(f"invalid OTLP/JSON: {where or 'the request'} {exc.problem}") from None


def _prepare_object(obj: dict[str, Any], descriptor: Any, depth: int) -> None:
    if depth > _MAX_JSON_DEPTH:
        raise _JsonFieldError("is nested too deeply", "")
    fields = _json_fields(descriptor)
    for name, value in obj.items():
        spec = fields.get(name)
        if spec is None or value is None:  # unknown, scalar, or null (the default)
            continue
        message_type, repeated, digits = spec
        try:
            if digits:
                # Replacing a value while iterating is safe: the dict's size is unchanged.
                obj[name] = _hex_id_to_base64(value, digits)
            elif not repeated:
                if not isinstance(value, dict):
                    raise _JsonFieldError(
                        f"must be a JSON object, got {_json_type_name(value)}", ""
                    )
                _prepare_object(value, message_type, depth + 1)
            elif isinstance(value, list):  # a non-array is reported by json_format
                for i, item in enumerate(value):
                    try:
                        if not isinstance(item, dict):
                            raise _JsonFieldError(
                                f"must be a JSON object, got {_json_type_name(item)}", ""
                            )
                        _prepare_object(item, message_type, depth + 1)
                    except _JsonFieldError as exc:
                        exc.segments.append(f"[{i}]")
                        raise
        except _JsonFieldError as exc:
            exc.segments.append(f".{name}")
            raise


def _hex_id_to_base64(value: object, digits: int) -> str:
    if not isinstance(value, str):
        raise _JsonFieldError(f"must be a hex string, got {_json_type_name(value)}", "")
    if len(value) not in (0, digits) or not _HEX_RE.fullmatch(value):
        raise _JsonFieldError(f"must be {digits} hex digits or empty, got {_echo(value)}", "")
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def validate_request(req: ExportLogsServiceRequest) -> None:
    """Refuse what the WAL must never hold (see the module docstring): ids whose length
    is neither empty nor the OTLP length. `decode_request` calls it; a gRPC receiver
    that lets grpcio deserialize calls it itself."""
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                t = len(lr.trace_id)
                s = len(lr.span_id)
                if (t and t != 16) or (s and s != 8):
                    _raise_bad_id(req)


def _raise_bad_id(req: ExportLogsServiceRequest) -> None:
    # Off the hot path: walk again with positions to name the first offender.
    for i, rl in enumerate(req.resource_logs):
        for j, sl in enumerate(rl.scope_logs):
            for k, lr in enumerate(sl.log_records):
                where = f"resource_logs[{i}].scope_logs[{j}].log_records[{k}]"
                for name, value, size in (
                    ("trace_id", lr.trace_id, 16),
                    ("span_id", lr.span_id, 8),
                ):
                    if len(value) not in (0, size):
                        raise BadRequest(
                            f"{where}.{name} is {len(value)} bytes; must be 0 or {size}"
                        )


#: a body from which a refusal over a limit gives the allocator's free memory back: its
#: parse may have been 30 times the body (`release_freed_memory`); below it, not worth
#: the trim's walk of the heap
_TRIM_AFTER_BYTES: Final = 1 << 20


def decode_batch(
    data: bytes, content_type: str, tenant: str, limits: RequestLimits | None
) -> tuple[bytes, FlatBatch] | None:
    """`decode_request` then `flatten`: the WAL payload (`data` itself for protobuf,
    `to_wal_payload` for JSON) and the rows; None when the request holds no records.
    Protobuf goes through `decode_flat` (the native decoder when it can).

    A refusal leaves with no traceback into this call: a traceback keeps its frames'
    locals alive, and the parsed request of a hostile body can be 30 times the body —
    held by a refusal that waits to be answered, it outlives the decode slot that
    bounded it (measured: 16 such refusals in flight held 3.7 GB)."""
    req: ExportLogsServiceRequest | None = None
    try:
        if _media_type(content_type) in _PROTOBUF_MEDIA_TYPES:
            batch = decode_flat(data, tenant, limits)
            return (data, batch) if len(batch) else None
        req = decode_request(data, content_type, limits)
        if count_records(req) == 0:
            return None
        return to_wal_payload(req), flatten(req, tenant, limits)
    except IngestRejection as exc:
        req = None
        exc = exc.with_traceback(None)  # frees the parse: the traceback held its frames
        if isinstance(exc, RequestLimitExceeded) and len(data) >= _TRIM_AFTER_BYTES:
            release_freed_memory()
        raise exc from None


def count_records(req: ExportLogsServiceRequest) -> int:
    """The number of log records in the request (what partial success counts)."""
    return sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)


# ── flattening ──────────────────────────────────────────────────────────────────────


def empty_batch(tenant: str) -> FlatBatch:
    """A request with no records."""
    return FlatBatch(tenant, _EMPTY)


def flatten(
    req: ExportLogsServiceRequest, tenant: str, limits: RequestLimits | None = None
) -> FlatBatch:
    """Every log record of `req` as a row of the decoder's Arrow columns, in request
    order. The walk fills flat Python lists (values, and offsets for the maps) and each
    column becomes an Arrow array in one call; no per-row Python object outlives it.
    A resource's attributes and a scope's name are converted once and gathered by row
    index (``take``).

    With `limits` (the receivers'; `decode_request` has checked the counts), a key or
    value over its length limit, or values nested in arrays and kvlists past the
    request's attribute limit, is `RequestLimitExceeded` as soon as the walk meets it;
    so are rows over ``limits.expanded_bytes``: a resource's attributes and its scopes'
    names times their records as soon as the resource is read, the rows' own strings
    once walked, and both before the resource attributes and scope names are copied
    per row (the one step the request's size does not bound)."""
    check = _Checks(limits)
    walked = _walk(req, check)
    if not walked.times:
        return FlatBatch(tenant, _EMPTY)
    return FlatBatch(tenant, _arrays(walked, check))


class _Walked(NamedTuple):
    """The flat lists ``_walk`` fills, one entry a row (or a resource, or a scope)."""

    times: list[int]
    observed: list[int]
    severities: list[int]
    severity_texts: list[str]
    bodies: list[str]
    traces: list[str | None]
    spans: list[str | None]
    keys: list[str]
    values: list[str]
    ends: list[int]
    resource_keys: list[str]
    resource_values: list[str]
    resource_ends: list[int]
    resource_rows: list[int]
    scopes: list[str]
    scope_rows: list[int]


def _walk(req: ExportLogsServiceRequest, check: _Checks) -> _Walked:
    """``flatten``'s pass over the request: every field read once into flat lists, the
    limits checked as the walk meets them (``flatten``'s docstring)."""
    w = _Walked([], [], [], [], [], [], [], [], [], [0], [], [], [0], [], [], [])
    resource_keys, resource_ends = w.resource_keys, w.resource_ends
    scopes = w.scopes
    for rl in req.resource_logs:
        resource = _attribute_dict(rl.resource.attributes, check)
        if check.limits is not None:
            check.repeated(resource, rl.scope_logs)
        resource_index = len(resource_ends) - 1
        resource_keys.extend(resource)
        w.resource_values.extend(resource.values())
        resource_ends.append(len(resource_keys))
        for sl in rl.scope_logs:
            records = sl.log_records
            if not records:
                continue
            scope_index = len(scopes)
            scopes.append(sl.scope.name)
            _walk_records(records, w, check)
            count = len(records)
            w.resource_rows.extend(itertools.repeat(resource_index, count))
            w.scope_rows.extend(itertools.repeat(scope_index, count))
    return w


def _walk_records(records: Any, w: _Walked, check: _Checks) -> None:
    """One scope's log records into ``w``'s row lists (``_walk``)."""
    # With upb every attribute access creates a Python object, so each field is read
    # exactly once, bound methods are hoisted out of the loop, and the common case (a
    # non-empty string value) is tested with the string itself instead of WhichOneof.
    key_chars, value_chars = check.key_chars, check.value_chars
    keys, values = w.keys, w.values
    add_time, add_observed = w.times.append, w.observed.append
    add_severity, add_severity_text = w.severities.append, w.severity_texts.append
    add_body, add_trace, add_span = w.bodies.append, w.traces.append, w.spans.append
    add_key, add_value, add_end = keys.append, values.append, w.ends.append
    value_text = check.value_text
    for lr in records:
        add_time(lr.time_unix_nano)
        add_observed(lr.observed_time_unix_nano)
        add_severity(lr.severity_number)
        add_severity_text(lr.severity_text)
        body = lr.body
        text = body.string_value
        add_body(text if text else value_text(body))
        # Slicing builds the element wrappers in one C loop, measured ~15% faster
        # than iterating the repeated field itself.
        start = len(keys)
        for kv in lr.attributes[:]:
            value = kv.value
            key = kv.key
            text = value.string_value or value_text(value)
            # Fewer characters than a quarter of the bound cannot be over it in
            # UTF-8; only longer ones are measured (two compares per attribute).
            if len(key) > key_chars:
                check.key(key)
            if len(text) > value_chars:
                check.value(key, text)
            add_key(key)
            add_value(text)
        end = len(keys)
        if end - start > 1 and len(set(keys[start:])) != end - start:
            _unique_keys(keys, values, start)  # rare: a duplicated key
            end = len(keys)
        add_end(end)
        trace_id = lr.trace_id
        add_trace(trace_id.hex() if trace_id else None)
        span_id = lr.span_id
        add_span(span_id.hex() if span_id else None)


def _arrays(walked: _Walked, check: _Checks) -> pa.RecordBatch:
    """The walked lists as the decoder's Arrow columns (``FLAT_SCHEMA``), each in one call;
    the rows' bytes checked against ``limits.expanded_bytes`` before the resource
    attributes and scope names are copied per row."""
    (
        times,
        observed,
        severities,
        severity_texts,
        bodies,
        traces,
        spans,
        keys,
        values,
        ends,
        resource_keys,
        resource_values,
        resource_ends,
        resource_rows,
        scopes,
        scope_rows,
    ) = walked
    n = len(times)
    severity_text_array = pa.array(severity_texts, pa.string())
    body_array = pa.array(bodies, pa.string())
    key_array = pa.array(keys, pa.string())
    value_array = pa.array(values, pa.string())
    if check.limits is not None:
        check.rows(severity_text_array, body_array, key_array, value_array)
    resources = pa.MapArray.from_arrays(
        pa.array(resource_ends, pa.int32()),
        pa.array(resource_keys, pa.string()),
        pa.array(resource_values, pa.string()),
        type=_STR_MAP,
    )
    arrays = [
        pa.array(times, pa.uint64()),
        pa.array(observed, pa.uint64()),
        pa.array(severities, pa.int32()),
        severity_text_array,
        body_array,
        pa.MapArray.from_arrays(pa.array(ends, pa.int32()), key_array, value_array, type=_STR_MAP),
        resources.take(pa.array(resource_rows, pa.int32())),
        pa.array(scopes, pa.string()).take(pa.array(scope_rows, pa.int32())),
        pa.array(traces, pa.string()),
        pa.array(spans, pa.string()),
        _record_indexes(n),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=FLAT_SCHEMA)


def decode_flat(data: bytes, tenant: str, limits: RequestLimits | None = None) -> FlatBatch:
    """``flatten(decode_request(data, protobuf, limits), tenant, limits)``: the native
    decoder's columns when it is in use and the request is on its fast path and within
    `limits` (``app.receive.native``), else that very call, which also words every
    refusal — a request over a limit included, so its 400 names the setting exactly as
    the upb path does. Replay passes no limits."""
    columns = native.decode(data, limits)
    if columns is not None:
        return FlatBatch(tenant, columns)
    return flatten(decode_request(data, PROTOBUF_CONTENT_TYPE, limits), tenant, limits)


#: 0, 1, 2, …: every batch's ``record_index`` is a zero-copy slice of it (an Arrow array
#: is immutable, so batches may share its buffer).
_INDEXES: list[pa.Array] = [pa.array(range(1024), pa.int32())]


def _record_indexes(n: int) -> pa.Array:
    indexes = _INDEXES[0]
    if n > len(indexes):
        indexes = _INDEXES[0] = pa.array(range(max(n, 2 * len(indexes))), pa.int32())
    return indexes.slice(0, n)


def _unique_keys(keys: list[str], values: list[str], start: int) -> None:
    """Make the keys from ``start`` on unique: a duplicated key keeps its first position
    and its last value (a dict's rule)."""
    unique = dict(zip(keys[start:], values[start:], strict=True))
    del keys[start:], values[start:]
    keys.extend(unique)
    values.extend(unique.values())


def _attribute_dict(attributes: Any, check: _Checks) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in attributes[:]:
        value = kv.value
        key = kv.key
        text = value.string_value or check.value_text(value)
        if len(key) > check.key_chars:
            check.key(key)
        if len(text) > check.value_chars:
            check.value(key, text)
        out[key] = text
    return out


class _Checks:
    """`flatten`'s side of `RequestLimits`: the length bounds as character counts below
    which no string can be over them (a UTF-8 character is at most 4 bytes), the exact
    checks for longer strings, the budget of values nested in arrays and kvlists, and
    the bytes the rows will hold. Without limits every bound is infinite and the budget
    never runs out."""

    __slots__ = ("budget", "key_chars", "limits", "repeated_bytes", "value_chars")

    def __init__(self, limits: RequestLimits | None) -> None:
        self.limits = limits
        self.key_chars = limits.key_bytes // 4 if limits else _UNBOUNDED
        self.value_chars = limits.value_bytes // 4 if limits else _UNBOUNDED
        self.budget = limits.attributes_per_request if limits else _UNBOUNDED
        #: the resources' attributes and scopes' names as the rows will repeat them
        self.repeated_bytes = 0

    def repeated(self, resource: dict[str, str], scope_logs: Any) -> None:
        """Add what one resource's rows repeat — its attributes (`resource`, duplicates
        merged) and each scope's name, once a record — and refuse past
        ``expanded_bytes``: read from sizes, before its records are walked."""
        assert self.limits is not None
        per_row = sum(_utf8_bytes(k) + _utf8_bytes(v) for k, v in resource.items())
        for sl in scope_logs:
            count = len(sl.log_records)
            if count:
                self.repeated_bytes += (per_row + _utf8_bytes(sl.scope.name)) * count
        if self.repeated_bytes > self.limits.expanded_bytes:
            raise self.limits.refuse(
                "expanded_bytes",
                self.repeated_bytes,
                "the bytes the request expands to, counting so far only the resource "
                "attributes and scope names its records repeat,",
            )

    def rows(self, *columns: pa.Array) -> None:
        """Refuse rows whose own strings (`columns`: severity texts, bodies, attribute
        keys and values) and repeated ones pass ``expanded_bytes``."""
        assert self.limits is not None
        total = self.repeated_bytes + sum(_string_bytes(column) for column in columns)
        if total > self.limits.expanded_bytes:
            raise self.limits.refuse(
                "expanded_bytes",
                total,
                "the bytes the request expands to (each record's severity text, body and "
                "attributes, and its resource's attributes and scope name)",
            )

    def key(self, key: str) -> None:
        assert self.limits is not None
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > self.limits.key_bytes:
            raise self.limits.refuse("key_bytes", size, f"the attribute key {_echo(key)}'s bytes")

    def value(self, key: str, text: str) -> None:
        assert self.limits is not None
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.limits.value_bytes:
            raise self.limits.refuse(
                "value_bytes", size, f"the value of attribute {_echo(key)} in bytes"
            )

    def nested(self, count: int) -> None:
        """`count` more values nested in an array or kvlist."""
        self.budget -= count
        if self.budget < 0 and self.limits is not None:
            raise self.limits.refuse(
                "attributes_per_request",
                self.limits.attributes_per_request - self.budget,
                "the number of values nested in arrays and kvlists",
            )

    def value_text(self, value: Any) -> str:
        return _value_text(value, self)


_UNBOUNDED: Final = 1 << 62


def _utf8_bytes(text: str) -> int:
    """`text`'s length in UTF-8 (an ASCII string's is its length: no encoding)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _string_bytes(column: pa.Array) -> int:
    """The bytes of a string column's values (its data, from its lengths)."""
    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


_dumps: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
).encode


def _value_text(value: Any, check: _Checks | None = None) -> str:
    """A top-level body or attribute value whose `string_value` is empty, as text."""
    kind = value.WhichOneof("value")
    if kind is None or kind == "string_value" or kind == "string_value_strindex":
        # Unset, the empty string, or a profiles dictionary index that means nothing
        # without the profiles dictionary: all render as the empty string.
        return ""
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    text: str = _dumps(_json_value(value, check))
    return text


def _json_value(value: Any, check: _Checks | None = None) -> object:
    """An AnyValue as the Python value `json` encodes (deterministic: same input, same
    text). Recursion depth is bounded by the protobuf parser's nesting limit."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        string: str = value.string_value
        return string
    if kind == "int_value":
        integer: int = value.int_value
        return integer
    if kind == "bool_value":
        flag: bool = value.bool_value
        return flag
    if kind == "double_value":
        return _json_double(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind == "array_value":
        items = value.array_value.values
        if check is not None:
            check.nested(len(items))  # before any element is built
        return [_json_value(item, check) for item in items]
    if kind == "kvlist_value":
        entries = value.kvlist_value.values
        if check is not None:
            check.nested(len(entries))
        return {kv.key: _json_value(kv.value, check) for kv in entries}
    return None  # unset, or string_value_strindex (see _value_text)


def _json_double(number: float) -> float | str:
    # JSON has no NaN or infinities; these are the proto3 JSON mapping's spellings.
    if math.isfinite(number):
        return number
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


# ── replies ─────────────────────────────────────────────────────────────────────────


def _encode(message: Any, as_json: bool) -> tuple[bytes, str]:
    if as_json:
        doc = json_format.MessageToDict(message)
        return _dumps(doc).encode("utf-8"), JSON_CONTENT_TYPE
    payload: bytes = message.SerializeToString()
    return payload, PROTOBUF_CONTENT_TYPE


def status_body(rejection: IngestRejection, json: bool) -> tuple[bytes, str]:
    """The HTTP error body: a `google.rpc.Status` with the gRPC code number and the
    message, plus a RetryInfo detail when the rejection carries `retry_after`, encoded
    like the request (`json`) and its content type."""
    status = status_pb2.Status(code=rejection.grpc_code.value[0], message=rejection.message)
    if rejection.retry_after is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.seconds = rejection.retry_after
        status.details.add().Pack(retry)
    return _encode(status, json)


def success_body(rejected: int, message: str, json: bool) -> tuple[bytes, str]:
    """An `ExportLogsServiceResponse`: empty, or with `partial_success` when `rejected`
    records were refused (`message` says why)."""
    if rejected < 0:
        raise ValueError(f"rejected must be >= 0, got {rejected}")
    response = ExportLogsServiceResponse()
    if rejected:
        response.partial_success.rejected_log_records = rejected
        response.partial_success.error_message = message
    return _encode(response, json)


# ── tenants ─────────────────────────────────────────────────────────────────────────


def parse_tenant(value: str | bytes | None, open_mode: bool) -> str:
    """The tenant named by an `X-Ourios-Tenant` header (or `x-ourios-tenant` gRPC
    metadata). Without the header, open mode writes tenant `default`; with auth
    configured the header is required (`BadRequest`). An invalid name is `BadRequest`
    naming the rule it breaks (`wal/tenant.py`'s, the one every part of the node checks)
    and quoting at most a short prefix of the value."""
    if value is None:
        if open_mode:
            return DEFAULT_TENANT
        raise BadRequest(f"the X-Ourios-Tenant header is required; {TENANT_RULE}")
    # latin-1 maps each byte to one character, so byte positions and counts survive
    # and any byte >= 0x80 fails the character check below.
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if is_valid_tenant(text):
        return text
    if not text:
        raise BadRequest(f"invalid tenant: empty; {TENANT_RULE}")
    bad = bad_tenant_char(text)
    if bad is not None:
        raise BadRequest(
            f"invalid tenant {_echo(text)}: character {ascii(text[bad])} at offset "
            f"{bad} is not allowed; {TENANT_RULE}"
        )
    raise BadRequest(
        f"invalid tenant {_echo(text)}: {len(text)} bytes is over the limit; {TENANT_RULE}"
    )

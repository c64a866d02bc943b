"""Tests for app/receive/otlp.py: body decoding, validation, flattening, replies, tenants."""

from __future__ import annotations

import base64
import gc
import gzip
import json
import math
import random
import struct
import tracemalloc
import zlib
from typing import Any

import grpc
import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from app.base import rejections
from app.base.rejections import (
    BadRequest,
    IngestRejection,
    PayloadTooLarge,
    Unavailable,
    UnsupportedMediaType,
)
from app.receive import otlp
from sink.parquet import FLAT_SCHEMA

PB = "application/x-protobuf"
JSON = "application/json"
MiB = 1 << 20

TRACE_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_HEX = "eee19b7ec3c1b174"


# ── fixtures: one rich request, written independently as protobuf and as OTLP/JSON ──


def _any(**kind: Any) -> common_pb2.AnyValue:
    return common_pb2.AnyValue(**kind)


def _kv(key: str, value: common_pb2.AnyValue) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=value)


def _s(text: str) -> common_pb2.AnyValue:
    return _any(string_value=text)


def rich_request() -> ExportLogsServiceRequest:
    """Two resources, three scopes, every AnyValue kind, ids, severities, duplicates."""
    nested = _any(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                _kv("n", _any(int_value=1)),
                _kv("list", _any(array_value=common_pb2.ArrayValue(values=[_s("x"), _any()]))),
                _kv("n", _any(int_value=2)),
            ]
        )
    )
    first = logs_pb2.LogRecord(
        time_unix_nano=1_700_000_000_000_000_001,
        observed_time_unix_nano=1_700_000_000_000_000_002,
        severity_number=logs_pb2.SEVERITY_NUMBER_INFO,
        severity_text="INFO",
        body=_s("hello ünïcode ✓"),
        attributes=[
            _kv("str", _s("v")),
            _kv("int", _any(int_value=-9_007_199_254_740_993)),
            _kv("double", _any(double_value=1.5)),
            _kv("bool", _any(bool_value=True)),
            _kv("bytes", _any(bytes_value=b"\x00\x01\xff")),
            _kv(
                "array",
                _any(array_value=common_pb2.ArrayValue(values=[_s("a"), _any(int_value=2)])),
            ),
            _kv("kvlist", nested),
            _kv("empty", _s("")),
            _kv("unset", _any()),
            _kv("dup", _s("first")),
            _kv("dup", _s("last")),
        ],
        trace_id=bytes.fromhex(TRACE_HEX),
        span_id=bytes.fromhex(SPAN_HEX),
        flags=1,
        event_name="checkout",
    )
    second = logs_pb2.LogRecord(
        time_unix_nano=5,
        severity_number=logs_pb2.SEVERITY_NUMBER_ERROR,
        severity_text="ERROR",
        body=_any(int_value=-42),
    )
    third = logs_pb2.LogRecord(body=nested, severity_number=logs_pb2.SeverityNumber.ValueType(77))
    specials = [
        logs_pb2.LogRecord(body=_any(array_value=common_pb2.ArrayValue(values=[_s("a"), _any()]))),
        logs_pb2.LogRecord(body=_any(bytes_value=b"\x00\x01\x02\xff")),
        logs_pb2.LogRecord(body=_any(double_value=math.inf)),
        logs_pb2.LogRecord(body=_any(double_value=math.nan)),
        logs_pb2.LogRecord(body=_any(bool_value=False)),
        logs_pb2.LogRecord(),
    ]
    return ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                resource=_resource(
                    [_kv("service.name", _s("checkout")), _kv("cpus", _any(int_value=8))]
                ),
                schema_url="https://opentelemetry.io/schemas/1.21.0",
                scope_logs=[
                    logs_pb2.ScopeLogs(
                        scope=common_pb2.InstrumentationScope(name="app.logger", version="1.0"),
                        log_records=[first, second],
                    ),
                    logs_pb2.ScopeLogs(scope=common_pb2.InstrumentationScope(name="empty")),
                    logs_pb2.ScopeLogs(
                        scope=common_pb2.InstrumentationScope(name="second"), log_records=[third]
                    ),
                ],
            ),
            logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=specials)]),
        ]
    )


def _resource(attributes: list[common_pb2.KeyValue]) -> resource_pb2.Resource:
    return resource_pb2.Resource(attributes=attributes)


# The same request as a client would write it in OTLP/JSON: hex ids (one upper-case),
# int64 as strings and numbers, camelCase and snake_case, an enum by name, and fields
# this server does not know.
RICH_JSON = """
{
  "resourceLogs": [
    {
      "resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "checkout"}},
        {"key": "cpus", "value": {"intValue": 8}}
      ]},
      "schemaUrl": "https://opentelemetry.io/schemas/1.21.0",
      "futureField": {"anything": [1, 2, 3]},
      "scopeLogs": [
        {
          "scope": {"name": "app.logger", "version": "1.0"},
          "logRecords": [
            {
              "timeUnixNano": "1700000000000000001",
              "observedTimeUnixNano": 1700000000000000002,
              "severityNumber": 9,
              "severityText": "INFO",
              "body": {"stringValue": "hello \\u00fcn\\u00efcode \u2713"},
              "attributes": [
                {"key": "str", "value": {"stringValue": "v"}},
                {"key": "int", "value": {"intValue": "-9007199254740993"}},
                {"key": "double", "value": {"doubleValue": 1.5}},
                {"key": "bool", "value": {"boolValue": true}},
                {"key": "bytes", "value": {"bytesValue": "AAH/"}},
                {"key": "array", "value": {"arrayValue": {"values": [
                  {"stringValue": "a"}, {"intValue": 2}]}}},
                {"key": "kvlist", "value": {"kvlistValue": {"values": [
                  {"key": "n", "value": {"intValue": "1"}},
                  {"key": "list", "value": {"arrayValue": {"values": [
                    {"stringValue": "x"}, {}]}}},
                  {"key": "n", "value": {"intValue": 2}}]}}},
                {"key": "empty", "value": {"stringValue": ""}},
                {"key": "unset", "value": {}},
                {"key": "dup", "value": {"stringValue": "first"}},
                {"key": "dup", "value": {"stringValue": "last"}}
              ],
              "traceId": "5B8EFFF798038103D269B633813FC60C",
              "spanId": "eee19b7ec3c1b174",
              "flags": 1,
              "eventName": "checkout",
              "notInTheSpec": true
            },
            {
              "time_unix_nano": 5,
              "severity_number": "SEVERITY_NUMBER_ERROR",
              "severity_text": "ERROR",
              "body": {"int_value": "-42"},
              "trace_id": "",
              "span_id": null
            }
          ]
        },
        {"scope": {"name": "empty"}},
        {
          "scope": {"name": "second"},
          "logRecords": [
            {"severityNumber": 77, "body": {"kvlistValue": {"values": [
              {"key": "n", "value": {"intValue": 1}},
              {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {}]}}},
              {"key": "n", "value": {"intValue": 2}}]}}}
          ]
        }
      ]
    },
    {
      "scope_logs": [
        {
          "log_records": [
            {"body": {"arrayValue": {"values": [{"stringValue": "a"}, {}]}}},
            {"body": {"bytesValue": "AAEC/w=="}},
            {"body": {"doubleValue": "Infinity"}},
            {"body": {"doubleValue": "NaN"}},
            {"body": {"boolValue": false}},
            {}
          ]
        }
      ]
    }
  ]
}
"""


def _json_body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def _records_doc(*records: object) -> dict[str, Any]:
    return {"resourceLogs": [{"scopeLogs": [{"logRecords": list(records)}]}]}


# ── empty requests ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        pytest.param(b"", PB, id="protobuf_empty_body"),
        pytest.param(b"{}", JSON, id="json_empty_object"),
        pytest.param(b'{"resourceLogs": []}', JSON, id="json_no_resource_logs"),
        pytest.param(b'{"resourceLogs": [{"scopeLogs": [{}]}]}', JSON, id="json_empty_scope"),
    ],
)
def test_empty_request_decodes_and_flattens_to_zero_rows(data: bytes, content_type: str) -> None:
    req = otlp.decode_request(data, content_type)
    assert otlp.count_records(req) == 0
    batch = otlp.flatten(req, "t")
    assert len(batch) == 0
    assert batch == otlp.empty_batch("t")
    assert batch.columns.schema.equals(FLAT_SCHEMA)


# ── JSON and protobuf equivalence ───────────────────────────────────────────────────


def test_json_and_protobuf_flatten_to_the_same_batch() -> None:
    from_pb = otlp.decode_request(rich_request().SerializeToString(), PB)
    from_json = otlp.decode_request(RICH_JSON.encode(), JSON)
    flat_pb = otlp.flatten(from_pb, "acme")
    flat_json = otlp.flatten(from_json, "acme")
    assert flat_json == flat_pb
    assert otlp.count_records(from_json) == otlp.count_records(from_pb) == 9


def test_a_flattened_batch_holds_no_python_object_per_row() -> None:
    """Records are Arrow from the decoder on: however many records a request holds, its
    flattened batch adds the same handful of objects to the cyclic collector's care (a
    full collection rescans every tracked object while holding the GIL)."""

    def tracked_after_flatten(records: int) -> int:
        req = ExportLogsServiceRequest()
        scope = req.resource_logs.add().scope_logs.add()
        for i in range(records):
            lr = scope.log_records.add()
            lr.body.string_value = f"user {i} logged in"
            kv = lr.attributes.add()
            kv.key, kv.value.string_value = "rid", str(i)
        gc.collect()
        before = len(gc.get_objects())
        batch = otlp.flatten(req, "acme")
        gc.collect()
        after = len(gc.get_objects())
        assert len(batch) == records and batch.columns.schema.equals(FLAT_SCHEMA)
        return after - before

    small, large = tracked_after_flatten(10), tracked_after_flatten(5_000)
    assert large <= small + 5, (small, large)


def test_flatten_columns_of_the_rich_request() -> None:
    batch = otlp.flatten(rich_request(), "acme")
    assert batch.tenant == "acme"
    assert batch.column("record_index") == list(range(9))
    assert batch.column("time_unix_nano")[:2] == [1_700_000_000_000_000_001, 5]
    assert batch.column("observed_time_unix_nano")[:2] == [1_700_000_000_000_000_002, 0]
    assert batch.column("severity_number")[:3] == [9, 17, 77]
    assert batch.column("severity_text")[:3] == ["INFO", "ERROR", ""]
    assert batch.column("scope_name") == ["app.logger", "app.logger", "second"] + [""] * 6
    assert batch.column("trace_id") == [TRACE_HEX] + [None] * 8
    assert batch.column("span_id") == [SPAN_HEX] + [None] * 8
    assert batch.column("body") == [
        "hello ünïcode ✓",
        "-42",
        '{"n":2,"list":["x",null]}',
        '["a",null]',
        '"AAEC/w=="',
        '"Infinity"',
        '"NaN"',
        "false",
        "",
    ]
    assert dict(batch.column("attributes")[0]) == {
        "str": "v",
        "int": "-9007199254740993",
        "double": "1.5",
        "bool": "true",
        "bytes": '"AAH/"',
        "array": '["a",2]',
        "kvlist": '{"n":2,"list":["x",null]}',
        "empty": "",
        "unset": "",
        "dup": "last",
    }
    keys = [key for key, _ in batch.column("attributes")[0]]
    assert len(keys) == len(set(keys)) == 10
    assert keys[-2:] == ["unset", "dup"]  # a duplicated key: first position, last value
    assert batch.column("attributes")[1:] == [[]] * 8
    resources = batch.column("resource_attributes")
    assert resources[0] == resources[2] == [("service.name", "checkout"), ("cpus", "8")]
    assert resources[3:] == [[]] * 6


def test_json_wal_payload_reparses_to_the_same_rows() -> None:
    req = otlp.decode_request(RICH_JSON.encode(), JSON)
    payload = otlp.to_wal_payload(req)
    assert otlp.flatten(otlp.decode_request(payload, PB), "t") == otlp.flatten(req, "t")


def test_protobuf_keeps_unknown_fields_in_the_bytes_the_wal_stores() -> None:
    # Field 99 is unknown to ExportLogsServiceRequest; recovery must re-parse the bytes.
    data = rich_request().SerializeToString() + b"\x9a\x06\x03abc"
    req = otlp.decode_request(data, PB)
    assert len(otlp.flatten(req, "t")) == 9


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-protobuf",
        "application/protobuf",
        "Application/X-Protobuf",
        "application/x-protobuf; charset=binary",
    ],
)
def test_protobuf_content_types(content_type: str) -> None:
    req = otlp.decode_request(rich_request().SerializeToString(), content_type)
    assert otlp.count_records(req) == 9


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", " APPLICATION/JSON "]
)
def test_json_content_types(content_type: str) -> None:
    assert otlp.count_records(otlp.decode_request(RICH_JSON.encode(), content_type)) == 9


@pytest.mark.parametrize(
    "content_type", ["", "text/plain", "application/grpc", "application/jsonx", "multipart/form"]
)
def test_unsupported_content_type(content_type: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        otlp.decode_request(b"{}", content_type)
    assert info.value.http_status == 415


def test_unsupported_content_type_echo_is_bounded() -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        otlp.decode_request(b"{}", "x" * 10_000)
    assert len(info.value.message) < 300


def test_unknown_json_fields_are_ignored() -> None:
    doc = {
        "resourceLogs": [
            {
                "extra": 1,
                "resource": {"attributes": [], "unknown": {"a": [1]}},
                "scopeLogs": [
                    {
                        "scope": {"name": "s", "somethingNew": "x"},
                        "logRecords": [{"body": {"stringValue": "b", "newKind": 3}, "x": None}],
                        "y": [],
                    }
                ],
            }
        ],
        "topLevelUnknown": {"deep": {"deeper": True}},
    }
    batch = otlp.flatten(otlp.decode_request(_json_body(doc), JSON), "t")
    assert batch.column("body") == ["b"]
    assert batch.column("scope_name") == ["s"]


def test_json_body_with_utf8_bom_is_accepted() -> None:
    req = otlp.decode_request(b"\xef\xbb\xbf" + RICH_JSON.encode(), JSON)
    assert otlp.count_records(req) == 9


def test_deepest_json_the_parser_accepts_reparses_from_the_wal() -> None:
    # The WAL holds the protobuf a JSON body parsed to; recovery must parse it again.
    deepest = None
    for depth in range(200):
        value: dict[str, Any] = {"stringValue": "x"}
        for _ in range(depth):
            value = {"arrayValue": {"values": [value]}}
        try:
            deepest = otlp.decode_request(_json_body(_records_doc({"body": value})), JSON)
        except BadRequest:
            break
    else:
        pytest.fail("no JSON nesting limit was reached")
    assert deepest is not None
    replayed = otlp.decode_request(otlp.to_wal_payload(deepest), PB)
    assert otlp.flatten(replayed, "t") == otlp.flatten(deepest, "t")


# ── invalid JSON ────────────────────────────────────────────────────────────────────


def _rec_with(**fields: object) -> bytes:
    return _json_body(_records_doc(dict(fields)))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param(b"", "invalid JSON", id="empty_body"),
        pytest.param(b"{", "invalid JSON", id="truncated"),
        pytest.param(b"{'a': 1}", "invalid JSON", id="single_quotes"),
        pytest.param(b'{"a": 1} x', "invalid JSON", id="trailing_data"),
        pytest.param(b'{"a": "\xff"}', "not UTF-8", id="not_utf8"),
        pytest.param(b"[" * 100_000, "invalid JSON", id="nested_too_deep"),
        pytest.param(b'{"a": ' + b"1" * 5000 + b"}", "invalid JSON", id="huge_integer_literal"),
        pytest.param(b"[]", "JSON object", id="top_level_array"),
        pytest.param(b"null", "JSON object", id="top_level_null"),
        pytest.param(b'"x"', "JSON object", id="top_level_string"),
        pytest.param(b'{"resourceLogs": "x"}', "resourceLogs", id="resource_logs_string"),
        pytest.param(b'{"resourceLogs": [1]}', "resourceLogs", id="resource_logs_element_number"),
        pytest.param(b'{"resourceLogs": [null]}', "resourceLogs", id="resource_logs_element_null"),
        pytest.param(_rec_with(timeUnixNano={}), "timeUnixNano", id="time_object"),
        pytest.param(_rec_with(timeUnixNano=1.5), "timeUnixNano", id="time_fraction"),
        pytest.param(_rec_with(timeUnixNano=-1), "timeUnixNano", id="time_negative"),
        pytest.param(_rec_with(timeUnixNano=2**64), "timeUnixNano", id="time_overflow"),
        pytest.param(_rec_with(timeUnixNano=True), "timeUnixNano", id="time_bool"),
        pytest.param(_rec_with(timeUnixNano="soon"), "timeUnixNano", id="time_word"),
        pytest.param(_rec_with(severityText=5), "severityText", id="severity_text_number"),
        pytest.param(_rec_with(attributes={"k": "v"}), "attributes", id="attributes_object"),
        pytest.param(_rec_with(body="text"), "body", id="body_bare_string"),
        pytest.param(_rec_with(body={"intValue": "x"}), "intValue", id="int_value_word"),
        pytest.param(_rec_with(body={"bytesValue": "A"}), "bytesValue", id="bytes_not_base64"),
        pytest.param(
            _rec_with(body={"stringValue": "a", "intValue": 1}), "body", id="two_oneof_members"
        ),
        pytest.param(
            _rec_with(body={"doubleValue": math.nan}),  # json.dumps writes a bare NaN
            "body",
            id="bare_nan_literal",
        ),
        pytest.param(
            _rec_with(body={"stringValue": "\ud800"}), "surrogate", id="unpaired_surrogate"
        ),
    ],
)
def test_invalid_json_is_bad_request(body: bytes, needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        otlp.decode_request(body, JSON)
    assert needle in info.value.message
    assert info.value.http_status == 400
    assert len(info.value.message) <= 512


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        pytest.param({"traceId": "abc"}, "traceId", id="trace_odd_length"),
        pytest.param({"traceId": TRACE_HEX[:-2]}, "traceId", id="trace_15_bytes"),
        pytest.param({"traceId": TRACE_HEX + "00"}, "traceId", id="trace_17_bytes"),
        pytest.param({"traceId": "zz" * 16}, "traceId", id="trace_not_hex"),
        pytest.param({"traceId": " " + TRACE_HEX[1:]}, "traceId", id="trace_space"),
        pytest.param(
            {"traceId": base64.b64encode(bytes(16)).decode()}, "traceId", id="trace_base64"
        ),
        pytest.param({"traceId": 5}, "traceId", id="trace_number"),
        pytest.param({"trace_id": ["a"]}, "trace_id", id="trace_snake_array"),
        pytest.param({"spanId": SPAN_HEX + "0"}, "spanId", id="span_odd"),
        pytest.param({"span_id": TRACE_HEX}, "span_id", id="span_trace_length"),
    ],
)
def test_json_bad_ids_are_bad_request_naming_the_field(
    fields: dict[str, object], needle: str
) -> None:
    doc = {
        "resourceLogs": [
            {"scopeLogs": [{"logRecords": [{}]}]},
            {"scopeLogs": [{}, {"logRecords": [{}, fields]}]},
        ]
    }
    with pytest.raises(BadRequest) as info:
        otlp.decode_request(_json_body(doc), JSON)
    assert f"resourceLogs[1].scopeLogs[1].logRecords[1].{needle}" in info.value.message


def test_json_ids_are_hex_not_base64() -> None:
    body = _rec_with(traceId=TRACE_HEX, spanId=SPAN_HEX)
    batch = otlp.flatten(otlp.decode_request(body, JSON), "t")
    assert (batch.column("trace_id"), batch.column("span_id")) == ([TRACE_HEX], [SPAN_HEX])


# ── invalid protobuf ────────────────────────────────────────────────────────────────


def test_random_bytes_are_bad_request() -> None:
    rnd = random.Random(20240601)
    refused = 0
    for _ in range(500):
        data = rnd.randbytes(rnd.randrange(1, 200))
        try:
            otlp.decode_request(data, PB)
        except BadRequest:
            refused += 1
    assert refused > 400  # random bytes are nearly never a valid request


def test_truncated_protobuf_is_bad_request_or_a_valid_prefix() -> None:
    data = rich_request().SerializeToString()
    refused = 0
    for end in range(len(data)):
        try:
            req = otlp.decode_request(data[:end], PB)
        except BadRequest:
            refused += 1
        else:
            otlp.flatten(req, "t")  # a prefix that parses must flatten
    assert refused > len(data) // 2
    with pytest.raises(BadRequest, match="invalid OTLP protobuf"):
        otlp.decode_request(data[:-1], PB)


def test_protobuf_invalid_utf8_is_bad_request() -> None:
    data = ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                scope_logs=[
                    logs_pb2.ScopeLogs(log_records=[logs_pb2.LogRecord(severity_text="ab")])
                ]
            )
        ]
    ).SerializeToString()
    with pytest.raises(BadRequest, match="UTF-8"):
        otlp.decode_request(data.replace(b"ab", b"\xff\xfe"), PB)


def test_protobuf_nesting_beyond_the_parser_limit_is_bad_request() -> None:
    req = ExportLogsServiceRequest()
    # Built in place: copying a message this deep would itself hit the depth limit.
    value = req.resource_logs.add().scope_logs.add().log_records.add().body
    for _ in range(100):
        value = value.array_value.values.add()
    value.string_value = "x"
    data = req.SerializeToString()
    with pytest.raises(BadRequest, match="MaxDepth"):
        otlp.decode_request(data, PB)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        pytest.param("trace_id", bytes(15), id="trace_15"),
        pytest.param("trace_id", bytes(17), id="trace_17"),
        pytest.param("trace_id", bytes(8), id="trace_8"),
        pytest.param("span_id", bytes(7), id="span_7"),
        pytest.param("span_id", bytes(16), id="span_16"),
    ],
)
def test_protobuf_bad_id_length_is_bad_request(field_name: str, value: bytes) -> None:
    req = rich_request()
    setattr(req.resource_logs[1].scope_logs[0].log_records[2], field_name, value)
    with pytest.raises(BadRequest) as info:
        otlp.decode_request(req.SerializeToString(), PB)
    assert f"resource_logs[1].scope_logs[0].log_records[2].{field_name}" in info.value.message


def test_all_zero_ids_pass_through() -> None:
    req = rich_request()
    record = req.resource_logs[1].scope_logs[0].log_records[0]
    record.trace_id = bytes(16)
    record.span_id = bytes(8)
    batch = otlp.flatten(otlp.decode_request(req.SerializeToString(), PB), "t")
    assert batch.column("trace_id")[3] == "0" * 32
    assert batch.column("span_id")[3] == "0" * 16


# ── decompression ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "GZIP", " gzip "])
def test_gzip_round_trip(coding: str) -> None:
    data = rich_request().SerializeToString()
    assert otlp.decompress(gzip.compress(data), coding, 1 * MiB) == data


@pytest.mark.parametrize("coding", [None, "", "identity", "Identity"])
def test_identity_passes_through(coding: str | None) -> None:
    assert otlp.decompress(b"abc", coding, 3) == b"abc"


def test_identity_over_the_limit_is_payload_too_large() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        otlp.decompress(b"abcd", None, 3)
    assert info.value.limit == 3
    assert info.value.http_status == 413
    assert "3 bytes" in info.value.message


def test_gzip_limit_is_on_the_decompressed_size() -> None:
    data = bytes(range(256)) * 64  # 16 KiB
    body = gzip.compress(data)
    assert otlp.decompress(body, "gzip", len(data)) == data
    with pytest.raises(PayloadTooLarge):
        otlp.decompress(body, "gzip", len(data) - 1)


def test_concatenated_gzip_members_are_one_body() -> None:
    body = gzip.compress(b"hello ") + gzip.compress(b"world")
    assert otlp.decompress(body, "gzip", 100) == b"hello world"
    with pytest.raises(PayloadTooLarge):
        otlp.decompress(body, "gzip", 10)


def _gzip_bomb(zero_bytes: int) -> bytes:
    """A valid gzip stream of `zero_bytes` zeros, built in about 1 MiB of memory.

    After a full flush deflate restarts without history, so every further MiB of
    zeros compresses to the same bytes; the trailer carries the real CRC and size."""
    chunk = bytes(MiB)
    assert zero_bytes % MiB == 0 and zero_bytes >= 3 * MiB
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH) == block
    final_block = compressor.flush(zlib.Z_FINISH)[:-8]
    crc = 0
    for _ in range(zero_bytes // MiB):
        crc = zlib.crc32(chunk, crc)
    trailer = struct.pack("<II", crc, zero_bytes & 0xFFFFFFFF)
    return head + block * (zero_bytes // MiB - 1) + final_block + trailer


def test_gzip_bomb_builder_is_a_real_gzip_stream() -> None:
    assert gzip.decompress(_gzip_bomb(4 * MiB)) == bytes(4 * MiB)


def test_gzip_bomb_is_refused_without_inflating_it() -> None:
    bomb = _gzip_bomb(1 << 30)  # 1 GiB of zeros in about 1 MiB
    assert len(bomb) < 2 * MiB
    limit = 4 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge) as info:
            otlp.decompress(bomb, "gzip", limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.limit == limit
    assert peak < 4 * limit  # the kept output plus one chunk in flight, not 1 GiB


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param(b"", "truncated", id="empty"),
        pytest.param(b"not gzip at all", "not valid gzip", id="not_gzip"),
        pytest.param(gzip.compress(b"x" * 1000)[:-12], "truncated", id="truncated"),
        pytest.param(gzip.compress(b"x" * 1000)[:10], "truncated", id="header_only"),
        pytest.param(gzip.compress(b"abc") + b"junk", "after the end", id="trailing_garbage"),
        pytest.param(gzip.compress(b"abc") + b"\x00" * 8, "after the end", id="trailing_zeros"),
        pytest.param(
            gzip.compress(b"abc")[:-8] + b"\x00\x00\x00\x00\x03\x00\x00\x00",
            "not valid gzip",
            id="bad_crc",
        ),
        pytest.param(
            gzip.compress(b"abc")[:-4] + b"\x04\x00\x00\x00", "not valid gzip", id="bad_size"
        ),
        pytest.param(gzip.compress(b"abc") + b"\x1f\x8b", "truncated", id="truncated_member"),
    ],
)
def test_corrupt_gzip_is_bad_request(body: bytes, needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        otlp.decompress(body, "gzip", MiB)
    assert needle in info.value.message


def test_corrupted_deflate_data_is_bad_request() -> None:
    body = bytearray(gzip.compress(bytes(range(256)) * 40))
    rnd = random.Random(7)
    for _ in range(200):
        corrupt = bytearray(body)
        corrupt[rnd.randrange(10, len(body) - 8)] ^= 1 << rnd.randrange(8)
        with pytest.raises(BadRequest):
            otlp.decompress(bytes(corrupt), "gzip", MiB)


@pytest.mark.parametrize("coding", ["br", "deflate", "zstd", "gzip, identity", "compress"])
def test_unsupported_content_encoding(coding: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        otlp.decompress(b"x", coding, MiB)
    assert info.value.http_status == 415
    assert coding in info.value.message


# ── replies ─────────────────────────────────────────────────────────────────────────


def _decode_status(body: bytes, content_type: str, as_json: bool) -> Any:
    status = status_pb2.Status()
    if as_json:
        assert content_type == JSON
        json_format.Parse(body.decode(), status)
    else:
        assert content_type == PB
        status.ParseFromString(body)
    return status


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
@pytest.mark.parametrize(
    "rejection",
    [BadRequest("bad body: ünï"), PayloadTooLarge(1024), Unavailable("disk full")],
    ids=lambda r: type(r).__name__,
)
def test_status_body_decodes_back(rejection: IngestRejection, as_json: bool) -> None:
    body, content_type = otlp.status_body(rejection, as_json)
    status = _decode_status(body, content_type, as_json)
    assert status.code == rejection.grpc_code.value[0]
    assert status.message == rejection.message
    assert len(status.details) == 0


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_status_body_carries_retry_info_when_hinted(as_json: bool) -> None:
    body, content_type = otlp.status_body(Unavailable("tenant settling", retry_after=30), as_json)
    status = _decode_status(body, content_type, as_json)
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0] == 14
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert retry.retry_delay.seconds == 30


def test_status_json_shape() -> None:
    body, _ = otlp.status_body(Unavailable("busy", retry_after=5), True)
    assert json.loads(body) == {
        "code": 14,
        "message": "busy",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"}],
    }


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_success_body_is_empty_without_rejections(as_json: bool) -> None:
    body, content_type = otlp.success_body(0, "ignored", as_json)
    if as_json:
        assert (body, content_type) == (b"{}", JSON)
    else:
        assert (body, content_type) == (b"", PB)


def test_success_body_partial_success_shape() -> None:
    body, content_type = otlp.success_body(3, "3 records had no body", False)
    response = ExportLogsServiceResponse.FromString(body)
    assert content_type == PB
    assert response.HasField("partial_success")
    assert response.partial_success.rejected_log_records == 3
    assert response.partial_success.error_message == "3 records had no body"
    body, content_type = otlp.success_body(3, "3 records had no body", True)
    assert content_type == JSON
    # OTLP/JSON writes int64 as a string
    assert json.loads(body) == {
        "partialSuccess": {"rejectedLogRecords": "3", "errorMessage": "3 records had no body"}
    }


# ── tenants ─────────────────────────────────────────────────────────────────────────

ALL_ALLOWED = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ":#/")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("a", id="one_byte"),
        pytest.param("t" * 128, id="128_bytes"),
        pytest.param(ALL_ALLOWED, id="all_allowed_punctuation"),
        pytest.param("team-a.prod_1", id="typical"),
        pytest.param("default", id="default"),
    ],
)
def test_valid_tenants(value: str) -> None:
    assert otlp.parse_tenant(value, open_mode=False) == value
    assert otlp.parse_tenant(value.encode(), open_mode=True) == value


def test_all_allowed_punctuation_fits_one_tenant() -> None:
    assert len(ALL_ALLOWED) == 91  # 94 graphic characters minus ':', '#', '/'


def test_missing_tenant_is_default_in_open_mode() -> None:
    assert otlp.parse_tenant(None, open_mode=True) == otlp.DEFAULT_TENANT == "default"


def test_missing_tenant_is_bad_request_with_auth() -> None:
    with pytest.raises(BadRequest, match="required"):
        otlp.parse_tenant(None, open_mode=False)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param(b"", "empty", id="empty_bytes"),
        pytest.param("t" * 129, "129 bytes", id="129_bytes"),
        pytest.param("a b", "' '", id="space"),
        pytest.param("a:b", "':'", id="colon"),
        pytest.param("a#b", "'#'", id="hash"),
        pytest.param("a/b", "'/'", id="slash"),
        pytest.param("café", "'\\xe9'", id="non_ascii"),
        pytest.param("caf\u00e9".encode(), "'\\xc3'", id="non_ascii_bytes"),
        pytest.param("a\x00b", "'\\x00'", id="nul"),
        pytest.param("a\nb", "'\\n'", id="newline"),
        pytest.param("a\x7f", "'\\x7f'", id="delete"),
        pytest.param("a\tb", "'\\t'", id="tab"),
    ],
)
def test_invalid_tenants(value: str | bytes, needle: str) -> None:
    for open_mode in (False, True):
        with pytest.raises(BadRequest) as info:
            otlp.parse_tenant(value, open_mode=open_mode)
        assert needle in info.value.message
        assert "1 to 128 bytes" in info.value.message


def test_invalid_tenant_echo_is_bounded() -> None:
    value = "x" * 5000 + ":" + "\r\n" * 5000
    with pytest.raises(BadRequest) as info:
        otlp.parse_tenant(value, open_mode=True)
    assert "offset 5000" in info.value.message
    assert len(info.value.message) < 300
    assert "\n" not in info.value.message and "\r" not in info.value.message


# ── fuzzing: the decoders only ever refuse with an IngestRejection ──────────────────

# Field names the strategies below draw keys from, so that generated documents reach
# the nested positions of the OTLP schema instead of being ignored as unknown fields.
_RECORD_NAMES = [
    "timeUnixNano", "observedTimeUnixNano", "time_unix_nano", "severityNumber",
    "severityText", "body", "attributes", "traceId", "spanId", "trace_id", "span_id",
    "flags", "eventName", "droppedAttributesCount",
]  # fmt: skip
_ANY_VALUE_NAMES = [
    "stringValue", "intValue", "doubleValue", "boolValue", "bytesValue", "arrayValue",
    "kvlistValue", "values", "key", "value", "string_value", "stringValueStrindex",
]  # fmt: skip
_OTLP_NAMES = [
    "resourceLogs", "resource_logs", "resource", "scopeLogs", "scope_logs", "scope",
    "name", "version", "logRecords", "log_records", "schemaUrl", "@type",
    *_RECORD_NAMES, *_ANY_VALUE_NAMES,
]  # fmt: skip
_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "",
            "0",
            "-1",
            "1e3",
            "NaN",
            "Infinity",
            TRACE_HEX,
            SPAN_HEX,
            "AAEC",
            "SEVERITY_NUMBER_WARN",
            "18446744073709551616",
        ]
    )  # fmt: skip
)


def _json_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # a named function, not a lambda: hypothesis reads the source of `extend` to check
    # that it uses its argument, and a multi-line lambda's source is not always found
    # (a HypothesisDeprecationWarning, an error under filterwarnings, now and then)
    return st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(_OTLP_NAMES) | st.text(max_size=6), children, max_size=5
    )


_json_values = st.recursive(_json_scalars, _json_containers, max_leaves=25)
_any_value_docs = st.dictionaries(st.sampled_from(_ANY_VALUE_NAMES), _json_values, max_size=2)
_kv_docs = st.lists(
    st.fixed_dictionaries({"key": st.text(max_size=4), "value": _any_value_docs}), max_size=3
)
_record_docs = st.dictionaries(
    st.sampled_from(_RECORD_NAMES), _json_values | _any_value_docs | _kv_docs, max_size=6
)
_scope_docs = st.fixed_dictionaries({"logRecords": st.lists(_record_docs, max_size=3)})
_resource_docs = st.fixed_dictionaries(
    {"scopeLogs": st.lists(_scope_docs, max_size=2)},
    optional={"resource": st.fixed_dictionaries({"attributes": _kv_docs}) | _json_values},
)
_request_docs = st.fixed_dictionaries({"resourceLogs": st.lists(_resource_docs, max_size=2)})


def _accepted_requests_replay(req: ExportLogsServiceRequest, payload: bytes) -> None:
    """What decode_request accepted flattens, and replays from its WAL bytes alike."""
    batch = otlp.flatten(req, "t")
    assert len(batch) == otlp.count_records(req)
    assert otlp.flatten(otlp.decode_request(payload, PB), "t") == batch


FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_protobuf_arbitrary_bytes(data: bytes) -> None:
    try:
        req = otlp.decode_request(data, PB)
    except IngestRejection:
        return
    _accepted_requests_replay(req, data)


_VALID_PB = rich_request().SerializeToString()


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(_VALID_PB) - 1), st.integers(0, 255)), min_size=1, max_size=3
    ),
    st.none() | st.integers(0, len(_VALID_PB)),
)
def test_fuzz_protobuf_mutated_valid_request(edits: list[tuple[int, int]], end: int | None) -> None:
    data = bytearray(_VALID_PB)
    for position, byte in edits:
        data[position] = byte
    mutated = bytes(data[:end])
    try:
        req = otlp.decode_request(mutated, PB)
    except IngestRejection:
        return
    _accepted_requests_replay(req, mutated)


@FUZZ
@given(st.one_of(_json_values, _request_docs))
def test_fuzz_json_values(doc: object) -> None:
    body = json.dumps(doc).encode()
    try:
        req = otlp.decode_request(body, JSON)
    except IngestRejection:
        return
    _accepted_requests_replay(req, otlp.to_wal_payload(req))


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzz_json_arbitrary_bytes(data: bytes) -> None:
    try:
        req = otlp.decode_request(data, JSON)
    except IngestRejection:
        return
    _accepted_requests_replay(req, otlp.to_wal_payload(req))


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(["gzip", "identity"]))
def test_fuzz_decompress(data: bytes, coding: str) -> None:
    try:
        out = otlp.decompress(data, coding, 4096)
    except IngestRejection:
        return
    assert len(out) <= 4096


@FUZZ
@given(st.text(max_size=140) | st.binary(max_size=140))
def test_fuzz_tenant(value: str | bytes) -> None:
    try:
        tenant = otlp.parse_tenant(value, open_mode=True)
    except BadRequest:
        return
    assert 1 <= len(tenant.encode("ascii")) <= 128
    assert not set(tenant) & set(":#/ ")


# ── expansion limits (issue 21 item 3, DESIGN.md §7) ───────────────────────────────

SMALL = otlp.RequestLimits(
    records=10,
    attributes_per_record=4,
    attributes_per_request=20,
    key_bytes=8,
    value_bytes=16,
    expanded_bytes=150,
)


def _limited_request(
    *,
    records: int = 1,
    attributes: int = 0,
    resource_attributes: int = 0,
    key: str = "k",
    value: common_pb2.AnyValue | None = None,
    scopes: int = 1,
) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for i in range(resource_attributes):
        rl.resource.attributes.append(_kv(f"r{i}", _s("v")))
    for s in range(scopes):
        sl = rl.scope_logs.add()
        for _ in range(records if s == 0 else 0):
            lr = sl.log_records.add()
            lr.body.string_value = "x"
            for i in range(attributes):
                lr.attributes.append(_kv(f"{key}{i}" if attributes > 1 else key, value or _s("v")))
    return req


def _expanding_request(records: int, resource_value: str, body: str) -> ExportLogsServiceRequest:
    """`records` records of `body` under one resource attribute "r" = `resource_value`."""
    req = _limited_request(records=records)
    req.resource_logs[0].resource.attributes.append(_kv("r", _s(resource_value)))
    for lr in req.resource_logs[0].scope_logs[0].log_records:
        lr.body.string_value = body
    return req


def _nested(count: int) -> common_pb2.AnyValue:
    return _any(array_value=common_pb2.ArrayValue(values=[_s("") for _ in range(count)]))


#: (request, the setting the refusal names, the figure it quotes)
LIMIT_CASES = {
    "records": (_limited_request(records=11), "max_request_records", "is 11"),
    "scope_groups": (_limited_request(records=1, scopes=11), "max_request_records", "is 11"),
    "attributes_per_record": (
        _limited_request(attributes=5),
        "max_attributes_per_record",
        "log_records[0]'s attributes is 5",
    ),
    "resource_attributes": (
        _limited_request(resource_attributes=5),
        "max_attributes_per_record",
        "resource's attributes is 5",
    ),
    # 6 records × (2 own + 2 resource) = 24 entries, each record within its own limit
    "attributes_per_request": (
        _limited_request(records=6, attributes=2, resource_attributes=2),
        "max_attributes_per_request",
        "is 24",
    ),
    "key_bytes": (_limited_request(attributes=1, key="k" * 9), "max_attribute_key_bytes", "is 9"),
    "key_bytes_utf8": (
        _limited_request(attributes=1, key="é" * 5),
        "max_attribute_key_bytes",
        "is 10",
    ),
    "value_bytes": (
        _limited_request(attributes=1, value=_s("v" * 17)),
        "max_attribute_value_bytes",
        "is 17",
    ),
    # 10 rows repeating "r" + 16 bytes: 170 from the resource alone, refused before the walk
    "expanded_bytes_repeated": (
        _expanding_request(10, "v" * 16, "x"),
        "max_expanded_bytes",
        "counting so far only the resource attributes and scope names its records repeat, is 170",
    ),
    # 10 rows of 2 + 14: only their own bodies take them past it, once walked
    "expanded_bytes_rows": (
        _expanding_request(10, "v", "b" * 14),
        "max_expanded_bytes",
        "is 160",
    ),
    "nested_values": (
        _limited_request(attributes=1, value=_nested(21)),
        "max_attributes_per_request",
        "nested in arrays and kvlists is 21",
    ),
}


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_bounded_3_expansion_limits_refuse_naming_the_setting(case: str, encoding: str) -> None:
    req, setting, figure = LIMIT_CASES[case]
    if encoding == "protobuf":
        data, content_type = req.SerializeToString(), PB
    else:
        data, content_type = json_format.MessageToJson(req).encode(), JSON
    with pytest.raises(rejections.RequestLimitExceeded) as info:
        otlp.flatten(otlp.decode_request(data, content_type, SMALL), "t", SMALL)
    refusal = info.value
    assert (refusal.http_status, refusal.grpc_code) == (400, grpc.StatusCode.INVALID_ARGUMENT)
    assert refusal.error_type == setting
    assert f"over server.{setting}=" in refusal.message
    assert figure in refusal.message, refusal.message
    assert refusal.retry_after is None
    # Without limits (a replay of a frame already in the WAL) the same request decodes.
    assert len(otlp.flatten(otlp.decode_request(data, content_type), "t")) >= 0


def test_bounded_3_counts_are_refused_before_anything_is_flattened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hostile shape of issue 21: one record with very many (empty) attributes. It
    # is refused by the count check, which reads lengths only: no attribute is visited.
    req = _limited_request(attributes=0)
    record = req.resource_logs[0].scope_logs[0].log_records[0]
    record.attributes.extend(common_pb2.KeyValue() for _ in range(50_000))
    data = req.SerializeToString()
    visited: list[object] = []

    def value_text(*args: object) -> str:
        visited.append(args)
        return ""

    monkeypatch.setattr(otlp, "_value_text", value_text)
    with pytest.raises(rejections.RequestLimitExceeded) as info:
        otlp.decode_request(data, PB, otlp.RequestLimits())
    assert "is 50000, over server.max_attributes_per_record=4096" in info.value.message
    assert visited == []


def test_bounded_3_a_large_request_refused_over_a_limit_gives_its_parse_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its parse (up to 30 times the body) is freed by the refusal; the allocator's free
    # memory goes back to the kernel then, so it does not stay resident beside the next
    # decode's (DESIGN.md §7). A small refused body is not worth the heap walk.
    trims: list[None] = []
    monkeypatch.setattr(otlp, "release_freed_memory", lambda: trims.append(None))
    req = _limited_request(attributes=0)
    record = req.resource_logs[0].scope_logs[0].log_records[0]
    record.attributes.extend(common_pb2.KeyValue() for _ in range(600_000))
    large = req.SerializeToString()
    assert len(large) >= MiB
    with pytest.raises(rejections.RequestLimitExceeded):
        otlp.decode_batch(large, PB, "t", otlp.RequestLimits())
    assert len(trims) == 1
    small = _limited_request(attributes=5).SerializeToString()
    with pytest.raises(rejections.RequestLimitExceeded):
        otlp.decode_batch(small, PB, "t", SMALL)
    assert len(trims) == 1


def test_bounded_3_a_collector_batch_passes_the_default_limits() -> None:
    # 8192 records with 64 attributes each under 32 resource attributes: 786,432 map
    # entries, a full Collector batch of heavily attributed records (short keys, so it
    # fits a default frame at all).
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for i in range(32):
        rl.resource.attributes.append(_kv(f"resource.attribute.{i}", _s("value")))
    sl = rl.scope_logs.add()
    template = logs_pb2.LogRecord(body=_s("a log line"))
    for i in range(64):
        template.attributes.append(_kv(f"a{i}", _s(f"v{i}")))
    for _ in range(8192):
        sl.log_records.append(template)
    data = req.SerializeToString()
    assert len(data) < 8 * MiB
    limits = otlp.RequestLimits()
    batch = otlp.flatten(otlp.decode_request(data, PB, limits), "t", limits)
    assert len(batch) == 8192


def test_bounded_3_inflation_stops_when_the_caller_refuses_a_step() -> None:
    # The in-flight budget grows per step; a refusal stops inflating there.
    body = gzip.compress(b"\0" * (8 * MiB))
    grown: list[int] = []

    def grow(size: int) -> None:
        grown.append(size)
        if sum(grown) > 2 * MiB:
            raise rejections.Unavailable("budget")

    with pytest.raises(rejections.Unavailable):
        otlp.decompress(body, "gzip", 16 * MiB, grow)
    assert sum(grown) <= 2 * MiB + otlp.INFLATE_STEP
    assert otlp.decompress(body, "gzip", 16 * MiB, lambda n: None) == b"\0" * (8 * MiB)

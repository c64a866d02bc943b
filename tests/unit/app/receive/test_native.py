"""Tests for app/receive/native.py and its extension app/receive/_otlpdecode.c: the
native decoder against the reference (the upb parse + ``otlp.flatten``), differentially.

Every case asserts one thing: when the native decoder answers, upb accepts the request
and ``flatten`` gives the same ``FlatBatch``; when it does not, ``otlp.decode_flat``
gives what the reference gives — the same batch or the same refusal (class and message).
The fast-path cases also assert that the native decoder did answer, so a decoder that
always fell back would fail them.

The corpus: valid requests of every shape (tests/support/otlpwire.py), written the ways
the wire format allows (fields in any order, a scalar sent twice, unknown fields, padded
varints, explicit defaults), strings made invalid UTF-8, and valid requests with bytes
changed, cut short or inserted. ``FUZZ_EXAMPLES`` scales every property (``make fuzz``);
``make fuzz`` also runs this file against a build with AddressSanitizer and
UndefinedBehaviorSanitizer (scripts/sanitize_native.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
from dataclasses import dataclass, replace
from typing import Any, Final

import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from app.base import rejections
from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection
from app.receive import native, otlp
from tests.support.otlpwire import Wire, encode, many_attributes, requests

PB = otlp.PROTOBUF_CONTENT_TYPE
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or None
#: the byte strings `check` compared, and how many the native decoder answered
CASES = {"checked": 0, "native": 0}


def _settings(examples: int) -> settings:
    return settings(
        derandomize=EXAMPLES is None,
        database=None,
        max_examples=EXAMPLES or examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True, scope="module")
def _report_cases() -> Any:
    # make fuzz's record of the corpus (scripts/fuzz_native.py reads it)
    yield
    path = os.environ.get("FUZZ_CASES_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(CASES, out)


@pytest.fixture(autouse=True)
def _native_selected() -> Any:
    decoder, why = native.select("native")
    assert decoder == "native", why  # the extension is built by `pip install -e .`
    yield
    native.select("native")


def _reference(data: bytes) -> FlatBatch | tuple[type, str]:
    try:
        return otlp.flatten(otlp.decode_request(data, PB), "t")
    except IngestRejection as exc:
        return type(exc), exc.message


def expanded_bytes(batch: FlatBatch) -> int:
    """``RequestLimits.expanded_bytes`` as the batch holds it: the UTF-8 bytes of every
    row's severity text, body, attribute keys and values, resource attribute keys and
    values and scope name (the definition, computed from the reference's output)."""
    total = 0
    for name in ("severity_text", "body", "scope_name"):
        total += sum(len(text.encode()) for text in batch.column(name))
    for name in ("attributes", "resource_attributes"):
        for pairs in batch.column(name):
            total += sum(len(k.encode()) + len(v.encode()) for k, v in pairs)
    return total


def _counts(req: ExportLogsServiceRequest) -> native.Counts:
    """The counts from the upb objects, as the receivers' limits count them
    (``otlp.RequestLimits``: attributes as sent; values as the column holds them; the
    expanded bytes from the reference's rows)."""
    resources = list(req.resource_logs)
    records = [lr for rl in resources for sl in rl.scope_logs for lr in sl.log_records]
    pairs = [kv for lr in records for kv in lr.attributes] + [
        kv for rl in resources for kv in rl.resource.attributes
    ]
    return native.Counts(
        records=len(records),
        resource_logs=len(resources),
        scope_logs=sum(len(rl.scope_logs) for rl in resources),
        attributes_max=max(
            [len(lr.attributes) for lr in records]
            + [len(rl.resource.attributes) for rl in resources],
            default=0,
        ),
        attributes_per_request=sum(len(lr.attributes) for lr in records)
        + sum(
            len(rl.resource.attributes) * sum(len(sl.log_records) for sl in rl.scope_logs)
            for rl in resources
        ),
        key_bytes_max=max((len(kv.key.encode()) for kv in pairs), default=0),
        value_bytes_max=max(
            (len((kv.value.string_value or otlp._value_text(kv.value)).encode()) for kv in pairs),
            default=0,
        ),
        expanded_bytes=expanded_bytes(otlp.flatten(req, "t")),
    )


def check(data: bytes, *, must_decode: bool = False) -> str:
    """The differential assertion (module docstring); returns the native status."""
    reference = _reference(data)
    got = native.decode_counted(data)
    CASES["checked"] += 1
    if got.status == "ok":
        CASES["native"] += 1
        assert isinstance(reference, FlatBatch), f"native accepted what upb refuses: {reference}"
        assert got.columns is not None
        got.columns.validate(full=True)  # offsets, bitmaps, UTF-8: a well-formed batch
        assert FlatBatch("t", got.columns) == reference
        req = ExportLogsServiceRequest.FromString(data)
        assert got.counts == _counts(req)
    else:
        assert not must_decode, f"the fast path fell back ({got.status})"
    try:
        via: FlatBatch | tuple[type, str] = otlp.decode_flat(data, "t")
    except IngestRejection as exc:
        via = type(exc), exc.message
    assert via == reference
    return got.status


# ── the differential properties ───────────────────────────────────────────────────


# A seed, not st.randoms(): every call on hypothesis' Random is a draw, 10x slower.
_SEEDS = st.integers(0, 2**32)
_WIRE = Wire(shuffle=True, unknown=0.15, decoy=0.2, padded=0.15, defaults=0.2)


# Generating a request costs far more than checking it, so each generated request is
# checked several ways: as serialized, and written two more ways the wire allows.
@_settings(500)
@given(requests(fast=True), _SEEDS)
def test_native_1_fast_path_requests_decode_natively_and_equal_upb(
    req: ExportLogsServiceRequest, seed: int
) -> None:
    rnd = random.Random(seed)
    check(req.SerializeToString(), must_decode=True)
    for _ in range(2):  # fields in any order, unknown fields, padding, decoys, defaults
        check(encode(req, rnd, _WIRE), must_decode=True)


@_settings(300)
@given(requests(fast=False), _SEEDS)
def test_native_1_requests_of_every_shape_equal_upb_or_fall_back(
    req: ExportLogsServiceRequest, seed: int
) -> None:
    rnd = random.Random(seed)
    check(encode(req, rnd, _WIRE))
    check(encode(req, rnd, Wire(shuffle=True, bad_utf8=0.3)))  # never accepted natively


@_settings(300)
@given(requests(fast=True), _SEEDS)
def test_native_1_mutated_and_truncated_requests_equal_upb(
    req: ExportLogsServiceRequest, seed: int
) -> None:
    rnd = random.Random(seed)
    valid = req.SerializeToString()
    for _ in range(4):
        data = bytearray(valid)
        for _ in range(rnd.randint(0, 3)):
            at = rnd.randrange(len(data) + 1)
            if rnd.random() < 0.3 or at == len(data):
                data.insert(at, rnd.randrange(256))
            else:
                data[at] = rnd.choice([rnd.randrange(256), 0x80, 0xFF, 0x00, data[at] ^ 1])
        if rnd.random() < 0.5:
            del data[rnd.randrange(len(data) + 1) :]
        check(bytes(data))


@_settings(200)
@given(many_attributes(), many_attributes(), _SEEDS)
def test_native_1_many_attributes_with_repeated_keys_equal_upb(
    attributes: list[common_pb2.KeyValue], resource: list[common_pb2.KeyValue], seed: int
) -> None:
    req = _request(logs_pb2.LogRecord(attributes=attributes), attributes=resource)
    check(encode(req, random.Random(seed), _WIRE), must_decode=True)


@_settings(300)
@given(st.binary(max_size=200))
def test_native_1_arbitrary_bytes_equal_upb(data: bytes) -> None:
    check(data)


# ── cases the properties might reach rarely ───────────────────────────────────────


def _kv(key: str, **value: Any) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**value))


def _request(*records: logs_pb2.LogRecord, **resource: Any) -> ExportLogsServiceRequest:
    return ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(
                resource=resource_pb2.Resource(**resource),
                scope_logs=[
                    logs_pb2.ScopeLogs(
                        scope=common_pb2.InstrumentationScope(name="s"), log_records=records
                    )
                ],
            )
        ]
    )


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1.0, 0.1, 1e16, 1e15, 1e-5, 1e-4, 5e-324, 1.7976931348623157e308, 123.456,
     math.nan, -math.nan, math.inf, -math.inf, 2.0**53, 1 / 3],
)  # fmt: skip
def test_native_1_doubles_render_as_json_renders_them(value: float) -> None:
    req = _request(
        logs_pb2.LogRecord(
            body=common_pb2.AnyValue(double_value=value), attributes=[_kv("d", double_value=value)]
        )
    )
    check(req.SerializeToString(), must_decode=True)


def test_native_1_a_duplicated_key_keeps_its_first_position_and_its_last_value() -> None:
    attrs = [_kv("a", string_value="1"), _kv("b", int_value=2), _kv("a", bool_value=True)]
    many = [_kv(f"k{i % 20}", int_value=i) for i in range(60)]  # the hashed path
    req = _request(
        logs_pb2.LogRecord(attributes=attrs),
        logs_pb2.LogRecord(attributes=many),
        attributes=[_kv("r", string_value="x"), _kv("r", string_value="y")],
    )
    batch = otlp.decode_flat(req.SerializeToString(), "t")
    assert batch.column("attributes")[0] == [("a", "true"), ("b", "2")]
    assert batch.column("attributes")[1] == [(f"k{i}", str(40 + i)) for i in range(20)]
    assert batch.column("resource_attributes")[0] == [("r", "y")]
    check(req.SerializeToString(), must_decode=True)


@pytest.mark.parametrize(("field", "size"), [("trace_id", 15), ("trace_id", 8), ("span_id", 16)])
def test_native_1_a_bad_id_gets_the_reference_refusal(field: str, size: int) -> None:
    record = logs_pb2.LogRecord()
    setattr(record, field, b"\x01" * size)
    data = _request(record).SerializeToString()
    assert native.decode_counted(data).status == "id"
    with pytest.raises(rejections.BadRequest, match=f"{field} is {size} bytes"):
        otlp.decode_flat(data, "t")
    check(data)


def test_native_1_the_resource_and_scope_may_follow_the_records() -> None:
    # Field order is the sender's: a resource written after its scope_logs still
    # applies to their records (the official serializer never writes it so).
    record = logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value="b"))
    scope = common_pb2.InstrumentationScope(name="late")
    scope_logs = _field(
        2, _field(2, record.SerializeToString()) + _field(1, scope.SerializeToString())
    )
    resource = resource_pb2.Resource(attributes=[_kv("svc", string_value="x")])
    data = _field(1, scope_logs + _field(1, resource.SerializeToString()))
    assert check(data, must_decode=True) == "ok"
    batch = otlp.decode_flat(data, "t")
    assert batch.column("scope_name") == ["late"]
    assert batch.column("resource_attributes") == [[("svc", "x")]]


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"\x0a\x02\x12", "malformed"),  # a length past the end
        (b"\x00\x01", "malformed"),  # field number 0
        (b"\x0f", "malformed"),  # wire type 7
        (b"\x0b\x0c", "shape"),  # an unknown group
        (b"\x08\x01", "shape"),  # resource_logs as a varint: upb keeps it as unknown
        (_field(1, _field(3, b"\xff")), "utf8"),  # a schema_url that is not UTF-8
        (b"\x7a\x01\xff", "ok"),  # an unknown field's bytes are not checked
    ],
)
def test_native_1_what_the_fast_path_leaves_to_upb(data: bytes, status: str) -> None:
    assert native.decode_counted(data).status == status
    check(data)


def test_native_1_an_empty_request_is_zero_rows() -> None:
    assert len(otlp.decode_flat(b"", "t")) == 0
    check(b"", must_decode=True)


def test_native_1_big_requests_release_and_retake_the_interpreter() -> None:
    # Over the release threshold, with a double midway (the GIL is taken back for it).
    records = [
        logs_pb2.LogRecord(
            body=common_pb2.AnyValue(string_value=f"line {i}" * 10),
            attributes=[_kv("n", double_value=i / 7) if i == 50 else _kv("n", int_value=i)],
            trace_id=struct.pack(">QQ", i, i),
        )
        for i in range(200)
    ]
    check(_request(*records).SerializeToString(), must_decode=True)


# ── limits, counts and the selection ──────────────────────────────────────────────


@dataclass(frozen=True)
class _Limits:
    """``otlp.RequestLimits``' shape (native.Limits)."""

    records: int = 1 << 62
    attributes_per_record: int = 1 << 62
    attributes_per_request: int = 1 << 62
    key_bytes: int = 1 << 62
    value_bytes: int = 1 << 62
    expanded_bytes: int = 1 << 62


def test_native_limits_are_found_before_the_expansion() -> None:
    # Two resources: 4 records with 5 resource attributes, 1 record with none.
    records = [logs_pb2.LogRecord(attributes=[_kv("a", int_value=-12345)]) for _ in range(4)]
    resource = [_kv(f"r{i}", string_value="v" * i) for i in range(5)]
    req = _request(*records, attributes=resource)
    req.resource_logs.add().scope_logs.add().log_records.add()
    data = req.SerializeToString()
    free = native.decode_counted(data)
    assert free.status == "ok"
    assert free.counts == native.Counts(
        records=5,
        resource_logs=2,
        scope_logs=2,
        attributes_max=5,
        attributes_per_request=4 * 1 + 4 * 5,
        key_bytes_max=2,
        value_bytes_max=len("-12345"),
        # per row of the first resource: "a" "-12345", r0..r4 with 0..4 "v", scope "s"
        expanded_bytes=4 * (7 + (10 + 10) + 1),
    )
    at = _Limits(5, 5, 24, 2, 6, 112)
    assert native.decode_counted(data, at).status == "ok"  # a limit is inclusive
    for name in ("records", "attributes_per_record", "attributes_per_request", "expanded_bytes"):
        limited = native.decode_counted(data, replace(at, **{name: getattr(at, name) - 1}))
        assert limited.status == "limit" and limited.columns is None, name
    for name in ("key_bytes", "value_bytes"):
        limited = native.decode_counted(data, replace(at, **{name: getattr(at, name) - 1}))
        assert limited.status == "limit", name
        assert native.decode(data, replace(at, **{name: getattr(at, name) - 1})) is None
    # records bounds the groups too: 2 resource_logs with 1 record each
    two = ExportLogsServiceRequest()
    for _ in range(2):
        two.resource_logs.add().scope_logs.add()
    two.resource_logs[0].scope_logs[0].log_records.add()
    assert native.decode_counted(two.SerializeToString(), _Limits(records=1)).status == "limit"


def test_native_a_limit_stops_the_parse_where_it_is_passed() -> None:
    # 50,000 empty attributes on one record (100 KB): the parse stops at the 11th, so
    # the hostile record never costs its scratch space (40 bytes an attribute).
    record = _field(6, b"") * 50_000
    data = _wide_field(1, _wide_field(2, _wide_field(2, record)))
    limited = native.decode_counted(data, _Limits(attributes_per_record=10))
    assert limited.status == "limit"
    assert limited.counts.attributes_max == 0 and limited.counts.records == 0  # not reached
    assert native.decode_counted(data).status == "ok"
    check(data, must_decode=True)


def _wide_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field of any length (`_field` takes up to 127 bytes)."""
    size, out = len(payload), bytearray([number << 3 | 2])
    while size >= 0x80:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + payload


# ── the request limits: the native decoder and the upb path refuse the same requests ──

#: a limit's name → the setting its refusal names (otlp.RequestLimits)
_LIMITS = (
    "records",
    "attributes_per_record",
    "attributes_per_request",
    "key_bytes",
    "value_bytes",
    "expanded_bytes",
)


def _bound_of(counts: native.Counts, name: str) -> int:
    """What `name` limits in a request of `counts` (records bounds the groups too)."""
    return {
        "records": max(counts.records, counts.resource_logs, counts.scope_logs),
        "attributes_per_record": counts.attributes_max,
        "attributes_per_request": counts.attributes_per_request,
        "key_bytes": counts.key_bytes_max,
        "value_bytes": counts.value_bytes_max,
        "expanded_bytes": counts.expanded_bytes,
    }[name]


def _limited(data: bytes, limits: otlp.RequestLimits) -> object:
    """What the receivers answer (``otlp.decode_batch``): the batch, None, or the
    refusal as (class, message, error_type)."""
    try:
        decoded = otlp.decode_batch(data, PB, "t", limits)
    except IngestRejection as exc:
        return type(exc), exc.message, exc.error_type
    return None if decoded is None else (decoded[0], decoded[1])


def check_limits(data: bytes, limits: otlp.RequestLimits, tightened: str | None) -> str:
    """The differential assertion with `limits`, for a request on the fast path: the
    native decoder answers exactly when the upb path accepts (with the same batch),
    says "limit" exactly when the upb path refuses for a limit — for the one limit
    `tightened` when only it can be passed — and the receivers' answer is the same
    refusal, status and message naming the setting, on either decoder."""
    try:
        reference: object = otlp.flatten(otlp.decode_request(data, PB, limits), "t", limits)
    except rejections.RequestLimitExceeded as exc:
        reference = exc
    got = native.decode_counted(data, limits)
    CASES["checked"] += 1
    if got.status == "ok":
        CASES["native"] += 1
        assert isinstance(reference, FlatBatch), f"native accepted what upb refuses: {reference}"
        assert FlatBatch("t", got.columns) == reference
    else:
        assert got.status == "limit", got.status  # the fast path falls back for nothing else
        assert isinstance(reference, rejections.RequestLimitExceeded), (
            "native refused what upb accepts"
        )
        if tightened is not None:
            assert reference.limit == otlp._SETTING_OF[tightened]
    answer = _limited(data, limits)
    native.select("upb")
    try:
        assert _limited(data, limits) == answer  # the same status, message and error_type
    finally:
        native.select("native")
    if isinstance(reference, rejections.RequestLimitExceeded):
        assert answer == (rejections.RequestLimitExceeded, reference.message, reference.limit)
        assert reference.http_status == 400 and reference.limit in reference.message
    return got.status


_HUGE: Final = 1 << 40


@_settings(300)
@given(requests(fast=True), st.sampled_from(_LIMITS), st.integers(-2, 1), _SEEDS)
def test_native_1_each_limit_refuses_what_the_upb_path_refuses(
    req: ExportLogsServiceRequest, name: str, offset: int, seed: int
) -> None:
    # One limit set around what the request holds (below, at, above), the rest open.
    counts = _counts(req)
    open_limits = {n: _HUGE for n in _LIMITS}
    limits = otlp.RequestLimits(**{**open_limits, name: max(1, _bound_of(counts, name) + offset)})
    check_limits(req.SerializeToString(), limits, name)
    check_limits(encode(req, random.Random(seed), _WIRE), limits, name)


@_settings(300)
@given(requests(fast=True), st.lists(st.integers(-1, 1), min_size=6, max_size=6), _SEEDS)
def test_native_1_limits_together_refuse_what_the_upb_path_refuses(
    req: ExportLogsServiceRequest, offsets: list[int], seed: int
) -> None:
    # Every limit near what the request holds: whichever the upb path names, the
    # receivers' answer is its refusal on either decoder.
    counts = _counts(req)
    bounds = {n: max(1, _bound_of(counts, n) + o) for n, o in zip(_LIMITS, offsets, strict=True)}
    limits = otlp.RequestLimits(**bounds)
    check_limits(encode(req, random.Random(seed), _WIRE), limits, None)


def test_native_1_a_limit_refusal_names_the_setting_on_either_decoder() -> None:
    records = [logs_pb2.LogRecord(attributes=[_kv("k" * 9, string_value="v" * 9)])] * 3
    data = _request(*records, attributes=[_kv("r", int_value=1)]).SerializeToString()
    for name, bound, what in [
        ("records", 2, "is 3, over server.max_request_records=2"),
        ("attributes_per_record", 1, None),
        ("attributes_per_request", 5, "is 6, over server.max_attributes_per_request=5"),
        ("key_bytes", 8, "is 9, over server.max_attribute_key_bytes=8"),
        ("value_bytes", 8, "is 9, over server.max_attribute_value_bytes=8"),
        # 3 rows of "k"*9 "v"*9 (own), resource "r" "1" and scope "s" (repeated): 3 x 21
        ("expanded_bytes", 62, "is 63, over server.max_expanded_bytes=62"),
    ]:
        limits = otlp.RequestLimits(**{name: bound})
        if what is None:  # one attribute each: at the limit, accepted
            assert check_limits(data, limits, name) == "ok"
            continue
        assert check_limits(data, limits, name) == "limit"
        answer = _limited(data, limits)
        assert isinstance(answer, tuple) and answer[0] is rejections.RequestLimitExceeded
        assert what in answer[1], answer


def test_native_select_upb_turns_the_native_decoder_off() -> None:
    data = _request(logs_pb2.LogRecord(severity_text="x")).SerializeToString()
    assert native.select("upb") == ("upb", "")
    assert native.active() == "upb"
    assert native.decode(data) is None
    assert otlp.decode_flat(data, "t").column("severity_text") == ["x"]
    assert native.select("native") == ("native", "")
    assert native.active() == "native"
    with pytest.raises(ValueError, match="decoder must be one of"):
        native.select("fast")


def test_native_a_schema_other_than_the_installed_one_is_refused() -> None:
    from app.receive import _otlpdecode

    assert native._schema_mismatch(_otlpdecode.SCHEMA) == ""
    # without event_name, a LogRecord field the installed schema has
    fewer = tuple(r for r in _otlpdecode.SCHEMA if not r[0].endswith("LogRecord") or r[1] != 12)
    assert "LogRecord" in native._schema_mismatch(fewer)
    retyped = tuple(
        (m, n, 12 if (m.endswith("KeyValue") and n == 1) else t) for m, n, t in _otlpdecode.SCHEMA
    )
    assert "KeyValue" in native._schema_mismatch(retyped)


# ── the expanded bytes (issue 21 item 3): resource attributes repeated on every row ──


@_settings(200)
@given(requests(fast=True), st.integers(0, 3000), st.integers(1, 40), st.integers(-2, 1), _SEEDS)
def test_bounded_3_expanded_bytes_refuse_the_same_requests_on_either_decoder(
    req: ExportLogsServiceRequest, value_size: int, copies: int, offset: int, seed: int
) -> None:
    # A long resource value over many records (each record sent `copies` times): the
    # bytes the rows hold grow with resource x records, not with the body. The bound
    # around what they hold: below it both decoders refuse naming the setting, at or
    # above it both give the same rows.
    for rl in req.resource_logs:
        rl.resource.attributes.append(_kv("big", string_value="x" * value_size))
        for sl in rl.scope_logs:
            records = list(sl.log_records)
            for _ in range(copies - 1):
                sl.log_records.extend(records)
    counts = _counts(req)
    bound = max(1, counts.expanded_bytes + offset)
    limits = otlp.RequestLimits(**{**{n: _HUGE for n in _LIMITS}, "expanded_bytes": bound})
    want = "limit" if counts.expanded_bytes > bound else "ok"
    assert check_limits(req.SerializeToString(), limits, "expanded_bytes") == want
    assert check_limits(encode(req, random.Random(seed), _WIRE), limits, "expanded_bytes") == want


@_settings(100)
@given(requests(fast=False))
def test_bounded_3_the_upb_path_counts_the_bytes_the_rows_hold_on_every_shape(
    req: ExportLogsServiceRequest,
) -> None:
    # Arrays, kvlists and the JSON encoding are the upb path's alone: the bound is the
    # bytes the reference's rows hold there too, exactly.
    try:
        otlp.validate_request(req)
    except rejections.BadRequest:
        return  # an id of a refused length: refused before any limit
    held = expanded_bytes(otlp.flatten(req, "t"))
    encodings = [(req.SerializeToString(), PB)]
    if held < 1 << 12:  # json_format is slow on long strings; protobuf covers those
        # OTLP/JSON writes ids as hex, json_format as base64: the ids (not counted) go
        json_req = ExportLogsServiceRequest()
        json_req.CopyFrom(req)
        for rl in json_req.resource_logs:
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    lr.ClearField("trace_id")
                    lr.ClearField("span_id")
        json_doc = json_format.MessageToJson(json_req, indent=None).encode()
        encodings.append((json_doc, otlp.JSON_CONTENT_TYPE))
    for data, content_type in encodings:
        at = otlp.RequestLimits(**{**{n: _HUGE for n in _LIMITS}, "expanded_bytes": max(1, held)})
        assert otlp.decode_batch(data, content_type, "t", at) is not None or held == 0
        if held == 0:
            continue
        under = replace(at, expanded_bytes=held - 1) if held > 1 else None
        if under is None:
            continue
        with pytest.raises(rejections.RequestLimitExceeded) as info:
            otlp.decode_batch(data, content_type, "t", under)
        assert info.value.error_type == "max_expanded_bytes"
        assert f"over server.max_expanded_bytes={held - 1}" in info.value.message


def test_bounded_3_a_small_body_expanding_to_gigabytes_is_refused_before_its_rows() -> None:
    # Issue 21 item 3's gap: 33,000 records under one 64 KiB resource value, a 130 KB
    # body within every count and length limit, would hold 2.1 GB of rows (and ended as
    # ArrowInvalid, a 500, on both decoders). Refused 400 naming the setting on either
    # decoder, from sizes: the native decoder never copies a row (status "limit"), the
    # upb path refuses as soon as the resource is read (before walking its records).
    req = _request(
        *[logs_pb2.LogRecord() for _ in range(33_000)],
        attributes=[_kv("k8s.pod.annotations", string_value="a" * (64 << 10))],
    )
    data = req.SerializeToString()
    assert len(data) < 140_000
    limits = otlp.RequestLimits()  # the defaults: server.max_expanded_bytes is 64 MiB
    got = native.decode_counted(data, limits)
    assert got.status == "limit" and got.columns is None
    assert got.counts.expanded_bytes == 33_000 * (len("k8s.pod.annotations") + (64 << 10) + 1)
    answers = []
    for decoder in ("native", "upb"):
        native.select(decoder)
        with pytest.raises(rejections.RequestLimitExceeded) as info:
            otlp.decode_batch(data, PB, "t", limits)
        answers.append((info.value.message, info.value.error_type, info.value.http_status))
    assert answers[0] == answers[1]
    message, error_type, status = answers[0]
    assert (error_type, status) == ("max_expanded_bytes", 400)
    assert "counting so far only the resource attributes" in message  # before the walk
    assert message.endswith(
        f"is {got.counts.expanded_bytes}, over server.max_expanded_bytes=67108864"
    )

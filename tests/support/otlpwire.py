"""OTLP logs requests for the native decoder's differential tests (tests/unit/app/receive/
test_native.py): hypothesis strategies for requests of every shape, and a wire encoder
that writes a message the ways the protobuf wire format allows but the official
serializer never does — fields in any order, a singular scalar sent twice (the last
wins), unknown fields of every wire type, padded varints and tags, explicit defaults,
any non-zero varint for ``true`` — and, on request, strings that are not UTF-8.

The encoder walks the installed descriptors, so it covers every field the schema has.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

__all__ = ["Wire", "encode", "many_attributes", "requests"]

# descriptor type numbers (google.protobuf.descriptor.FieldDescriptor.TYPE_*)
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL, _STRING = range(1, 10)
_MESSAGE, _BYTES, _UINT32, _ENUM = 11, 12, 13, 14
_VARINTS = {_INT64, _UINT64, _INT32, _BOOL, _UINT32, _ENUM}


@dataclass(frozen=True)
class Wire:
    """How `encode` may write a message (each a probability, drawn from ``rnd``)."""

    shuffle: bool = False
    unknown: float = 0.0  # an unknown field before a field
    decoy: float = 0.0  # a singular scalar written twice, a different value first
    padded: float = 0.0  # a varint or tag padded with continuation bytes
    defaults: float = 0.0  # an unset scalar written explicitly with its default
    bad_utf8: float = 0.0  # a string field's bytes replaced by invalid UTF-8


def _varint(value: int, rnd: random.Random, wire: Wire, limit: int = 10) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
    if wire.padded and rnd.random() < wire.padded and len(out) < limit:
        # the same value in more bytes: continuation bits over zero groups
        extra = rnd.randint(1, limit - len(out))
        out[-1] |= 0x80
        out.extend([0x80] * (extra - 1) + [0x00])
    return bytes(out)


def _tag(number: int, wt: int, rnd: random.Random, wire: Wire) -> bytes:
    return _varint(number << 3 | wt, rnd, wire, limit=5)


_BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"a\x80"]


def _scalar(fd: Any, value: Any, rnd: random.Random, wire: Wire) -> bytes:
    t = fd.type
    if t in _VARINTS:
        if t == _BOOL and value and rnd.random() < 0.3:
            value = rnd.choice([2, 255, 1 << 40])  # any non-zero varint is true
        return _tag(fd.number, 0, rnd, wire) + _varint(int(value), rnd, wire)
    if t in (_FIXED64, _DOUBLE):
        packed = struct.pack("<Q", value) if t == _FIXED64 else struct.pack("<d", value)
        return _tag(fd.number, 1, rnd, wire) + packed
    if t == _FIXED32:
        return _tag(fd.number, 5, rnd, wire) + struct.pack("<I", value)
    if t == _FLOAT:
        return _tag(fd.number, 5, rnd, wire) + struct.pack("<f", value)
    if t in (_STRING, _BYTES):
        data: bytes = value.encode("utf-8") if t == _STRING else value
        if t == _STRING and wire.bad_utf8 and rnd.random() < wire.bad_utf8:
            cut = rnd.randint(0, len(data))
            data = data[:cut] + rnd.choice(_BAD_UTF8) + data[cut:]
        return _tag(fd.number, 2, rnd, wire) + _varint(len(data), rnd, wire, 5) + data
    raise AssertionError(f"unexpected field type {t}")


_DEFAULTS = {_STRING: "", _BYTES: b"", _BOOL: False, _DOUBLE: 0.0, _FLOAT: 0.0}


def _unknown(descriptor: Any, rnd: random.Random, wire: Wire) -> bytes:
    known = {f.number for f in descriptor.fields}
    number = rnd.choice([n for n in (4, 13, 14, 99, 1000, 536_870_911) if n not in known])
    wt = rnd.choice([0, 1, 2, 5])
    if wt == 0:
        body = _varint(rnd.getrandbits(64), rnd, wire)
    elif wt == 1:
        body = rnd.randbytes(8)
    elif wt == 5:
        body = rnd.randbytes(4)
    else:
        data = rnd.randbytes(rnd.randint(0, 6))  # not checked: not even UTF-8
        body = _varint(len(data), rnd, wire, 5) + data
    return _tag(number, wt, rnd, wire) + body


def encode(message: Any, rnd: random.Random, wire: Wire = Wire()) -> bytes:
    """`message` in the protobuf wire format, written as `wire` allows."""
    queues: list[list[bytes]] = []
    present = set()
    for fd, value in message.ListFields():
        present.add(fd.number)
        values = value if fd.is_repeated else [value]
        parts = []
        for v in values:
            if fd.type == _MESSAGE:
                sub = encode(v, rnd, wire)
                parts.append(_tag(fd.number, 2, rnd, wire) + _varint(len(sub), rnd, wire, 5) + sub)
            else:
                if not fd.is_repeated and wire.decoy and rnd.random() < wire.decoy:
                    parts.append(_scalar(fd, _other(fd, v), rnd, wire))
                parts.append(_scalar(fd, v, rnd, wire))
        queues.append(parts)
    for fd in message.DESCRIPTOR.fields:
        if (
            fd.number not in present
            and not fd.is_repeated
            and fd.type != _MESSAGE
            and fd.containing_oneof is None
            and wire.defaults
            and rnd.random() < wire.defaults
        ):
            queues.append([_scalar(fd, _DEFAULTS.get(fd.type, 0), rnd, wire)])
    out = bytearray()
    while any(queues):
        # a random interleaving that keeps each repeated field's order
        live = [q for q in queues if q]
        queue = rnd.choice(live) if wire.shuffle else live[0]
        if wire.unknown and rnd.random() < wire.unknown:
            out += _unknown(message.DESCRIPTOR, rnd, wire)
        out += queue.pop(0)
    return bytes(out)


def _other(fd: Any, value: Any) -> Any:
    """A different value of the field's type (the decoy the real value overrides)."""
    t = fd.type
    if t == _STRING:
        return value + "x"
    if t == _BYTES:
        return value + b"x"
    if t == _BOOL:
        return not value
    if t in (_DOUBLE, _FLOAT):
        return 1.5
    if t in (_FIXED64, _FIXED32, _UINT32, _UINT64):
        return (value + 1) % (1 << 32)
    return int(value) + 1 if int(value) < (1 << 31) - 1 else 0


# ── strategies ────────────────────────────────────────────────────────────────────

_KEYS = st.sampled_from(["a", "b", "service.name", "k", "", "ключ", "host.name"]) | st.text(
    max_size=8
)
_TEXT = st.text(max_size=12) | st.sampled_from(["", "x", "ünïcode ✓", "a\x00b", "𝄞"])


def _scalar_values() -> st.SearchStrategy[common_pb2.AnyValue]:
    return st.one_of(
        st.builds(common_pb2.AnyValue),
        _TEXT.map(lambda s: common_pb2.AnyValue(string_value=s)),
        st.booleans().map(lambda b: common_pb2.AnyValue(bool_value=b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: common_pb2.AnyValue(int_value=i)),
        st.floats().map(lambda f: common_pb2.AnyValue(double_value=f)),
        st.binary(max_size=10).map(lambda b: common_pb2.AnyValue(bytes_value=b)),
        st.integers(-(2**31), 2**31 - 1).map(
            lambda i: common_pb2.AnyValue(string_value_strindex=i)
        ),
    )


def _nested_values() -> st.SearchStrategy[common_pb2.AnyValue]:
    def extend(children: st.SearchStrategy[common_pb2.AnyValue]) -> Any:
        return st.lists(children, max_size=3).map(
            lambda vs: common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=vs))
        ) | st.lists(st.tuples(_KEYS, children), max_size=3).map(
            lambda kvs: common_pb2.AnyValue(
                kvlist_value=common_pb2.KeyValueList(
                    values=[common_pb2.KeyValue(key=k, value=v) for k, v in kvs]
                )
            )
        )

    return st.recursive(_scalar_values(), extend, max_leaves=6)


def _attributes(values: st.SearchStrategy[common_pb2.AnyValue]) -> Any:
    kv = st.builds(common_pb2.KeyValue, key=_KEYS, value=values) | st.builds(
        common_pb2.KeyValue, key=_KEYS
    )
    return st.lists(kv, max_size=5)


def _ids(fast: bool) -> Any:
    lengths = st.sampled_from([0, 16]) if fast else st.sampled_from([0, 16, 16, 1, 15, 17, 8])
    return lengths.flatmap(lambda n: st.binary(min_size=n, max_size=n))


def _span_ids(fast: bool) -> Any:
    lengths = st.sampled_from([0, 8]) if fast else st.sampled_from([0, 8, 8, 7, 9, 16])
    return lengths.flatmap(lambda n: st.binary(min_size=n, max_size=n))


def _records(fast: bool) -> Any:
    values = _scalar_values() if fast else (_scalar_values() | _nested_values())
    body = st.none() | values
    return st.builds(
        lambda body, **kw: logs_pb2.LogRecord(**kw, **({} if body is None else {"body": body})),
        body=body,
        time_unix_nano=st.integers(0, 2**64 - 1),
        observed_time_unix_nano=st.integers(0, 2**64 - 1),
        severity_number=st.integers(-(2**31), 2**31 - 1) | st.integers(0, 24),
        severity_text=_TEXT,
        attributes=_attributes(values),
        dropped_attributes_count=st.integers(0, 2**32 - 1),
        flags=st.integers(0, 2**32 - 1),
        trace_id=_ids(fast),
        span_id=_span_ids(fast),
        event_name=_TEXT,
    )


def requests(fast: bool) -> st.SearchStrategy[ExportLogsServiceRequest]:
    """Requests of every shape; with `fast`, only what the native decoder's fast path
    covers (scalar values, valid ids)."""
    values = _scalar_values() if fast else (_scalar_values() | _nested_values())
    scope = st.builds(
        common_pb2.InstrumentationScope,
        name=_TEXT,
        version=_TEXT,
        attributes=st.lists(st.builds(common_pb2.KeyValue, key=_KEYS, value=values), max_size=2),
        dropped_attributes_count=st.integers(0, 5),
    )
    entity = st.builds(
        common_pb2.EntityRef,
        schema_url=_TEXT,
        type=_TEXT,
        id_keys=st.lists(_TEXT, max_size=2),
        description_keys=st.lists(_TEXT, max_size=2),
    )
    resource = st.builds(
        resource_pb2.Resource,
        attributes=_attributes(values),
        dropped_attributes_count=st.integers(0, 5),
        entity_refs=st.lists(entity, max_size=1),
    )
    scope_logs = st.builds(
        lambda scope, **kw: logs_pb2.ScopeLogs(**kw, **({} if scope is None else {"scope": scope})),
        scope=st.none() | scope,
        log_records=st.lists(_records(fast), max_size=3),
        schema_url=_TEXT,
    )
    resource_logs = st.builds(
        lambda resource, **kw: logs_pb2.ResourceLogs(
            **kw, **({} if resource is None else {"resource": resource})
        ),
        resource=st.none() | resource,
        scope_logs=st.lists(scope_logs, max_size=2),
        schema_url=_TEXT,
    )
    return st.builds(ExportLogsServiceRequest, resource_logs=st.lists(resource_logs, max_size=2))


def many_attributes() -> st.SearchStrategy[list[common_pb2.KeyValue]]:
    """One record's worth of attributes past the decoder's pairwise duplicate search
    (it hashes from 24 on), keys from a small set so that many repeat."""
    kv = st.builds(
        common_pb2.KeyValue,
        key=st.sampled_from([f"k{i}" for i in range(40)]),
        value=_scalar_values(),
    )
    return st.lists(kv, min_size=20, max_size=48)

"""The native decoder: an OTLP/protobuf logs request straight to ``FlatBatch`` columns.

``app/receive/_otlpdecode.c`` (a CPython extension ``pip install`` compiles; setup.py)
parses the request bytes in one pass with the GIL released and writes the raw buffers
of the ``sink.parquet.FLAT_SCHEMA`` columns; `decode` wraps them as Arrow arrays without
a copy. The upb parse + ``app.receive.otlp.flatten`` stays the reference: the decoder
answers only when it is sure upb accepts the request and ``flatten`` gives the same
rows, and returns ``None`` otherwise — a request upb refuses, an id
``validate_request`` refuses, or a shape outside its fast path (array and kvlist
values, groups, a singular message sent twice, a known field on another wire type) —
so the caller takes the upb path, which decides and words any refusal
(``app.receive.otlp.decode_flat``). tests/unit/app/receive/test_native.py holds the two
equal (a differential test).

Which decoder runs is chosen once a process (`select`, from ``server.decoder``): the
native one when it is wanted and its extension imports and was built for the installed
opentelemetry-proto schema; else upb, and ``ourios serve`` says so loudly (the
``receive.decoder`` event, ``ourios_build_info{decoder="upb"}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Final, NamedTuple, Protocol

import pyarrow as pa
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from sink import FLAT_SCHEMA

__all__ = [
    "DECODERS",
    "Counts",
    "Decoded",
    "Limits",
    "active",
    "decode",
    "decode_counted",
    "select",
    "start",
]

#: ``server.decoder``'s values: the native decoder (upb when it cannot be used), or upb.
DECODERS: Final = ("native", "upb")


class Counts(NamedTuple):
    """What a request holds, counted as the receivers' per-request limits count it
    (``app.receive.otlp.RequestLimits``): attributes as sent, duplicates included,
    record and resource attributes only (not scope attributes, not bodies) — except
    `expanded_bytes`."""

    records: int
    resource_logs: int
    scope_logs: int
    #: the most attributes of one record or one resource
    attributes_max: int
    #: each record's attributes plus its resource's (which every row repeats)
    attributes_per_request: int
    #: the longest attribute key, UTF-8 bytes
    key_bytes_max: int
    #: the longest attribute value as the column holds it (a non-string value as its
    #: JSON text), UTF-8 bytes
    value_bytes_max: int
    #: the string bytes the rows hold (``RequestLimits.expanded_bytes``): each record's
    #: severity text, body and attributes, its resource's attributes and its scope's
    #: name (the last two repeated on every row), as the columns hold them
    expanded_bytes: int


class Limits(Protocol):
    """The per-request limits `decode` enforces (``app.receive.otlp.RequestLimits``):
    ``records`` bounds the records, the resource_logs and the scope_logs;
    ``attributes_per_record`` one record's or one resource's attributes;
    ``attributes_per_request`` `Counts.attributes_per_request`; ``key_bytes`` and
    ``value_bytes`` one attribute's key and value; ``expanded_bytes``
    `Counts.expanded_bytes`."""

    @property
    def records(self) -> int: ...
    @property
    def attributes_per_record(self) -> int: ...
    @property
    def attributes_per_request(self) -> int: ...
    @property
    def key_bytes(self) -> int: ...
    @property
    def value_bytes(self) -> int: ...
    @property
    def expanded_bytes(self) -> int: ...


def _bounds(limits: Limits | None) -> tuple[int, int, int, int, int, int] | None:
    if limits is None:
        return None
    return (
        limits.records,
        limits.attributes_per_record,
        limits.attributes_per_request,
        limits.key_bytes,
        limits.value_bytes,
        limits.expanded_bytes,
    )


class Decoded(NamedTuple):
    """`decode_counted`'s answer: ``columns`` is None when the request was not decoded
    here; ``status`` then says why (``REASONS``)."""

    status: str
    counts: Counts
    columns: pa.RecordBatch | None


_STR_MAP: Final = FLAT_SCHEMA.field("attributes").type
_ENTRIES: Final = [_STR_MAP.key_field, _STR_MAP.item_field]  # the entries struct's fields
_EMPTY: Final = pa.RecordBatch.from_arrays(
    [pa.array([], field.type) for field in FLAT_SCHEMA], schema=FLAT_SCHEMA
)


def _load() -> tuple[ModuleType | None, str]:
    """The extension and "", or None and why it cannot be used."""
    try:
        from app.receive import _otlpdecode as ext
    except ImportError as exc:
        return None, f"the native decoder cannot be imported: {exc}"
    mismatch = _schema_mismatch(ext.SCHEMA)
    if mismatch:
        return None, f"the native decoder was built for another OTLP schema: {mismatch}"
    return ext, ""


def _schema_mismatch(assumed: Sequence[tuple[str, int, int]]) -> str:
    """The first message whose fields (number, type) differ between what the extension
    parses and the installed descriptors, or ""."""
    messages: dict[str, set[tuple[int, int]]] = {}
    for message, number, kind in assumed:
        messages.setdefault(message, set()).add((number, kind))
    pending = [ExportLogsServiceRequest.DESCRIPTOR]
    seen: set[str] = set()
    while pending:
        descriptor = pending.pop()
        if descriptor.full_name in seen or descriptor.full_name not in messages:
            continue  # ArrayValue, KeyValueList: never parsed natively (the upb path)
        seen.add(descriptor.full_name)
        fields = {(f.number, f.type) for f in descriptor.fields}
        if fields != messages[descriptor.full_name]:
            return (
                f"{descriptor.full_name} has fields {sorted(fields)}, the decoder expects "
                f"{sorted(messages[descriptor.full_name])}"
            )
        pending.extend(f.message_type for f in descriptor.fields if f.message_type)
    missing = set(messages) - seen
    return f"messages not in the installed schema: {sorted(missing)}" if missing else ""


_EXT, _UNAVAILABLE = _load()
#: status code → name (the reasons a request is not decoded here)
REASONS: Final[dict[int, str]] = (
    {}
    if _EXT is None
    else {
        getattr(_EXT, name): name.lower()
        for name in ("OK", "MALFORMED", "SHAPE", "UTF8", "ID", "SIZE", "LIMIT")
    }
)
_state: dict[str, ModuleType | None] = {"ext": _EXT}


def select(wanted: str) -> tuple[str, str]:
    """Use the `wanted` decoder (``server.decoder``) for the rest of the process; returns
    the decoder in use and, when it is not the one wanted, why."""
    if wanted not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {wanted!r}")
    if wanted == "upb":
        _state["ext"] = None
        return "upb", ""
    _state["ext"] = _EXT
    return ("native", "") if _EXT is not None else ("upb", _UNAVAILABLE)


def start(
    wanted: str, emit: Callable[[str, Mapping[str, object], str], None], **fields: object
) -> str:
    """`select` at a process's start, and the ``receive.decoder`` event saying which
    decoder it uses: a warning when it is not the one wanted (why), else info."""
    decoder, why = select(wanted)
    details: dict[str, object] = {"decoder": decoder, "wanted": wanted, **fields}
    if why:
        details["reason"] = why
        details["message"] = "decoding on the upb path: slower (DESIGN.md §3), same results"
    emit("receive.decoder", details, "warning" if why else "info")
    return decoder


def active() -> str:
    """The decoder in use: "native" or "upb"."""
    return "upb" if _state["ext"] is None else "native"


def decode(data: bytes, limits: Limits | None = None) -> pa.RecordBatch | None:
    """The request's ``FLAT_SCHEMA`` columns, or None: the caller takes the upb path
    (which refuses what must be refused). With `limits`, a request over one of them is
    None too — found before the resource attributes are copied per row — and the upb
    path given the same limits refuses it with the limit's own error."""
    ext = _state["ext"]
    if ext is None:
        return None
    answer = ext.decode(data, _bounds(limits))
    if answer[0]:
        return None
    return _columns(answer)


def decode_counted(data: bytes, limits: Limits | None = None) -> Decoded:
    """`decode` with the reason and the counts (tests, and a caller that checks the
    limits itself). Always uses the extension; ImportError when there is none."""
    if _EXT is None:
        raise ImportError(_UNAVAILABLE)
    answer = _EXT.decode(data, _bounds(limits))
    status = REASONS[answer[0]]
    counts = Counts(*answer[2] if status == "ok" else answer[1])
    return Decoded(status, counts, _columns(answer) if status == "ok" else None)


#: 0, 1, 2, …: every batch's ``record_index`` is a zero-copy slice of it (as flatten's).
_INDEXES: list[pa.Array] = [pa.array(range(1024), pa.int32())]


def _record_indexes(n: int) -> pa.Array:
    indexes = _INDEXES[0]
    if n > len(indexes):
        indexes = _INDEXES[0] = pa.array(range(max(n, 2 * len(indexes))), pa.int32())
    return indexes.slice(0, n)


def _columns(answer: tuple[object, ...]) -> pa.RecordBatch:
    _, n, _, blocks, trace_nulls, span_nulls = answer
    assert isinstance(n, int) and isinstance(blocks, list)
    if n == 0:
        return _EMPTY
    (
        time, observed, severity, sevtext_off, sevtext, body_off, body,
        attr_off, key_off, key, val_off, val,
        res_off, rkey_off, rkey, rval_off, rval,
        scope_off, scope,
        trace_valid, trace_off, trace, span_valid, span_off, span,
    ) = (pa.py_buffer(b) for b in blocks)  # fmt: skip
    string = pa.string()
    arrays = [
        pa.Array.from_buffers(pa.uint64(), n, [None, time]),
        pa.Array.from_buffers(pa.uint64(), n, [None, observed]),
        pa.Array.from_buffers(pa.int32(), n, [None, severity]),
        pa.Array.from_buffers(string, n, [None, sevtext_off, sevtext]),
        pa.Array.from_buffers(string, n, [None, body_off, body]),
        _map(n, attr_off, key_off, key, val_off, val),
        _map(n, res_off, rkey_off, rkey, rval_off, rval),
        pa.Array.from_buffers(string, n, [None, scope_off, scope]),
        pa.Array.from_buffers(string, n, [trace_valid, trace_off, trace], trace_nulls),
        pa.Array.from_buffers(string, n, [span_valid, span_off, span], span_nulls),
        _record_indexes(n),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=FLAT_SCHEMA)


def _map(
    n: int, offsets: pa.Buffer, key_off: pa.Buffer, key: pa.Buffer, val_off: pa.Buffer,
    val: pa.Buffer,
) -> pa.Array:  # fmt: skip
    entries = (len(key_off) // 4) - 1
    keys = pa.Array.from_buffers(pa.string(), entries, [None, key_off, key])
    values = pa.Array.from_buffers(pa.string(), entries, [None, val_off, val])
    children = pa.StructArray.from_arrays([keys, values], fields=_ENTRIES)
    return pa.Array.from_buffers(_STR_MAP, n, [None, offsets], children=[children])

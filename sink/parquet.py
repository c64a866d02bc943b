"""Parquet objects in the store: the two schemas, their columnar buffers and encoders.

Format (DESIGN.md §3 "Parquet in the store"; the column names are an external interface
that DuckDB, pyarrow and operators' queries depend on). Records::

    tenant                   string              required
    time_unix_nano           uint64              required
    observed_time_unix_nano  uint64              required
    severity_number          int32               required
    severity_text            string              required
    body                     string              nullable  (absent OTLP body)
    attributes               map<string,string>  required  (possibly empty)
    resource_attributes      map<string,string>  required  (possibly empty)
    scope_name               string              required
    trace_id                 string              nullable  lowercase hex; empty id → null
    span_id                  string              nullable  lowercase hex; empty id → null
    template_id              int64               required  0: not mined (an isolated frame)
    template_params          list<string>        required  (possibly empty)
    wal_lsn                  uint64              required  the frame's end offset (a mark)
    record_index             int32               required  the record's place in its frame

Audit::

    tenant            string   required
    template_id       int64    required
    template_version  int32    required
    template          string   required
    change            string   required  "created" | "changed"
    wal_lsn           uint64   required
    time_unix_nano    uint64   required

Timestamps and ``wal_lsn`` are ``uint64`` because OTLP's ``time_unix_nano`` is a
``fixed64`` and the WAL's LSN is a u64: every value the wire or the log can carry is
representable, so no record can fail an encode on range. Parquet stores them as INT64
with the UINT_64 logical type; DuckDB reads them as ``UBIGINT`` (for a timestamp:
``make_timestamp_ns(time_unix_nano::BIGINT)``), pyarrow as ``uint64``. Body and
attribute values that were not strings in OTLP are JSON-encoded by the caller. The
schema metadata carries ``ourios.schema`` = ``records/1`` or ``audit/1``; a change to a
column's name or type bumps it. A records object's row groups hold ``ROW_GROUP_ROWS``
rows.

Invariant: an object is encoded whole in memory and handed to the store as one
``bytes``, so a reader never sees a Parquet file without its footer; the store's atomic
put is the only publication step.

``RecordColumns`` and ``AuditColumns`` are the buffers the ingest turn appends to. The
turn extends one Python list per column (no per-row dict, no Arrow call); every
``sink.buffers.SEAL_ROWS`` rows it freezes a records buffer's lists into a piece, which
the sealer thread converts into an Arrow chunk, so the publisher's encode converts
nothing and writes with the GIL released. Converting a whole partition on the
publisher thread instead held the interpreter for tens of milliseconds per call, and
every turn waiting on an fsync or a lock queued behind it (p99 ack latency at half
load: 130-400 ms before, soak/bench/ingest.py). Attributes stay the caller's sequence
of ``(key, value)`` tuples and become a ``MapArray`` in one ``pyarrow.array`` call,
which measured faster than building the array from flattened keys, values and
offsets. Audit buffers are small and converted at encode time.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "AUDIT_SCHEMA",
    "COMPRESSIONS",
    "RECORDS_SCHEMA",
    "Attributes",
    "AuditColumns",
    "AuditRow",
    "EncodeError",
    "RecordColumns",
    "RecordRow",
    "TemplateChange",
    "encode_audit",
    "encode_records",
]

#: OTLP attributes after the receiver's conversion: (key, value) pairs, values
#: JSON-encoded unless they were strings. Key order is kept; duplicate keys are kept.
Attributes = Sequence[tuple[str, str]]

_STR_MAP: Final = pa.map_(pa.string(), pa.string())
# "element" is the Parquet-compliant name of a list's item field, so a file read back
# has exactly this schema.
_STR_LIST: Final = pa.list_(pa.field("element", pa.string()))

RECORDS_SCHEMA: Final[pa.Schema] = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("time_unix_nano", pa.uint64(), nullable=False),
        pa.field("observed_time_unix_nano", pa.uint64(), nullable=False),
        pa.field("severity_number", pa.int32(), nullable=False),
        pa.field("severity_text", pa.string(), nullable=False),
        pa.field("body", pa.string()),
        pa.field("attributes", _STR_MAP, nullable=False),
        pa.field("resource_attributes", _STR_MAP, nullable=False),
        pa.field("scope_name", pa.string(), nullable=False),
        pa.field("trace_id", pa.string()),
        pa.field("span_id", pa.string()),
        pa.field("template_id", pa.int64(), nullable=False),
        pa.field("template_params", _STR_LIST, nullable=False),
        pa.field("wal_lsn", pa.uint64(), nullable=False),
        pa.field("record_index", pa.int32(), nullable=False),
    ],
    metadata={"ourios.schema": "records/1"},
)

AUDIT_SCHEMA: Final[pa.Schema] = pa.schema(
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("template_id", pa.int64(), nullable=False),
        pa.field("template_version", pa.int32(), nullable=False),
        pa.field("template", pa.string(), nullable=False),
        pa.field("change", pa.string(), nullable=False),
        pa.field("wal_lsn", pa.uint64(), nullable=False),
        pa.field("time_unix_nano", pa.uint64(), nullable=False),
    ],
    metadata={"ourios.schema": "audit/1"},
)

#: accepted values of ``OURIOS_SINK_PARQUET_COMPRESSION``
COMPRESSIONS: Final = ("zstd", "snappy", "gzip", "none")
_CODECS: Final[dict[str, str | None]] = {
    "zstd": "zstd",
    "snappy": "snappy",
    "gzip": "gzip",
    "none": None,
}

# The size estimate is the Arrow form's bytes: fixed-width values, one int32 offset per
# string, map or list value, and the string lengths. It counts code points, not UTF-8
# bytes, and ignores Python object overhead (the heap holds several times more).
_OFFSET: Final = 4
_RECORD_FIXED_BYTES: Final = (
    8
    + 8
    + 4
    + 8
    + 8
    + 4  # times, severity_number, template_id, wal_lsn, record_index
    + 6 * _OFFSET  # tenant, severity_text, body, scope_name, trace_id, span_id
    + 3 * _OFFSET  # attributes, resource_attributes, template_params
)
_AUDIT_FIXED_BYTES: Final = 8 + 4 + 8 + 8 + 3 * _OFFSET
_ATTR_ENTRY_BYTES: Final = 2 * _OFFSET  # the key's and the value's offsets
_ID_BYTES: Final = 32 + 16  # hex trace id and span id


class EncodeError(Exception):
    """A buffer could not be encoded: names the schema, the column and pyarrow's reason.

    The buffer is left untouched, so the caller can requeue or quarantine its rows.
    """

    error_type: str = "parquet_encode"

    def __init__(self, schema: str, column: str, reason: str) -> None:
        self.schema = schema
        self.column = column
        self.reason = reason
        super().__init__(f"cannot encode {schema} column {column!r}: {reason}")


class TemplateChange(enum.StrEnum):
    """The ``change`` column of an audit row."""

    CREATED = "created"
    CHANGED = "changed"


class RecordRow(NamedTuple):
    """One record row in schema order, for ``RecordColumns.extend``."""

    tenant: str
    time_unix_nano: int
    observed_time_unix_nano: int
    severity_number: int
    severity_text: str
    body: str | None
    attributes: Attributes
    resource_attributes: Attributes
    scope_name: str
    trace_id: bytes | str | None
    span_id: bytes | str | None
    template_id: int
    template_params: Sequence[str]
    wal_lsn: int
    record_index: int


class AuditRow(NamedTuple):
    """One audit row in schema order, for ``AuditColumns.extend``."""

    tenant: str
    template_id: int
    template_version: int
    template: str
    change: TemplateChange
    wal_lsn: int
    time_unix_nano: int


_join = "".join
_chain = itertools.chain.from_iterable
# Rows sized per pass of ``RecordColumns._measure``: bounds the joined temp strings.
_MEASURE_CHUNK: Final = 4096


def _attributes_nbytes(attributes: Attributes) -> int:
    return len(_join(_chain(attributes))) + _ATTR_ENTRY_BYTES * len(attributes)


class RecordColumns:
    """A columnar buffer of record rows in ``RECORDS_SCHEMA``: frozen pieces (each an
    Arrow chunk once converted), then rows held as one Python list per column, in that
    order.

    Rows arrive as lists (``extend_columns``, the ingest turn's path, a C-level extend
    per column; ``append_row`` and ``extend`` for tests and tools); ``freeze`` moves the
    list rows into a ``FrozenRows`` piece, which ``FrozenRows.convert`` turns into an
    Arrow chunk. The owner freezes every ``sink.buffers.SEAL_ROWS`` rows and converts
    off its lock, so a large buffer is Arrow memory, which the cyclic collector never
    walks and an encode does not convert. Each column also reads as a
    property giving its values over every row (``column``; tests and diagnostics).

    ``nbytes`` is exact for chunks; for list rows it is kept incrementally by sizing,
    when it is read, only the rows appended since the last read, in a few C-level
    passes. Not thread-safe, reads of ``nbytes`` included: the owner's lock (the sink
    lock) guards it.

    ``trace_id``/``span_id`` take the raw OTLP bytes or an already-hex string; bytes
    are hex-encoded at encode time, off the ingest path, and an empty id becomes null.
    """

    __slots__ = (
        "_tenant",
        "_time_unix_nano",
        "_observed_time_unix_nano",
        "_severity_number",
        "_severity_text",
        "_body",
        "_attributes",
        "_resource_attributes",
        "_scope_name",
        "_trace_id",
        "_span_id",
        "_template_id",
        "_template_params",
        "_wal_lsn",
        "_record_index",
        "_nbytes",
        "_sized",
        "_last_resource",
        "_last_resource_nbytes",
        "_pieces",
        "_piece_rows",
    )

    def __init__(self) -> None:
        self._tenant: list[str] = []
        self._time_unix_nano: list[int] = []
        self._observed_time_unix_nano: list[int] = []
        self._severity_number: list[int] = []
        self._severity_text: list[str] = []
        self._body: list[str | None] = []
        self._attributes: list[Attributes] = []
        self._resource_attributes: list[Attributes] = []
        self._scope_name: list[str] = []
        self._trace_id: list[bytes | str | None] = []
        self._span_id: list[bytes | str | None] = []
        self._template_id: list[int] = []
        self._template_params: list[Sequence[str]] = []
        self._wal_lsn: list[int] = []
        self._record_index: list[int] = []
        self._nbytes = 0  # the size of rows [0, _sized)
        self._sized = 0
        # Records of one OTLP resource share its attribute sequence, so its size is
        # computed once per run of rows rather than once per row.
        self._last_resource: Attributes | None = None
        self._last_resource_nbytes = 0
        #: rows frozen out of the lists (``freeze``), in order, before the list rows
        self._pieces: list[FrozenRows] = []
        self._piece_rows = 0

    def __len__(self) -> int:
        return self._piece_rows + len(self._wal_lsn)

    def __repr__(self) -> str:
        return f"RecordColumns(rows={len(self)}, nbytes={self.nbytes})"

    @property
    def nbytes(self) -> int:
        """Uncompressed Arrow size of the rows: exact for chunks, approximate for the
        list rows (see the module docstring)."""
        rows = len(self._wal_lsn)
        if self._sized < rows:
            for lo in range(self._sized, rows, _MEASURE_CHUNK):
                self._nbytes += self._measure(lo, min(rows, lo + _MEASURE_CHUNK))
            self._sized = rows
        return sum(piece.nbytes for piece in self._pieces) + self._nbytes

    @property
    def list_rows(self) -> int:
        """Rows held in the buffer's own lists (not yet frozen)."""
        return len(self._wal_lsn)

    @property
    def arrow_rows(self) -> int:
        """Rows held as Arrow chunks (frozen and converted)."""
        return sum(
            piece.data.num_rows
            for piece in list(self._pieces)
            if isinstance(piece.data, pa.RecordBatch)
        )

    def extend_columns(
        self,
        tenant: str,
        time_unix_nano: Sequence[int],
        observed_time_unix_nano: Sequence[int],
        severity_number: Sequence[int],
        severity_text: Sequence[str],
        body: Sequence[str | None],
        attributes: Sequence[Attributes],
        resource_attributes: Sequence[Attributes],
        scope_name: Sequence[str],
        trace_id: Sequence[bytes | str | None],
        span_id: Sequence[bytes | str | None],
        template_id: Sequence[int],
        template_params: Sequence[Sequence[str]],
        wal_lsn: int,
        record_index: Sequence[int],
    ) -> None:
        """Append one batch's rows given column-wise, all of ``len(record_index)``, with
        one tenant and one LSN: the ingest turn's path, a C-level extend per column."""
        n = len(record_index)
        self._tenant.extend(itertools.repeat(tenant, n))
        self._time_unix_nano.extend(time_unix_nano)
        self._observed_time_unix_nano.extend(observed_time_unix_nano)
        self._severity_number.extend(severity_number)
        self._severity_text.extend(severity_text)
        self._body.extend(body)
        self._attributes.extend(attributes)
        self._resource_attributes.extend(resource_attributes)
        self._scope_name.extend(scope_name)
        self._trace_id.extend(trace_id)
        self._span_id.extend(span_id)
        self._template_id.extend(template_id)
        self._template_params.extend(template_params)
        self._wal_lsn.extend(itertools.repeat(wal_lsn, n))
        self._record_index.extend(record_index)

    def freeze(self) -> FrozenRows:
        """Move the list rows, as they are, into a piece after the pieces before them
        (O(1): the lists change hands) and return it; ``FrozenRows.convert`` turns it into
        an Arrow chunk later, outside the owner's lock. Until then it reads as lists."""
        piece_cols = RecordColumns()
        for name in _LIST_SLOTS:
            setattr(piece_cols, name, getattr(self, name))
            setattr(self, name, [])
        piece_cols._nbytes, piece_cols._sized = self._nbytes, self._sized
        piece_cols._last_resource = self._last_resource
        piece_cols._last_resource_nbytes = self._last_resource_nbytes
        self._nbytes = self._sized = 0
        self._last_resource, self._last_resource_nbytes = None, 0
        piece = FrozenRows(piece_cols)
        self._pieces.append(piece)
        self._piece_rows += len(piece_cols)
        return piece

    def table(self) -> pa.Table:
        """Every row as one Arrow table in ``RECORDS_SCHEMA`` (EncodeError naming the
        column when a list row's value does not fit it); the buffer is unchanged."""
        batches = [piece.batch() for piece in list(self._pieces)]
        if self._wal_lsn:
            batches.append(_rows_batch(self))
        return pa.Table.from_batches(batches, schema=RECORDS_SCHEMA)

    def column(self, name: str) -> list[Any]:
        """One column's values over every row, in order, as pyarrow reads them back
        (maps as lists of pairs; for tests and diagnostics, not the hot path)."""
        if name not in _RECORD_COLUMNS:
            raise KeyError(f"no record column {name!r}")
        out: list[Any] = []
        for piece in list(self._pieces):
            out.extend(piece.column(name))
        out.extend(getattr(self, "_" + name))
        return out

    def lsn_bounds(self) -> tuple[int, int, int, int] | None:
        """``(first_lsn, last_lsn, first_index, last_index)``: the lowest and highest
        ``wal_lsn`` among the rows, the lowest ``record_index`` among the rows at the
        first and the highest among those at the last; None when empty."""
        if not len(self):
            return None
        if self._pieces:
            table = self.table()
            lsn_column, index_column = table.column("wal_lsn"), table.column("record_index")
            first, last = pc.min(lsn_column).as_py(), pc.max(lsn_column).as_py()
            at_first = pc.filter(index_column, pc.equal(lsn_column, first))
            at_last = pc.filter(index_column, pc.equal(lsn_column, last))
            return first, last, pc.min(at_first).as_py(), pc.max(at_last).as_py()
        lsns, indexes = self._wal_lsn, self._record_index
        first, last = min(lsns), max(lsns)
        first_index = min(i for lsn, i in zip(lsns, indexes, strict=True) if lsn == first)
        last_index = max(i for lsn, i in zip(lsns, indexes, strict=True) if lsn == last)
        return first, last, first_index, last_index

    def _measure(self, lo: int, hi: int) -> int:
        attributes = self._attributes[lo:hi]
        params = self._template_params[lo:hi]
        total = (hi - lo) * (_RECORD_FIXED_BYTES + _ID_BYTES)
        total += len(_join(self._tenant[lo:hi])) + len(_join(self._severity_text[lo:hi]))
        total += len(_join(self._scope_name[lo:hi]))
        total += len(_join([body for body in self._body[lo:hi] if body]))
        total += len(_join(_chain(_chain(attributes))))
        total += _ATTR_ENTRY_BYTES * sum(map(len, attributes))
        total += len(_join(_chain(params))) + _OFFSET * sum(map(len, params))
        last, size = self._last_resource, self._last_resource_nbytes
        for resource in self._resource_attributes[lo:hi]:
            if resource is not last:
                last, size = resource, _attributes_nbytes(resource)
            total += size
        self._last_resource, self._last_resource_nbytes = last, size
        return total

    def append_row(
        self,
        tenant: str,
        time_unix_nano: int,
        observed_time_unix_nano: int,
        severity_number: int,
        severity_text: str,
        body: str | None,
        attributes: Attributes,
        resource_attributes: Attributes,
        scope_name: str,
        trace_id: bytes | str | None,
        span_id: bytes | str | None,
        template_id: int,
        template_params: Sequence[str],
        wal_lsn: int,
        record_index: int,
    ) -> None:
        """Append one row. The sequences are kept by reference and must not be mutated."""
        self._tenant.append(tenant)
        self._time_unix_nano.append(time_unix_nano)
        self._observed_time_unix_nano.append(observed_time_unix_nano)
        self._severity_number.append(severity_number)
        self._severity_text.append(severity_text)
        self._body.append(body)
        self._attributes.append(attributes)
        self._resource_attributes.append(resource_attributes)
        self._scope_name.append(scope_name)
        self._trace_id.append(trace_id)
        self._span_id.append(span_id)
        self._template_id.append(template_id)
        self._template_params.append(template_params)
        self._wal_lsn.append(wal_lsn)
        self._record_index.append(record_index)

    def extend(self, rows: Iterable[RecordRow]) -> None:
        """Append rows given as ``RecordRow`` tuples, in order."""
        append = self.append_row
        for row in rows:
            append(*row)

    def merge(self, other: RecordColumns) -> None:
        """Append every row of ``other`` after this buffer's rows; ``other`` is unchanged."""
        if other._pieces:
            if self._wal_lsn:
                self.freeze()
            self._pieces.extend(other._pieces)  # shared: a piece's rows never change
            self._piece_rows += other._piece_rows
        total = self._nbytes_of_lists() + other._nbytes_of_lists()
        for name in _RECORD_COLUMNS:
            column: list[Any] = getattr(self, "_" + name)
            column.extend(getattr(other, "_" + name))
        self._nbytes, self._sized = total, len(self._wal_lsn)

    def _nbytes_of_lists(self) -> int:
        return self.nbytes - sum(piece.nbytes for piece in self._pieces)

    def rows(self) -> list[RecordRow]:
        """The rows as tuples, in order (for tests and diagnostics, not the hot path);
        rows held as chunks come back as pyarrow reads them (maps as lists of pairs)."""
        out: list[RecordRow] = []
        for piece in list(self._pieces):
            out.extend(piece.rows())
        columns = [getattr(self, "_" + n) for n in _RECORD_COLUMNS]
        out.extend(RecordRow(*r) for r in zip(*columns, strict=True))
        return out


def _column_property(name: str) -> property:
    return property(lambda self: self.column(name), doc=f"every row's ``{name}``")


class FrozenRows:
    """Rows frozen out of a ``RecordColumns``: a list-only ``RecordColumns`` until
    ``convert`` replaces it with its Arrow chunk. Both live in the one ``data``
    attribute, so a reader on another thread sees either, never neither; both hold the
    same rows, and a piece's rows never change, so buffers may share it (``merge``)."""

    __slots__ = ("data",)

    def __init__(self, data: RecordColumns) -> None:
        self.data: RecordColumns | pa.RecordBatch = data

    def convert(self) -> None:
        """Replace the lists with the Arrow chunk (EncodeError: left as lists)."""
        data = self.data
        if not isinstance(data, pa.RecordBatch):
            self.data = _rows_batch(data)

    def batch(self) -> pa.RecordBatch:
        data = self.data
        return data if isinstance(data, pa.RecordBatch) else _rows_batch(data)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def column(self, name: str) -> list[Any]:
        data = self.data
        if isinstance(data, pa.RecordBatch):
            values: list[Any] = data.column(name).to_pylist()
            return values
        return data.column(name)

    def rows(self) -> list[RecordRow]:
        data = self.data
        if isinstance(data, pa.RecordBatch):
            return [RecordRow(**row) for row in data.to_pylist()]
        return data.rows()


_LIST_SLOTS: Final = tuple("_" + name for name in RECORDS_SCHEMA.names)


for _name in RECORDS_SCHEMA.names:
    setattr(RecordColumns, _name, _column_property(_name))
del _name


class AuditColumns:
    """A columnar buffer of audit rows: one list per column of ``AUDIT_SCHEMA``.

    Same contract as ``RecordColumns``; ``change`` is validated on append (an audit
    event is rare, a wrong value in the store is permanent).
    """

    __slots__ = (
        "tenant",
        "template_id",
        "template_version",
        "template",
        "change",
        "wal_lsn",
        "time_unix_nano",
        "nbytes",
    )

    def __init__(self) -> None:
        self.tenant: list[str] = []
        self.template_id: list[int] = []
        self.template_version: list[int] = []
        self.template: list[str] = []
        self.change: list[str] = []
        self.wal_lsn: list[int] = []
        self.time_unix_nano: list[int] = []
        #: approximate uncompressed Arrow size of the rows, maintained on every append
        self.nbytes: int = 0

    def __len__(self) -> int:
        return len(self.wal_lsn)

    def __repr__(self) -> str:
        return f"AuditColumns(rows={len(self)}, nbytes={self.nbytes})"

    def append_row(
        self,
        tenant: str,
        template_id: int,
        template_version: int,
        template: str,
        change: TemplateChange | str,
        wal_lsn: int,
        time_unix_nano: int,
    ) -> None:
        """Append one row; ``change`` must be ``created`` or ``changed`` (ValueError)."""
        value = TemplateChange(change).value
        self.tenant.append(tenant)
        self.template_id.append(template_id)
        self.template_version.append(template_version)
        self.template.append(template)
        self.change.append(value)
        self.wal_lsn.append(wal_lsn)
        self.time_unix_nano.append(time_unix_nano)
        self.nbytes += _AUDIT_FIXED_BYTES + len(tenant) + len(template) + len(value)

    def extend(self, rows: Iterable[AuditRow]) -> None:
        """Append rows given as ``AuditRow`` tuples, in order."""
        append = self.append_row
        for row in rows:
            append(*row)

    def merge(self, other: AuditColumns) -> None:
        """Append every row of ``other`` after this buffer's rows; ``other`` is unchanged."""
        for name in _AUDIT_COLUMNS:
            column: list[Any] = getattr(self, name)
            column.extend(getattr(other, name))
        self.nbytes += other.nbytes

    def rows(self) -> list[AuditRow]:
        """The rows as tuples, in order (``change`` as ``TemplateChange``)."""
        out = []
        for r in zip(*(getattr(self, n) for n in _AUDIT_COLUMNS), strict=True):
            row = AuditRow(*r)
            out.append(row._replace(change=TemplateChange(row.change)))
        return out


_RECORD_COLUMNS: Final = tuple(RECORDS_SCHEMA.names)
_AUDIT_COLUMNS: Final = tuple(AUDIT_SCHEMA.names)
assert _RECORD_COLUMNS == RecordRow._fields, "RecordRow must follow RECORDS_SCHEMA"
assert _AUDIT_COLUMNS == AuditRow._fields, "AuditRow must follow AUDIT_SCHEMA"


def _hex_ids(ids: list[bytes | str | None]) -> list[str | None]:
    # None and empty ids (bytes or str) are null: an absent id is not the string "none".
    out: list[str | None] = []
    for i in ids:
        if not i:
            out.append(None)
        elif isinstance(i, bytes):
            out.append(i.hex())
        else:
            out.append(i.lower())
    return out


def _shared_maps(values: list[Attributes]) -> pa.Array:
    """Convert a column whose rows mostly share a few sequence objects (one per OTLP
    resource): each distinct object is converted once and the rows gathered by index."""
    first: dict[int, int] = {}
    distinct: list[Attributes] = []
    indices: list[int] = []
    for value in values:
        key = id(value)
        index = first.get(key)
        if index is None:
            index = first[key] = len(distinct)
            distinct.append(value)
        indices.append(index)
    if len(distinct) * 2 > len(values):
        return pa.array(values, type=_STR_MAP)
    return pa.array(distinct, type=_STR_MAP).take(pa.array(indices, type=pa.int32()))


_Converter = Callable[[list[Any]], pa.Array]

#: Rows per Parquet row group, and per conversion call (see ``_encode``).
ROW_GROUP_ROWS: Final = 8192


def _plain(arrow_type: pa.DataType) -> _Converter:
    return lambda values: pa.array(values, type=arrow_type)


_RECORD_CONVERTERS: Final[dict[str, _Converter]] = {
    field.name: _plain(field.type) for field in RECORDS_SCHEMA
} | {
    "trace_id": lambda v: pa.array(_hex_ids(v), type=pa.string()),
    "span_id": lambda v: pa.array(_hex_ids(v), type=pa.string()),
    "resource_attributes": _shared_maps,
}
_AUDIT_CONVERTERS: Final[dict[str, _Converter]] = {
    field.name: _plain(field.type) for field in AUDIT_SCHEMA
}


def _codec(compression: str) -> str | None:
    try:
        return _CODECS[compression]
    except KeyError:
        allowed = "|".join(COMPRESSIONS)
        raise ValueError(
            f"unknown Parquet compression {compression!r}: must be {allowed}"
        ) from None


def _encode(
    label: str,
    schema: pa.Schema,
    converters: dict[str, _Converter],
    source: RecordColumns | AuditColumns,
    compression: str,
) -> bytes:
    codec = _codec(compression)
    columns = [getattr(source, name) for name in schema.names]
    rows = len(source)
    out = pa.BufferOutputStream()
    # Converting Python objects to Arrow holds the GIL for the whole call, so an audit
    # buffer is converted and written one row group at a time: the ingest threads get
    # the interpreter back between groups instead of stalling for the whole buffer.
    try:
        with pq.ParquetWriter(out, schema, compression=codec) as writer:
            for start in range(0, max(rows, 1), ROW_GROUP_ROWS):
                stop = min(rows, start + ROW_GROUP_ROWS)
                arrays = []
                for name, column in zip(schema.names, columns, strict=True):
                    try:
                        arrays.append(converters[name](column[start:stop]))
                    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                        raise EncodeError(label, name, str(exc)) from exc
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
    except pa.ArrowException as exc:
        raise EncodeError(label, "*", str(exc)) from exc
    return bytes(out.getvalue().to_pybytes())


def _convert(label: str, converters: dict[str, _Converter], name: str, values: Any) -> pa.Array:
    try:
        return converters[name](values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        raise EncodeError(label, name, str(exc)) from exc


def _rows_batch(cols: RecordColumns) -> pa.RecordBatch:
    """The list rows of ``cols`` as one chunk (EncodeError naming the column)."""
    arrays = [
        _convert("records", _RECORD_CONVERTERS, name, getattr(cols, "_" + name))
        for name in _RECORD_COLUMNS
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RECORDS_SCHEMA)


def encode_records(cols: RecordColumns, compression: str = "zstd") -> bytes:
    """One Parquet file (``RECORDS_SCHEMA``) holding every row of ``cols``, in order.

    ``compression`` is ``zstd``, ``snappy``, ``gzip`` or ``none`` (ValueError otherwise);
    a value that does not fit its column raises ``EncodeError`` naming the column.

    Rows the ingest turn buffered are Arrow chunks already: nothing is converted here,
    and the Parquet writer runs without the GIL, so a large partition's encode does not
    stall the ingest threads (a long conversion call would hold the interpreter for its
    whole length, and every turn waiting on a lock or an fsync would wait behind it).
    """
    codec = _codec(compression)
    table = cols.table()
    out = pa.BufferOutputStream()
    try:
        with pq.ParquetWriter(out, RECORDS_SCHEMA, compression=codec) as writer:
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    except pa.ArrowException as exc:
        raise EncodeError("records", "*", str(exc)) from exc
    return bytes(out.getvalue().to_pybytes())


def encode_audit(cols: AuditColumns, compression: str = "zstd") -> bytes:
    """One Parquet file (``AUDIT_SCHEMA``) holding every row of ``cols``; as ``encode_records``."""
    return _encode("audit", AUDIT_SCHEMA, _AUDIT_CONVERTERS, cols, compression)

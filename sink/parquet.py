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
    template_version         int32               required  the version of template_id whose
                                                           text template_params fill; 0:
                                                           not mined

A record's ``template_params`` are its body's tokens at the ``<*>`` places of the text
of ``(template_id, template_version)`` in the audit stream, in order: substituting them
into that text gives the body back (tokens joined by one space). Its version is the
last its template reached in the record's own frame, so a replay publishes the same
rows, and that version's audit row is published before the record (DESIGN.md §3
"Template versions of a record").

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
schema metadata carries ``ourios.schema`` = ``records/2`` (``template_version`` added)
or ``audit/1``; a change to a column's name or type bumps it. A records object's row
groups hold ``ROW_GROUP_ROWS`` rows.

Invariant: an object is encoded whole in memory and handed to the store as one
``bytes``, so a reader never sees a Parquet file without its footer; the store's atomic
put is the only publication step.

``RecordColumns`` and ``AuditColumns`` are the buffers the ingest turn appends to. A
records buffer is a list of Arrow record batches, one per frame: the decoder produces
the ``FLAT_SCHEMA`` columns as Arrow arrays (built from flat lists, never Python rows),
and the turn adds the tenant, template and WAL columns with ``assemble_records``. So
buffered records are Arrow memory, which the cyclic collector never walks, and an
encode converts nothing and writes with the GIL released. Audit buffers are small and
converted at encode time.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "AUDIT_SCHEMA",
    "COMPRESSIONS",
    "FLAT_SCHEMA",
    "RECORDS_DICTIONARY_COLUMNS",
    "RECORDS_SCHEMA",
    "RECORDS_STATISTICS_COLUMNS",
    "TURN_COLUMNS",
    "AttributePairs",
    "AuditColumns",
    "AuditRow",
    "EncodeError",
    "RecordColumns",
    "RecordRow",
    "TemplateChange",
    "assemble_records",
    "encode_audit",
    "encode_records",
    "encode_table",
    "held_bytes",
    "records_batch",
]

#: OTLP attributes after the receiver's conversion: (key, value) pairs, values
#: JSON-encoded unless they were strings. Key order is kept; duplicate keys are kept.
AttributePairs = Sequence[tuple[str, str]]

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
        pa.field("template_version", pa.int32(), nullable=False),
    ],
    metadata={"ourios.schema": "records/2"},
)

#: The columns the template miner and the WAL add to a decoded batch; the rest
#: (``FLAT_SCHEMA``) come from the decoder.
TURN_COLUMNS: Final = ("tenant", "template_id", "template_params", "wal_lsn", "template_version")
#: A decoded request's records: ``RECORDS_SCHEMA`` without ``TURN_COLUMNS``, same order.
FLAT_SCHEMA: Final[pa.Schema] = pa.schema(
    [field for field in RECORDS_SCHEMA if field.name not in TURN_COLUMNS]
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

# The audit size estimate is the Arrow form's bytes: fixed-width values, one int32
# offset per string, and the string lengths (code points, not UTF-8 bytes).
_OFFSET: Final = 4
_AUDIT_FIXED_BYTES: Final = 8 + 4 + 8 + 8 + 3 * _OFFSET


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
    attributes: AttributePairs
    resource_attributes: AttributePairs
    scope_name: str
    trace_id: bytes | str | None
    span_id: bytes | str | None
    template_id: int
    template_params: Sequence[str]
    wal_lsn: int
    record_index: int
    #: 0 for rows built without mining (tests and tools)
    template_version: int = 0


class AuditRow(NamedTuple):
    """One audit row in schema order, for ``AuditColumns.extend``."""

    tenant: str
    template_id: int
    template_version: int
    template: str
    change: TemplateChange
    wal_lsn: int
    time_unix_nano: int


class RecordColumns:
    """A records buffer: Arrow record batches in ``RECORDS_SCHEMA``, in order.

    The ingest turn appends one batch per frame (``append_batch``: the decoder's columns
    plus the template columns, built as arrays, never as Python rows), so a buffer of
    any size is Arrow memory: the cyclic collector never walks it and an encode
    converts nothing. ``extend``/``append_row`` convert Python rows (tests and tools);
    a value that does not fit its column raises ``EncodeError`` naming the column and
    leaves the buffer unchanged.

    Each column also reads as a property giving its values over every row (``column``;
    tests and diagnostics). A batch is immutable once appended, so buffers may share
    batches (``merge``). Not thread-safe: the owner's lock (the sink lock) guards it.
    """

    __slots__ = ("_batches", "_rows", "_nbytes")

    if TYPE_CHECKING:
        # The column properties the loop after the class sets, one per RECORDS_SCHEMA
        # field, declared so that a checker knows them (each is ``column(name)``).
        tenant: list[Any]
        time_unix_nano: list[Any]
        observed_time_unix_nano: list[Any]
        severity_number: list[Any]
        severity_text: list[Any]
        body: list[Any]
        attributes: list[Any]
        resource_attributes: list[Any]
        scope_name: list[Any]
        trace_id: list[Any]
        span_id: list[Any]
        template_id: list[Any]
        template_params: list[Any]
        wal_lsn: list[Any]
        record_index: list[Any]

    def __init__(self) -> None:
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        self._nbytes = 0

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"RecordColumns(rows={self._rows}, nbytes={self._nbytes})"

    @property
    def nbytes(self) -> int:
        """The memory the rows hold (``held_bytes`` of every batch)."""
        return self._nbytes

    @property
    def batches(self) -> list[pa.RecordBatch]:
        """The batches, in order (a copy of the list; the batches are immutable)."""
        return list(self._batches)

    def append_batch(self, batch: pa.RecordBatch) -> None:
        """Append a batch in ``RECORDS_SCHEMA`` (ValueError naming both schemas if not)."""
        if not batch.schema.equals(RECORDS_SCHEMA):
            raise ValueError(
                f"a records batch must have RECORDS_SCHEMA, got {batch.schema} "
                f"(expected {RECORDS_SCHEMA})"
            )
        if batch.num_rows:
            self._batches.append(batch)
            self._rows += batch.num_rows
            self._nbytes += held_bytes(batch)

    def table(self) -> pa.Table:
        """Every row as one Arrow table in ``RECORDS_SCHEMA``; the buffer is unchanged."""
        return pa.Table.from_batches(self._batches, schema=RECORDS_SCHEMA)

    def column(self, name: str) -> list[Any]:
        """One column's values over every row, in order, as pyarrow reads them back
        (maps as lists of pairs; for tests and diagnostics, not the hot path)."""
        if name not in _RECORD_COLUMNS:
            raise KeyError(f"no record column {name!r}")
        values: list[Any] = self.table().column(name).to_pylist()
        return values

    def lsn_bounds(self) -> tuple[int, int, int, int] | None:
        """``(first_lsn, last_lsn, first_index, last_index)``: the lowest and highest
        ``wal_lsn`` among the rows, the lowest ``record_index`` among the rows at the
        first and the highest among those at the last; None when empty."""
        if not self._rows:
            return None
        table = self.table()
        lsn_column, index_column = table.column("wal_lsn"), table.column("record_index")
        first, last = pc.min(lsn_column).as_py(), pc.max(lsn_column).as_py()
        at_first = pc.filter(index_column, pc.equal(lsn_column, first))
        at_last = pc.filter(index_column, pc.equal(lsn_column, last))
        return first, last, pc.min(at_first).as_py(), pc.max(at_last).as_py()

    def append_row(self, *row: Any) -> None:
        """Append one row given in schema order (``RecordRow``'s fields)."""
        self.extend([RecordRow(*row)])

    def extend(self, rows: Iterable[RecordRow]) -> None:
        """Append rows given as ``RecordRow`` tuples, in order, as one batch."""
        rows = list(rows)
        if rows:
            values = zip(*rows, strict=True)
            columns = {name: list(v) for name, v in zip(_RECORD_COLUMNS, values, strict=True)}
            self.append_batch(records_batch(columns))

    def mapped(self, f: Callable[[pa.RecordBatch], pa.RecordBatch]) -> RecordColumns:
        """A new buffer of ``f`` of each batch (same schema, same rows); this one is
        unchanged, and a batch ``f`` returns as it is stays shared."""
        out = RecordColumns()
        for batch in self._batches:
            out.append_batch(f(batch))
        return out

    def merge(self, other: RecordColumns) -> None:
        """Append every row of ``other`` after this buffer's rows; ``other`` is unchanged."""
        self._batches.extend(other._batches)  # shared: a batch never changes
        self._rows += other._rows
        self._nbytes += other._nbytes

    def rows(self) -> list[RecordRow]:
        """The rows as tuples, in order, as pyarrow reads them (maps as lists of pairs,
        ids as hex strings; for tests and diagnostics, not the hot path)."""
        return [RecordRow(**row) for row in self.table().to_pylist()]


def _column_property(name: str) -> property:
    return property(lambda self: self.column(name), doc=f"every row's ``{name}``")


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
#: RECORDS_SCHEMA's fixed-width columns (every one an integer): the bytes of a row in them
_FIXED_ROW_BYTES: Final = sum(
    f.type.bit_width // 8 for f in RECORDS_SCHEMA if pa.types.is_integer(f.type)
)
#: the positions of its variable-width columns (strings, lists, maps)
_VARIABLE_COLUMNS: Final = tuple(
    i for i, f in enumerate(RECORDS_SCHEMA) if not pa.types.is_integer(f.type)
)


def held_bytes(batch: pa.RecordBatch) -> int:
    """What a ``RECORDS_SCHEMA`` batch's rows hold in memory, as the sink's buffers count
    it: the variable-width columns' buffers whole (a column sliced out of a larger buffer
    holds all of it) and the fixed-width columns' values (their buffers may be shared by
    many batches: ``record_index`` is a slice of one array of 0, 1, 2, …).

    ``RecordBatch.nbytes`` reads the same within the offsets' padding but costs ~2 µs a
    column whatever its length — 34 µs a batch, 0.35 µs a record of the turn at
    100-record requests, and as much again in every publish's re-match
    (docs/BENCHMARKS.md, 2026-12-06)."""
    n: int = batch.num_rows * _FIXED_ROW_BYTES
    for i in _VARIABLE_COLUMNS:
        n += batch.column(i).get_total_buffer_size()
    return n


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


def _shared_maps(values: list[AttributePairs]) -> pa.Array:
    """Convert a column whose rows mostly share a few sequence objects (one per OTLP
    resource): each distinct object is converted once and the rows gathered by index."""
    first: dict[int, int] = {}
    distinct: list[AttributePairs] = []
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
        array = converters[name](values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        raise EncodeError(label, name, str(exc)) from exc
    if array.null_count and not RECORDS_SCHEMA.field(name).nullable:
        raise EncodeError(label, name, f"{array.null_count} null value(s) in a required column")
    return array


def records_batch(columns: Mapping[str, Sequence[Any]]) -> pa.RecordBatch:
    """A ``RECORDS_SCHEMA`` batch from Python values given column by column (tests and
    tools; the ingest path builds its arrays directly). Ids may be raw bytes or hex
    (empty: null), maps sequences of pairs. ``EncodeError`` names a column that does not
    fit."""
    n = len(columns["tenant"])
    arrays = [
        _convert("records", _RECORD_CONVERTERS, name, list(columns.get(name, [0] * n)))
        if name == "template_version"
        else _convert("records", _RECORD_CONVERTERS, name, list(columns[name]))
        for name in _RECORD_COLUMNS
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RECORDS_SCHEMA)


def assemble_records(
    tenant: str,
    flat: pa.RecordBatch,
    template_id: Sequence[int],
    template_params: Sequence[Sequence[str]],
    wal_lsn: int,
    template_version: Sequence[int] | None = None,
) -> pa.RecordBatch:
    """A frame's decoded records (``FLAT_SCHEMA``) with the turn's columns added: the
    tenant and the frame's ``wal_lsn`` repeated, and the miner's template id and
    parameters per row (``len(flat)`` of each) and the version they fill (None: 0,
    not mined), as one ``RECORDS_SCHEMA`` batch."""
    n = flat.num_rows
    if not template_version:
        template_version = [0] * n  # an unmined frame's rows
    elif len(template_version) != n:
        raise ValueError(f"{n} decoded records but {len(template_version)} template versions")
    if len(template_id) != n or len(template_params) != n:
        raise ValueError(
            f"{n} decoded records but {len(template_id)} template ids and "
            f"{len(template_params)} parameter lists"
        )
    # One C call per column: the parameters (Python tuples from the miner) convert as
    # a nested list column directly, without a flattened copy and an offsets pass.
    added = {
        "tenant": pa.repeat(pa.scalar(tenant, pa.string()), n),
        "template_id": pa.array(template_id, pa.int64()),
        "template_params": pa.array(template_params, _STR_LIST),
        "wal_lsn": pa.repeat(pa.scalar(wal_lsn, pa.uint64()), n),
        "template_version": pa.array(template_version, pa.int32()),
    }
    arrays = [added[name] if name in added else flat.column(name) for name in _RECORD_COLUMNS]
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
    return encode_table(cols.table(), compression)


#: The records columns whose values repeat — the tenant, the severity's text, the scope,
#: the attribute keys, the resource's attributes — written dictionary-encoded. The others
#: (bodies, attribute values, ids, parameters) are mostly distinct: a dictionary there is
#: built and then abandoned at its size limit, CPU for nothing.
RECORDS_DICTIONARY_COLUMNS: Final = (
    "tenant",
    "severity_text",
    "scope_name",
    "attributes.key_value.key",
    "resource_attributes.key_value.key",
    "resource_attributes.key_value.value",
)
#: The records columns written with min/max statistics: those a query's filter can skip
#: a row group by (times, severity, template, the WAL position). A body's, an id's or an
#: attribute's min and max span a whole row group and skip nothing.
RECORDS_STATISTICS_COLUMNS: Final = (
    "tenant",
    "time_unix_nano",
    "observed_time_unix_nano",
    "severity_number",
    "severity_text",
    "scope_name",
    "template_id",
    "wal_lsn",
    "record_index",
    "template_version",
)


def encode_table(table: pa.Table, compression: str = "zstd") -> bytes:
    """``encode_records`` of rows already gathered in one ``RECORDS_SCHEMA`` table (a
    worker process encodes the core's partitions with it). Dictionaries and statistics
    only where they serve (``RECORDS_DICTIONARY_COLUMNS``, ``RECORDS_STATISTICS_COLUMNS``):
    a fifth less CPU than on every column, the object no larger (docs/BENCHMARKS.md,
    2026-12-06)."""
    codec = _codec(compression)
    out = pa.BufferOutputStream()
    try:
        with pq.ParquetWriter(
            out,
            RECORDS_SCHEMA,
            compression=codec,
            use_dictionary=list(RECORDS_DICTIONARY_COLUMNS),
            write_statistics=list(RECORDS_STATISTICS_COLUMNS),
        ) as writer:
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    except pa.ArrowException as exc:
        raise EncodeError("records", "*", str(exc)) from exc
    return bytes(out.getvalue().to_pybytes())


def encode_audit(cols: AuditColumns, compression: str = "zstd") -> bytes:
    """One Parquet file (``AUDIT_SCHEMA``) holding every row of ``cols``; as ``encode_records``."""
    return _encode("audit", AUDIT_SCHEMA, _AUDIT_CONVERTERS, cols, compression)

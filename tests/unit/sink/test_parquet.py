"""Parquet encoding: the two schemas, the columnar buffers, and what pyarrow and DuckDB
read back from the bytes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from sink.parquet import (
    AUDIT_SCHEMA,
    COMPRESSIONS,
    FLAT_SCHEMA,
    RECORDS_DICTIONARY_COLUMNS,
    RECORDS_SCHEMA,
    RECORDS_STATISTICS_COLUMNS,
    AuditColumns,
    AuditRow,
    EncodeError,
    RecordColumns,
    RecordRow,
    TemplateChange,
    assemble_records,
    encode_audit,
    encode_records,
    held_bytes,
    records_batch,
)

T0 = 1_714_521_600_000_000_000  # 2024-05-01T00:00:00Z
TRACE = bytes(range(16))
SPAN = bytes(range(8, 16))
RESOURCE = [("service.name", "checkout"), ("k8s.pod.name", "checkout-7d9f")]


def sample_rows() -> list[RecordRow]:
    return [
        RecordRow(
            "acme", T0, T0 + 5, 9, "INFO", "user 42 logged in",
            [("http.method", "GET"), ("retry", "3")], RESOURCE, "auth",
            TRACE, SPAN, 7, ["42"], 4096, 0,
        ),
        RecordRow(
            "acme", T0 + 1, T0 + 6, 17, "ERROR", None,
            [], RESOURCE, "",
            b"", b"", 8, [], 4096, 1,
        ),
        RecordRow(
            "acme", 2**64 - 1, 0, 0, "", '{"kvlist": "json"}',
            [("dup", "1"), ("dup", "2"), ("ünï", "cødé")], [], "scope",
            "ABCDEF0123456789ABCDEF0123456789", "", 2**63 - 1, ["a", "", "ü"], 2**64 - 1, 2**31 - 1,
        ),
    ]  # fmt: skip


def expected_pylist(rows: list[RecordRow]) -> list[dict[str, Any]]:
    """What pyarrow's to_pylist must give back: maps as (key, value) tuples, ids hex."""

    def hexid(v: bytes | str | None) -> str | None:
        return (v.hex() if isinstance(v, bytes) else v.lower() if v else v) or None

    out = []
    for row in rows:
        d = row._asdict()
        d["attributes"] = list(row.attributes)
        d["resource_attributes"] = list(row.resource_attributes)
        d["template_params"] = list(row.template_params)
        d["trace_id"], d["span_id"] = hexid(row.trace_id), hexid(row.span_id)
        out.append(d)
    return out


def buffer(rows: list[RecordRow]) -> RecordColumns:
    cols = RecordColumns()
    cols.extend(rows)
    return cols


def read(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def write(tmp_path: Path, data: bytes, name: str = "obj.parquet") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# --- schemas ---------------------------------------------------------------------------


def test_records_schema_has_the_design_columns() -> None:
    assert RECORDS_SCHEMA.names == [
        "tenant", "time_unix_nano", "observed_time_unix_nano", "severity_number",
        "severity_text", "body", "attributes", "resource_attributes", "scope_name",
        "trace_id", "span_id", "template_id", "template_params", "wal_lsn", "record_index",
            "template_version",
    ]  # fmt: skip
    types = {f.name: f.type for f in RECORDS_SCHEMA}
    assert types["time_unix_nano"] == pa.uint64() == types["wal_lsn"]
    assert types["severity_number"] == pa.int32() == types["record_index"]
    assert types["template_id"] == pa.int64()
    assert types["attributes"] == pa.map_(pa.string(), pa.string())
    assert types["template_params"] == pa.list_(pa.field("element", pa.string()))
    assert list(RecordRow._fields) == RECORDS_SCHEMA.names


def test_audit_schema_has_the_design_columns() -> None:
    assert AUDIT_SCHEMA.names == [
        "tenant", "template_id", "template_version", "template", "change", "wal_lsn",
        "time_unix_nano",
    ]  # fmt: skip
    assert list(AuditRow._fields) == AUDIT_SCHEMA.names


# --- records: pyarrow and DuckDB read back every column --------------------------------


def test_records_round_trip_through_pyarrow() -> None:
    rows = sample_rows()
    table = read(encode_records(buffer(rows)))
    assert table.schema.equals(RECORDS_SCHEMA)  # map entry names differ on read
    assert table.schema.metadata == {b"ourios.schema": b"records/2"}
    assert table.to_pylist() == expected_pylist(rows)


def test_empty_trace_and_span_ids_are_null() -> None:
    table = read(encode_records(buffer(sample_rows())))
    assert table.column("trace_id").to_pylist() == [
        TRACE.hex(),
        None,
        "abcdef0123456789abcdef0123456789",
    ]
    assert table.column("span_id").to_pylist() == [SPAN.hex(), None, None]


def test_records_read_by_duckdb(tmp_path: Path) -> None:
    path = write(tmp_path, encode_records(buffer(sample_rows())))
    with duckdb.connect() as con:
        types = dict(
            (name, typ)
            for name, typ, *_ in con.sql(
                f"describe select * from read_parquet('{path}')"
            ).fetchall()
        )
        assert types == {
            "tenant": "VARCHAR", "time_unix_nano": "UBIGINT",
            "observed_time_unix_nano": "UBIGINT", "severity_number": "INTEGER",
            "severity_text": "VARCHAR", "body": "VARCHAR",
            "attributes": "MAP(VARCHAR, VARCHAR)", "resource_attributes": "MAP(VARCHAR, VARCHAR)",
            "scope_name": "VARCHAR", "trace_id": "VARCHAR", "span_id": "VARCHAR",
            "template_id": "BIGINT", "template_params": "VARCHAR[]", "wal_lsn": "UBIGINT",
            "record_index": "INTEGER", "template_version": "INTEGER",
        }  # fmt: skip
        got = con.sql(
            f"""
            select tenant, time_unix_nano, observed_time_unix_nano, severity_number,
                   severity_text, body, attributes['http.method'], cardinality(attributes),
                   resource_attributes['service.name'], scope_name, trace_id, span_id,
                   template_id, template_params, wal_lsn, record_index
            from read_parquet('{path}') order by record_index
            """
        ).fetchall()
    assert got == [
        ("acme", T0, T0 + 5, 9, "INFO", "user 42 logged in", "GET", 2, "checkout", "auth",
         TRACE.hex(), SPAN.hex(), 7, ["42"], 4096, 0),
        ("acme", T0 + 1, T0 + 6, 17, "ERROR", None, None, 0, "checkout", "",
         None, None, 8, [], 4096, 1),
        ("acme", 2**64 - 1, 0, 0, "", '{"kvlist": "json"}', None, 3, None, "scope",
         "abcdef0123456789abcdef0123456789", None, 2**63 - 1, ["a", "", "ü"], 2**64 - 1,
         2**31 - 1),
    ]  # fmt: skip


def test_duckdb_converts_time_to_a_timestamp(tmp_path: Path) -> None:
    path = write(tmp_path, encode_records(buffer(sample_rows()[:1])))
    with duckdb.connect() as con:
        got = con.sql(
            f"select strftime(make_timestamp_ns(time_unix_nano::BIGINT), '%Y-%m-%dT%H:%M:%S')"
            f" from read_parquet('{path}')"
        ).fetchall()
    assert got == [("2024-05-01T00:00:00",)]


def test_duckdb_reads_many_objects_with_hive_partitions(tmp_path: Path) -> None:
    for i, tenant in enumerate(["a", "b=c"]):
        rows = [r._replace(tenant=tenant) for r in sample_rows()]
        part = tmp_path / "records" / f"tenant={tenant.replace('=', '%3D')}" / "date=2024-05-01"
        part.mkdir(parents=True)
        (part / f"n{i}.parquet").write_bytes(encode_records(buffer(rows)))
    with duckdb.connect() as con:
        got = con.sql(
            f"select tenant, count(*) from read_parquet('{tmp_path}/records/*/*/*.parquet')"
            " group by tenant order by tenant"
        ).fetchall()
    assert got == [("a", 3), ("b=c", 3)]


@pytest.mark.parametrize(
    ("compression", "codec"),
    [("zstd", "ZSTD"), ("snappy", "SNAPPY"), ("gzip", "GZIP"), ("none", "UNCOMPRESSED")],
)
def test_compression_options(compression: str, codec: str, tmp_path: Path) -> None:
    rows = sample_rows()
    data = encode_records(buffer(rows), compression=compression)
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {codec}
    assert read(data).to_pylist() == expected_pylist(rows)
    with duckdb.connect() as con:
        path = write(tmp_path, data)
        assert con.sql(f"select count(*) from read_parquet('{path}')").fetchall() == [(3,)]


def test_default_compression_is_zstd() -> None:
    meta = pq.ParquetFile(pa.BufferReader(encode_records(buffer(sample_rows())))).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


def test_unknown_compression_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="lz4.*zstd\\|snappy\\|gzip\\|none"):
        encode_records(buffer(sample_rows()), compression="lz4")
    assert set(COMPRESSIONS) == {"zstd", "snappy", "gzip", "none"}


def test_an_empty_buffer_encodes_to_an_empty_file() -> None:
    table = read(encode_records(RecordColumns()))
    assert table.num_rows == 0 and table.schema.equals(RECORDS_SCHEMA)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        pytest.param("time_unix_nano", -1, id="negative_time"),
        pytest.param("wal_lsn", 2**64, id="lsn_overflow"),
        pytest.param("severity_number", 2**31, id="severity_overflow"),
        pytest.param("tenant", None, id="null_tenant"),
    ],
)
def test_a_value_that_does_not_fit_names_its_column(column: str, value: Any) -> None:
    rows = [sample_rows()[0]._replace(**{column: value})]
    cols = buffer(sample_rows()[1:2])
    with pytest.raises(EncodeError, match=column) as info:
        cols.extend(rows)
    assert info.value.column == column and info.value.error_type == "parquet_encode"
    assert len(cols) == 1  # the buffer is untouched: the caller can requeue it


def test_shared_and_distinct_resource_attributes_both_encode() -> None:
    shared = [("service.name", "s")]
    many = [
        sample_rows()[0]._replace(resource_attributes=shared, record_index=i) for i in range(50)
    ]
    distinct = [
        sample_rows()[0]._replace(resource_attributes=[("i", str(i))], record_index=i)
        for i in range(50)
    ]
    for rows in (many, distinct, many + distinct):
        got = read(encode_records(buffer(rows))).column("resource_attributes").to_pylist()
        assert got == [list(r.resource_attributes) for r in rows]


# A seeded property test: arbitrary strings, maps and lists survive an encode.
_text = st.text(max_size=20)
_attrs = st.lists(st.tuples(_text, _text), max_size=4)
_u64 = st.integers(0, 2**64 - 1)
_row = st.builds(
    RecordRow,
    tenant=st.just("t"), time_unix_nano=_u64, observed_time_unix_nano=_u64,
    severity_number=st.integers(0, 24), severity_text=_text, body=st.none() | _text,
    attributes=_attrs, resource_attributes=_attrs, scope_name=_text,
    trace_id=st.binary(min_size=0, max_size=16), span_id=st.binary(min_size=0, max_size=8),
    template_id=st.integers(-(2**63), 2**63 - 1), template_params=st.lists(_text, max_size=4),
    wal_lsn=_u64, record_index=st.integers(0, 2**31 - 1),
    template_version=st.integers(0, 2**31 - 1),
)  # fmt: skip


@seed(20240504)
@settings(max_examples=60, database=None, deadline=None)
@given(st.lists(_row, max_size=20))
def test_any_rows_round_trip(rows: list[RecordRow]) -> None:
    assert read(encode_records(buffer(rows), compression="snappy")).to_pylist() == (
        expected_pylist(rows)
    )


# --- the buffer ------------------------------------------------------------------------


def test_append_row_and_extend_agree() -> None:
    rows = sample_rows()
    a = RecordColumns()
    for row in rows:
        a.append_row(*row)
    b = buffer(rows)
    assert a.rows() == b.rows() == [RecordRow(**r) for r in expected_pylist(rows)]
    assert len(a) == 3 and a.nbytes > 0 and b.nbytes > 0


def test_merge_appends_the_other_buffer_and_leaves_it_unchanged() -> None:
    rows = sample_rows()
    a, b = buffer(rows[:1]), buffer(rows[1:])
    a_bytes, b_bytes = a.nbytes, b.nbytes
    a.merge(b)
    assert a.rows() == buffer(rows).rows() and b.rows() == buffer(rows[1:]).rows()
    assert a.nbytes == a_bytes + b_bytes and len(a) == 3 and len(b) == 2
    assert a.batches[1:] == b.batches  # shared, not copied: a batch never changes


def test_nbytes_is_what_the_batches_hold() -> None:
    cols = RecordColumns()
    for row in sample_rows():
        cols.append_row(*row)
    assert cols.nbytes == sum(held_bytes(batch) for batch in cols.batches) > 0
    # Arrow's own figure, within a few bytes a batch: the offsets' one extra entry of
    # each variable-width column (three in a map, two in a list), validity bitmaps
    arrow = sum(batch.nbytes for batch in cols.batches)
    assert arrow <= cols.nbytes <= arrow + 64 * len(cols.batches)


def test_bounded_1_held_bytes_counts_a_shared_index_by_its_rows_and_a_sliced_string_whole() -> None:
    (row,) = sample_rows()[:1]
    batch = records_batch(
        {name: [value] * 10 for name, value in zip(RECORDS_SCHEMA.names, row, strict=True)}
    )
    base = held_bytes(batch)
    # record_index as the decoders build it: a slice of one long array of 0, 1, 2, …
    shared = pa.array(range(100_000), pa.int32()).slice(0, 10)
    index_at = RECORDS_SCHEMA.get_field_index("record_index")
    assert held_bytes(batch.set_column(index_at, "record_index", shared)) == base
    # a string column sliced out of a larger one keeps all of it in memory
    body_at = RECORDS_SCHEMA.get_field_index("body")
    big = pa.array(["x" * 1_000] * 100, pa.string())
    sliced = batch.set_column(body_at, RECORDS_SCHEMA.field("body"), big.slice(0, 10))
    assert held_bytes(sliced) - base >= 100 * 1_000 - batch.column(body_at).nbytes


def test_records_objects_have_dictionaries_and_statistics_only_where_they_serve() -> None:
    cols = RecordColumns()
    for row in sample_rows():
        cols.append_row(*row)
    meta = pq.ParquetFile(pa.BufferReader(encode_records(cols))).metadata.row_group(0)
    chunks = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    dictionary = {p for p, c in chunks.items() if any("DICTIONARY" in e for e in c.encodings)}
    assert dictionary == set(RECORDS_DICTIONARY_COLUMNS)
    assert {p for p, c in chunks.items() if c.is_stats_set} == set(RECORDS_STATISTICS_COLUMNS)
    assert read(encode_records(cols)).to_pylist() == cols.table().to_pylist()


def test_a_batch_of_another_schema_is_refused() -> None:
    cols = RecordColumns()
    other = pa.RecordBatch.from_pydict({"tenant": ["t"]})
    with pytest.raises(ValueError, match="RECORDS_SCHEMA"):
        cols.append_batch(other)
    assert len(cols) == 0


def test_nbytes_approximates_the_arrow_size() -> None:
    rng = random.Random(6)
    rows = [
        RecordRow(
            "acme", T0 + i, T0 + i, 9, "INFO", "x" * rng.randrange(20, 200),
            [(f"k{j}", str(rng.random())) for j in range(rng.randrange(6))], RESOURCE, "s",
            TRACE, SPAN, i, [str(i), "y"], 4096 + i, i % 10,
        )
        for i in range(5_000)
    ]  # fmt: skip
    cols = buffer(rows)
    arrow = read(encode_records(cols)).nbytes
    assert 0.75 < cols.nbytes / arrow < 1.33, (cols.nbytes, arrow)


# --- audit -----------------------------------------------------------------------------


def audit_rows() -> list[AuditRow]:
    return [
        AuditRow("acme", 7, 1, "user <*> logged in", TemplateChange.CREATED, 4096, T0),
        AuditRow("acme", 7, 2, "user <*> logged <*>", TemplateChange.CHANGED, 8192, T0 + 1),
        AuditRow("b=c", 2**63 - 1, 2**31 - 1, "", TemplateChange.CREATED, 2**64 - 1, 2**64 - 1),
    ]


def audit_buffer(rows: list[AuditRow]) -> AuditColumns:
    cols = AuditColumns()
    cols.extend(rows)
    return cols


def test_audit_round_trips_through_pyarrow_and_duckdb(tmp_path: Path) -> None:
    rows = audit_rows()
    data = encode_audit(audit_buffer(rows))
    table = read(data)
    assert table.schema.equals(AUDIT_SCHEMA, check_metadata=True)
    assert table.to_pylist() == [r._asdict() | {"change": r.change.value} for r in rows]
    path = write(tmp_path, data)
    with duckdb.connect() as con:
        got = con.sql(f"select * from read_parquet('{path}') order by wal_lsn").fetchall()
    assert got == [tuple(r) for r in rows]  # TemplateChange is a str enum


def test_audit_change_is_validated_on_append() -> None:
    cols = AuditColumns()
    cols.append_row("acme", 1, 1, "t", "created", 1, 1)
    with pytest.raises(ValueError):
        cols.append_row("acme", 1, 1, "t", "deleted", 1, 1)
    assert len(cols) == 1 and cols.rows()[0].change is TemplateChange.CREATED


def test_audit_merge_and_nbytes() -> None:
    rows = audit_rows()
    a, b = audit_buffer(rows[:2]), audit_buffer(rows[2:])
    total = a.nbytes + b.nbytes
    a.merge(b)
    assert a.rows() == rows and a.nbytes == total == audit_buffer(rows).nbytes


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_audit_compression_options(compression: str) -> None:
    data = encode_audit(audit_buffer(audit_rows()), compression=compression)
    assert read(data).num_rows == 3


# --- batches (the ingest path: one batch per frame) -----------------------------------


def many_rows(n: int, seed_value: int = 11) -> list[RecordRow]:
    rng = random.Random(seed_value)
    rows = sample_rows()
    return [
        rows[rng.randrange(3)]._replace(wal_lsn=4096 + i // 7, record_index=i % 7) for i in range(n)
    ]


@seed(20261203)
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), data=st.data())
def test_batches_encode_the_rows_in_order(n: int, data: Any) -> None:
    rows = many_rows(n)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n), max_size=5))))
    cols = RecordColumns()
    last = 0
    for cut in [*cuts, n]:
        cols.extend(rows[last:cut])
        last = max(last, cut)
    assert len(cols) == n and len(cols.batches) == len({*cuts, n})
    assert read(encode_records(cols)).to_pylist() == expected_pylist(rows)
    assert cols.lsn_bounds() == buffer(rows).lsn_bounds()
    assert cols.wal_lsn == [r.wal_lsn for r in rows]  # a column reads over every batch


def test_assembled_records_equal_the_rows_built_from_python_values() -> None:
    rows = many_rows(9)
    flat = records_batch({name: [getattr(r, name) for r in rows] for name in RecordRow._fields})
    decoded = flat.select(FLAT_SCHEMA.names)
    built = assemble_records(
        "acme",
        pa.RecordBatch.from_arrays(decoded.columns, schema=FLAT_SCHEMA),
        [r.template_id for r in rows],
        [r.template_params for r in rows],
        4096,
    )
    expected = [r._replace(tenant="acme", wal_lsn=4096) for r in rows]
    assert built.schema.equals(RECORDS_SCHEMA)
    assert built.to_pylist() == expected_pylist(expected)
    with pytest.raises(ValueError, match="9 decoded records but 8 template ids"):
        assemble_records("acme", decoded, [1] * 8, [[]] * 9, 1)

"""Read what `ourios serve` published, the way an operator's query engine would.

A store root is a directory laid out as DESIGN.md §3 pins it (a `LocalStore`
directory, or an S3 prefix downloaded with `download_prefix`)::

    <root>/records/tenant=<pct-tenant>/date=YYYY-MM-DD/<name>.parquet
    <root>/audit/tenant=<pct-tenant>/date=YYYY-MM-DD/<name>.parquet

`read_store(root, "duckdb")` reads it with DuckDB (`read_parquet(..., hive_partitioning=
true)`), `read_store(root, "pyarrow")` with `pyarrow.dataset` and hive partitioning. Both
return a `Published` of plain-Python rows normalised the same way, so a test compares
the two readers with `==`. Each row holds:

- every column of the Parquet file as the file stores it (`tenant` is the file's own
  column; maps become dicts, lists lists, unsigned integers ints);
- `partition_tenant` and `date` (ISO string): the hive partition values as the reader
  decoded them from the path;
- `key`: the object's key relative to the root, and `tenant_segment`: the raw
  `tenant=` path segment (still percent-encoded), for layout assertions.

A map column whose entries repeat a key is not silently collapsed: `DuplicateMapKey`
is raised, since the design promises `map<string,string>` with unique keys.
DuckDB's httpfs extension is not available here, so an S3 store is downloaded first
(`download_prefix`) and read locally.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, Literal

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "KINDS",
    "DuplicateMapKey",
    "Kind",
    "Published",
    "Reader",
    "Row",
    "download_prefix",
    "object_keys",
    "read_kind",
    "read_store",
]

Kind = Literal["records", "audit"]
Reader = Literal["duckdb", "pyarrow"]
Row = dict[str, Any]

KINDS: Final[tuple[Kind, ...]] = ("records", "audit")
_MAP_COLUMNS: Final = frozenset({"attributes", "resource_attributes"})
# Explicit partition types: autodetection would read a tenant named "2024" as a number.
_HIVE_TYPES: Final = "{'tenant': 'VARCHAR', 'date': 'DATE'}"
_PARTITION_SCHEMA: Final = pa.schema([("tenant", pa.string()), ("date", pa.date32())])


class DuplicateMapKey(AssertionError):
    """A map column holds the same key twice in one row (names the object and key)."""


@dataclass(frozen=True)
class Published:
    """Every published row of a store root, sorted deterministically, and the keys."""

    records: list[Row]
    audit: list[Row]
    keys: list[str]

    def records_of(self, tenant: str) -> list[Row]:
        return [r for r in self.records if r["tenant"] == tenant]

    def audit_of(self, tenant: str) -> list[Row]:
        return [r for r in self.audit if r["tenant"] == tenant]


def object_keys(root: Path) -> list[str]:
    """Every file under `root` as a store key (relative, `/`-separated), sorted."""
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def read_store(root: Path, reader: Reader) -> Published:
    """Both kinds under `root`, read with `reader`."""
    return Published(
        records=read_kind(root, "records", reader),
        audit=read_kind(root, "audit", reader),
        keys=object_keys(root),
    )


def read_kind(root: Path, kind: Kind, reader: Reader) -> list[Row]:
    """The rows of every `<root>/<kind>/**/*.parquet`, normalised (module docstring),
    sorted by (tenant, wal_lsn, record_index or template_id, key)."""
    base = root / kind
    if not base.is_dir() or not any(base.rglob("*.parquet")):
        return []
    rows = _read_duckdb(root, base) if reader == "duckdb" else _read_pyarrow(root, base)
    return sorted(rows, key=_sort_key)


def _sort_key(row: Row) -> tuple[Any, ...]:
    second = row.get("record_index", row.get("template_id"))
    return (row["tenant"], row["wal_lsn"], second, row.get("template_version", 0), row["key"])


def _read_duckdb(root: Path, base: Path) -> list[Row]:
    pattern = (base / "**" / "*.parquet").as_posix().replace("'", "''")
    con = duckdb.connect()
    try:
        # The file's own columns (hive off, so the file's `tenant` is not replaced)...
        table = con.sql(
            f"SELECT * FROM read_parquet('{pattern}', hive_partitioning=false, filename=true)"
        ).to_arrow_table()
        # ...and the partition values DuckDB derives from each path.
        parts = con.sql(
            f"SELECT DISTINCT filename, tenant, date FROM read_parquet('{pattern}', "
            f"hive_partitioning=true, hive_types={_HIVE_TYPES}, filename=true)"
        ).fetchall()
    finally:
        con.close()
    partition = {str(name): (tenant, day) for name, tenant, day in parts}
    out: list[Row] = []
    for raw in table.to_pylist():
        filename = str(raw.pop("filename"))
        tenant, day = partition[filename]
        out.append(_normalise(raw, root, Path(filename), tenant, day))
    return out


def _read_pyarrow(root: Path, base: Path) -> list[Row]:
    dataset = ds.dataset(
        base,
        format="parquet",
        partitioning=ds.partitioning(_PARTITION_SCHEMA, flavor="hive"),
    )
    out: list[Row] = []
    for fragment in dataset.get_fragments():
        keys = ds.get_partition_keys(fragment.partition_expression)
        # The physical schema: the file's own columns, including its `tenant`.
        table = fragment.to_table(schema=fragment.physical_schema)
        for raw in table.to_pylist():
            out.append(
                _normalise(raw, root, Path(fragment.path), keys.get("tenant"), keys.get("date"))
            )
    return out


def _normalise(raw: Row, root: Path, path: Path, tenant: object, day: object) -> Row:
    key = path.resolve().relative_to(root.resolve()).as_posix()
    row: Row = {}
    for name, value in raw.items():
        if name in _MAP_COLUMNS:
            row[name] = _as_dict(value, key, name)
        elif name == "template_params":
            row[name] = list(value)
        else:
            row[name] = value
    row["partition_tenant"] = tenant
    row["date"] = day.isoformat() if isinstance(day, dt.date) else day
    row["key"] = key
    row["tenant_segment"] = _segment(key, "tenant=")
    return row


def _as_dict(entries: Iterable[tuple[str, str]] | None, key: str, column: str) -> dict[str, str]:
    if entries is None:
        raise DuplicateMapKey(f"{key}: column {column} is null (it is required)")
    out: dict[str, str] = {}
    for k, v in entries:
        if k in out:
            raise DuplicateMapKey(f"{key}: column {column} repeats the key {k!r}")
        out[k] = v
    return out


def _segment(key: str, prefix: str) -> str | None:
    for part in PurePosixPath(key).parts:
        if part.startswith(prefix):
            return part[len(prefix) :]
    return None


def download_prefix(client: S3Client, bucket: str, prefix: str, dest: Path) -> list[str]:
    """Download every object under `prefix` in `bucket` into `dest`, keys made relative
    to the prefix (so `dest` is a store root `read_store` reads). Returns the full keys
    found, sorted. A key outside `prefix/` is not downloaded but is returned, so a
    test can assert that nothing was written beside the store's prefix."""
    norm = prefix.strip("/")
    keys: list[str] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            keys.append(obj["Key"])
    for key in keys:
        if norm and not key.startswith(norm + "/"):
            continue
        rel = key[len(norm) + 1 :] if norm else key
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        # get_object, not download_file: no transfer-manager threads to outlive a test.
        target.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    return sorted(keys)

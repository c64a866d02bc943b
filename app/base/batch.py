"""``FlatBatch``: one request's records as Arrow columns, the unit every floor passes.

The decoders build it (`app.receive.otlp.flatten`, the native decoder), the worker's
channel carries it, the pipeline turns it and recovery rebuilds it from the WAL, so it
lives on the ground floor, not in the receiver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["FlatBatch"]


@dataclass(frozen=True, eq=False, slots=True)
class FlatBatch:
    """The records of one request as Arrow columns (``sink.parquet.FLAT_SCHEMA``, the
    record columns the decoder fills; DESIGN.md §3), in request order.

    `body` and attribute values are strings: a non-string AnyValue is JSON-encoded
    (ints as numbers, doubles as numbers or "NaN"/"Infinity"/"-Infinity", bytes as
    base64 strings, arrays as arrays, kvlists as objects, an unset value as null), and
    an unset top-level body or attribute value is "". An attribute map has unique keys:
    a duplicated key keeps its first position and its last value, because a map column
    with duplicate keys is not readable by every engine. `trace_id`/`span_id` are
    lower-case hex, null when empty. `record_index` is the record's position in the
    whole request. The tenant is the same for every row, so it is kept once; the turn
    adds it with the template and WAL columns (``sink.parquet.assemble_records``).
    """

    tenant: str
    columns: pa.RecordBatch

    def __len__(self) -> int:
        return int(self.columns.num_rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FlatBatch):
            return NotImplemented
        return self.tenant == other.tenant and bool(self.columns.equals(other.columns))

    __hash__ = None  # type: ignore[assignment]

    def column(self, name: str) -> list[Any]:
        """One column's values as Python objects (maps as lists of pairs): the miner's
        bodies, and tests; the turn itself keeps the Arrow arrays."""
        values: list[Any] = self.columns.column(name).to_pylist()
        return values

    @property
    def bodies(self) -> list[str]:
        """The bodies as strings, in order: what the tenant's miner takes."""
        return self.column("body")

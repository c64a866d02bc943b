"""``app.base.batch``: a ``FlatBatch`` is its tenant and its columns, compared by value."""

from __future__ import annotations

import pyarrow as pa
import pytest

from app.base.batch import FlatBatch
from sink.parquet import FLAT_SCHEMA


def _columns(bodies: list[str]) -> pa.RecordBatch:
    arrays = [
        pa.array(bodies, field.type)
        if field.name == "body"
        else pa.array([None] * len(bodies), field.type)
        for field in FLAT_SCHEMA
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=FLAT_SCHEMA)


def test_a_batch_is_its_rows_and_reads_its_bodies_in_order() -> None:
    batch = FlatBatch("t", _columns(["a", "b", "c"]))
    assert len(batch) == 3
    assert batch.bodies == ["a", "b", "c"]


def test_two_batches_are_equal_by_tenant_and_columns_and_never_hashed() -> None:
    one = FlatBatch("t", _columns(["a"]))
    assert one == FlatBatch("t", _columns(["a"]))
    assert one != FlatBatch("u", _columns(["a"]))
    assert one != FlatBatch("t", _columns(["b"]))
    with pytest.raises(TypeError):
        hash(one)

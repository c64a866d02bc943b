"""Records batches for tests of the sink's buffers: one frame's rows, each carrying its
``wal_lsn``, all on one UTC day."""

from __future__ import annotations

import pyarrow as pa

from sink.buffers import NANOS_PER_DAY
from sink.parquet import records_batch


def frame_rows(
    tenant: str,
    day: int,
    lsn: int,
    n: int = 2,
    *,
    template_id: int = 1,
    params: bool = False,
    rids: bool = False,
) -> pa.RecordBatch:
    """``n`` rows of ``tenant`` on ``day``, written by the frame ending at ``lsn``, mined
    to ``template_id`` (with one parameter each, ``str(k)``, when ``params``; with an
    attribute ``rid`` = ``f"{lsn}/{k}"`` each when ``rids``)."""
    ts = day * NANOS_PER_DAY
    return records_batch(
        {
            "tenant": [tenant] * n,
            "time_unix_nano": [ts] * n,
            "observed_time_unix_nano": [ts] * n,
            "severity_number": [9] * n,
            "severity_text": ["INFO"] * n,
            "body": [f"row {lsn} {k}" for k in range(n)],
            "attributes": [[("rid", f"{lsn}/{k}")] if rids else [] for k in range(n)],
            "resource_attributes": [[] for _ in range(n)],
            "scope_name": [""] * n,
            "trace_id": [None] * n,
            "span_id": [None] * n,
            "template_id": [template_id] * n,
            "template_params": [[str(k)] if params else [] for k in range(n)],
            "record_index": list(range(n)),
            "wal_lsn": [lsn] * n,
        }
    )

"""The emit step: a mined batch's template events and rows into the sink's buffers.

Deterministic on replay: a record's day (and an event's time) is its time, else its
observed time, else the creation time of the segment its frame is in — never the clock —
so a frame replayed after a crash lands in the same partitions under the same names.
Used by the ingest turn, recovery's replay and settlement's rebuild alike.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from app.base.batch import FlatBatch
from app.ingest.mining.tenant_miner import MineResult
from sink.buffers import NANOS_PER_DAY, Buffers, Detached
from sink.parquet import assemble_records
from wal import WalOffset
from wal.segment import uuid7_time

__all__ = ["buffer_audit", "buffer_records", "rows_in_days"]


def buffer_audit(
    buffers: Buffers,
    tenant: str,
    batch: FlatBatch,
    result: MineResult,
    offset: WalOffset,
    staged: Callable[[int], bool] | None = None,
) -> list[Detached]:
    """Buffer the template events of a mined batch. ``staged``: the frame lies in a
    settlement's intent span (``sink.buffers``) and says which template ids the tree
    had before the rebuild — their events are staged (every attempt at the span
    derives them alike); the others name ids this attempt allocated (no other
    attempt's event binds them) and are buffered as usual."""
    if not result.events:
        return []
    times = batch.column("time_unix_nano")
    observed = batch.column("observed_time_unix_nano")
    fallback = int(uuid7_time(offset.segment) * 1e9)  # as records: deterministic
    events = [
        (
            e.template_id,
            e.version,
            e.template,
            e.change,
            times[e.index] or observed[e.index] or fallback,
        )
        for e in result.events
    ]
    if staged is None:
        return buffers.add_audit(tenant, events, offset.lsn)
    known = [e for e in events if staged(e[0])]
    out = buffers.add_audit(tenant, [e for e in events if not staged(e[0])], offset.lsn)
    buffers.add_audit(tenant, known, offset.lsn, staged=True)
    return out


def buffer_records(
    buffers: Buffers,
    tenant: str,
    batch: FlatBatch,
    result: MineResult,
    offset: WalOffset,
    nbytes: int,
    staged: bool = False,
    skip_days: frozenset[int] = frozenset(),
) -> list[Detached]:
    """The frame's rows with the template columns added, one Arrow batch per UTC day
    (the usual frame is one day and is buffered as it is); the rows of ``skip_days``
    are not buffered (already in the store: ``replay_frame``)."""
    out: list[Detached] = []
    lsn = offset.lsn
    records = assemble_records(
        tenant,
        batch.columns,
        result.template_ids,
        result.template_params,
        lsn,
        result.template_versions,
    )
    rows = len(batch) or 1
    for day, index in _days(batch, offset):
        if day in skip_days:
            continue
        if index is None:
            part, share = records, nbytes
        else:
            part, share = records.take(pa.array(index, pa.int32())), nbytes * len(index) // rows
        d = buffers.add_records(tenant, day, part, wal_lsn=lsn, nbytes=share, staged=staged)
        if d is not None:
            out.append(d)
    return out


def _days(batch: FlatBatch, offset: WalOffset) -> list[tuple[int, list[int] | None]]:
    """Partition a batch by UTC day of each record's time (its observed time when unset,
    the segment's creation time when both are — deterministic on replay). The usual
    batch is one day: returned as ``[(day, None)]`` without building index lists."""
    if not len(batch):
        return []
    # numpy over the column's buffer (zero-copy: the column has no nulls) costs half of
    # ``pc.min_max`` and its scalars
    times_np = batch.columns.column("time_unix_nano").to_numpy()
    lo, hi = int(times_np.min()), int(times_np.max())
    if lo and lo // NANOS_PER_DAY == hi // NANOS_PER_DAY:
        return [(lo // NANOS_PER_DAY, None)]  # the usual batch: one day, every time set
    times = batch.column("time_unix_nano")
    fallback = int(uuid7_time(offset.segment) * 1e9)
    observed = batch.column("observed_time_unix_nano")
    days: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        ns = t or observed[i] or fallback
        days.setdefault(ns // NANOS_PER_DAY, []).append(i)
    if len(days) == 1:
        return [(next(iter(days)), None)]
    return sorted(days.items())


def rows_in_days(batch: FlatBatch, offset: WalOffset, days: frozenset[int]) -> int:
    """How many of ``batch``'s rows fall on ``days`` (``_days``'s split)."""
    rows = 0
    for day, index in _days(batch, offset):
        if day in days:
            rows += len(batch) if index is None else len(index)
    return rows

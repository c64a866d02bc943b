"""Record buffers freeze their list rows every SEAL_ROWS rows and the sealer thread
converts the pieces into Arrow chunks: a large buffer holds few Python objects (the
cyclic collector walks them all on every full collection) and its encode converts
nothing, while no ingest turn ever converts."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq

from sink.buffers import SEAL_ROWS, SEALER_IDLE_SECS, Buffers, Detached
from sink.parquet import encode_records

DAY = 20_000
DAY_NS = DAY * 86_400 * 1_000_000_000


def add(buffers: Buffers, tenant: str, lsn: int, n: int) -> Detached | None:
    return buffers.add_records(
        tenant,
        DAY,
        time_unix_nano=[DAY_NS + k for k in range(n)],
        observed_time_unix_nano=[DAY_NS] * n,
        severity_number=[9] * n,
        severity_text=["INFO"] * n,
        body=[f"{tenant} {lsn}/{k}" for k in range(n)],
        attributes=[(("k", str(k)),) for k in range(n)],
        resource_attributes=[(("service.name", tenant),)] * n,
        scope_name=[""] * n,
        trace_id=[None] * n,
        span_id=[None] * n,
        template_id=[7] * n,
        template_params=[(str(k),) for k in range(n)],
        wal_lsn=lsn,
        record_index=list(range(n)),
        nbytes=n,
    )


def bodies(buffers: Buffers) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in buffers.drain_all("test"):
        cols = d.partition.records
        if cols is not None:
            table = pq.read_table(pa.BufferReader(encode_records(cols)))
            out[d.partition.tenant] = table.column("body").to_pylist()
    return out


def test_a_large_buffer_keeps_at_most_seal_rows_as_lists_and_encodes_every_row() -> None:
    buffers = Buffers(
        flush_bytes=1 << 40, clock=time.monotonic, epoch=lambda: 1, background_sealing=False
    )
    expected: dict[str, list[str]] = {"a": [], "b": []}
    for lsn in range(1, 60):
        for tenant in ("a", "b"):
            assert add(buffers, tenant, lsn, 37) is None
            expected[tenant].extend(f"{tenant} {lsn}/{k}" for k in range(37))
            part = buffers._records[(tenant, DAY)]
            assert part.records is not None and part.records.list_rows < SEAL_ROWS
    frozen = sum(len(p.records) - p.records.list_rows for p in buffers._records.values())  # type: ignore[union-attr]
    assert frozen >= 2 * (59 * 37 // SEAL_ROWS) * SEAL_ROWS
    # Nothing converted in the turns; seal_pending converts every frozen piece.
    assert all(p.records.arrow_rows == 0 for p in buffers._records.values())  # type: ignore[union-attr]
    converted = buffers.seal_pending()
    assert converted == frozen // SEAL_ROWS
    assert sum(p.records.arrow_rows for p in buffers._records.values()) == frozen  # type: ignore[union-attr]
    assert buffers.seal_pending() == 0
    assert bodies(buffers) == expected


def test_unconverted_pieces_still_publish_every_row_in_order() -> None:
    buffers = Buffers(
        flush_bytes=1 << 40, clock=time.monotonic, epoch=lambda: 1, background_sealing=False
    )
    for lsn in range(1, 30):
        add(buffers, "a", lsn, 50)
    assert bodies(buffers) == {"a": [f"a {lsn}/{k}" for lsn in range(1, 30) for k in range(50)]}


def test_the_sealer_thread_converts_what_the_turns_froze_and_ends_when_idle() -> None:
    buffers = Buffers(flush_bytes=1 << 40, clock=time.monotonic, epoch=lambda: 1)
    sealed = threading.Event()
    converted: list[int] = []

    def on_sealed(done: int) -> None:
        converted.append(done)
        if sum(converted) >= 2:
            sealed.set()

    buffers.on_sealed = on_sealed
    for lsn in range(1, 2 * SEAL_ROWS // 64 + 2):
        add(buffers, "a", lsn, 64)
    sealer = buffers._sealer
    assert sealer is not None and sealer.name == "ourios-sealer"
    assert sealed.wait(30), converted
    part = buffers._records[("a", DAY)]
    assert part.records is not None and part.records.arrow_rows == 2 * SEAL_ROWS
    sealer.join(SEALER_IDLE_SECS + 30)
    assert not sealer.is_alive() and buffers._sealer is None
    # The next freeze starts a new one.
    for lsn in range(100, 100 + SEAL_ROWS // 64):
        add(buffers, "a", lsn, 64)
    assert buffers._sealer is not None and buffers._sealer is not sealer
    buffers._sealer.join(SEALER_IDLE_SECS + 30)


def test_stop_sealing_joins_the_sealer_and_none_starts_after() -> None:
    buffers = Buffers(flush_bytes=1 << 40, clock=time.monotonic, epoch=lambda: 1)
    for lsn in range(1, SEAL_ROWS // 64 + 1):
        add(buffers, "a", lsn, 64)
    sealer = buffers._sealer
    assert sealer is not None
    assert buffers.stop_sealing(30)
    assert not sealer.is_alive() and buffers._sealer is None
    for lsn in range(100, 100 + 2 * SEAL_ROWS // 64):
        add(buffers, "a", lsn, 64)
    assert buffers._sealer is None  # frozen pieces wait for their encode
    assert bodies(buffers) == {
        "a": [
            f"a {lsn}/{k}"
            for lsn in [*range(1, SEAL_ROWS // 64 + 1), *range(100, 100 + 2 * SEAL_ROWS // 64)]
            for k in range(64)
        ]
    }
    assert Buffers(flush_bytes=1, clock=time.monotonic, epoch=lambda: 1).stop_sealing(0)

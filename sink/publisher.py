"""The publisher: encodes detached partitions as Parquet and writes them to the store.

Two ways in. ``offer`` hands a partition the size trigger detached to the publisher
thread through a bounded queue and never blocks: when the queue is full the caller
parks the rows back into the buffers (``Buffers.requeue``), where the next trigger or
cut finds them. ``publish`` writes synchronously on the calling thread (the barrier's
flush, the age sweep, the shutdown flush), outside any exclusion.

Every outcome settles the partition's in-flight registration exactly once: success,
or a requeue that puts every row back into the buffers under the sink lock. An
exception of any kind requeues too (DESIGN.md §5: Python can always put a batch back).
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass

from sink.buffers import Buffers, Detached, Kind, PublishOutcome
from sink.keys import audit_key, new_object_name, records_key
from sink.parquet import encode_audit, encode_records
from sink.store import ObjectStore, StoreError

log = logging.getLogger("ourios.sink")


@dataclass
class PublishStats:
    """Counters (primary state, not copies): objects and bytes written, failures."""

    objects: Counter[str]
    bytes: Counter[str]
    failures: Counter[tuple[str, str]]  # (kind, error_type)


class Publisher:
    def __init__(
        self,
        store: ObjectStore,
        buffers: Buffers,
        *,
        node: str,
        compression: str = "zstd",
        queue_depth: int = 64,
    ) -> None:
        self._store = store
        self._buffers = buffers
        self._node = node
        self._compression = compression
        self._queue: queue.Queue[Detached | None] = queue.Queue(maxsize=queue_depth)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.stats = PublishStats(Counter(), Counter(), Counter())
        self._stats_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ourios-publisher", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 60.0) -> bool:
        """Stop after the queued partitions are written; True when the thread joined."""
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout)
        joined = not self._thread.is_alive()
        self._thread = None
        return joined

    def __enter__(self) -> Publisher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the two ways in -----------------------------------------------------------------

    def offer(self, d: Detached) -> bool:
        """Queue ``d`` for the publisher thread; False (the caller parks it) when full."""
        try:
            self._queue.put_nowait(d)
        except queue.Full:
            return False
        return True

    def park(self, d: Detached) -> None:
        """Put a partition the queue refused back into the buffers."""
        self._buffers.requeue(d, "parked")

    def publish(self, d: Detached) -> PublishOutcome:
        """Encode and write ``d`` now; on failure its rows go back into the buffers."""
        kind = d.partition.kind.value
        try:
            key, data = self._encode(d)
            self._store.put(key, data)
        except StoreError as exc:
            return self._failed(d, kind, exc.error_type, exc)
        except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
            return self._failed(d, kind, "unexpected", exc)
        with self._stats_lock:
            self.stats.objects[kind] += 1
            self.stats.bytes[kind] += len(data)
        outcome = PublishOutcome(d.id, True)
        self._buffers.in_flight.settle(outcome)
        return outcome

    def _failed(
        self, d: Detached, kind: str, error_type: str, exc: BaseException
    ) -> PublishOutcome:
        with self._stats_lock:
            self.stats.failures[(kind, error_type)] += 1
        log.warning(
            "publish of %s partition for tenant %r (%d rows) failed (%s): %s; rows requeued",
            kind,
            d.partition.tenant,
            d.partition.rows,
            error_type,
            exc,
        )
        return self._buffers.requeue(d, error_type)

    def _encode(self, d: Detached) -> tuple[str, bytes]:
        part = d.partition
        name = new_object_name(self._node)
        if part.kind is Kind.RECORDS:
            assert part.records is not None
            day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
            return records_key(part.tenant, day, name), encode_records(
                part.records, self._compression
            )
        assert part.audit is not None
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        return audit_key(part.tenant, day, name), encode_audit(part.audit, self._compression)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            d = self._queue.get()
            if d is None:
                return
            self.publish(d)

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

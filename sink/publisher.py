"""The publisher: encodes detached partitions as Parquet and writes them to the store.

Two ways in. ``offer`` hands a partition the size trigger detached to the publisher
thread through a bounded queue and never blocks: when the queue is full the caller
parks the rows back into the buffers (``Buffers.requeue``), where the next trigger or
cut finds them. ``publish`` writes synchronously on the calling thread (the barrier's
flush, the age sweep, the shutdown flush), outside any exclusion.

Every outcome settles the partition's in-flight registration exactly once: success,
or a requeue that puts every row back into the buffers under the sink lock. An
exception of any kind requeues too (DESIGN.md §5: Python can always put a batch back).

Records never reach the store ahead of the template events they reference (RFC 0052
§3.1, the ``write_ordered`` rule). A records partition carries the tenant's audit
watermark from its last append; before writing it the publisher makes every event up to
it durable: it writes the ones still buffered itself, first; it waits for the ones in
another caller's unsettled publish; and it refuses (requeues) the records when such an
event was refused — so a failed audit half takes its records back with it. The
publisher thread never waits for a partition the size trigger detached: that one is in
its own queue (or about to be: a turn offers what it detached after the turn), so it
defers the records instead and takes them up again after each partition it writes.

A records publish that fails *ambiguously* (the store may have accepted the object) is
requeued as its own unit under a deterministic name (``sink.keys.retry_object_name``,
RFC 0055 §9.2): every later attempt writes that same key, with the store's conditional
create, so a retry never adds a second object for the same rows and never replaces an
object holding other rows. A key that already exists was written by an earlier attempt
of these very rows (the name is derived from them), so the publish is complete.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Final

from sink.buffers import Buffers, Detached, Kind, PublishOutcome
from sink.keys import audit_key, new_object_name, records_key, retry_object_name
from sink.parquet import encode_audit, encode_records
from sink.store import ObjectStore, StoreError

log = logging.getLogger("ourios.sink")

#: ``_events_durable``'s answer when a queued partition holds the events
_DEFER: Final = "defer"


class _Wake:
    """Queued by ``park``: the publisher thread re-examines the records it deferred."""


_WAKE: Final = _Wake()


@dataclass
class PublishStats:
    """Counters (primary state, not copies): objects and bytes written, failures."""

    objects: Counter[str]
    bytes: Counter[str]
    failures: Counter[tuple[str, str]]  # (kind, error_type)
    #: retries under a deterministic name whose object an earlier attempt had written
    already_present: int = 0


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
        self._queue: queue.Queue[Detached | _Wake | None] = queue.Queue(maxsize=queue_depth)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.stats = PublishStats(Counter(), Counter(), Counter())
        self._deferred = 0
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
        """Put a partition the queue refused back into the buffers, then wake the
        publisher thread: records it deferred on this partition are refused now."""
        self._buffers.requeue(d, "parked")
        try:
            self._queue.put_nowait(_WAKE)
        except queue.Full:
            pass  # a full queue wakes it anyway: each write retries the deferred

    def publish(self, d: Detached) -> PublishOutcome:
        """Encode and write ``d`` now; on failure its rows go back into the buffers."""
        outcome = self._publish(d, queue_thread=False)
        assert outcome is not None
        return outcome

    def _publish(self, d: Detached, *, queue_thread: bool) -> PublishOutcome | None:
        """None: deferred (only on the publisher thread, see the module docstring)."""
        kind = d.partition.kind.value
        if d.partition.kind is Kind.RECORDS:
            refusal = self._events_durable(d, queue_thread)
            if refusal == _DEFER:
                return None
            if refusal:
                return self._failed(d, kind, "audit_not_durable", RuntimeError(refusal))
        created = True
        try:
            key, data = self._encode(d)
            if d.partition.identity is None:
                self._store.put(key, data)
            else:
                # a retry of rows whose earlier attempt may have landed: never replace
                created = self._store.put_if_absent(key, data)
        except StoreError as exc:
            identity = None
            if exc.ambiguous and d.partition.kind is Kind.RECORDS:
                identity = self._retry_name(d)
            return self._failed(d, kind, exc.error_type, exc, identity)
        except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
            return self._failed(d, kind, "unexpected", exc)
        with self._stats_lock:
            if created:
                self.stats.objects[kind] += 1
                self.stats.bytes[kind] += len(data)
            else:
                self.stats.already_present += 1
        outcome = PublishOutcome(d.id, True)
        self._buffers.in_flight.settle(outcome)
        return outcome

    def _events_durable(self, d: Detached, queue_thread: bool) -> str:
        """Make the template events ``d``'s rows reference durable; "" when they are,
        ``_DEFER`` when a queued partition holds some (publisher thread only), else why
        the rows are refused."""
        part = d.partition
        taken, refused = self._buffers.audit_dependencies(d)
        failed = 0
        for a in taken:
            if not self.publish(a).ok:
                failed += 1
        if refused or failed:
            return f"template events of tenant {part.tenant!r} were refused by the store"
        others = self._buffers.in_flight.audit_upto(part.tenant, part.audit_watermark)
        if queue_thread and any(o.detached.reason == "size" for o in others):
            return _DEFER
        for item in others:  # a synchronous caller's publish: it never waits on this one
            item.wait()
        if self._buffers.audit_pending(part.tenant, part.audit_watermark, part.gen):
            return f"template events of tenant {part.tenant!r} failed to publish"
        return ""

    def _retry_name(self, d: Detached) -> str | None:
        """The deterministic name of a records partition's rows (None when it has none)."""
        cols = d.partition.records
        bounds = None if cols is None else cols.lsn_bounds()
        if bounds is None:
            return None
        first, last, first_index, last_index = bounds
        day = dt.date(1970, 1, 1) + dt.timedelta(days=d.partition.day)
        return retry_object_name(
            self._node, d.partition.tenant, day, first, last, first_index, last_index
        )

    def _failed(
        self,
        d: Detached,
        kind: str,
        error_type: str,
        exc: BaseException,
        identity: str | None = None,
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
        return self._buffers.requeue(d, error_type, identity=identity)

    def _encode(self, d: Detached) -> tuple[str, bytes]:
        part = d.partition
        name = part.identity if part.identity is not None else new_object_name(self._node)
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
        deferred: list[Detached] = []
        while True:
            d = self._queue.get()
            if d is None:
                break
            if isinstance(d, _Wake):
                pass
            elif self._publish(d, queue_thread=True) is None:
                deferred.append(d)
                self._deferred = len(deferred)
                continue
            if deferred:
                # a partition was written: the records waiting on it may go now
                deferred = [r for r in deferred if self._publish(r, queue_thread=True) is None]
            self._deferred = len(deferred)
        # Everything offered before close() was queued ahead of the stop, so what the
        # deferred records wait for has been written; any still waiting go back into
        # the buffers (the final cut's drain takes them) rather than being dropped.
        for r in deferred:
            if self._publish(r, queue_thread=True) is None:
                self._buffers.requeue(r, "deferred_at_close")
        self._deferred = 0

    @property
    def queue_depth(self) -> int:
        """Partitions queued for the publisher thread, and records it deferred."""
        return self._queue.qsize() + self._deferred

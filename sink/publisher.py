"""The publisher: encodes detached partitions as Parquet and writes them to the store.

Two ways in. ``offer`` hands a partition the size trigger detached to the publisher
thread through a bounded queue and never blocks: when the queue is full the caller
parks the rows back into the buffers (``park``), where the next trigger or cut finds
them. ``publish`` writes synchronously on the calling thread (the barrier's flush, the
age sweep, the shutdown flush), outside any exclusion.

Every publish is *claimed* first (``sink.buffers.InFlight.claim``): the one thread that
claims a partition writes it and settles it — success, or a requeue that puts every
row back into the buffers under the sink lock. An exception of any kind requeues too
(DESIGN.md §5: Python can always put a batch back). ``publish`` of a partition another
thread has claimed waits for that thread's write (bounded by ``wait_secs``) and
returns its outcome; the publisher thread skips a queued partition someone else claimed.

Records never reach the store ahead of the template events they reference (RFC 0052
§3.1, the ``write_ordered`` rule). A records partition carries the tenant's audit
watermark from its last append; before writing it the publisher makes every event up to
it durable: it writes the ones still buffered itself, first; for the ones registered in
flight it *publishes them too* — claiming and writing any that no thread is writing yet
(in a pending cut only the barrier thread runs, in the publisher's own queue, detached
by a turn and not yet offered), waiting only for one another thread is already writing;
and it refuses (requeues) the records when such an event was refused. So a failed audit
half takes its records back with it, and releases everyone who waited for it.

Why it helps instead of waiting for the partition's owner (issue 18): the owner can be
the very thread that waits. A cut's records waited for template events that a failed
publish had put back and a rotation-fired cut had drained again into the barrier's
pending slot — which the barrier thread runs only after the cut it was waiting in. It
waited for good, and so did every age sweep that needed the same events. A waiter now
waits only for a write another thread is executing, and an audit write waits for
nothing, so no wait can close a cycle; each is bounded besides (``wait_secs``) and a
timeout refuses the waiting records (requeued: nothing is lost, the next cut retries).

Every object's *claim* — its key and exactly which rows it holds (``sink.claims``) —
goes to the ``intents`` hook before its PUT, which makes it durable (the node's
``wal.IntentLog``): after a crash recovery asks the store which of those objects
exist and suppresses exactly the rows they hold, so nothing published is published
again (docs/ARCHITECTURE.md "Exactly once in the store").

A publish that fails *ambiguously* (the store may have accepted the object), records or
audit, is requeued as its own unit under the name that attempt used (RFC 0055 §9.3:
never merged with rows that arrived meanwhile), and every later attempt writes that
same key with the store's conditional create: a key that already exists was written by
an earlier attempt of these very rows, so the publish is complete and no attempt adds a
copy. (RFC 0055 §9.2 renamed the retry by a UUIDv5 over the rows because nothing
recorded the first attempt's name and accepted the one extra object; the intent now
records it.) A clean failure wrote nothing and merges freely.

A *deterministic* partition (a settlement's intent span, RFC 0055 §9.4; see
``sink.buffers``) is named the same way from its first attempt: its records by the
derivation above, its template events by their content (``sink.keys.audit_object_name``),
and written with the conditional create — so the settlement, a cut retrying it, and a
recovery replaying the span after a crash all write the same keys, and an object one of
them wrote is never written again (``already_present``).
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from sink.buffers import Buffers, Detached, Kind, PublishOutcome
from sink.claims import IntentHook, claim_of
from sink.keys import (
    audit_key,
    audit_object_name,
    new_object_name,
    records_key,
    retry_object_name,
)
from sink.parquet import RecordColumns, encode_audit, encode_records
from sink.store import ObjectStore, StoreError

log = logging.getLogger("ourios.sink")

#: How long ``publish`` waits for a write another thread is executing before it gives
#: up (the outcome is ``publish_wait_timeout``; a waiting records publish is refused).
#: Longer than one store operation may take under ``sink.store.RetryPolicy`` and the S3
#: client's timeouts (five attempts of 5 s connect + 30 s read, plus backoff), so it
#: fires only for a store call that hangs beyond its own bounds.
WAIT_SECS: Final = 300.0

#: the outcome's error type when a wait for another thread's write timed out
WAIT_TIMEOUT: Final = "publish_wait_timeout"


def _no_step(name: str) -> None:
    return None


class ThreadHandle(Protocol):
    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class Threads(Protocol):
    """Runs a long-lived loop on a thread of its own and restarts it after an
    unexpected exception (the node passes its ``app.threads.Supervisor``)."""

    def start(
        self,
        name: str,
        loop: Callable[[], None],
        *,
        thread_name: str | None = None,
        restart: bool = True,
        stop: threading.Event | None = None,
    ) -> ThreadHandle: ...


@dataclass
class PublishStats:
    """Counters (primary state, not copies): objects and bytes written, failures."""

    objects: Counter[str]
    bytes: Counter[str]
    failures: Counter[tuple[str, str]]  # (kind, error_type)
    #: retries under a deterministic name whose object an earlier attempt had written
    already_present: int = 0
    #: publishes whose intent could not be made durable (written anyway: after a crash
    #: their rows may be published a second time, never lost)
    intent_failures: int = 0


class Publisher:
    def __init__(
        self,
        store: ObjectStore,
        buffers: Buffers,
        *,
        node: str,
        compression: str = "zstd",
        queue_depth: int = 64,
        wait_secs: float = WAIT_SECS,
        intents: IntentHook | None = None,
        step: Callable[[str], None] | None = None,
        threads: Threads | None = None,
    ) -> None:
        self._store = store
        #: runs the publisher's loop (None: a plain thread)
        self._threads = threads
        #: makes each object's claim durable before its PUT (module docstring)
        self.intents = intents
        #: told each step of a publish by name (``publish.intended``: the claim is
        #: durable, the PUT not started; ``publish.stored``: the PUT returned, nothing
        #: settled yet) — the node passes its named sync points, so a test can hold or
        #: kill a publish between the two
        self._step = step or _no_step
        self._buffers = buffers
        self._node = node
        self._compression = compression
        self._wait_secs = wait_secs
        self._queue: queue.Queue[Detached | None] = queue.Queue(maxsize=queue_depth)
        self._thread: ThreadHandle | None = None
        self._stop = threading.Event()
        self.stats = PublishStats(Counter(), Counter(), Counter())
        self._stats_lock = threading.Lock()
        #: turns a records partition into its Parquet object: ``encode_records`` here,
        #: or (with worker processes) a worker's encode with the same result, so the
        #: encode's CPU is not the node's serial process's
        self.records_encoder: Callable[[RecordColumns, str], bytes] = encode_records

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._threads is not None:
            # Restartable: a publish settles or requeues its partition itself, and the
            # queue outlives the loop; no stop event, so a restart still drains the
            # queue up to ``close``'s end marker.
            self._thread = self._threads.start(
                "publisher", self._run, thread_name="ourios-publisher"
            )
            return
        thread = threading.Thread(target=self._run, name="ourios-publisher", daemon=True)
        thread.start()
        self._thread = thread

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
        """Put a partition the queue refused back into the buffers — unless another
        thread has claimed it meanwhile (a records publish that needed its events), which
        then settles it."""
        self._buffers.requeue(d, "parked")

    def publish(self, d: Detached) -> PublishOutcome:
        """Write ``d`` now on this thread and return the outcome (on failure its rows are
        back in the buffers); when another thread is already writing it, wait for that
        write instead (at most ``wait_secs``: then ``WAIT_TIMEOUT``, ``d`` unsettled)."""
        if self._buffers.in_flight.claim(d):
            return self._publish_claimed(d)
        return self._awaited(d)

    def _awaited(self, d: Detached) -> PublishOutcome:
        item = d.flight
        assert item is not None, f"publish {d.id} was never registered in flight"
        if not item.wait(self._wait_secs):
            log.warning(
                "publish of %s partition %d for tenant %r still running on another thread "
                "after %.0f s; not waiting longer",
                d.partition.kind.value,
                d.id,
                d.partition.tenant,
                self._wait_secs,
            )
            return PublishOutcome(d.id, False, None, WAIT_TIMEOUT)
        assert item.outcome is not None
        return item.outcome

    def _publish_claimed(self, d: Detached) -> PublishOutcome:
        """Write ``d``, whose claim this thread holds, and settle it."""
        kind = d.partition.kind.value
        if d.partition.kind is Kind.RECORDS:
            try:
                refusal = self._events_durable(d)
            except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
                return self._failed(d, kind, "unexpected", exc)
            if refusal:
                return self._failed(d, kind, "audit_not_durable", RuntimeError(refusal))
        created = True
        name = ""
        try:
            name, key, data = self._encode(d)
            self._intend(key, d)
            self._step("publish.intended")
            if d.partition.identity is None:
                self._store.put(key, data)
            else:
                # a retry of rows whose earlier attempt may have landed: never replace
                created = self._store.put_if_absent(key, data)
            self._step("publish.stored")
        except StoreError as exc:
            # The store may hold the object: every later attempt at these rows writes
            # this very key, conditionally (module docstring), so none adds a copy.
            identity = name if exc.ambiguous and name else None
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

    def _intend(self, key: str, d: Detached) -> None:
        """Make the object's claim durable before its PUT (module docstring). A claim
        that cannot be recorded does not stop the publish — the store must keep taking
        rows, or the WAL could never be reclaimed — it only gives up, for this object,
        the suppression a restart would have applied: counted, and logged."""
        if self.intents is None:
            return
        try:
            self.intents(claim_of(key, d.partition))
        except Exception as exc:  # noqa: BLE001 - the publish goes on (docstring)
            with self._stats_lock:
                self.stats.intent_failures += 1
            log.warning(
                "the publish intent for %s was not recorded (%s): a crash before the next "
                "checkpoint may publish its rows again",
                key,
                exc,
            )

    def _events_durable(self, d: Detached) -> str:
        """Make the template events ``d``'s rows reference durable; "" when they are,
        else why the rows are refused (module docstring)."""
        part = d.partition
        taken, refused = self._buffers.audit_dependencies(d)
        failed = 0
        for a in taken:
            if not self.publish(a).ok:
                failed += 1
        if refused or failed:
            return f"template events of tenant {part.tenant!r} were refused by the store"
        # Registered elsewhere: written here when nobody is writing them yet, else waited
        # for (bounded); the first failure refuses the records — they requeue with it.
        for item in self._buffers.in_flight.audit_upto(part.tenant, part.audit_watermark):
            outcome = self.publish(item.detached)
            if not outcome.ok:
                return (
                    f"template events of tenant {part.tenant!r} failed to publish "
                    f"({outcome.error_type or 'refused'})"
                )
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

    def _deterministic_name(self, d: Detached) -> str:
        """The name every attempt at an intent span's partition derives (module docstring)."""
        part = d.partition
        if part.kind is Kind.RECORDS:
            name = self._retry_name(d)
            assert name is not None, "an intent partition is never empty"
            return name
        cols = part.audit
        assert cols is not None
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        rows = zip(
            cols.template_id,
            cols.template_version,
            cols.template,
            cols.change,
            cols.wal_lsn,
            cols.time_unix_nano,
            strict=True,
        )
        return audit_object_name(self._node, part.tenant, day, rows)

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
        outcome = self._buffers.requeue(d, error_type, identity=identity, claimed=True)
        assert outcome is not None  # this thread holds the claim
        return outcome

    def _encode(self, d: Detached) -> tuple[str, str, bytes]:
        """(name, key, bytes) of ``d``'s object."""
        part = d.partition
        if part.identity is None and part.deterministic:
            part.identity = self._deterministic_name(d)
        name = part.identity if part.identity is not None else new_object_name(self._node)
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        if part.kind is Kind.RECORDS:
            assert part.records is not None
            data = self.records_encoder(part.records, self._compression)
            return name, records_key(part.tenant, day, name), data
        assert part.audit is not None
        data = encode_audit(part.audit, self._compression)
        return name, audit_key(part.tenant, day, name), data

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            d = self._queue.get()
            if d is None:
                break
            # A partition another thread claimed (its records' publish needed it, a cut
            # wrote it) is theirs to settle: skipped, never written twice.
            if self._buffers.in_flight.claim(d):
                self._publish_claimed(d)

    @property
    def queue_depth(self) -> int:
        """Partitions queued for the publisher thread."""
        return self._queue.qsize()

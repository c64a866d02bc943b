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

A publish that fails *cleanly* (nothing was written: a refused connection, a throttle)
takes its intent back (``retract``): its rows merge into the buffers and the next
attempt has a fresh name, so the publish intents hold one record per object that may
exist — an attempt that failed cleanly leaves none — however long an outage lasts.

**The store gate** (``StoreGate``). A publish that fails because the store is not
taking writes (a refused or timed-out connection, a 5xx, a throttle) marks the store
*down*; while it is, one publish at a time, at most once per ``probe_secs``, goes to
the store as its probe, and every other one fails at once (``store_unavailable``: no
encode, no intent, no request) and is requeued. The first probe that lands marks it up
again. So an outage costs one request per second, not one per partition per cut, and
the spool is not read back while nothing can take it. ``sink.store.unavailable`` and
``sink.store.available`` are its events.

**Spilling** (DESIGN.md §5.12, ``sink.spool``). ``spill`` is the spiller's publish: the
partition is encoded and written to the store when the gate lets it; when it does not,
or the write fails, the encoded object is written to the spool instead, under the name
it has now, with its intent recorded — so it leaves memory and becomes a unit that is
published from its file, as it is, with the conditional create. A spooled unit's intent
is never recorded again: one record per spooled object, however many attempts.

**A publish's CPU** (``encode_slot``). The node passes the slots that bound its
records encodes (TAIL.6, ``app.node.encode_dispatch``): a publish holds one while it
re-matches and encodes its rows and again while it settles them, not while its intent
and PUT wait on the disk or the network. So a rotation cut's lanes overlap their writes
but never want more CPU at once than the slots allow, which the requests being served
would wait for. Without the node's slots it is a no-op.

**Object size.** An encoded records object over ``max_object_bytes`` is not written: its
partition goes back as two halves (``object_too_large``), unless it is a single frame's
rows or already has a name.

**Dead letters** (DESIGN.md §5.13, ``sink.deadletter``). A failure of a permanent class
(``PERMANENT_ERRORS``: the store refused this very object, or its rows cannot be
encoded) is a strike against its partition (tenant, kind, day); at
``dead_letter_attempts`` strikes the object is written durably to the dead-letter
directory instead and the partition settles as published, so the other partitions' cut
completes and the checkpoint advances. A denial (``DENIALS``) counts only while the store
takes other objects meanwhile: one denied for every object is the node's
misconfiguration, not one partition's, and the WAL absorbs it. A success clears the
strikes; after a dead letter the partition's later rows go the same way at their first
permanent failure.

A *deterministic* partition (a settlement's intent span, RFC 0055 §9.4; see
``sink.buffers``) is named the same way from its first attempt: its records by the
derivation above, its template events by their content (``sink.keys.audit_object_name``),
and written with the conditional create — so the settlement, a cut retrying it, and a
recovery replaying the span after a crash all write the same keys, and an object one of
them wrote is never written again (``already_present``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Final, Protocol

import pyarrow as pa

from sink.buffers import MAX_OBJECT_BYTES, Buffers, Detached, PublishOutcome
from sink.claims import IntentHook, claim_of
from sink.deadletter import ARROW_SUFFIX, DENIALS, PERMANENT_ERRORS, DeadLetter, arrow_stream
from sink.keys import (
    audit_key,
    audit_object_name,
    new_object_name,
    records_key,
    retry_object_name,
)
from sink.parquet import AUDIT_SCHEMA, RECORDS_SCHEMA, RecordColumns, encode_audit, encode_records
from sink.spool import OBJECT_TOO_LARGE, Spool
from sink.store import ObjectStore, StoreError
from wal import ObjectKind

log = logging.getLogger("ourios.sink")

#: How long ``publish`` waits for a write another thread is executing before it gives
#: up (the outcome is ``publish_wait_timeout``; a waiting records publish is refused).
#: Longer than one store operation may take under ``sink.store.RetryPolicy`` and the S3
#: client's timeouts (five attempts of 5 s connect + 30 s read, plus backoff), so it
#: fires only for a store call that hangs beyond its own bounds.
WAIT_SECS: Final = 300.0

#: the outcome's error type when a wait for another thread's write timed out
WAIT_TIMEOUT: Final = "publish_wait_timeout"


#: the outcome's error type of a publish the store gate refused (the store is down)
STORE_UNAVAILABLE: Final = "store_unavailable"

#: error types of a store that is not taking writes at all (the gate's "down"); any
#: other failure is the object's own and leaves the gate as it was
UNAVAILABLE_ERRORS: Final = frozenset(
    {"s3_connection", "s3_timeout", "s3_5xx", "s3_throttled", "local_io", "local_no_space"}
)

#: the gate's default: how often a store that is down is tried again (seconds)
PROBE_SECS: Final = 1.0


def _no_step(name: str) -> None:
    return None


class Ticket(enum.Enum):
    """What the store gate allows one publish (module docstring)."""

    OPEN = 1  # the store takes writes
    PROBE = 2  # the store is down and this publish is its probe
    REFUSED = 3  # the store is down: fail at once


class StoreGate:
    """Whether the store takes writes, learnt from the publishes' own outcomes (module
    docstring). Thread-safe."""

    def __init__(
        self,
        *,
        probe_secs: float = PROBE_SECS,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> None:
        self.probe_secs = probe_secs
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._probing = False
        self._next_probe = 0.0
        #: publishes refused while the store was down
        self.refused = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def admit(self) -> Ticket:
        with self._lock:
            if self._down_since is None:
                return Ticket.OPEN
            if self._probing or self._clock() < self._next_probe:
                self.refused += 1
                return Ticket.REFUSED
            self._probing = True
            return Ticket.PROBE

    def done(self, ticket: Ticket, verdict: StoreError | bool | None) -> None:
        """What the publish admitted with ``ticket`` learnt: True (the store took a
        write), a ``StoreError``, or None (it never reached the store)."""
        event: tuple[str, dict[str, object]] | None = None
        with self._lock:
            if ticket is Ticket.PROBE:
                self._probing = False
            now = self._clock()
            if verdict is True and self._down_since is not None:
                event = (
                    "sink.store.available",
                    {"seconds": round(now - self._down_since, 3)},
                )
                self._down_since = None
            elif isinstance(verdict, StoreError) and verdict.error_type in UNAVAILABLE_ERRORS:
                self._next_probe = now + self.probe_secs
                if self._down_since is None:
                    self._down_since = now
                    event = (
                        "sink.store.unavailable",
                        {
                            "error": str(verdict),
                            "error_type": verdict.error_type,
                            "action": "one publish a second probes the store; the others "
                            "fail at once and their rows stay buffered or spooled",
                        },
                    )
        if event is not None:
            self._events(*event)


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
    #: partitions the spiller wrote to the spool, and objects published from it
    spooled: int = 0
    unspooled: int = 0
    #: (kind, error_type) -> partitions written to the dead-letter directory
    dead_lettered: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass
class _Strikes:
    """A partition's permanent failures since its last success (module docstring)."""

    #: the objects the store had taken when the first strike came
    landed_before: int
    count: int = 0


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
        retract: Callable[[str], None] | None = None,
        step: Callable[[str], None] | None = None,
        spool: Spool | None = None,
        gate: StoreGate | None = None,
        max_object_bytes: int = MAX_OBJECT_BYTES,
        threads: Threads | None = None,
        dead_letter: DeadLetter | None = None,
        dead_letter_attempts: int = 5,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        records_encoder: Callable[[RecordColumns, str], bytes] = encode_records,
        encode_slot: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self._store = store
        #: where a partition the store refuses for good goes (None: retried for ever)
        self.dead_letter = dead_letter
        self.dead_letter_attempts = dead_letter_attempts
        self._events = events or (lambda name, fields: None)
        #: (kind, tenant, day) -> its permanent failures; objects the store took
        self._strikes: dict[tuple[str, str, int], _Strikes] = {}
        self._landed = 0
        #: runs the publisher's loop (None: a plain thread)
        self._threads = threads
        #: makes each object's claim durable before its PUT (module docstring)
        self.intents = intents
        #: takes back the intent of an object a clean failure did not write
        self._retract = retract
        #: where the spiller's partitions go when the store does not take them
        self.spool = spool
        self.gate = gate
        self.max_object_bytes = max_object_bytes
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
        self.records_encoder = records_encoder
        #: held around a publish's CPU part — re-matching, encoding, settling its rows —
        #: and not around its intent and PUT (module docstring, "A publish's CPU")
        self._encode_slot = encode_slot

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

    def spill(self, d: Detached) -> PublishOutcome | None:
        """The spiller's publish of ``d`` (module docstring): to the store when it takes
        it, else to the spool; None when another thread holds ``d``."""
        if not self._buffers.in_flight.claim(d):
            return None
        return self._publish_claimed(d, spill=True)

    def _publish_claimed(self, d: Detached, *, spill: bool = False) -> PublishOutcome:
        """Write ``d``, whose claim this thread holds, and settle it. ``spill``: whatever
        keeps it from the store, its rows go to the spool (module docstring)."""
        kind = d.partition.kind.value
        gate = self.gate
        ticket = gate.admit() if gate is not None else Ticket.OPEN
        if ticket is Ticket.REFUSED and not spill:
            why = RuntimeError("the store is down; another publish probes it")
            return self._failed(d, kind, STORE_UNAVAILABLE, why, quiet=True)
        verdict: StoreError | bool | None = None
        try:
            outcome, verdict = self._attempt(d, kind, ticket is not Ticket.REFUSED, spill)
            return outcome
        finally:
            if gate is not None:
                gate.done(ticket, verdict)

    def _attempt(
        self, d: Detached, kind: str, admitted: bool, spill: bool
    ) -> tuple[PublishOutcome, StoreError | bool | None]:
        """``_publish_claimed``'s work: the outcome, and what the store said (for the
        gate: True, its error, or None when no request was made)."""
        part = d.partition
        refusal = ""
        if part.kind is ObjectKind.RECORDS and admitted:
            try:
                refusal = self._events_durable(d)
            except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
                return self._failed(d, kind, "unexpected", exc), None
            if refusal and not spill:
                return self._failed(d, kind, "audit_not_durable", RuntimeError(refusal)), None
        with contextlib.ExitStack() as held:
            try:
                if part.spool is not None and self.spool is not None:
                    # the spooled bytes in memory stay within the spool's read budget
                    data = held.enter_context(self.spool.reading(part.spool))
                    name, key = self._spooled_key(d)
                else:
                    with self._encode_slot():
                        name, key, data = self._encode(d)
            except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
                if part.spool is None:
                    return self._encode_failed(d, kind, exc), None
                return self._failed(d, kind, "unexpected", exc), None
            if self._too_large(d, data):
                why = RuntimeError(f"{len(data)} bytes over sink.max_object_bytes")
                return self._failed(d, kind, OBJECT_TOO_LARGE, why, split=True), None
            if not admitted or refusal:
                reason = "audit_not_durable" if refusal else STORE_UNAVAILABLE
                return self._to_spool(d, kind, name, key, data, reason), None
            return self._write(d, kind, name, key, data, spill)

    def _write(
        self, d: Detached, kind: str, name: str, key: str, data: bytes, spill: bool
    ) -> tuple[PublishOutcome, StoreError | bool | None]:
        """The intent, then the PUT, then the settlement (module docstring)."""
        part = d.partition
        created = True
        # a spooled unit's intent was recorded when it was spooled: never again
        intended = part.spool is not None or self._intend(key, d)
        try:
            self._step("publish.intended")
            if part.identity is None:
                self._store.put(key, data)
            else:
                # a retry of rows whose earlier attempt may have landed: never replace
                created = self._store.put_if_absent(key, data)
            self._step("publish.stored")
        except StoreError as exc:
            if spill:
                return self._to_spool(d, kind, name, key, data, exc.error_type), exc
            if exc.ambiguous:
                # The store may hold the object: every later attempt at these rows writes
                # this very key, conditionally (module docstring), so none adds a copy.
                return self._failed(d, kind, exc.error_type, exc, name), exc
            if intended and part.identity is None and part.spool is None:
                self._take_back(key)  # nothing was written: its intent holds nothing
            attempts = self._strike(d, exc.error_type)
            if attempts:
                return self._to_dead_letter(d, kind, key, data, exc, attempts), exc
            return self._failed(d, kind, exc.error_type, exc), exc
        except Exception as exc:  # noqa: BLE001 - requeued and counted, never lost
            return self._failed(d, kind, "unexpected", exc), None
        with self._stats_lock:
            self._landed += 1
            self._strikes.pop((kind, part.tenant, part.day), None)
            if created:
                self.stats.objects[kind] += 1
                self.stats.bytes[kind] += len(data)
            else:
                self.stats.already_present += 1
            if part.spool is not None:
                self.stats.unspooled += 1
        with self._encode_slot():
            return self._buffers.published(d), True

    def _too_large(self, d: Detached, data: bytes) -> bool:
        """An encoded records object over ``max_object_bytes`` that can still be split:
        in memory, more than one frame, no name an earlier attempt may have used."""
        part = d.partition
        return (
            len(data) > self.max_object_bytes
            and part.spool is None
            and part.identity is None
            and part.records is not None
            and len(part.records.batches) > 1
        )

    def _to_spool(
        self, d: Detached, kind: str, name: str, key: str, data: bytes, error_type: str
    ) -> PublishOutcome:
        """Write the encoded object to the spool under ``name`` with its intent, and put
        the partition back as a spooled unit (its rows leave memory). When the intent or
        the file cannot be written, the rows go back into memory under that name."""
        part = d.partition
        spool = self.spool
        if spool is None or part.spool is not None:
            return self._failed(d, kind, error_type, RuntimeError("not spooled"), name)
        if not self._intend(key, d):
            why = RuntimeError("its publish intent could not be recorded")
            return self._failed(d, kind, error_type, why, name)
        try:
            spooled = spool.write(kind, name, data)
        except OSError as exc:
            return self._failed(d, kind, "spool_write", exc, name)
        with self._stats_lock:
            self.stats.spooled += 1
        outcome = self._buffers.requeue(d, error_type, identity=name, claimed=True, spooled=spooled)
        assert outcome is not None  # this thread holds the claim
        return outcome

    def _strike(self, d: Detached, error_type: str) -> int:
        """Count a permanent failure of ``d``'s partition (module docstring): the strikes
        so far when it is to be dead-lettered now, else 0."""
        if self.dead_letter is None or error_type not in PERMANENT_ERRORS:
            return 0
        part = d.partition
        with self._stats_lock:
            strikes = self._strikes.setdefault(
                (part.kind.value, part.tenant, part.day), _Strikes(self._landed)
            )
            strikes.count += 1
            if strikes.count < self.dead_letter_attempts:
                return 0
            if error_type in DENIALS and self._landed == strikes.landed_before:
                return 0  # denied with everything else: the node's, not this partition's
            return strikes.count

    def _encode_failed(self, d: Detached, kind: str, exc: Exception) -> PublishOutcome:
        """``d``'s rows could not be encoded: requeued, or after the strikes dead-lettered
        as an Arrow stream of the same rows."""
        attempts = self._strike(d, "encode_error")
        if not attempts:
            return self._failed(d, kind, "encode_error", exc)
        part = d.partition
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        name = part.identity if part.identity is not None else new_object_name(self._node)
        try:
            if part.kind is ObjectKind.RECORDS:
                assert part.records is not None
                key = records_key(part.tenant, day, name)
                data = arrow_stream(part.records.batches, RECORDS_SCHEMA)
            else:
                assert part.audit is not None
                key = audit_key(part.tenant, day, name)
                cols = {n: getattr(part.audit, n) for n in AUDIT_SCHEMA.names}
                table = pa.Table.from_pydict(cols, schema=AUDIT_SCHEMA)
                data = arrow_stream(table.to_batches(), AUDIT_SCHEMA)
        except Exception as again:  # noqa: BLE001 - kept in memory and the WAL, counted
            return self._failed(d, kind, "encode_error", again)
        return self._to_dead_letter(d, kind, key + ARROW_SUFFIX, data, exc, attempts)

    def _to_dead_letter(
        self, d: Detached, kind: str, key: str, data: bytes, exc: Exception, attempts: int
    ) -> PublishOutcome:
        """Write the object the store refused for good to the dead-letter directory,
        durably, and settle its partition as published; when it cannot be written the
        rows are requeued (nothing acknowledged is dropped)."""
        part = d.partition
        error_type = exc.error_type if isinstance(exc, StoreError) else "encode_error"
        assert self.dead_letter is not None
        try:
            path = self.dead_letter.write(key, data)
        except OSError as failed:
            log.error("dead-lettering %s failed (%s): rows requeued", key, failed)
            return self._failed(d, kind, error_type, exc)
        with self._stats_lock:
            self.stats.dead_lettered[(kind, error_type)] += 1
        self._events(
            "sink.partition.dead_lettered",
            {
                "tenant": part.tenant,
                "kind": kind,
                "day": str(dt.date(1970, 1, 1) + dt.timedelta(days=part.day)),
                "rows": part.rows,
                "bytes": len(data),
                "attempts": attempts,
                "error_type": error_type,
                "error": str(exc),
                "path": str(path),
                "action": "the store refuses this object for good: it is kept in the "
                "dead-letter directory and its WAL frames may be reclaimed; fix the cause "
                "and re-drive it (RUNBOOK.md)",
            },
        )
        return self._buffers.published(d)

    def _take_back(self, key: str) -> None:
        if self._retract is None:
            return
        try:
            self._retract(key)
        except Exception as exc:  # noqa: BLE001 - a restart only asks about one more key
            log.warning("the publish intent for %s was not taken back: %s", key, exc)

    def _intend(self, key: str, d: Detached) -> bool:
        """Make the object's claim durable before its PUT (module docstring); False when
        it could not be. A claim that cannot be recorded does not stop the publish — the
        store must keep taking rows, or the WAL could never be reclaimed — it only gives
        up, for this object, the suppression a restart would have applied: counted, and
        logged."""
        if self.intents is None:
            return True
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
            return False
        return True

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
        if part.kind is ObjectKind.RECORDS:
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
        *,
        quiet: bool = False,
        split: bool = False,
    ) -> PublishOutcome:
        with self._stats_lock:
            self.stats.failures[(kind, error_type)] += 1
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "publish of %s partition for tenant %r (%d rows) failed (%s): %s; rows requeued",
            kind,
            d.partition.tenant,
            d.partition.rows,
            error_type,
            exc,
        )
        outcome = self._buffers.requeue(d, error_type, identity=identity, claimed=True, split=split)
        assert outcome is not None  # this thread holds the claim
        return outcome

    def _encode(self, d: Detached) -> tuple[str, str, bytes]:
        """(name, key, bytes) of ``d``'s object."""
        part = d.partition
        if part.identity is None and part.deterministic:
            part.identity = self._deterministic_name(d)
        name = part.identity if part.identity is not None else new_object_name(self._node)
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        if part.spool is not None:  # encoded when it was spooled, under its name
            name, key = self._spooled_key(d)
            return name, key, part.spool.read()
        if part.kind is ObjectKind.RECORDS:
            assert part.records is not None
            records = part.records
            if part.rematch is not None:
                # the template versions pinned at the detach (DESIGN.md §3 "Template
                # versions of a record"): every attempt encodes the same rows
                records = records.mapped(part.rematch)
            data = self.records_encoder(records, self._compression)
            return name, records_key(part.tenant, day, name), data
        assert part.audit is not None
        data = encode_audit(part.audit, self._compression)
        return name, audit_key(part.tenant, day, name), data

    def _spooled_key(self, d: Detached) -> tuple[str, str]:
        """(name, key) of a spooled unit: the name it was spooled under."""
        part = d.partition
        assert part.identity is not None, "a spooled unit always has its name"
        day = dt.date(1970, 1, 1) + dt.timedelta(days=part.day)
        key_of = records_key if part.kind is ObjectKind.RECORDS else audit_key
        return part.identity, key_of(part.tenant, day, part.identity)

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

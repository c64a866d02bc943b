"""Sink buffers: per-partition columnar rows waiting to be published, and the in-flight
registry that says where every record is at every instant.

Partitions are tenant × UTC day for records and tenant for audit events. Each keeps its
rows, its first-append time (for the age sweep), the highest WAL LSN among its rows and
its byte figure. A partition leaves the buffers only by *detaching* it into a
``Detached`` unit, which is registered as in flight in the same critical section, so a
record is always in exactly one of: the buffers, a registered in-flight publish, or the
store (DESIGN.md §5.5). A publish that fails is *requeued*: its rows go back into the
buffers (never lost), tagged with the barrier epoch current at the requeue, so the
barrier can tell which cuts it invalidates.

A publish requeued after an *ambiguous* failure (the store may have accepted it),
records or audit, keeps its identity (RFC 0055 §9.3): it is held as its own unit, never
merged with rows that arrived meanwhile, carrying the object name that attempt used
(``Partition.identity``), so every later attempt writes the same key and none adds a
copy. A clean failure wrote nothing and merges freely.

A settlement's intent span (RFC 0055 §9.4, "intent then confirm") is buffered *staged*:
its records, and the template events of templates the tree had before the rebuild, go
into partitions of their own (one per kind and day, no size trigger), which become
*deterministic* units when sealed — never merged with other rows, requeued as
themselves, published under a name their rows derive (``sink.keys``) with the store's
conditional create. Every attempt at the span (the settlement's publish, a cut's
retry, the recovery that replays the span after a crash) builds the same units and so
writes the same keys: what landed is not written again. A drain seals what is staged;
the settlement and recovery seal at the end of the span.

A settlement (RFC 0055 §9.4) replaces a tenant's miner tree and re-emits, from the
WAL, everything of it that is not known durable; the rows and template events the
discarded tree produced are then superseded. ``drop_tenant``, in the section that swaps
the tree, drops the tenant's buffered partitions and starts a new *generation* for it.
A partition of an older generation still in flight at the swap may publish (its rows
are real, at most a second copy of what the replay re-emits) unless its template
events were among the dropped ones — then the write-ordering check refuses it, so no
row under a template id without a durable event reaches the store — and a requeue
discards it instead of putting it back (a failed publish: a cut whose batch held it
does not stamp; the re-emitted rows are the tenant's copy). Nothing waits for those
publishes, so a settlement never depends on another thread's progress.

Settling a registered publish is a *claim*: the one thread that takes it (``claim``)
writes the partition or puts its rows back, and settles it; every other thread that
needs it waits for that one. A publisher claims what it is about to write; a caller that
needs an unclaimed partition written (a records publish needing its template events
durable, a cut needing every publish registered before it settled) claims and writes it
itself instead of waiting for the thread that detached it — which may be waiting for it
in turn (a pending cut only the barrier thread runs, the publisher's queue); a requeue by
anyone but the claimant (``park``, an abandoned cut, a count) claims first and leaves a
partition someone else holds alone. So a waiter only ever waits for a write another
thread is executing, and every claimed partition is settled by its claimant.

**The memory bound** (DESIGN.md §5.12). ``held_bytes`` is what the rows in memory cost:
every buffered partition and every registered publish not yet settled (a records
partition's Arrow size plus its frames' payload bytes, which the decoded columns share a
buffer with; an audit row's estimate plus its Python objects). Past three quarters of
``ceiling_bytes`` the ``pressure`` event wakes the spiller (``sink.spool``), which
publishes the largest partitions early and *spools* what the store does not take: the
partition becomes a unit whose rows are a Parquet file on the data volume under the
object name decided then (``Partition.spool``), never merged, published from the file
with the conditional create. At ``ceiling_bytes`` the ingest turn waits for room
(``wait_for_room``) instead of buffering more. A publish's rows leave memory when it
lands (``published``). No partition grows past ``max_object_bytes``: the size trigger
detaches it first and a failed publish is not merged past it.

Everything here runs under the sink lock, which this class owns; the lock order of
DESIGN.md §5.3 puts it after the barrier exclusion and the miner lock (the in-flight
registry's own lock is innermost).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from sink.parquet import AuditColumns, RecordColumns
from sink.spool import SpoolFile
from wal import ObjectKind

NANOS_PER_DAY: Final = 86_400 * 1_000_000_000
#: What one buffered template event costs beyond ``AuditColumns.nbytes``: its seven list
#: slots and the Python integers and strings they point at.
AUDIT_ROW_OVERHEAD: Final = 320
#: The largest object a store takes in one PUT (S3): ``max_object_bytes``' default bound.
MAX_OBJECT_BYTES: Final = 5 << 30
#: How long a turn waits for room under the ceiling before it goes on (``wait_for_room``).
ROOM_WAIT_SECS: Final = 30.0


@dataclass
class Partition:
    kind: ObjectKind
    tenant: str
    day: int  # UTC day number of the rows' times (records and audit)
    records: RecordColumns | None
    audit: AuditColumns | None
    first_at: float
    max_lsn: int = 0
    #: the partition's size as the triggers and the gauges see it: for records, the sum
    #: of the estimates the appender passed (the frames' payload bytes, so the size
    #: trigger fires at the same volume of input whatever the Arrow form's overhead)
    est_bytes: int = 0
    #: put back by a requeue (a failed or refused publish) and not yet published
    parked: bool = False
    #: audit: the tenant's sequence number of the partition's oldest template event
    first_seq: int = 0
    #: records: the tenant's template events accepted when the rows were appended; the
    #: rows may reach the store only once every event up to it is durable
    audit_watermark: int = 0
    #: the object name every attempt must use, set when a publish of these rows was
    #: ambiguous (the name that attempt used) or derived for an intent span; None: a
    #: fresh name per attempt
    identity: str | None = None
    #: the tenant's tree generation its rows came from (``drop_tenant`` starts a new one)
    gen: int = 0
    #: a settlement's intent span (module docstring): a unit of its own, named by its
    #: rows (the publisher derives ``identity`` from them), never merged
    deterministic: bool = False
    #: spooled: the rows are this Parquet file (under ``identity``), not in memory
    spool: SpoolFile | None = None
    #: rows no longer in memory (spooled, or released once published); ``rows`` counts them
    rows_elsewhere: int = 0
    #: records: what the publisher applies to each batch before encoding it — the
    #: tenant's template versions at the instant the partition was detached
    #: (``Buffers.pin``; DESIGN.md §3 "Template versions of a record"); None: as mined
    rematch: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None

    @property
    def nbytes(self) -> int:
        if self.records is not None:
            return self.est_bytes
        assert self.audit is not None
        return self.audit.nbytes

    @property
    def mem_bytes(self) -> int:
        """What the rows cost in memory (module docstring); 0 once they left it."""
        if self.records is not None:
            return self.records.nbytes + self.est_bytes if len(self.records) else 0
        assert self.audit is not None
        return self.audit.nbytes + AUDIT_ROW_OVERHEAD * len(self.audit)

    @property
    def rows(self) -> int:
        cols = self.records if self.records is not None else self.audit
        assert cols is not None
        return len(cols) + self.rows_elsewhere

    def release_rows(self) -> None:
        """Drop the rows from memory (published, or spooled), keeping their count."""
        self.rows_elsewhere = self.rows
        self.est_bytes = 0
        if self.records is not None:
            self.records = RecordColumns()
        else:
            self.audit = AuditColumns()


@dataclass
class Detached:
    """A partition on its way to the store: the unit the publisher writes as one object."""

    id: int
    partition: Partition
    epoch: int  # the barrier epoch current when it was detached
    reason: str  # "size", "age", "barrier", "shutdown"
    #: its registration in flight (``InFlight.register`` sets it, in the detaching section)
    flight: _InFlight | None = field(default=None, repr=False, compare=False)


@dataclass
class PublishOutcome:
    id: int
    ok: bool
    requeue_epoch: int | None = None  # the epoch current when a failure requeued it
    error_type: str = ""


class _InFlight:
    """One registered publish. Waiting uses the registry's one condition: a capture
    registers every buffered partition under the barrier's exclusion, and an event per
    partition cost more than the rest of the registration (soak/bench/barrier.py)."""

    __slots__ = ("_registry", "claimed", "detached", "outcome")

    def __init__(self, registry: InFlight, detached: Detached) -> None:
        self._registry = registry
        self.detached = detached
        self.outcome: PublishOutcome | None = None
        #: a thread holds the right to settle it (``InFlight.claim``)
        self.claimed = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the publish settles; False when ``timeout`` passed first."""
        return self._registry._wait(self, timeout)


class InFlight:
    """Registered publishes: created under the sink lock before a partition leaves the
    buffers; claimed by one thread, which settles it exactly once with an outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._items: dict[int, _InFlight] = {}
        #: failed publishes, kept until no cut can be affected by them
        self._failures: list[PublishOutcome] = []

    def register(self, d: Detached) -> None:
        with self._lock:
            item = _InFlight(self, d)
            d.flight = item
            self._items[d.id] = item

    def claim(self, d: Detached) -> bool:
        """Take the one right to settle ``d`` (write it, or put its rows back): True for
        exactly one caller while it is registered and unsettled; that caller must settle
        it. False: another thread holds it (wait for it) or it has settled."""
        with self._lock:
            item = d.flight
            if item is None or item.claimed or item.outcome is not None:
                return False
            item.claimed = True
            return True

    def settle(self, outcome: PublishOutcome) -> None:
        with self._lock:
            item = self._items.pop(outcome.id, None)
            if not outcome.ok:
                self._failures.append(outcome)
            if item is not None:
                item.outcome = outcome
                self._settled.notify_all()

    def _wait(self, item: _InFlight, timeout: float | None) -> bool:
        with self._lock:
            return self._settled.wait_for(lambda: item.outcome is not None, timeout)

    def failures_upto(self, upto_id: int) -> list[PublishOutcome]:
        with self._lock:
            return [f for f in self._failures if f.id <= upto_id]

    def forget_failures(self, epoch: int) -> None:
        """Drop failures requeued at or below ``epoch``: every cut still to come has an
        epoch at least that high, so none of them can be refused by these."""
        with self._lock:
            self._failures = [
                f for f in self._failures if f.requeue_epoch is None or f.requeue_epoch > epoch
            ]

    def audit_upto(self, tenant: str, seq: int) -> list[_InFlight]:
        """Unsettled audit publishes of ``tenant`` holding an event at or below ``seq``."""
        with self._lock:
            return [
                i
                for i in self._items.values()
                if i.detached.partition.kind is ObjectKind.AUDIT
                and i.detached.partition.tenant == tenant
                and i.detached.partition.first_seq <= seq
            ]

    def pending_for(self, tenant: str) -> list[_InFlight]:
        """The unsettled publishes of ``tenant``'s partitions."""
        with self._lock:
            return [i for i in self._items.values() if i.detached.partition.tenant == tenant]

    def pending_upto(self, upto_id: int) -> list[_InFlight]:
        """The publishes registered at or before ``upto_id`` that have not settled."""
        with self._lock:
            return [i for k, i in self._items.items() if k <= upto_id]

    def mem_bytes(self) -> int:
        """What the rows of the unsettled publishes cost in memory."""
        with self._lock:
            return sum(i.detached.partition.mem_bytes for i in self._items.values())

    def partitions(self) -> list[Partition]:
        """The partitions of the publishes not settled yet."""
        with self._lock:
            return [i.detached.partition for i in self._items.values()]

    def unsettled_rows(self) -> tuple[int, int]:
        """(records rows, template events) in publishes not settled yet."""
        with self._lock:
            parts = [i.detached.partition for i in self._items.values()]
        return _rows_by_kind(parts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _rows_by_kind(parts: Sequence[Partition]) -> tuple[int, int]:
    records = sum(p.rows for p in parts if p.kind is ObjectKind.RECORDS)
    return records, sum(p.rows for p in parts if p.kind is ObjectKind.AUDIT)


def _halves(part: Partition) -> list[Partition] | None:
    """A records partition of more than one batch as two, each half of its batches
    (in order, the metadata shared, the size estimate shared by rows); None for one."""
    cols = part.records
    assert cols is not None
    batches = cols.batches
    if len(batches) < 2:
        return None
    out: list[Partition] = []
    rows = len(cols) or 1
    for chunk in (batches[: len(batches) // 2], batches[len(batches) // 2 :]):
        half = RecordColumns()
        for batch in chunk:
            half.append_batch(batch)
        p = dataclasses.replace(part, records=half, est_bytes=part.est_bytes * len(half) // rows)
        p.max_lsn = max(pc.max(b.column("wal_lsn")).as_py() for b in chunk)
        p.parked = True
        out.append(p)
    # the integer shares may fall short of the whole: the first half carries the rest
    out[0].est_bytes += part.est_bytes - sum(p.est_bytes for p in out)
    return out


class Buffers:
    """Record and audit partitions behind the sink lock (module docstring)."""

    def __init__(
        self,
        *,
        flush_bytes: int,
        clock: Callable[[], float],
        epoch: Callable[[], int],
        ceiling_bytes: int | None = None,
        max_object_bytes: int = MAX_OBJECT_BYTES,
    ) -> None:
        self.flush_bytes = flush_bytes
        #: the memory bound (module docstring); None: unbounded, nothing spills or waits
        self.ceiling_bytes = ceiling_bytes
        self.max_object_bytes = max_object_bytes
        self._clock = clock
        self._epoch = epoch
        self.lock = threading.Lock()  # the sink lock
        #: notified whenever rows leave memory (``wait_for_room``'s waiters)
        self._room = threading.Condition(self.lock)
        #: set when ``held_bytes`` passes the spill mark: the spiller's wake-up
        self.pressure = threading.Event()
        self._held = 0  # rows in memory: buffered and in unsettled publishes
        #: the highest ``held_bytes`` since start
        self.peak_held_bytes = 0
        #: turns that waited for room, for how long in all (seconds), and gave up waiting
        self.room_waits = 0
        self.room_wait_seconds = 0.0
        self.room_timeouts = 0
        self._records: dict[tuple[str, int], Partition] = {}
        self._audit: dict[tuple[str, int], Partition] = {}
        self._ids = itertools.count(1)
        self.in_flight = InFlight()
        self._last_id = 0
        self._bytes = 0  # bytes of buffered partitions as of their last append
        self._audit_seq: dict[str, int] = {}  # tenant -> template events accepted
        #: units published as themselves: records publishes requeued after an ambiguous
        #: failure, and sealed intent partitions (records and audit)
        self._units: list[Partition] = []
        #: (kind, tenant, day) -> an intent span's partition being filled (unsealed)
        self._staged: dict[tuple[ObjectKind, str, int], Partition] = {}
        #: tenant -> tree generation (a settlement's swap starts the next one)
        self._gen: dict[str, int] = {}
        #: tenant -> the lowest sequence number among template events a settlement
        #: superseded before they were durable (older generations only)
        self._lost_from: dict[str, int] = {}
        #: rows discarded because a settlement superseded them (dropped or fenced)
        self.superseded_rows = 0

    # -- appends (the ingest turn) -------------------------------------------------------

    def add_records(
        self,
        tenant: str,
        day: int,
        batch: pa.RecordBatch,
        *,
        wal_lsn: int,
        nbytes: int,
        staged: bool = False,
    ) -> Detached | None:
        """Append one frame's rows of one day (a ``RECORDS_SCHEMA`` batch whose rows all
        carry ``wal_lsn``); returns the partition, detached, when it reached
        ``flush_bytes`` (the size trigger). ``nbytes`` is the caller's estimate of the
        rows' size (the pipeline passes the frame's payload bytes). O(1) in the rows: the
        batch is kept as it is. ``staged``: the rows belong to an intent span (module
        docstring): its own partition, never size-triggered."""
        if batch.num_rows == 0:
            return None
        with self.lock:
            key = (tenant, day)
            part = (
                self._staged.get((ObjectKind.RECORDS, *key)) if staged else self._records.get(key)
            )
            if part is None:
                part = Partition(
                    ObjectKind.RECORDS, tenant, day, RecordColumns(), None, self._clock()
                )
                part.gen = self._gen.get(tenant, 0)
                if staged:
                    part.deterministic = True
                    self._staged[(ObjectKind.RECORDS, *key)] = part
                else:
                    self._records[key] = part
            cols = part.records
            assert cols is not None
            before = part.mem_bytes
            cols.append_batch(batch)
            part.max_lsn = max(part.max_lsn, wal_lsn)
            part.audit_watermark = self._audit_seq.get(tenant, 0)
            part.est_bytes += nbytes
            self._bytes += nbytes
            self._hold_locked(part.mem_bytes - before)
            if not staged and (
                part.est_bytes >= self.flush_bytes or part.mem_bytes >= self.max_object_bytes
            ):
                del self._records[key]
                return self._detach_locked(part, "size")
            return None

    def add_audit(
        self,
        tenant: str,
        events: Sequence[tuple[int, int, str, str, int]],  # id, version, template, change, time
        wal_lsn: int,
        staged: bool = False,
    ) -> list[Detached]:
        """Append template events, each to its tenant × UTC-day partition (the day of the
        event's time, as for records); returns the partitions the size trigger detached.
        ``staged``: events of an intent span (module docstring), never size-triggered."""
        out: list[Detached] = []
        if not events:
            return out
        with self.lock:
            seq = self._audit_seq.get(tenant, 0)
            for template_id, version, template, change, ts in events:
                seq += 1
                key = (tenant, ts // NANOS_PER_DAY)
                part = (
                    self._staged.get((ObjectKind.AUDIT, *key)) if staged else self._audit.get(key)
                )
                if part is None:
                    part = Partition(
                        ObjectKind.AUDIT, tenant, key[1], None, AuditColumns(), self._clock()
                    )
                    part.first_seq = seq
                    part.gen = self._gen.get(tenant, 0)
                    if staged:
                        part.deterministic = True
                        self._staged[(ObjectKind.AUDIT, *key)] = part
                    else:
                        self._audit[key] = part
                cols = part.audit
                assert cols is not None
                before, held = cols.nbytes, part.mem_bytes
                cols.append_row(tenant, template_id, version, template, change, wal_lsn, ts)
                part.max_lsn = max(part.max_lsn, wal_lsn)
                self._bytes += cols.nbytes - before
                self._hold_locked(part.mem_bytes - held)
                if not staged and cols.nbytes >= self.flush_bytes:
                    del self._audit[key]
                    out.append(self._detach_locked(part, "size"))
            self._audit_seq[tenant] = seq
        return out

    # -- the memory bound (module docstring) --------------------------------------------

    def _hold_locked(self, delta: int) -> None:
        """Rows entered (``delta`` > 0) or left memory; wakes the spiller past the mark
        and the turns waiting for room when rows left."""
        self._held += delta
        if self._held > self.peak_held_bytes:
            self.peak_held_bytes = self._held
        ceiling = self.ceiling_bytes
        if ceiling is None:
            return
        if delta > 0 and self._held >= self.spill_mark:
            self.pressure.set()
        elif delta < 0:
            self._room.notify_all()

    @property
    def spill_mark(self) -> int:
        """``held_bytes`` from which the spiller publishes or spools (3/4 of the ceiling)."""
        ceiling = self.ceiling_bytes
        return ceiling - ceiling // 4 if ceiling is not None else 1 << 62

    @property
    def spill_target(self) -> int:
        """What the spiller brings ``held_bytes`` down to once woken (half the ceiling)."""
        ceiling = self.ceiling_bytes
        return ceiling // 2 if ceiling is not None else 1 << 62

    @property
    def held_bytes(self) -> int:
        """Rows in memory: buffered, and in publishes not settled (module docstring)."""
        return self._held

    def wait_for_room(self, timeout: float = ROOM_WAIT_SECS) -> float:
        """Block while ``held_bytes`` is at ``ceiling_bytes`` and something can bring it
        down (a partition the spiller can take, or a publish under way that will settle);
        the ingest turn calls it before it buffers a frame, holding no lock, so the rows
        in memory stay under the ceiling plus one frame. After ``timeout`` seconds the
        turn goes on anyway (counted in ``room_timeouts``): a spool that cannot be
        written (a full volume, where admission refuses new batches already) must not
        stop the turns for good. Returns the seconds waited."""
        ceiling = self.ceiling_bytes
        if ceiling is None or self._held < ceiling:
            return 0.0
        started = time.monotonic()
        deadline = started + timeout
        with self._room:
            while self._held >= ceiling:
                if not self._spillable_locked() and not self.in_flight.mem_bytes():
                    break  # nothing can free memory: never wait for good (staged spans)
                left = deadline - time.monotonic()
                if left <= 0:
                    self.room_timeouts += 1
                    break
                self.pressure.set()
                self._room.wait(min(0.25, left))
        waited = time.monotonic() - started
        self.room_waits += 1
        self.room_wait_seconds += waited
        return waited

    def _spillable_locked(self) -> list[Partition]:
        """Partitions in memory the spiller may take: never a span still being staged."""
        return [
            p
            for p in itertools.chain(self._records.values(), self._audit.values(), self._units)
            if p.spool is None and p.rows
        ]

    def detach_for_spill(self) -> Detached | None:
        """The largest partition in memory, detached and registered (reason ``spill``)
        for the spiller, or None when memory is at or below the spill target or nothing
        can be taken."""
        with self.lock:
            if self._held <= self.spill_target:
                return None
            candidates = self._spillable_locked()
            if not candidates:
                return None
            part = max(candidates, key=lambda p: p.mem_bytes)
            if part.records is not None and self._records.get((part.tenant, part.day)) is part:
                del self._records[(part.tenant, part.day)]
            elif part.audit is not None and self._audit.get((part.tenant, part.day)) is part:
                del self._audit[(part.tenant, part.day)]
            else:
                self._units.remove(part)
            return self._detach_locked(part, "spill")

    def published(self, d: Detached) -> PublishOutcome:
        """``d`` is in the store: its rows leave memory (and its spool file the disk);
        settle it."""
        outcome = PublishOutcome(d.id, True)
        with self.lock:
            part = d.partition
            self._hold_locked(-part.mem_bytes)
            self._forget_locked(part)
            part.release_rows()
        self.in_flight.settle(outcome)
        return outcome

    def _forget_locked(self, part: Partition) -> None:
        """``part``'s rows are gone for good (published, dropped): remove its spool file."""
        if part.spool is not None:
            part.spool.discard()

    def _over_object_locked(self, part: Partition) -> bool:
        """Whether merging a requeued ``part`` into its buffered partition would pass
        ``max_object_bytes``."""
        key = (part.tenant, part.day)
        existing = (
            self._records.get(key) if part.kind is ObjectKind.RECORDS else self._audit.get(key)
        )
        return existing is not None and existing.mem_bytes + part.mem_bytes > self.max_object_bytes

    @property
    def spooled(self) -> tuple[int, int]:
        """(units, bytes) whose rows are spool files: buffered or in a publish."""
        with self.lock:
            units = [u for u in self._units if u.spool is not None]
        flying = [p for p in self.in_flight.partitions() if p.spool is not None]
        files = {id(p.spool): p.spool for p in [*units, *flying] if p.spool is not None}
        return len(files), sum(f.nbytes for f in files.values())

    def _detach_locked(self, part: Partition, reason: str) -> Detached:
        d = Detached(next(self._ids), part, self._epoch(), reason)
        self._last_id = d.id
        self._bytes -= part.nbytes
        self.in_flight.register(d)
        return d

    def pin(self, d: Detached, rematch: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        """Have ``d``'s records encoded through ``rematch`` (the tenant's template versions
        now: the caller holds the miner lock where the buffers hold every event the
        miner emitted), and raise its audit watermark to the tenant's events now, so the
        versions it names are published before its rows. A partition of an earlier tree
        of its tenant or of a tenant filling an intent span, an intent span's (named by
        its rows) or a spooled one (encoded already) keeps its rows as they are."""
        part = d.partition
        if part.kind is not ObjectKind.RECORDS or part.deterministic or part.spool is not None:
            return
        with self.lock:
            if part.gen < self._gen.get(part.tenant, 0) or any(
                k[0] is ObjectKind.AUDIT and a.tenant == part.tenant
                for k, a in self._staged.items()
            ):
                return  # an earlier tree's rows, or events of a span still being filled
            part.rematch = rematch
            part.audit_watermark = max(part.audit_watermark, self._audit_seq.get(part.tenant, 0))

    # -- detaching many (barrier, age sweep, shutdown) --------------------------------

    def drain_all(self, reason: str) -> list[Detached]:
        """Every buffered partition, audit first (template events land before the records
        that reference them: audit partitions, then audit units), then the records units
        (each alone, under its own name, before the rows that arrived after it), detached
        and registered in flight; what is staged is sealed first."""
        return self._drain(reason, lambda part: True)

    def seal_staged(self, tenant: str) -> int:
        """End ``tenant``'s intent span: its staged partitions become units (module
        docstring). Returns how many."""
        with self.lock:
            return self._seal_locked(lambda part: part.tenant == tenant)

    def _seal_locked(self, take: Callable[[Partition], bool]) -> int:
        sealed = [k for k, part in self._staged.items() if take(part)]
        for k in sealed:
            self._units.append(self._staged.pop(k))
        return len(sealed)

    def drain_tenant(self, tenant: str, reason: str) -> list[Detached]:
        """Every buffered partition of ``tenant`` (settlement's forced publish)."""
        return self._drain(reason, lambda part: part.tenant == tenant)

    def drain_aged(self, max_age: float) -> list[Detached]:
        now = self._clock()
        return self._drain("age", lambda part: now - part.first_at >= max_age)

    def _drain(self, reason: str, take: Callable[[Partition], bool]) -> list[Detached]:
        with self.lock:
            self._seal_locked(take)
            out: list[Detached] = []
            for key_a, part in list(self._audit.items()):
                if take(part):
                    del self._audit[key_a]
                    out.append(self._detach_locked(part, reason))
            kept: list[Partition] = []
            taken = [u for u in self._units if take(u)]
            for unit in self._units:
                if not take(unit):
                    kept.append(unit)
            for unit in sorted(taken, key=lambda u: u.kind is not ObjectKind.AUDIT):
                out.append(self._detach_locked(unit, reason))
            self._units = kept
            for key, part in list(self._records.items()):
                if take(part):
                    del self._records[key]
                    out.append(self._detach_locked(part, reason))
            return out

    # -- failures -----------------------------------------------------------------------

    def requeue(
        self,
        d: Detached,
        error_type: str,
        *,
        identity: str | None = None,
        claimed: bool = False,
        spooled: SpoolFile | None = None,
        split: bool = False,
    ) -> PublishOutcome | None:
        """Put a failed (or parked) publish's rows back, older rows first; settle it.

        ``claimed``: the caller holds ``d``'s claim (the publisher whose write failed).
        Anyone else (a park, an abandoned cut, a count) claims it here first; when another
        thread holds it or it has settled, nothing is put back (that thread settles it, or
        its rows are in the store or the buffers already) and None is returned.

        ``identity`` (an ambiguous failure: the store may hold the object) keeps the rows
        as their own unit under that name; a partition that already has one
        keeps it whatever the failure, since an earlier attempt may have landed.

        ``spooled``: the rows were written to this spool file (under ``identity``), so
        they leave memory and stay a unit of their own. ``split``: the encoded object
        was over ``max_object_bytes``; a records partition of more than one frame goes
        back as two units, each half of its batches (one without a name only)."""
        if not claimed and not self.in_flight.claim(d):
            return None
        with self.lock:
            epoch = self._epoch()
            part = d.partition
            if part.gen < self._gen.get(part.tenant, 0):
                # superseded by a settlement (module docstring): discarded, never back
                self.superseded_rows += part.rows
                if part.kind is ObjectKind.AUDIT:
                    self._lose_locked(part.tenant, part.first_seq)
                self._forget_locked(part)
                outcome = PublishOutcome(d.id, False, epoch, "superseded")
                self.in_flight.settle(outcome)
                return outcome
            if identity is not None and part.identity is None:
                part.identity = identity
            if spooled is not None and part.spool is None:
                # the rows are a file now (``sink.spool``): out of memory, under their name
                self._hold_locked(-part.mem_bytes)
                part.release_rows()
                part.spool = spooled
            if split and part.identity is None and part.records is not None:
                halves = _halves(part)
                if halves is not None:
                    self._units.extend(halves)
                    self._bytes += part.nbytes
                    outcome = PublishOutcome(d.id, False, epoch, error_type)
                    self.in_flight.settle(outcome)
                    return outcome
            if part.deterministic or part.identity is not None or part.spool is not None:
                self._units.append(part)
            elif self._over_object_locked(part):
                self._units.append(part)  # published as itself: merged, it would pass the bound
            elif part.kind is ObjectKind.RECORDS:
                key = (part.tenant, part.day)
                existing = self._records.get(key)
                if existing is not None:
                    assert part.records is not None and existing.records is not None
                    part.records.merge(existing.records)
                    self._bytes -= existing.nbytes
                    part.est_bytes += existing.est_bytes
                    part.max_lsn = max(part.max_lsn, existing.max_lsn)
                    part.audit_watermark = max(part.audit_watermark, existing.audit_watermark)
                    if part.rematch is None:
                        part.rematch = existing.rematch  # either map fits every row
                self._records[key] = part
            else:
                akey = (part.tenant, part.day)
                existing = self._audit.get(akey)
                if existing is not None:
                    assert part.audit is not None and existing.audit is not None
                    part.audit.merge(existing.audit)
                    self._bytes -= existing.nbytes
                    part.max_lsn = max(part.max_lsn, existing.max_lsn)
                    part.first_seq = min(part.first_seq, existing.first_seq)
                self._audit[akey] = part
            self._bytes += part.nbytes
            part.parked = True
            outcome = PublishOutcome(d.id, False, epoch, error_type)
        self.in_flight.settle(outcome)
        return outcome

    # -- write ordering (records never land ahead of their template events) ----------

    def audit_dependencies(self, d: Detached) -> tuple[list[Detached], bool]:
        """For a records publish: detach the tenant's buffered, never-refused audit
        partitions holding events at or below its watermark (the caller writes them
        first), and say whether a refused (parked) one holds such events — then the
        records are refused with it, as a failed audit half refuses its records."""
        part = d.partition
        w = part.audit_watermark
        taken: list[Detached] = []
        refused = False
        if w == 0:
            return taken, refused
        with self.lock:
            if part.gen < self._gen.get(part.tenant, 0) and w >= self._lost_from.get(
                part.tenant, w + 1
            ):
                return taken, True  # superseded, and some of its events were dropped
            for key, a in list(self._audit.items()):
                if a.tenant != part.tenant or a.first_seq > w:
                    continue
                if a.parked:
                    refused = True
                    continue
                del self._audit[key]
                taken.append(self._detach_locked(a, "ordered"))
            kept: list[Partition] = []
            for u in self._units:
                if u.kind is not ObjectKind.AUDIT or u.tenant != part.tenant or u.first_seq > w:
                    kept.append(u)
                elif u.parked:
                    refused = True
                    kept.append(u)
                else:
                    taken.append(self._detach_locked(u, "ordered"))
            self._units = kept
            if any(
                k[0] is ObjectKind.AUDIT and a.tenant == part.tenant and a.first_seq <= w
                for k, a in self._staged.items()
            ):
                refused = True  # an intent span still being filled: not publishable yet
        return taken, refused

    def audit_pending(self, tenant: str, seq: int, gen: int | None = None) -> bool:
        """Whether an event of ``tenant`` at or below ``seq`` is not yet durable: still
        buffered or in an unsettled publish — or, for rows of an older generation
        ``gen``, superseded by a settlement before it was durable (never will be)."""
        if seq == 0:
            return False
        with self.lock:
            if (
                gen is not None
                and gen < self._gen.get(tenant, 0)
                and seq >= self._lost_from.get(tenant, seq + 1)
            ):
                return True
            waiting = [
                *self._audit.values(),
                *(u for u in self._units if u.kind is ObjectKind.AUDIT),
                *(a for k, a in self._staged.items() if k[0] is ObjectKind.AUDIT),
            ]
            if any(a.tenant == tenant and a.first_seq <= seq for a in waiting):
                return True
        return bool(self.in_flight.audit_upto(tenant, seq))

    def _lose_locked(self, tenant: str, first_seq: int) -> None:
        lost = self._lost_from.get(tenant)
        if lost is None or first_seq < lost:
            self._lost_from[tenant] = first_seq

    def drop_tenant(self, tenant: str) -> int:
        """Drop every buffered row of ``tenant`` (records, units and template events) and
        start its next generation: settlement's handoff, in the section that swaps its
        tree (module docstring). Returns the rows dropped."""
        with self.lock:
            self._gen[tenant] = self._gen.get(tenant, 0) + 1
            for a in [
                *self._audit.values(),
                *(u for u in self._units if u.kind is ObjectKind.AUDIT),
                *(p for k, p in self._staged.items() if k[0] is ObjectKind.AUDIT),
            ]:
                if a.tenant == tenant:
                    self._lose_locked(tenant, a.first_seq)
            dropped = self._discard_locked(tenant)
            self.superseded_rows += dropped
            return dropped

    def discard_tenant(self, tenant: str) -> int:
        """Drop a tenant's buffered rows; returns how many."""
        with self.lock:
            return self._discard_locked(tenant)

    def _discard_locked(self, tenant: str) -> int:
        gone: list[Partition] = []
        kept: list[Partition] = []
        for unit in self._units:
            (gone if unit.tenant == tenant else kept).append(unit)
        self._units = kept
        gone.extend(self._records.pop(k) for k in [k for k in self._records if k[0] == tenant])
        gone.extend(self._audit.pop(k) for k in [k for k in self._audit if k[0] == tenant])
        gone.extend(self._staged.pop(k) for k in [k for k in self._staged if k[1] == tenant])
        dropped = 0
        for part in gone:
            dropped += part.rows
            self._bytes -= part.nbytes
            self._hold_locked(-part.mem_bytes)
            self._forget_locked(part)
        return dropped

    # -- state ---------------------------------------------------------------------------

    @property
    def last_id(self) -> int:
        """The id of the most recently detached partition (0 when none)."""
        with self.lock:
            return self._last_id

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def unpublished_rows(self) -> tuple[int, int]:
        """(records rows, template events) not known durable in the store: buffered, or
        in a publish that has not settled (a thread still writing it, or one that never
        will — what a shutdown must report, since only the WAL holds them)."""
        with self.lock:
            parts = [
                *self._records.values(),
                *self._audit.values(),
                *self._units,
                *self._staged.values(),
            ]
            buffered = _rows_by_kind(parts)
        flying = self.in_flight.unsettled_rows()
        return buffered[0] + flying[0], buffered[1] + flying[1]

    @property
    def parked_partitions(self) -> int:
        """Buffered partitions that a failed or refused publish put back."""
        with self.lock:
            return (
                sum(1 for p in self._records.values() if p.parked)
                + sum(1 for p in self._audit.values() if p.parked)
                + sum(1 for u in self._units if u.parked)
            )

    @property
    def partitions(self) -> int:
        with self.lock:
            return len(self._records) + len(self._audit) + len(self._units) + len(self._staged)

    def empty(self) -> bool:
        with self.lock:
            return not self._records and not self._audit and not self._units and not self._staged

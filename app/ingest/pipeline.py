"""The ingest pipeline: admission → WAL append → group-commit wait → the ingest turn in
commit order → acknowledge.

Lock order, always (DESIGN.md §5.3): admission mutex (released before the journal) →
ingest gate (turn order) → barrier exclusion (a reader–writer lock: turns and the age
sweep shared, the barrier's cut capture exclusive) → miner lock → sink lock →
last_durable. The journal mutex is the WAL's own and is never held across store I/O;
no store I/O happens under the exclusion or inside a turn.

The turn runs in commit order (the journal's sequence), which is the order replay
feeds frames, so a tenant's miner sees the same frames in the same order live and on
recovery. Inside it: mine the batch's bodies, emit template events to the audit
buffers, append the rows to the record buffers, and set ``last_durable`` to this
turn's own frame end — never the fsync's EOF (RFC 0052 §3.1). A failed append or sync
still passes its turn (with nothing to ingest), so the gate never stalls on it.

Before the append, under the admission mutex (``app.ingest.tenants``): a settling or
unrecoverable tenant is refused, and a tenant not yet held takes a slot (refused at
``max_tenants``); after the turn, with nothing else held, the slot's transition is
recorded. A mining failure inside a turn records an unmined entry (``app.ingest.settlement``)
instead of latching the barrier: the frame is durable and acknowledged, the mark is
clamped below it, and the tenant is rebuilt by settlement.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, NamedTuple

import pyarrow as pa

from app import points
from app.base.batch import FlatBatch
from app.base.gc_policy import collection_deferred
from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge, Unavailable
from app.ingest.admission import Admission
from app.ingest.cuts import Cut
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.rematch import VersionMap
from app.ingest.mining.tenant_miner import MineResult, TemplateEvent, TenantMiner
from app.ingest.settle_parts import SettleParts, SettleSchedule
from app.ingest.settlement import (
    DEFAULT_MINING_ATTEMPTS,
    ReplayGates,
    Settler,
    UnminedEntry,
    UnminedSet,
)
from app.ingest.shares import TurnShares
from app.ingest.snapshot_store import SnapshotLedger, SnapshotState
from app.ingest.tenants import Reservation, TenantTable, TenantUnrecoverable, TurnResult
from app.receive.api import IngestOutcome
from app.threads import Supervisor
from sink.buffers import NANOS_PER_DAY, Buffers, Detached
from sink.parquet import assemble_records
from sink.publisher import Publisher
from wal import (
    AppendError,
    ErrorClass,
    Frame,
    FrameRejected,
    FrameSpan,
    FrameTooLarge,
    Journal,
    Pending,
    PublishedMarks,
    RotationExhausted,
    WalOffset,
)
from wal.segment import uuid7_time

log = logging.getLogger("ourios.pipeline")

#: The latch's clear value: no cut has failed (RFC 0052 §3.1's sentinel).
LATCH_CLEAR: Final = 2**63


class ReadWriteLock:
    """Shared for ingest turns and the age sweep, exclusive for a cut's capture.

    Writer-preferring: once a capture waits, new shared holders wait behind it, so a
    cut is never starved by a stream of turns."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class TurnGate:
    """Runs turns strictly in the journal's commit sequence. Each waiting turn has its
    own lock, so finishing a turn wakes exactly the next one (no thundering herd)."""

    def __init__(self, first_seq: int = 1) -> None:
        self._lock = threading.Lock()
        self._next = first_seq
        self._waiting: dict[int, threading.Lock] = {}

    def enter(self, seq: int) -> None:
        with self._lock:
            if self._next == seq:
                return
            if seq < self._next:
                raise RuntimeError(f"turn {seq} entered after turn {self._next - 1} finished")
            wake = threading.Lock()
            wake.acquire()
            self._waiting[seq] = wake
        wake.acquire()

    def leave(self, seq: int) -> None:
        with self._lock:
            if seq != self._next:
                raise RuntimeError(f"turn {seq} left while turn {self._next} is current")
            self._next = seq + 1
            wake = self._waiting.pop(self._next, None)
        if wake is not None:
            wake.release()

    @property
    def next_seq(self) -> int:
        with self._lock:
            return self._next


@dataclass
class PipelineState:
    """What the turn leaves behind for the barrier (read under the exclusion)."""

    last_durable: WalOffset | None = None
    #: tenant -> the end of the last frame its miner folded (its own horizon)
    folded: dict[str, WalOffset] | None = None


@dataclass(slots=True)
class Ticket:
    """One request between its stages: appended, then durable (or failed), then turned."""

    tenant: str
    batch: FlatBatch
    nbytes: int  # the frame's payload bytes (the buffers' size estimate)
    reservation: Reservation | None
    pending: Pending
    offset: WalOffset | None = None
    error: AppendError | None = None
    #: the work reserved against the tenant's turn share, settled at its turn
    estimate: float = 0.0


class Pipeline:
    """Implements ``app.receive.api.IngestPort`` for the receivers."""

    def __init__(
        self,
        journal: Journal,
        miners: MinerCluster,
        buffers: Buffers,
        publisher: Publisher,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        ledger: SnapshotLedger | None = None,
        admission: Admission | None = None,
        mining_attempts: int = DEFAULT_MINING_ATTEMPTS,
        shares: TurnShares | None = None,
        threads: Supervisor | None = None,
        schedule: SettleSchedule | None = None,
    ) -> None:
        self.journal = journal
        self.admission = admission or Admission()
        self.miners = miners
        self.buffers = buffers
        self.publisher = publisher
        #: monotonic: a cut's capture time and the settling hint's countdown are ages
        self.clock = clock
        #: the node's supervised threads: one that stopped makes the node not alive
        self._threads = threads
        self._events = events or (lambda name, fields: None)
        self.gate = TurnGate()
        self.exclusion = ReadWriteLock()
        self.miner_lock = threading.Lock()
        self._durable_lock = threading.Lock()
        #: the mark: the latest acknowledged offset, clamped below every unmined entry
        self._last_durable: WalOffset | None = None
        #: the latest acknowledged turn's own frame end, unclamped
        self._latest: WalOffset | None = None
        #: tenant slots and admission states; its lock is the admission mutex
        self.tenants = TenantTable(journal.config.max_tenants)
        #: frames whose mining raised, until settlement rebuilds their tenants
        self.unmined = UnminedSet()
        #: tenants refused as unrecoverable, and why; replaced whole by the settler (turns
        #: read them under the miner lock, where the admission mutex may not be taken)
        self.refused: frozenset[str] = frozenset()
        self.refused_details: Mapping[str, str] = {}
        self.folded: dict[str, WalOffset] = {}
        #: tenants whose intent span recovery's replay is buffering staged (unsealed)
        self._staging: set[str] = set()
        #: barrier epoch: the number of the next cut (incremented at each capture)
        self.epoch = 1
        #: the lowest epoch a failure invalidated (LATCH_CLEAR when none)
        self.failed_epoch = LATCH_CLEAR
        self._ready = False
        self.records_mined = 0
        #: durable snapshot installs: a tenant whose folded horizon moved past its
        #: installed one is frozen at the next capture
        self.ledger = ledger if ledger is not None else SnapshotLedger()
        #: the barrier's hand-off of a cut a turn captured at a rotation (None: no
        #: barrier, the rotation is left to the next timer cut)
        self.on_rotation: Callable[[Cut], None] | None = None
        #: tenant -> (the cut waiting for its state, the horizon it was frozen at)
        self._frozen: dict[str, tuple[Cut, WalOffset]] = {}
        #: how long each capture held the exclusion (seconds): the latest ones, and an
        #: observer the metrics install
        self.cut_stall_seconds: deque[float] = deque(maxlen=4096)
        self.on_cut_stall: Callable[[float], None] | None = None
        self.settler = Settler(self._settle_parts(schedule), max_attempts=mining_attempts)
        #: each tenant's share of the turn (None: unbounded); ``_turn`` leaves the work
        #: of the batch it mined and the seconds its mining took in ``_work`` and
        #: ``_mined_secs`` for ``turn_and_finish`` to charge
        self.shares = shares
        self._work = 0
        self._mined_secs = 0.0

    def _settle_parts(self, schedule: SettleSchedule | None) -> SettleParts:
        """What the settler works with, handed to it here (``app.ingest.settle_parts``)."""
        return SettleParts(
            journal=self.journal,
            miners=self.miners,
            buffers=self.buffers,
            in_flight=self.buffers.in_flight,
            publisher=self.publisher,
            ledger=self.ledger,
            tenants=self.tenants,
            unmined=self.unmined,
            exclusion=self.exclusion,
            miner_lock=self.miner_lock,
            folded=self.folded,
            pipeline=self,
            clock=self.clock,
            schedule=schedule or SettleSchedule(),
            events=self._events,
        )

    # -- the receivers' interface --------------------------------------------------------

    @property
    def ready(self) -> bool:
        return (
            self._ready
            and not isinstance(self.journal.rotation_state, RotationExhausted)
            and self.alive
        )

    @property
    def alive(self) -> bool:
        """False once a supervised thread stopped for good (``app.threads``): /healthz
        fails so the pod is restarted."""
        return self._threads is None or self._threads.healthy

    @property
    def health_detail(self) -> str:
        """Why the node is not alive ("" while it is): the stopped threads, named."""
        return "" if self._threads is None else self._threads.verdict()

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        """Append, wait for the covering fsync, run the turn; raises an ``IngestRejection``
        when nothing was acknowledged. The three stages on the caller's thread (the
        in-process receivers); the core's ``app.ingest.stages`` runs them on its own threads."""
        ticket = self.admit_and_append(tenant, payload, batch)
        self.await_durable(ticket)
        return self.turn_and_finish(ticket)

    def admit_and_append(self, tenant: str, payload: bytes, batch: FlatBatch) -> Ticket:
        """Stage 1: admission, then the WAL append; raises an ``IngestRejection`` when
        refused (nothing written).

        Order of the checks (RFC 0055 §9.5): an oversize batch is TooLarge and a terminal
        WAL reports the WAL's state before any tenant state; then the tenant's admission
        state and slot (admission mutex, released before the journal); then the bounds."""
        limit = self.journal.config.max_frame_bytes
        if len(payload) > limit:
            raise PayloadTooLarge(limit)
        reservation: Reservation | None = None
        estimate = 0.0
        if not isinstance(self.journal.rotation_state, RotationExhausted):
            hint = self.settler.retry_after(tenant)
            try:
                reservation = self.tenants.admit(tenant, hint)  # a refusal writes nothing
            except Unavailable as refusal:
                refusal.records = len(batch)
                raise
        try:
            try:
                self.admission.check(tenant, len(payload))  # the bounds: refusing writes nothing
                if self.shares is not None:
                    estimate = self.shares.admit(tenant, len(batch))  # the tenant's turn share
            except IngestRejection as exc:
                exc.records = len(batch)  # the refused-records counter
                raise
            try:
                pending = self.journal.append_batch(tenant, payload)
            except FrameTooLarge as exc:
                raise PayloadTooLarge(exc.limit) from exc
            except FrameRejected as exc:
                raise BadRequest(str(exc)) from exc
            except AppendError as exc:
                raise _unavailable(exc, len(batch)) from exc
        except BaseException:
            if reservation is not None:
                self.tenants.finish(reservation, TurnResult.NO_FRAME)
            if estimate and self.shares is not None:
                self.shares.release(tenant, estimate)
            raise
        points.hit("ingest.appended")
        return Ticket(tenant, batch, len(payload), reservation, pending, estimate=estimate)

    def await_durable(self, ticket: Ticket) -> None:
        """Stage 2: wait for the fsync covering the ticket's frame (group commit)."""
        try:
            ticket.offset = ticket.pending.wait().offset
        except AppendError as exc:
            ticket.error = exc

    def refusal_of(self, ticket: Ticket) -> IngestRejection:
        """What the client of a ticket whose sync failed is told (``ticket.error``)."""
        assert ticket.error is not None
        return _unavailable(ticket.error, len(ticket.batch))

    def turn_and_finish(self, ticket: Ticket) -> IngestOutcome:
        """Stage 3, in commit order: the turn (a failed sync passes its turn with nothing
        to ingest, so the turns behind it never stall), then the slot's transition;
        raises the refusal when nothing was acknowledged."""
        tenant, batch = ticket.tenant, ticket.batch
        result = TurnResult.FRAME_LEFT
        try:
            seq = ticket.pending.seq
            self.gate.enter(seq)
            try:
                self._work = 0
                self._mined_secs = 0.0
                if ticket.offset is not None:
                    result = self._turn(
                        tenant, batch, ticket.offset, ticket.nbytes, ticket.pending.span
                    )
            finally:
                work, mined_secs = self._work, self._mined_secs
                self.gate.leave(seq)
                if self.shares is not None and ticket.estimate:
                    self.shares.charge(tenant, ticket.estimate, work, len(batch), mined_secs)
        finally:
            # The slot's transition, with nothing else held (RFC 0055 §9.1).
            if ticket.reservation is not None:
                self.tenants.finish(ticket.reservation, result)
            if result is TurnResult.UNMINED:
                # refused until settled — unless a settler got there first
                self.tenants.set_settling(tenant, True, still=lambda: self.unmined.has(tenant))
        if ticket.error is not None:
            raise _unavailable(ticket.error, len(batch)) from ticket.error
        return IngestOutcome(records=len(batch))

    # -- the turn ------------------------------------------------------------------------

    def _refused(self, tenant: str) -> TenantUnrecoverable:
        detail = self.refused_details.get(tenant, "see the tenant.unrecoverable event")
        return TenantUnrecoverable(tenant, detail)

    def _turn(
        self, tenant: str, batch: FlatBatch, offset: WalOffset, nbytes: int, span: FrameSpan
    ) -> TurnResult:
        """Mine, buffer, and advance the mark — no store I/O (publishes are queued)."""
        if tenant in self.refused:
            raise self._refused(tenant)
        if self.unmined.has(tenant):
            # An earlier frame of this tenant is unmined: settle it before this batch (or
            # wait for the settler that holds the claim), so this frame is mined against
            # the rebuilt tree and nothing overtakes the gap. Never under the exclusion.
            points.hit("turn.settling")
            self.settler.settle(tenant, force_publish=False)
        # The memory bound (DESIGN.md §5.12): no lock held, so the spiller and the cuts
        # go on while this turn waits for room.
        self.buffers.wait_for_room()
        detached: list[Detached] = []
        with self.exclusion.shared():
            prev = self._last_durable
            on_rotation = self.on_rotation
            if prev is not None and prev.segment != offset.segment and on_rotation is not None:
                # This turn observed the rotation: capture a cut at the closed segment's
                # mark (the previous turn's own frame end) and hand it to the barrier
                # thread. Capture only: the store I/O runs there.
                started = time.perf_counter()
                with collection_deferred():
                    cut = self.capture_cut_locked("rotation")
                self.record_cut_stall(time.perf_counter() - started)
                on_rotation(cut)
            points.hit("turn.before_mine")
            with self.miner_lock:
                # Re-tested under the miner lock (a settler refuses a tenant inside the
                # exclusion, so a turn either ran wholly before it or sees it here).
                if tenant in self.refused:
                    raise self._refused(tenant)
                if self.unmined.has(tenant):
                    # settlement failed just now: the tree is still the discarded one
                    self._record_unmined(
                        tenant, span, offset, "an earlier frame is unmined", failed=False
                    )
                    return TurnResult.UNMINED
                if tenant in self._frozen:
                    self._serialize_locked(tenant)
                started = time.thread_time()
                try:
                    result = self.miners.mine(tenant, batch.bodies)
                except Exception as exc:  # noqa: BLE001 - the frame is durable; settled
                    self._record_unmined(tenant, span, offset, f"{type(exc).__name__}: {exc}")
                    return TurnResult.UNMINED
                self._work = result.work
                # the turn thread's CPU time, which it spent holding the GIL: not wall
                # time, which counts its own waits for the GIL (receivers in this process)
                self._mined_secs = time.thread_time() - started
                # Buffered under the miner lock too, so whoever pins template versions
                # (the age sweep) never sees a tree ahead of the buffered events.
                try:
                    detached.extend(self._buffer(tenant, batch, result, offset, nbytes))
                except Exception as exc:  # noqa: BLE001 - mined but not emitted: settled
                    # The tree took the batch and its rows and events are partly buffered:
                    # the same unknown state as a failure inside mining (RFC 0055 §9.4).
                    self._record_unmined(tenant, span, offset, f"{type(exc).__name__}: {exc}")
                    return TurnResult.UNMINED
                self.pin_versions_locked(detached)
            with self._durable_lock:
                self._latest = offset
                self._recompute_durable_locked()
                self.folded[tenant] = offset
            self.records_mined += len(batch)
        for d in detached:
            if not self.publisher.offer(d):
                self.publisher.park(d)
        return TurnResult.MINED

    def _record_unmined(
        self, tenant: str, span: FrameSpan, offset: WalOffset, why: str, *, failed: bool = True
    ) -> None:
        """The turn's mining (or its emit) raised, under the shared exclusion (a settler's
        claim takes it exclusively): the frame is durable, so record an unmined entry
        clamped at the previous acknowledged offset (RFC 0055 §9.4). ``failed``: the
        failure was this frame's own (its first attempt), not an earlier frame's."""
        if failed:
            self.settler.note_failure(tenant, offset, why)
        with self._durable_lock:
            entry = UnminedEntry(span, tenant, self._latest)
            self.unmined.add(entry)
            self._recompute_durable_locked()
        self._events(
            "tenant.settling",
            {
                "tenant": tenant,
                "frame": str(offset),
                "clamp": None if entry.clamp is None else str(entry.clamp),
                "error": why,
            },
        )
        log.error(
            "mining failed for tenant %r at %s (%s): the frame is durable; the tenant is "
            "settled by a rebuild and the mark is held at %s meanwhile",
            tenant,
            offset,
            why,
            entry.clamp,
        )

    def recompute_durable(self) -> None:
        with self._durable_lock:
            self._recompute_durable_locked()

    def _recompute_durable_locked(self) -> None:
        """``last_durable = min(latest, clamp)`` while any entry clamps (None stays None)."""
        clamped, clamp = self.unmined.clamp()
        latest = self._latest
        if not clamped:
            self._last_durable = latest
        elif clamp is None or latest is None:
            self._last_durable = None
        else:
            self._last_durable = latest if latest.lsn <= clamp.lsn else clamp

    def refuse_tenant(self, tenant: str, detail: str) -> None:
        """The settler refuses ``tenant`` as unrecoverable (it holds the exclusion and the
        miner lock); both are replaced whole, since turns read them without a lock."""
        self.refused_details = {**self.refused_details, tenant: detail}
        self.refused = self.refused | {tenant}

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> None:
        """Settlement's swap (miner lock held): install the rebuilt tree."""
        self.miners.replace_tenant(tenant, miner)
        self._frozen.pop(tenant, None)

    def _buffer(
        self, tenant: str, batch: FlatBatch, result: MineResult, offset: WalOffset, nbytes: int
    ) -> list[Detached]:
        out = self.buffer_audit(tenant, batch, result, offset)
        out.extend(self.buffer_records(tenant, batch, result, offset, nbytes))
        return out

    def buffer_audit(
        self,
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
            return self.buffers.add_audit(tenant, events, offset.lsn)
        known = [e for e in events if staged(e[0])]
        out = self.buffers.add_audit(tenant, [e for e in events if not staged(e[0])], offset.lsn)
        self.buffers.add_audit(tenant, known, offset.lsn, staged=True)
        return out

    def buffer_records(
        self,
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
            d = self.buffers.add_records(
                tenant, day, part, wal_lsn=lsn, nbytes=share, staged=staged
            )
            if d is not None:
                out.append(d)
        return out

    # -- the barrier's side --------------------------------------------------------------

    def pin_versions_locked(self, detached: list[Detached]) -> None:
        """Pin each records partition of ``detached`` to its tenant's template versions
        now (``VersionMap``: O(1) per partition), so its rows are encoded re-matched to
        them (DESIGN.md §3 "Template versions of a record"). The caller holds the miner
        lock at a point where the buffers hold every event the miners emitted: a cut's
        capture (the versions at its mark), a turn or a replayed frame after its
        buffering, the age sweep, the recovery's publish. Never to a tree a failure left
        (an unmined entry, a refused tenant, a failed miner): it may hold versions whose
        events were never buffered."""
        records = [d for d in detached if d.partition.records is not None]
        if not records:
            return
        unsettled = self.unmined.tenants() | self.refused
        for d in records:
            tenant = d.partition.tenant
            miner = self.miners.get(tenant)
            if miner is not None and not miner.failed and tenant not in unsettled:
                self.buffers.pin(d, VersionMap(miner.versions(), miner.mined_tokens))

    def record_cut_stall(self, seconds: float) -> None:
        self.cut_stall_seconds.append(seconds)
        if self.on_cut_stall is not None:
            self.on_cut_stall(seconds)

    def capture_cut_locked(self, reason: str) -> Cut:
        """Capture a cut. The caller holds the exclusion exclusively, or is the ingest
        turn (the gate keeps every other turn out): no turn is mining or buffering."""

        epoch = self.epoch
        batches = self.buffers.drain_all("barrier")  # registered in flight at ``epoch``
        mark = self._last_durable
        cut = Cut(epoch, mark, batches, self.buffers.last_id, reason, captured_at=self.clock())
        self.epoch = epoch + 1  # a publish registered from now on belongs to later cuts
        installed = self.ledger.horizons()
        # No snapshot of a tenant with an unmined entry (its live tree is unknown) or of
        # an unrecoverable one (RFC 0055 §9.4).
        unsettled = self.unmined.tenants() | self.refused
        with self.miner_lock:
            self.pin_versions_locked(batches)
            for tenant, horizon in self.folded.items():
                done = installed.get(tenant)
                if done is not None and done.lsn >= horizon.lsn:
                    continue
                if tenant in unsettled:
                    continue
                if tenant in self._frozen:
                    self._serialize_locked(tenant)  # into the earlier, still pending cut
                self._frozen[tenant] = (cut, horizon)
                cut.frozen.add(tenant)
        return cut

    def _serialize_locked(self, tenant: str) -> None:
        """Serialise a frozen tenant's miner into the cut waiting for it (miner lock)."""
        cut, horizon = self._frozen.pop(tenant)
        cut.frozen.discard(tenant)
        miner = self.miners.get(tenant)
        if miner is None:
            return
        try:
            state = miner.to_snapshot()
        except Exception as exc:  # noqa: BLE001 - a failed miner has no snapshot
            log.warning("no snapshot for tenant %r: %s", tenant, exc)
            return
        cut.snaps[tenant] = SnapshotState(tenant, horizon, state)

    def serialize_frozen(self, cut: Cut) -> None:
        """The barrier thread serialises what no turn has yet, one tenant at a time."""
        for tenant in list(cut.frozen):
            with self.miner_lock:
                entry = self._frozen.get(tenant)
                if entry is not None and entry[0] is cut:
                    self._serialize_locked(tenant)

    def move_frozen(self, src: Cut, dst: Cut) -> None:
        """Coalescing: tenants frozen for ``src`` now serialise into ``dst``."""
        with self.miner_lock:
            for tenant in list(src.frozen):
                entry = self._frozen.get(tenant)
                if entry is not None and entry[0] is src:
                    self._frozen[tenant] = (dst, entry[1])
                    dst.frozen.add(tenant)
                    dst.snaps.pop(tenant, None)  # latest wins
            src.frozen.clear()

    def abandon_cut(self, cut: Cut, why: str) -> None:
        """A cut that will not run: its batches go back into the buffers (epoch-dated
        requeues) and its snapshots are discarded."""
        for d in cut.batches:
            self.buffers.requeue(d, why)
        with self.miner_lock:
            for tenant in list(cut.frozen):
                entry = self._frozen.get(tenant)
                if entry is not None and entry[0] is cut:
                    del self._frozen[tenant]
            cut.frozen.clear()
        cut.snaps.clear()
        cut.batches = []

    def prior_publishes_ok(self, cut: Cut) -> bool:
        """Settle every publish registered before the capture (not the cut's own) and
        refuse the cut when one requeued at an epoch above the cut's: its rows were not in
        the cut's drain. A failure requeued before the capture is in the cut.

        ``Publisher.publish`` writes one that no thread is writing yet (queued for the
        publisher thread, detached by a turn and not yet offered) on this thread, and
        waits, bounded, for one another thread is writing; one still unsettled after
        that refuses the cut (the next cut settles it)."""
        own = cut.own_ids
        unsettled = False
        for item in self.buffers.in_flight.pending_upto(cut.prior_upto):
            if item.detached.id in own:
                continue
            self.publisher.publish(item.detached)
            unsettled = unsettled or item.outcome is None
        if unsettled:
            return False
        for failure in self.buffers.in_flight.failures_upto(cut.prior_upto):
            if failure.id in own:
                continue
            if failure.requeue_epoch is not None and failure.requeue_epoch > cut.epoch:
                return False
        return True

    def publish_all_now(self, reason: str) -> bool:
        """Publish everything: drain the buffers and publish on this thread, then wait for
        every publish already registered (the size trigger's, queued for the publisher
        thread). True only when all of it reached the store and nothing was requeued —
        recovery installs snapshots above X on that alone."""
        with self.exclusion.exclusive():
            detached = self.buffers.drain_all(reason)  # seals every intent span staged
            upto = self.buffers.last_id
            self._staging.clear()
            with self.miner_lock:
                self.pin_versions_locked(detached)
        ok = True
        for d in detached:
            ok = self.publisher.publish(d).ok and ok
        for item in self.buffers.in_flight.pending_upto(upto):
            ok = self.publisher.publish(item.detached).ok and ok  # written here, or awaited
        return ok and self.buffers.empty()

    def forget_failures_before(self, epoch: int) -> None:
        self.buffers.in_flight.forget_failures(epoch)

    # -- recovery's entry ------------------------------------------------------------------

    def replay_frame(
        self,
        tenant: str,
        batch: FlatBatch,
        offset: WalOffset,
        *,
        publish_records: bool,
        publish_audit: bool,
        nbytes: int = 0,
        is_fresh: Callable[[int], bool] | None = None,
        intent: bool = False,
        landed_days: frozenset[int] = frozenset(),
        landed_event: Callable[[int, int], bool] | None = None,
    ) -> ReplayCounts:
        """Feed a replayed frame (above the tenant's snapshot horizon) to its miner;
        forward its rows only when ``publish_records`` and the template events it
        regenerates only when ``publish_audit`` — except an event of a template this
        replay minted afresh (``is_fresh`` of its id: above the allocator's high-water at
        start): no published event binds that id, so it is forwarded once whatever the
        gate (RFC0052.10's 2026-10-06 amendment). Returns (records, events) suppressed.

        ``intent``: the frame lies in the span of the tenant's unconfirmed settlement
        intent (RFC 0055 §9.4): what it forwards is staged as the settlement staged it —
        its records, and the events of ids not minted by this replay — so the span is
        republished under the names the settlement's attempt used (``sink.buffers``).
        The tenant's first frame past the span seals it.

        ``landed_days`` and ``landed_event`` (``app.ingest.landed``): what an object
        published before the restart already holds of this frame — its rows of those
        UTC days, those template events (by id and version; never an id this replay
        minted) — and is therefore not forwarded again, whatever the gates say."""
        if intent:
            self._staging.add(tenant)
        elif tenant in self._staging:
            self._staging.discard(tenant)
            self.buffers.seal_staged(tenant)
        self.buffers.wait_for_room()  # a replay re-derives the spool under the same bound
        # Mined and buffered under the miner lock, as a turn is (``pin_versions_locked``).
        with self.miner_lock:
            result = self.miners.mine(tenant, batch.bodies)
            self.folded[tenant] = offset
            detached: list[Detached] = []
            counts = ReplayCounts(0 if publish_records else len(batch), 0, 0, 0)
            if result.events:
                forwarded: list[TemplateEvent] = []
                gated = landed = 0
                for e in result.events:
                    if is_fresh is not None and is_fresh(e.template_id):
                        forwarded.append(e)  # minted by this replay: no stored event binds it
                    elif landed_event is not None and landed_event(e.template_id, e.version):
                        landed += 1
                    elif publish_audit:
                        forwarded.append(e)
                    else:
                        gated += 1
                if gated or landed:
                    result = dataclasses.replace(result, events=forwarded)
                counts = counts._replace(events=gated + landed, events_landed=landed)
                known = (
                    (lambda tid: not is_fresh(tid)) if is_fresh is not None else (lambda tid: True)
                )
                detached.extend(
                    self.buffer_audit(tenant, batch, result, offset, known if intent else None)
                )
            if publish_records:
                if landed_days:
                    skipped = _rows_in_days(batch, offset, landed_days)
                    counts = counts._replace(records=skipped, records_landed=skipped)
                detached.extend(
                    self.buffer_records(
                        tenant, batch, result, offset, nbytes, staged=intent, skip_days=landed_days
                    )
                )
            self.pin_versions_locked(detached)
        for d in detached:
            if not self.publisher.offer(d):
                self.publisher.park(d)
        return counts

    def cut_frontiers(self, mark: WalOffset) -> dict[str, PublishedMarks]:
        """The frontiers a cut stamping ``mark`` writes to PUBLISHED: the mark for every
        tenant but an unrecoverable one, and but one whose start-up replay failed and
        which is not settled yet — its rows above the replay's gates were dropped with
        its tree and are re-emitted only by its settlement, so its frontier stays where
        the replay found it (the mark may be above: the clamp is the checkpoint)."""
        skip = self.refused | self.unmined.replayed()
        return {t: PublishedMarks(mark, mark) for t in self.miners.tenants() if t not in skip}

    def replay_failed(
        self,
        frame: Frame,
        exc: BaseException,
        gates: ReplayGates,
        clamp: WalOffset | None,
    ) -> None:
        """Recovery's guard: mining (or emitting) a replayed frame raised. As in a turn,
        the frame becomes an unmined entry (clamped at ``clamp``, the checkpoint) and the
        tenant is settled after the start, its attempts bounded, so a frame that fails
        every time is isolated instead of failing every start. The tenant's tree is
        unknown now: its buffered rows are dropped (the settlement re-emits them above
        ``gates``, which is what this replay publishes above) and nothing more of it is
        mined here (``replay_deferred``)."""
        tenant = frame.tenant
        why = f"{type(exc).__name__}: {exc}"
        self.settler.note_failure(tenant, frame.offset, why)
        with self.exclusion.exclusive():
            with self.miner_lock:
                self.buffers.drop_tenant(tenant)  # what it staged too: its settlement re-stages
        self._staging.discard(tenant)
        self._add_replayed_entry(frame, gates, clamp)
        self._events(
            "tenant.settling",
            {
                "tenant": tenant,
                "frame": str(frame.offset),
                "clamp": None if clamp is None else str(clamp),
                "error": why,
                "during": "recovery",
            },
        )
        log.error(
            "replay: mining failed for tenant %r at %s (%s): the tenant is settled after the "
            "start (its later frames with it) and the mark is held at %s meanwhile",
            tenant,
            frame.offset,
            why,
            clamp,
            exc_info=exc,
        )

    def replay_isolated(self, frame: Frame, error: str) -> None:
        """Recovery isolated ``frame``: its payload did not decode. The tenant's tree goes
        on without it (folded past it), and a settlement of the tenant never decodes it
        in this process (it may be what killed a worker)."""
        self.settler.isolate_undecodable(frame.tenant, frame.offset, error)
        with self.miner_lock:
            folded = self.folded.get(frame.tenant)
            if folded is None or folded.lsn < frame.offset.lsn:
                self.folded[frame.tenant] = frame.offset

    def replay_deferred(self, frame: Frame, gates: ReplayGates, clamp: WalOffset | None) -> None:
        """A replayed frame of a tenant whose replay failed earlier: not mined into the
        unknown tree, but left to the settlement as an entry of its own."""
        self._add_replayed_entry(frame, gates, clamp)

    def _add_replayed_entry(
        self, frame: Frame, gates: ReplayGates, clamp: WalOffset | None
    ) -> None:
        entry = UnminedEntry(FrameSpan.of(frame), frame.tenant, clamp, gates=gates)
        with self._durable_lock:
            self.unmined.add(entry)
            self._recompute_durable_locked()

    @property
    def last_durable(self) -> WalOffset | None:
        """The mark a cut captures: the latest acknowledged offset, clamped."""
        with self._durable_lock:
            return self._last_durable

    @property
    def latest(self) -> WalOffset | None:
        """The latest acknowledged (and mined) turn's own frame end, never clamped."""
        with self._durable_lock:
            return self._latest


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


class ReplayCounts(NamedTuple):
    """What ``replay_frame`` did not forward: records and template events suppressed
    in all (by the gates or because the store holds them), and of those the ones an
    object published before the restart holds (``app.ingest.landed``)."""

    records: int
    events: int
    records_landed: int
    events_landed: int


def _rows_in_days(batch: FlatBatch, offset: WalOffset, days: frozenset[int]) -> int:
    """How many of ``batch``'s rows fall on ``days`` (``_days``'s split)."""
    rows = 0
    for day, index in _days(batch, offset):
        if day in days:
            rows += len(batch) if index is None else len(index)
    return rows


def _unavailable(exc: AppendError, records: int) -> Unavailable:
    """The WAL's refusal as the client sees it; the WAL error's type (for example
    ``wal_rotation_retrying``, ``wal_rotation_terminal``) rides the counters' label."""
    if exc.error_class is ErrorClass.TERMINAL:
        refusal = Unavailable(
            f"WAL refused the batch (server-terminal, retry later): {exc}",
            error_type=exc.error_type,
        )
    else:
        refusal = Unavailable(
            f"WAL could not make the batch durable (transient, retrying): {exc}",
            error_type=exc.error_type,
        )
    refusal.records = records
    return refusal

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

The pipeline keeps the turn; what the turn works with are rooms of their own it builds
and hands out: the cut's state and capture (``app.ingest.cuts``, which the barrier is
handed), the mark (``app.ingest.mark``), the emit step (``app.ingest.emit``) and
recovery's replayed frames (``app.ingest.replay_feed``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from app import points
from app.base.batch import FlatBatch
from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge, Unavailable
from app.ingest.admission import Admission
from app.ingest.cuts import LATCH_CLEAR as LATCH_CLEAR
from app.ingest.cuts import CutOwner
from app.ingest.emit import buffer_audit, buffer_records
from app.ingest.mark import DurableMark
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.tenant_miner import MineResult, TenantMiner
from app.ingest.replay_feed import ReplayFeed
from app.ingest.settle_parts import SettleParts, SettleSchedule
from app.ingest.settlement import (
    DEFAULT_MINING_ATTEMPTS,
    Settler,
    UnminedSet,
)
from app.ingest.shares import TurnShares
from app.ingest.snapshot_store import SnapshotLedger
from app.ingest.tenants import Reservation, TenantTable, TenantUnrecoverable, TurnResult
from app.receive.api import IngestOutcome
from app.threads import Supervisor
from sink.buffers import Buffers, Detached
from sink.publisher import Publisher
from wal import (
    AppendError,
    ErrorClass,
    FrameRejected,
    FrameSpan,
    FrameTooLarge,
    Journal,
    Pending,
    RotationExhausted,
    WalOffset,
)

log = logging.getLogger("ourios.pipeline")


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
        ceiling_bytes: int | None = None,
        on_cut_stall: Callable[[float], None] | None = None,
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
        #: tenant slots and admission states; its lock is the admission mutex
        self.tenants = TenantTable(journal.config.max_tenants)
        #: frames whose mining raised, until settlement rebuilds their tenants
        self.unmined = UnminedSet()
        #: the mark a cut captures, clamped below every unmined entry
        self.mark = DurableMark(self.unmined)
        #: tenants refused as unrecoverable, and why; replaced whole by the settler (turns
        #: read them under the miner lock, where the admission mutex may not be taken)
        self.refused: frozenset[str] = frozenset()
        self.refused_details: Mapping[str, str] = {}
        self.folded: dict[str, WalOffset] = {}
        self._ready, self.records_mined = False, 0
        #: durable snapshot installs (``CutOwner.ledger``)
        self.ledger = ledger if ledger is not None else SnapshotLedger()
        #: the cut's state and its capture; the barrier runs what it yields. A turn that
        #: observes a rotation offers its cut to the barrier's pending slot, coalesced
        #: under ``ceiling_bytes`` (None: no barrier takes cuts)
        self.cuts = self._cut_owner(ceiling_bytes, on_cut_stall)
        self.settler = Settler(self._settle_parts(schedule), max_attempts=mining_attempts)
        #: recovery's entry: replayed frames into the miners and buffers
        self.replay_feed = ReplayFeed(
            buffers,
            miners,
            publisher,
            cuts=self.cuts,
            mark=self.mark,
            settler=self.settler,
            folded=self.folded,
            events=self._events,
        )
        #: each tenant's share of the turn (None: unbounded); ``_turn`` leaves the work
        #: of the batch it mined and the seconds its mining took in ``_work`` and
        #: ``_mined_secs`` for ``turn_and_finish`` to charge
        self.shares = shares
        self._work = 0
        self._mined_secs = 0.0

    def _cut_owner(
        self, ceiling_bytes: int | None, on_cut_stall: Callable[[float], None] | None
    ) -> CutOwner:
        """The cut's owner, handed the turn's locks and what a capture reads."""
        return CutOwner(
            self.buffers,
            self.miners,
            self.publisher,
            self.ledger,
            exclusion=self.exclusion,
            miner_lock=self.miner_lock,
            folded=self.folded,
            unmined=self.unmined,
            mark=lambda: self.mark.current,
            refused=lambda: self.refused,
            clock=self.clock,
            ceiling_bytes=ceiling_bytes,
            on_cut_stall=on_cut_stall,
        )

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
            prev = self.mark.current
            if prev is not None and prev.segment != offset.segment and self.cuts.hands_off:
                self.cuts.capture_rotation()  # this turn observed the rotation
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
                self.cuts.serialize_if_frozen_locked(tenant)
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
                self.cuts.pin_versions_locked(detached)
            with self.mark.lock:
                self.mark.advance_locked(offset)
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
        entry = self.mark.add_unmined(span, tenant)
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
        self.mark.recompute()

    def refuse_tenant(self, tenant: str, detail: str) -> None:
        """The settler refuses ``tenant`` as unrecoverable (it holds the exclusion and the
        miner lock); both are replaced whole, since turns read them without a lock."""
        self.refused_details = {**self.refused_details, tenant: detail}
        self.refused = self.refused | {tenant}

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> None:
        """Settlement's swap (miner lock held): install the rebuilt tree."""
        self.miners.replace_tenant(tenant, miner)
        self.cuts.forget_tenant(tenant)

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
        """``app.ingest.emit.buffer_audit`` into this pipeline's buffers."""
        return buffer_audit(self.buffers, tenant, batch, result, offset, staged)

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
        """``app.ingest.emit.buffer_records`` into this pipeline's buffers."""
        return buffer_records(
            self.buffers, tenant, batch, result, offset, nbytes, staged, skip_days
        )

    @property
    def last_durable(self) -> WalOffset | None:
        """The mark a cut captures (``app.ingest.mark``)."""
        return self.mark.last_durable

    @property
    def latest(self) -> WalOffset | None:
        """The latest acknowledged turn's own frame end, never clamped."""
        return self.mark.latest

    @property
    def epoch(self) -> int:
        """The number of the next cut (``CutOwner.epoch``)."""
        return self.cuts.epoch

    @property
    def failed_epoch(self) -> int:
        """The lowest epoch a failure invalidated (``CutOwner.failed_epoch``)."""
        return self.cuts.failed_epoch


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

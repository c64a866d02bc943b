"""The cut: what the barrier publishes and stamps at one mark, and its owner
(DESIGN.md §5.4–5.6).

A cut is captured under the barrier exclusion (held exclusively by the barrier thread,
or shared by the ingest turn that observed a rotation) and flushed outside it: its
``batches`` are the partitions drained at the capture, registered in flight at its
``epoch``; ``prior_upto`` separates the publishes registered before the capture, which
must settle before the cut may stamp; ``snaps`` and ``frozen`` hold the tenants'
miner states at their folded horizons.

``CutOwner`` holds the cut's state — the epoch, the latch, the frozen tenants, the
pending slot — and does everything to a cut short of running it: capture, serialise,
coalesce, move, abandon, the prior-publish check, the frontiers, the version pins and
publish-all. The pipeline builds it and its turn captures through it; the barrier
(``app.cadence.barrier``) is handed it and runs the cuts it yields. The pending slot
is the queue between the two: a turn that observed a rotation offers its cut there
(never blocking, no I/O) and the barrier thread takes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from app.base.gc_policy import collection_deferred
from app.ingest.mining.rematch import VersionMap
from app.ingest.snapshot_store import SnapshotLedger, SnapshotState
from sink.buffers import Buffers, Detached
from wal import PublishedMarks, WalOffset

if TYPE_CHECKING:
    from app.ingest.mining.miner_cluster import MinerCluster
    from app.ingest.settlement import UnminedSet
    from sink.publisher import Publisher

__all__ = ["LATCH_CLEAR", "Cut", "CutOwner"]

log = logging.getLogger("ourios.pipeline")

#: The latch's clear value: no cut has failed (RFC 0052 §3.1's sentinel).
LATCH_CLEAR: Final = 2**63


@dataclass
class Cut:
    epoch: int
    mark: WalOffset | None
    batches: list[Detached]
    #: publishes registered up to this id were registered before the capture
    prior_upto: int
    reason: str
    snaps: dict[str, SnapshotState] = field(default_factory=dict)
    #: tenants frozen for this cut whose state is not serialised yet
    frozen: set[str] = field(default_factory=set)
    captured_at: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(d.partition.nbytes for d in self.batches)

    @property
    def own_ids(self) -> set[int]:
        return {d.id for d in self.batches}


class _Exclusion(Protocol):
    def shared(self) -> AbstractContextManager[None]: ...

    def exclusive(self) -> AbstractContextManager[None]: ...


class CutOwner:
    """The cut's state and everything done to a cut but running it (module docstring).

    What it reads of the turn's state is passed in: the locks the turn takes, the
    folded horizons, the mark and the unsettled tenants (unmined entries, refused)."""

    def __init__(
        self,
        buffers: Buffers,
        miners: MinerCluster,
        publisher: Publisher,
        ledger: SnapshotLedger,
        *,
        exclusion: _Exclusion,
        miner_lock: threading.Lock,
        folded: dict[str, WalOffset],
        unmined: UnminedSet,
        mark: Callable[[], WalOffset | None],
        refused: Callable[[], frozenset[str]],
        clock: Callable[[], float] = time.monotonic,
        ceiling_bytes: int | None = None,
        on_cut_stall: Callable[[float], None] | None = None,
    ) -> None:
        self.buffers = buffers
        self.miners = miners
        self.publisher = publisher
        #: durable snapshot installs: a tenant whose folded horizon moved past its
        #: installed one is frozen at the next capture
        self.ledger = ledger
        self.exclusion = exclusion
        self.miner_lock = miner_lock
        self._folded = folded
        self._unmined = unmined
        self._mark = mark
        self._refused = refused
        self._clock = clock
        #: barrier epoch: the number of the next cut (incremented at each capture)
        self.epoch = 1
        #: the lowest epoch a failure invalidated (LATCH_CLEAR when none)
        self.failed_epoch = LATCH_CLEAR
        #: tenant -> (the cut waiting for its state, the horizon it was frozen at)
        self._frozen: dict[str, tuple[Cut, WalOffset]] = {}
        #: how long each capture held the exclusion (seconds): the latest ones, and the
        #: metrics' observer
        self.cut_stall_seconds: deque[float] = deque(maxlen=4096)
        self._on_cut_stall = on_cut_stall
        #: the pending slot's bound: a coalesced cut stays under it, all or nothing;
        #: None: no barrier takes cuts, so a turn leaves a rotation to the next timer cut
        self.ceiling_bytes = ceiling_bytes
        #: guards the pending slot; the barrier's schedule waits on it for an offer
        self.slot = threading.Condition()
        self._pending: Cut | None = None

    # -- what the turn asks --------------------------------------------------------------

    @property
    def hands_off(self) -> bool:
        """A barrier takes the cut of a rotation a turn observes."""
        return self.ceiling_bytes is not None

    def unsettled(self) -> set[str]:
        """Tenants with an unmined entry or refused as unrecoverable: their live tree is
        unknown, so no snapshot of theirs and no version pinned to it (RFC 0055 §9.4)."""
        return self._unmined.tenants() | self._refused()

    def capture_rotation(self) -> None:
        """Inside the turn that observed the rotation: capture a cut at the closed
        segment's mark (the previous turn's own frame end) and offer it to the barrier
        thread. Capture only: the store I/O runs there."""
        started = time.perf_counter()
        with collection_deferred():
            cut = self.capture_cut_locked("rotation")
        self.record_cut_stall(time.perf_counter() - started)
        self.offer(cut)

    def serialize_if_frozen_locked(self, tenant: str) -> None:
        """A turn about to mine a frozen tenant serialises its state first (miner lock)."""
        if tenant in self._frozen:
            self._serialize_locked(tenant)

    def forget_tenant(self, tenant: str) -> None:
        """Settlement swapped the tenant's tree (miner lock): nothing frozen of the old."""
        self._frozen.pop(tenant, None)

    # -- capture -------------------------------------------------------------------------

    def record_cut_stall(self, seconds: float) -> None:
        self.cut_stall_seconds.append(seconds)
        if self._on_cut_stall is not None:
            self._on_cut_stall(seconds)

    def capture_cut_locked(self, reason: str) -> Cut:
        """Capture a cut. The caller holds the exclusion exclusively, or is the ingest
        turn (the gate keeps every other turn out): no turn is mining or buffering."""

        epoch = self.epoch
        batches = self.buffers.drain_all("barrier")  # registered in flight at ``epoch``
        mark = self._mark()
        cut = Cut(epoch, mark, batches, self.buffers.last_id, reason, captured_at=self._clock())
        self.epoch = epoch + 1  # a publish registered from now on belongs to later cuts
        installed = self.ledger.horizons()
        # No snapshot of a tenant with an unmined entry (its live tree is unknown) or of
        # an unrecoverable one (RFC 0055 §9.4).
        unsettled = self.unsettled()
        with self.miner_lock:
            self.pin_versions_locked(batches)
            for tenant, horizon in self._folded.items():
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
        unsettled = self.unsettled()
        for d in records:
            tenant = d.partition.tenant
            miner = self.miners.get(tenant)
            if miner is not None and not miner.failed and tenant not in unsettled:
                self.buffers.pin(d, VersionMap(miner.versions(), miner.mined_tokens))

    # -- frozen tenants ------------------------------------------------------------------

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

    # -- the pending slot ----------------------------------------------------------------

    def offer(self, cut: Cut) -> None:
        """The rotation's hand-off (inside an ingest turn: no I/O, never blocks): the cut
        waits in the slot, or is coalesced into the one waiting there."""
        with self.slot:
            pending = self._pending
            if pending is None:
                self._pending = cut
                self.slot.notify_all()
                return
            assert self.ceiling_bytes is not None
            if pending.nbytes + cut.nbytes > self.ceiling_bytes:
                # All or nothing: parking only the excess would leave frames at or below
                # the coalesced mark outside the cut's batches.
                self.abandon_cut(cut, "coalesce_ceiling")
                return
            pending.batches.extend(cut.batches)
            pending.mark = cut.mark
            pending.epoch = cut.epoch
            pending.prior_upto = cut.prior_upto
            pending.reason = f"{pending.reason}+{cut.reason}"
            self.move_frozen(cut, pending)
            pending.snaps.update(cut.snaps)

    def take_pending(self) -> Cut | None:
        """Empty the slot: the cut that waited there, if any."""
        with self.slot:
            cut, self._pending = self._pending, None
            return cut

    @property
    def pending(self) -> Cut | None:
        with self.slot:
            return self._pending

    # -- running a cut -------------------------------------------------------------------

    def latch(self, epoch: int) -> bool:
        """A failure invalidated ``epoch``: no cut at or above it stamps until a restart
        (RFC 0052 §3.2). True when the latch moved down to it."""
        if self.failed_epoch > epoch:
            self.failed_epoch = epoch
            return True
        return False

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

    def cut_frontiers(self, mark: WalOffset) -> dict[str, PublishedMarks]:
        """The frontiers a cut stamping ``mark`` writes to PUBLISHED: the mark for every
        tenant but an unrecoverable one, and but one whose start-up replay failed and
        which is not settled yet — its rows above the replay's gates were dropped with
        its tree and are re-emitted only by its settlement, so its frontier stays where
        the replay found it (the mark may be above: the clamp is the checkpoint)."""
        skip = self._refused() | self._unmined.replayed()
        return {t: PublishedMarks(mark, mark) for t in self.miners.tenants() if t not in skip}

    def forget_failures_before(self, epoch: int) -> None:
        self.buffers.in_flight.forget_failures(epoch)

    def publish_all_now(self, reason: str) -> bool:
        """Publish everything: drain the buffers and publish on this thread, then wait for
        every publish already registered (the size trigger's, queued for the publisher
        thread). True only when all of it reached the store and nothing was requeued —
        recovery installs snapshots above X on that alone."""
        with self.exclusion.exclusive():
            detached = self.buffers.drain_all(reason)  # seals every intent span staged
            upto = self.buffers.last_id
            with self.miner_lock:
                self.pin_versions_locked(detached)
        ok = True
        for d in detached:
            ok = self.publisher.publish(d).ok and ok
        for item in self.buffers.in_flight.pending_upto(upto):
            ok = self.publisher.publish(item.detached).ok and ok  # written here, or awaited
        return ok and self.buffers.empty()

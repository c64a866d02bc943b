"""Settlement after a mining failure (RFC 0055 §9.4, DESIGN.md §5 and §13).

An exception inside a turn's mining leaves the tenant's tree in an unknown state (a
leaf may have been widened before its template event was emitted), while the frame is
durable and acknowledged. The turn records an *unmined entry* — the frame's span, its
tenant, and ``clamp``: the last acknowledged offset before the frame — and nothing else
of the batch. From then on:

* **the clamp**: the pipeline's mark is ``min(latest, clamp)`` over every remaining
  entry (None stays None), so no barrier stamps past the frame; the latest offset is
  kept beside it and becomes the mark again when the set is empty;
* **no snapshot** of the entry's tenant is installed (the live tree is unknown), and
  admission refuses the tenant (``SettlementInProgress``, 503 with a bounded hint);
* **settlement** rebuilds the tenant, triggered by the next turn for it (before its
  own batch) or by the barrier tick (before it captures), exactly once per entry:

  1. *claim* — the settling state is published under the admission mutex, then under
     the barrier exclusion (exclusive) and the miner lock the entries move Unresolved →
     Settling (a second trigger finds them Settling: a turn waits on their signal, the
     barrier tick goes on with its cut), and the frontier W is read: the larger of the
     checkpoint X and the tenant's PUBLISHED records mark — every row at or below it is
     durable, every buffered row lies above it;
  2. *check* — the restorable horizon (the SnapshotLedger's retained state, never the
     directory) against RECLAIM's ``reclaimed_through`` written under Known: below it,
     the surviving frames cannot rebuild the tree, and the tenant is refused as
     unrecoverable (below);
  3. *read and mine* — the tenant's frames from its snapshot horizon (or its oldest
     surviving frame) through the entry's span, in bounded ``read_frames_from`` calls
     with no pipeline lock held (the journal mutex is dropped between calls), mined
     into a new tree built off to the side;
  4. *swap* — under the exclusion (exclusive) and the miner lock, in one section: the
     new tree replaces the old, every buffered row of the tenant is dropped and its
     next generation begins (``Buffers.drop_tenant``: a discarded-tree partition still
     in flight is fenced, never written after this point), the replay's rows and
     events are buffered, the entries are removed and the clamp lifted; the signal is
     set. Nothing here waits for another thread's publish;
  5. *intent, forced frontier* (barrier thread only; no I/O in an ingest turn) — RFC
     0055 §9.4 "intent then confirm". Before the swap, ``publish_marks`` records the
     intent: the frontier W (one position for both sides) and the end of the span, the
     entry's ``publishing`` bit set. The swap buffers the span *staged* (its records,
     and the events of templates the tree held before the rebuild: ``sink.buffers``),
     units named by their rows. After it the tenant's rows are published and, when
     nothing of it is left in flight, ``publish_marks`` confirms (the raised marks
     reach the span's end: the bit clears), so a crash after it replays nothing of the
     span. A crash between the two leaves the bit: recovery gates the tenant at W and
     republishes the span staged from the same snapshot, under the same names, with the
     store's conditional create — what landed is not written again, what did not is
     (``app/node/recovery.py``; the crash cases are argued in docs/ARCHITECTURE.md). One
     intent at a time: a settlement that finds one in force stages exactly its span and
     writes none of its own; a turn's settlement stages it too and never writes one.
     No intent can be written (the write failed, or the sides start apart): nothing is
     force-published, the rows wait for the next cut.

  What the replay emits: a frame's records only above W; its template events above
  the audit frontier, and always the events of templates the replay created (a fresh
  id: no published event names it). So a record at or below W is present exactly once;
  one above it at most twice (the discarded tree may have published it before the
  swap), never absent. Template ids are never rewound: a template the replay re-creates
  gets a fresh id.

* **failure inside settlement** — the entries return to Unresolved, the signal is set;
  the tenant stays refused and the next tick retries. The retries are bounded
  (``max_attempts``, ``wal.frame_mining_attempts``): a failure raised while mining or
  emitting one frame counts against that frame (so do the ingest turn's and a start-up
  replay's), and a frame at the bound is *isolated* — the rebuild, run again at once,
  does not mine it and buffers its records as they are, with ``NO_TEMPLATE`` and no
  template events — so the entry resolves and the mark moves on. Where that cannot
  help (the isolated frame's template-less rows cannot be buffered either, or the
  settlement fails ``max_attempts`` times for a reason no frame explains) the tenant is
  refused as unrecoverable (below). A start-up replay's entries carry the gates that
  replay applied (``ReplayGates``): the settlement re-emits above them.

* **unrecoverable** — PUBLISHED records a terminal entry for the tenant (its frontier
  stays at W — never above a replay's gates — so a restart replays its frames in
  full), the entries leave the clamp set (the checkpoint advances for everyone else),
  the tenant is dropped from the horizons housekeeping uses (its frames stay pinned),
  its appends are refused (``TenantUnrecoverable``, server-terminal, naming it),
  ``tenant.unrecoverable`` is emitted once. Every other tenant continues.

Settlement never takes the ingest gate: the barrier exclusion, then the miner lock.
"""

from __future__ import annotations

import logging
import math
import threading

from app import points
from app.base.config import WalSettings
from app.ingest.frame_attempts import AttemptBook, FrameAttempts
from app.ingest.rebuild import NO_TEMPLATE, READ_LIMIT, FrameFailed, Rebuild, Replayed
from app.ingest.settle_parts import SettleParts
from app.ingest.snapshot_store import SnapshotState
from app.ingest.unmined import (
    EntryState,
    ReplayGates,
    SettleOutcome,
    SettleResult,
    UnminedEntry,
    UnminedSet,
    lsn,
)
from app.ingest.unrecoverable import Unrecoverable
from wal import PublishedMarks, WalOffset

#: what the pipeline, recovery and the tests take from here (the entries' own types live
#: in ``app.ingest.unmined``, the untemplated id in ``app.ingest.rebuild``)
__all__ = [
    "DEFAULT_MINING_ATTEMPTS",
    "NO_TEMPLATE",
    "EntryState",
    "ReplayGates",
    "SettleOutcome",
    "SettleResult",
    "Settler",
    "UnminedEntry",
    "UnminedSet",
]

log = logging.getLogger("ourios.settlement")

#: Default of ``wal.frame_mining_attempts`` (declared once, in the settings table).
DEFAULT_MINING_ATTEMPTS: int = WalSettings.frame_mining_attempts


class Settler:
    """Runs settlements for the pipeline (module docstring): claims the entries, has the
    rebuild (``app.ingest.rebuild``) do the work, counts failures against frames
    (``app.ingest.frame_attempts``) and refuses what cannot be rebuilt
    (``app.ingest.unrecoverable``) — all with the parts it is built with
    (``app.ingest.settle_parts``), none reached through the pipeline."""

    def __init__(
        self,
        parts: SettleParts,
        *,
        read_limit: int = READ_LIMIT,
        max_attempts: int = DEFAULT_MINING_ATTEMPTS,
    ) -> None:
        self._book = AttemptBook(max_attempts)
        self._work = Rebuild(parts)
        self._unrecoverable = Unrecoverable(parts)
        self._journal = parts.journal
        self._miners = parts.miners
        self._publisher = parts.publisher
        self._ledger = parts.ledger
        self._tenants = parts.tenants
        self._unmined = parts.unmined
        self._exclusion = parts.exclusion
        self._miner_lock = parts.miner_lock
        self._clock = parts.clock
        #: (cadence seconds, next tick time) of the barrier that settles refused
        #: tenants; None before one is followed (the hint is one second)
        self._schedule = parts.schedule
        self._events = parts.events
        self.read_limit = read_limit
        #: failed attempts at one frame after which it is isolated (its rows published
        #: without templates), and failed settlements no frame explains after which the
        #: tenant is refused as unrecoverable (``wal.frame_mining_attempts``)
        self.max_attempts = max_attempts
        #: rebuilds swapped in (the claim makes it one per entry set)
        self.rebuilds = 0
        self.last: SettleOutcome | None = None

    # -- attempts (``app.ingest.frame_attempts``) ----------------------------------------

    @property
    def isolated_frames(self) -> int:
        """Frames isolated in this process (``ourios_wal_isolated_frames_total``)."""
        return self._book.isolated_frames

    def note_failure(self, tenant: str, offset: WalOffset, error: str) -> int:
        """Count a failed attempt at mining (or emitting) the frame ending at ``offset``;
        returns its failures so far."""
        return self._book.note_failure(tenant, offset, error)

    def isolate_undecodable(self, tenant: str, offset: WalOffset, error: str) -> None:
        """A replay isolated the frame ending at ``offset``: its payload did not decode."""
        self._book.isolate_undecodable(tenant, offset, error)

    def attempts(self, tenant: str, offset: WalOffset) -> int:
        return self._book.attempts(tenant, offset)

    # -- the two triggers ----------------------------------------------------------------

    def settle_all(self, *, force_publish: bool) -> list[SettleOutcome]:
        """The barrier tick: every tenant with an entry, before the cut is captured."""
        return [
            self.settle(t, force_publish=force_publish, wait=False)
            for t in sorted(self._unmined.tenants())
        ]

    def retry_after(self, tenant: str) -> int:
        """The hint a refused request gets: about a second while a rebuild runs, else
        until the next barrier tick retries it; at least 1 s, at most the cadence."""
        schedule = self._schedule()
        cadence = 1.0 if schedule is None else schedule[0]
        entries = self._unmined.of(tenant)
        if any(e.state is EntryState.SETTLING for e in entries) or schedule is None:
            remaining = 1.0
        else:
            remaining = schedule[1] - self._clock()
        return int(max(1, min(math.ceil(cadence), math.ceil(remaining))))

    # -- one settlement ------------------------------------------------------------------

    def settle(self, tenant: str, *, force_publish: bool, wait: bool = True) -> SettleOutcome:
        """Settle ``tenant``'s entries, or — another trigger holding the claim — wait for
        its signal (``wait``: a turn must not mine before the rebuild is installed; the
        barrier tick need not wait, and must not: the claimant may be waiting for a cut
        only the barrier thread runs)."""
        if not self._unmined.has(tenant):
            self._tenants.set_settling(tenant, False)
            return SettleOutcome(tenant, SettleResult.NOTHING)
        # The claim is visible to admission before it exists (admission mutex alone).
        self._tenants.set_settling(tenant, True)
        signal: threading.Event | None = None
        done = threading.Event()
        claim_x: WalOffset | None = None
        state: SnapshotState | None = None
        with self._exclusion.exclusive():
            with self._miner_lock:
                entries = self._unmined.of(tenant)
                busy = [e for e in entries if e.state is EntryState.SETTLING]
                if busy:
                    signal = busy[0].done
                elif entries:
                    claim_x = self._journal.last_checkpoint
                    for e in entries:
                        e.state = EntryState.SETTLING
                        e.done = done
                    state = self._ledger.state(tenant)
        if not entries:
            self._tenants.set_settling(tenant, False)
            return SettleOutcome(tenant, SettleResult.NOTHING)
        if signal is not None:
            points.hit("settlement.lost")
            if wait:
                signal.wait()
            return SettleOutcome(tenant, SettleResult.WAITED)
        points.hit("settlement.claimed")
        try:
            outcome = self._rebuild(tenant, entries, state, claim_x, done, force_publish)
        except FrameFailed as exc:
            if exc.isolated:
                # Even its template-less rows cannot be buffered: isolate the tenant.
                outcome = self._unrecoverable.refuse(
                    tenant,
                    entries,
                    done,
                    claim_x,
                    f"the rows of its frame at {exc.offset} cannot be buffered even without "
                    f"templates ({type(exc.cause).__name__}: {exc.cause}); its frames stay in "
                    f"the WAL and a restart replays them",
                    {"reason": "isolated_frame_emit_failed", "failed_frame": str(exc.offset)},
                )
            else:
                error = f"{type(exc.cause).__name__}: {exc.cause}"
                failures = self.note_failure(tenant, exc.offset, error)
                outcome = self._failed(tenant, entries, done, exc.cause, exc.offset)
                if self._book.at_bound(failures):
                    # At the bound: rebuild again at once, the frame isolated, rather than
                    # holding every tenant's mark for another barrier period.
                    return self.settle(tenant, force_publish=force_publish, wait=wait)
        except Exception as exc:  # noqa: BLE001 - the entry goes back; the next tick retries
            if max(e.unexplained for e in entries) + 1 >= self.max_attempts:
                outcome = self._unrecoverable.refuse(
                    tenant,
                    entries,
                    done,
                    claim_x,
                    f"its settlement failed {self.max_attempts} times for a reason no frame "
                    f"explains (last: {type(exc).__name__}: {exc}); its frames stay in the WAL "
                    f"and a restart replays them",
                    {"reason": "settlement_failed", "error": f"{type(exc).__name__}: {exc}"},
                )
            else:
                outcome = self._failed(tenant, entries, done, exc, None)
        self.last = outcome
        return outcome

    def _failed(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        exc: BaseException,
        frame: WalOffset | None,
    ) -> SettleOutcome:
        """Entries back to Unresolved; ``frame`` is the frame whose mining or emit raised
        (its attempts are counted by the caller), None when no frame explains it."""
        with self._exclusion.exclusive():
            with self._miner_lock:
                for e in entries:
                    if e.state is EntryState.SETTLING:
                        e.state = EntryState.UNRESOLVED
                    e.failures += 1
                    if frame is None:
                        e.unexplained += 1
                    e.error = f"{type(exc).__name__}: {exc}"
        done.set()
        at = (
            f"at its frame {frame} (failure {self.attempts(tenant, frame)} of "
            f"{self.max_attempts} before the frame is isolated)"
            if frame is not None
            else f"(unexplained failure {entries[0].unexplained} of {self.max_attempts})"
        )
        log.error(
            "settlement of tenant %r failed (attempt %d) %s: %s; it stays refused and the next "
            "barrier tick retries",
            tenant,
            entries[0].failures,
            at,
            exc,
            exc_info=exc,
        )
        return SettleOutcome(tenant, SettleResult.FAILED, error=entries[0].error)

    def _rebuild(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        state: SnapshotState | None,
        claim_x: WalOffset | None,
        done: threading.Event,
        force_publish: bool,
    ) -> SettleOutcome:
        """Settle one tenant in RFC 0055 §9.4's order: restore its snapshot, refuse if the
        WAL no longer holds what it needs, replay its frames into a new tree, record the
        intent, swap the tree in, then publish and report."""
        to = max((e.span for e in entries), key=lambda s: s.end)
        tree, horizon = self._work.restore(tenant, state)
        refused = self._unrecoverable.if_reclaimed(tenant, entries, done, claim_x, horizon)
        if refused is not None:
            return refused
        if tree is None:
            tree = self._miners.build(tenant, None)
        marks = self._journal.published_marks().get(tenant, PublishedMarks())
        from_records, from_audit = self._work.frontiers(entries, claim_x, marks)
        w_records, w_audit = lsn(from_records), lsn(from_audit)
        #: the ids the tree had before this rebuild: their events are the same in every
        #: attempt at the span, the others are this attempt's own
        known = {t.template_id for t in tree.templates()}
        isolated = self._book.isolated(tenant, horizon)
        replayed = self._work.replay(
            tenant, tree, horizon, to, isolated, (w_records, w_audit), self.read_limit
        )
        points.hit("settlement.before_swap")
        span = marks.intent  # an earlier settlement's span not confirmed yet: kept as it is
        if span is None and force_publish:
            span = self._work.intend(tenant, from_records, from_audit, horizon, to.offset)
            force_publish = span is not None
        detached, records, events_out, dropped = self._work.swap(
            tenant, tree, entries, replayed, span, known, to.offset
        )
        self.rebuilds += 1
        done.set()
        self._tenants.set_settling(tenant, False)
        self._tenants.settled(tenant, installed=True)
        for r in replayed:
            if r.isolated:
                self._announce(tenant, r, isolated[r.frame.offset.lsn])
        if not force_publish:
            for d in detached:
                if not self._publisher.offer(d):
                    self._publisher.park(d)
        self._report_settled(
            tenant,
            (horizon, to.offset, span),
            (w_records, w_audit),
            (len(replayed), records, events_out, dropped),
        )
        written = self._work.force_frontier(tenant, to.offset, detached) if force_publish else False
        return SettleOutcome(
            tenant, SettleResult.SETTLED, len(replayed), records, events_out, dropped, written
        )

    def _report_settled(
        self,
        tenant: str,
        where: tuple[WalOffset | None, WalOffset, WalOffset | None],
        frontiers: tuple[int, int],
        counts: tuple[int, int, int, int],
    ) -> None:
        """``tenant.settled`` and its log line: from where through where, the frontiers,
        the intent, and how many frames, records, events and dropped rows."""
        horizon, through, span = where
        w_records, w_audit = frontiers
        frames, records, events_out, dropped = counts
        self._events(
            "tenant.settled",
            {
                "tenant": tenant,
                "from": None if horizon is None else str(horizon),
                "through": str(through),
                "records_frontier": w_records,
                "audit_frontier": w_audit,
                "intent": None if span is None else str(span),
                "frames": frames,
                "records": records,
                "events": events_out,
                "dropped": dropped,
            },
        )
        log.info(
            "tenant %r settled: %d frames replayed from %s through %s, %d records and %d "
            "template events re-emitted (frontier %d), %d discarded rows dropped",
            tenant,
            frames,
            horizon if horizon is not None else "its oldest surviving frame",
            through,
            records,
            events_out,
            w_records,
            dropped,
        )

    def _announce(self, tenant: str, r: Replayed, attempts: FrameAttempts) -> None:
        """Once per isolated frame and process: the event naming tenant and frame, the
        counter, an error line."""
        if not self._book.first_announcement(attempts):
            return
        self._events(
            "tenant.frame_isolated",
            {
                "tenant": tenant,
                "frame": str(r.frame.offset),
                "attempts": attempts.failures,
                "error": attempts.error,
                "records": len(r.batch),
                "published": r.publish_records,
                "action": f"its records are published without templates (template_id "
                f"{NO_TEMPLATE}, no parameters, no template events); the tenant goes on and "
                f"the checkpoint no longer waits on the frame",
            },
        )
        log.error(
            "tenant %r: the frame at %s failed mining %d times (last: %s); it is isolated: "
            "its %d records are published without templates (template_id %d) and the tenant "
            "goes on",
            tenant,
            r.frame.offset,
            attempts.failures,
            attempts.error,
            len(r.batch),
            NO_TEMPLATE,
        )

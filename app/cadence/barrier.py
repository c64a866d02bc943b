"""The publication barrier: the only place the checkpoint advances (RFC 0052 §3.1).

A cut is *captured* under the barrier exclusion held exclusively (or, for a rotation-
fired cut, inside the ingest turn that observed the segment change, which the gate
already makes exclusive of every other turn): the mark is read (``last_durable``, the
last acknowledged turn's own frame end), both sinks are drained into owned batches
registered as in flight, every tenant whose folded horizon moved since its last
installed snapshot is *frozen* at that horizon, and an epoch is taken. Nothing else
happens under the exclusion: a frozen tenant's miner state is serialised afterwards by
the barrier thread, or by that tenant's next turn if it comes first, so the stall a
cut causes does not grow with the number of tenants.

The cut then *runs* outside the exclusion:

1. flush its batches (audit partitions first) to the store;
2. check every publish registered before the capture: a failure that requeued at an
   epoch above the cut's means its rows were not in this cut — the cut fails;
3. recheck the latch (``failed_epoch`` at or below the cut's epoch fails it);
4. install the snapshots (a failure is logged and never blocks the stamp) — none for a
   tenant with an unmined entry or refused as unrecoverable (RFC 0055);
5. ``Journal.checkpoint(mark, published)`` (a failure leaves the previous mark in
   force), which writes every other tenant's publication frontier (the mark: all its
   records and events at or below it are durable) to PUBLISHED after CHECKPOINT; an
   unrecoverable tenant's frontier is left where it was, so a restart replays it, and
   so is that of a tenant whose start-up replay failed, until it is settled
   (``Pipeline.cut_frontiers``).

Each tick first runs the pending cut, if any, then settles every tenant with an unmined
entry (RFC 0055 §9.4, before a fresh capture), then captures on the timer.

Cuts are strictly ordered: the single pending slot holds at most one cut captured while
another runs, coalesces a further capture into it (all-or-nothing under
``ceiling_bytes``), never installs or stamps before the running cut's outcome, and is
invalidated — batches back into the buffers, snapshots discarded — when that cut fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app import points
from app.base.gc_policy import collection_deferred
from app.ingest.cuts import Cut
from app.ingest.landed import live_intent
from app.ingest.settlement import SettleOutcome, SettleResult
from app.ingest.snapshot_store import SnapshotLedger, SnapshotStore
from app.threads import Supervised, Supervisor, start_thread
from wal import (
    AppendError,
    CheckpointError,
    IntentLog,
    IntentWriteError,
    PublishedWriteError,
    RotationKind,
    WalOffset,
)

if TYPE_CHECKING:
    from app.ingest.pipeline import Pipeline
    from sink.buffers import Detached

log = logging.getLogger("ourios.barrier")

#: The first retry delay after a failed cut (seconds); it doubles up to barrier_secs.
RETRY_FIRST_SECS = 0.5


@dataclass(frozen=True, slots=True)
class CutOutcome:
    """What running a cut did, with the fields the metrics and tests read."""

    epoch: int
    reason: str
    mark: WalOffset | None
    flushed: int = 0
    flush_failures: int = 0
    prior_ok: bool = True
    latched: bool = False
    checkpointed: bool = False
    checkpoint_error: str = ""
    snapshots_installed: int = 0
    snapshot_failures: int = 0
    #: the failed write's error type: ``checkpoint_write`` (the mark stays where it was)
    #: or ``published_write`` (CHECKPOINT advanced, PUBLISHED did not); "" when none
    checkpoint_error_type: str = ""

    @property
    def ok(self) -> bool:
        """The cut's flush and checks passed, so it went on to stamp (RFC0052.1: the
        barrier reports success even when the checkpoint write then fails)."""
        return self.flush_failures == 0 and self.prior_ok and not self.latched

    @property
    def complete(self) -> bool:
        """Everything the cut set out to do was done: ``ok`` and its checkpoint and
        publication frontiers written (or nothing to stamp). Only such a cut counts as
        outcome ``ok`` in ``ourios_cadence_runs_total``."""
        return self.ok and not self.checkpoint_error


#: A cut's partitions published at once: their encodes, intent fsyncs and PUTs overlap
#: (the store's connection pool holds ten).
FLUSH_CONCURRENCY = 8


class Barrier:
    """The barrier thread: a timer every ``barrier_secs`` plus the rotation hook's slot."""

    def __init__(
        self,
        pipeline: Pipeline,
        store: SnapshotStore,
        ledger: SnapshotLedger,
        *,
        barrier_secs: float,
        segment_age_secs: float,
        ceiling_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        on_cut: Callable[[CutOutcome], None] | None = None,
        on_run: Callable[[str, str], None] | None = None,
        intents: IntentLog | None = None,
        flush_concurrency: int = FLUSH_CONCURRENCY,
        threads: Supervisor | None = None,
    ) -> None:
        self.pipeline = pipeline
        #: runs the timer's loop and restarts it after an unexpected exception
        self._threads = threads
        #: how many of a cut's partitions are published at once (``_flush``)
        self.flush_concurrency = max(1, flush_concurrency)
        #: the publish intents, trimmed to what lies above the frontiers after each cut
        self.intents = intents
        self.store = store
        self.ledger = ledger
        self.barrier_secs = barrier_secs
        self.segment_age_secs = segment_age_secs
        self.ceiling_bytes = ceiling_bytes
        #: the timer's, the retries' and the ages' clock: monotonic, so a wall clock
        #: stepped back never stalls a cut (nothing the barrier writes carries a time)
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._on_cut = on_cut or (lambda outcome: None)
        #: (outcome, error_type) of every tick: the metrics' cadence counter
        self.on_run = on_run
        self._current_epoch: int | None = None
        self._failed_epoch: int | None = None
        self._cond = threading.Condition()
        self._pending: Cut | None = None
        self._running = False
        self._stop = threading.Event()
        self._thread: Supervised | None = None
        self.last: CutOutcome | None = None
        self.last_ok_at: float | None = None
        self.recapture = False
        #: After a failed cut the fresh capture is not taken before this (monotonic):
        #: the delay doubles from ``RETRY_FIRST_SECS`` up to ``barrier_secs`` while cuts
        #: keep failing (a store outage, a latch) and resets on the first good cut, so
        #: a node whose cuts cannot succeed neither spins nor floods its log.
        self._retry_not_before = 0.0
        self._retry_delay = 0.0
        #: when the timer fires next (the settling hint reads it)
        self.next_tick_at = self._clock() + barrier_secs
        self.settlements: list[SettleOutcome] = []
        # The pipeline and its settler learn of this barrier through callbacks only: a
        # turn hands it the cut of a rotation it observed, and a refused tenant's hint
        # reads when the next tick settles it.
        pipeline.on_rotation = self.offer_cut

    # -- the rotation hook (inside an ingest turn: no I/O, never blocks) ---------------

    def offer_cut(self, cut: Cut) -> None:
        with self._cond:
            pending = self._pending
            if pending is None:
                self._pending = cut
                self._cond.notify_all()
                return
            if pending.nbytes + cut.nbytes > self.ceiling_bytes:
                # All or nothing: parking only the excess would leave frames at or below
                # the coalesced mark outside the cut's batches.
                self.pipeline.abandon_cut(cut, "coalesce_ceiling")
                return
            pending.batches.extend(cut.batches)
            pending.mark = cut.mark
            pending.epoch = cut.epoch
            pending.prior_upto = cut.prior_upto
            pending.reason = f"{pending.reason}+{cut.reason}"
            self.pipeline.move_frozen(cut, pending)
            pending.snaps.update(cut.snaps)

    def schedule(self) -> tuple[float, float]:
        """(the cadence in seconds, when the timer fires next): the settling hint."""
        return self.barrier_secs, self.next_tick_at

    def request_cut(self) -> None:
        """Capture and run a cut now rather than at the next timer (the housekeeper
        asks when the disk is low or a bound refuses batches); never blocks."""
        with self._cond:
            self.recapture = True
            self._cond.notify_all()

    # -- the timer ---------------------------------------------------------------------

    def start(self) -> None:
        # Restartable: a tick's own failure is latched by ``tick_failed`` and ``run_cut``
        # gives a failed cut's batches back, so what reaches the supervisor left no cut
        # half-run; the pending slot waits for the restarted loop (DESIGN.md §5.10).
        self._thread = start_thread(
            self._threads, "barrier", self._run, thread_name="ourios-barrier", stop=self._stop
        )

    def _run(self) -> None:
        deadline = self.next_tick_at = self._clock() + self.barrier_secs
        while not self._stop.is_set():
            with self._cond:
                while (
                    self._pending is None
                    and not (self.recapture and self._clock() >= self._retry_not_before)
                    and not self._stop.is_set()
                    and self._clock() < deadline
                ):
                    wake = deadline
                    if self.recapture:
                        wake = min(wake, self._retry_not_before)
                    self._cond.wait(timeout=min(1.0, max(0.01, wake - self._clock())))
            if self._stop.is_set():
                return
            timed = self._clock() >= deadline
            try:
                self.step(timer=timed)
            except Exception as exc:  # noqa: BLE001 - latched and counted; the next tick runs
                self.tick_failed(exc)
            if timed:
                deadline = self.next_tick_at = self._clock() + self.barrier_secs

    def close(self, timeout: float = 60.0) -> bool:
        """Stop the timer; the running cut finishes and a pending one runs once."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        joined = True
        if self._thread is not None:
            self._thread.join(timeout)
            joined = not self._thread.is_alive()
            self._thread = None
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is not None and joined:
            self.run_cut(pending)
        return joined

    def tick_failed(self, exc: BaseException) -> None:
        """A tick raised outside any publish: the tick's epoch is latched (no later cut
        stamps until a restart, RFC 0052 §3.2), the pending slot is invalidated."""
        p = self.pipeline
        epoch = self._failed_epoch if self._failed_epoch is not None else p.epoch
        self._failed_epoch = None
        if p.failed_epoch > epoch:
            p.failed_epoch = epoch
            self._events("barrier.latch.set", {"epoch": epoch, "error": f"barrier tick: {exc}"})
        log.error("barrier tick failed: %s", exc, exc_info=exc)
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is not None:
            p.abandon_cut(pending, "tick_failed")
        self._count("error", "cadence_panic")

    def _count(self, outcome: str, error_type: str) -> None:
        if self.on_run is not None:
            self.on_run(outcome, error_type)

    # -- one step ------------------------------------------------------------------------

    def step(self, *, timer: bool = True) -> CutOutcome | None:
        """Run the pending cut if one waits, else (on the timer) rotate an old idle
        segment and capture a fresh cut; either way settle every unmined entry first
        (a pending cut's batches are published before, so a settlement never waits on
        them). Returns what the cut did."""
        with self._cond:
            cut, self._pending = self._pending, None
            recapture, self.recapture = self.recapture, False
        if cut is not None:
            outcome = self.run_cut(cut)
            self.settle()
            return outcome
        self.settle()
        if not (timer or recapture):
            return None
        return self.run_cut(self.capture(rotate_idle=timer))

    def settle(self) -> list[SettleOutcome]:
        """Settle every tenant with an unmined entry (the barrier's trigger): the store
        I/O of the forced frontier is allowed here, on the barrier thread."""
        outcomes = self.pipeline.settler.settle_all(force_publish=True)
        for o in outcomes:
            if o.result is SettleResult.FAILED:
                self._count("error", "settlement_failed")
        self.settlements = outcomes
        return outcomes

    def capture(self, *, rotate_idle: bool = True) -> Cut:
        """Capture a cut under the exclusive exclusion (the timer's path)."""
        p = self.pipeline
        started = time.perf_counter()
        # A collection the capture would trigger runs after the exclusion is released,
        # not inside the hold (app/base/gc_policy.py).
        with collection_deferred(), p.exclusion.exclusive():
            points.hit("barrier.after_quiesce")
            if rotate_idle:
                self._rotate_if_idle()
            cut = p.capture_cut_locked("timer")
        p.record_cut_stall(time.perf_counter() - started)
        # The turns the hold queued were just woken: let them have the interpreter
        # before this thread goes on (the flush, the deferred collection), or each would
        # wait up to a switch interval more (soak/bench/barrier.py, turns that met a cut).
        time.sleep(0)
        return cut

    def _rotate_if_idle(self) -> None:
        """The idle path: rotate first when the current segment is older than
        ``segment_age_secs`` and holds a frame, so the mark (in the closed segment) can
        release it; a failure draws on the rotation budget and is reported there."""
        journal = self.pipeline.journal
        age, frames = journal.current_segment_age()
        if frames and age >= self.segment_age_secs:
            try:
                journal.rotate(RotationKind.DISCRETIONARY)
            except AppendError as exc:
                log.warning("idle rotation failed: %s", exc)

    def run_cut(self, cut: Cut) -> CutOutcome:
        p = self.pipeline
        with self._cond:
            self._running = True
        self._current_epoch = cut.epoch
        self._failed_epoch = None
        try:
            return self._run_cut(cut)
        except BaseException:
            # whatever raised after the capture drained the buffers: the cut's unsettled
            # batches go back (else they wedge every later cut's wait), its snapshots are
            # dropped, and tick_failed latches this cut's own epoch
            self._failed_epoch = cut.epoch
            p.abandon_cut(cut, "tick_failed")
            raise
        finally:
            self._current_epoch = None
            with self._cond:
                self._running = False

    def _run_cut(self, cut: Cut) -> CutOutcome:
        p = self.pipeline
        p.serialize_frozen(cut)
        points.hit("barrier.before_flush")
        results = self._flush(cut.batches)
        flushed = sum(results)
        failures = len(results) - flushed
        points.hit("barrier.after_flush")
        prior_ok = p.prior_publishes_ok(cut)
        latched = p.failed_epoch <= cut.epoch  # the recheck, after the waits
        points.hit("barrier.before_stamp")
        outcome = CutOutcome(cut.epoch, cut.reason, cut.mark, flushed, failures, prior_ok, latched)
        if not outcome.ok:
            self._invalidate_pending(outcome)
        elif cut.mark is not None:
            outcome = self._stamp(cut, outcome)
        self.last = outcome
        if outcome.complete and cut.mark is not None:
            points.hit("barrier.stamped")  # CHECKPOINT and PUBLISHED written
            self._trim_intents()
        if outcome.complete:
            self.last_ok_at = self._clock()
            self._retry_delay = 0.0
            self._retry_not_before = 0.0
        else:
            self._retry_delay = min(self.barrier_secs, max(RETRY_FIRST_SECS, 2 * self._retry_delay))
            self._retry_not_before = self._clock() + self._retry_delay
        p.forget_failures_before(cut.epoch + 1)
        self._on_cut(outcome)
        # One count per cut, and outcome "ok" only for a complete one: a cut whose
        # checkpoint or frontier write failed advanced nothing an operator relies on.
        if outcome.complete:
            self._count("ok", "")
        elif outcome.ok:
            self._count("error", outcome.checkpoint_error_type)
        elif outcome.latched:
            self._count("refused", "latched")
        elif outcome.flush_failures:
            self._count("refused", "flush_failed")
        else:
            self._count("refused", "prior_publish_failed")
        return outcome

    def _flush(self, batches: list[Detached]) -> list[bool]:
        """Publish a cut's partitions, ``flush_concurrency`` at a time, each on a thread
        of the cut's own (joined before this returns): one partition's encode, intent
        fsync and PUT wait on other processes, and one after the other the flush of a
        busy node's cut outlasted the cadence — the checkpoint fell further behind
        every cut and the WAL grew without bound (the 2026-12-03 soak). Whether each
        publish succeeded, in ``batches``' order; an unexpected exception is raised
        here once every thread has stopped."""
        publish = self.pipeline.publisher.publish
        lanes = min(self.flush_concurrency, len(batches))
        if lanes <= 1:
            return [publish(d).ok for d in batches]
        results: list[bool] = [False] * len(batches)
        errors: list[BaseException] = []
        next_index = iter(range(len(batches)))
        lock = threading.Lock()

        def lane() -> None:
            while True:
                with lock:
                    i = next(next_index, None)
                    if i is None or errors:
                        return
                try:
                    results[i] = publish(batches[i]).ok
                except BaseException as exc:  # noqa: BLE001 - raised by the cut's thread
                    with lock:
                        errors.append(exc)
                    return

        threads = [
            threading.Thread(target=lane, name=f"ourios-flush-{n}", daemon=True)
            for n in range(lanes)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def _stamp(self, cut: Cut, outcome: CutOutcome) -> CutOutcome:
        installed = failed = 0
        p = self.pipeline
        unsettled = p.unmined.tenants() | p.refused
        snaps = {t: s for t, s in cut.snaps.items() if t not in unsettled}
        for tenant, result in self.store.install_all(snaps).items():
            if result.installed:
                installed += 1
                self.ledger.record(cut.snaps[tenant])
            elif result.reason != "not above the installed horizon":
                failed += 1  # the store reports a tenant's failing installs once, not per cut
        assert cut.mark is not None
        mark = cut.mark
        published = p.cut_frontiers(mark)
        checkpointed = False
        error = error_type = ""
        try:
            checkpointed = p.journal.checkpoint(mark, published)
        except CheckpointError as exc:
            error, error_type = str(exc), "checkpoint_write"
            log.warning("checkpoint not advanced: %s", exc)
        except PublishedWriteError as exc:
            checkpointed = exc.checkpointed
            error, error_type = str(exc), "published_write"
            log.warning("publication frontiers not written: %s", exc)
        return CutOutcome(
            outcome.epoch,
            outcome.reason,
            outcome.mark,
            outcome.flushed,
            outcome.flush_failures,
            outcome.prior_ok,
            outcome.latched,
            checkpointed,
            error,
            installed,
            failed,
            error_type,
        )

    def _trim_intents(self) -> None:
        """The frontiers just moved: drop the publish intents wholly at or below them,
        which no restart will consult (``app.ingest.landed``). A failure keeps them all
        (a restart asks about more objects, nothing else)."""
        if self.intents is None:
            return
        journal = self.pipeline.journal
        mark = journal.last_checkpoint
        keep = live_intent(journal.published_marks(), -1 if mark is None else mark.lsn)
        try:
            self.intents.trim(keep)
        except IntentWriteError as exc:
            log.warning("publish intents not trimmed: %s", exc)
        points.hit("barrier.after_trim")

    def _invalidate_pending(self, outcome: CutOutcome) -> None:
        """The running cut failed: a pending cut folded frames whose only durable copy
        was the failed batches, so it must not install or stamp. Its batches go back
        into the buffers and a fresh capture follows after the retry delay
        (``RETRY_FIRST_SECS``, doubling up to ``barrier_secs`` while cuts keep failing;
        the barrier thread honours it, a test's direct ``step`` does not)."""
        with self._cond:
            pending, self._pending = self._pending, None
            self.recapture = True
            self._cond.notify_all()
        if pending is not None:
            self.pipeline.abandon_cut(pending, "invalidated")
        if outcome.latched:
            self._events(
                "barrier.cut.refused",
                {
                    "epoch": outcome.epoch,
                    "reason": "latched",
                    "failed_epoch": self.pipeline.failed_epoch,
                },
            )

    @property
    def pending(self) -> Cut | None:
        with self._cond:
            return self._pending

    @property
    def retry_not_before(self) -> float:
        """The monotonic time before which no fresh capture follows a failed cut (0.0 once
        a cut succeeds): what the retry backoff has come to."""
        return self._retry_not_before

"""The barrier's work: running a cut (RFC 0052 §3.1; the schedule that decides when is
``app.cadence.barrier``).

A cut the cut owner (``app.ingest.cuts.CutOwner``) captured runs outside the exclusion:

1. flush its batches (audit partitions first) to the store, ``flush_concurrency`` at a
   time on lanes of the cut's own (the ``ourios-flush-*`` threads);
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
   (``CutOwner.cut_frontiers``).

A failed cut invalidates the pending one (its batches back into the buffers, its
snapshots discarded) and asks for a fresh capture after the retry delay, which doubles
from ``RETRY_FIRST_SECS`` up to ``barrier_secs`` while cuts keep failing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from app import points
from app.base.gc_policy import collection_deferred
from app.ingest.cuts import Cut, CutOwner
from app.ingest.landed import live_intent
from app.ingest.snapshot_store import SnapshotLedger, SnapshotStore
from sink.buffers import Detached, PublishOutcome
from wal import (
    AppendError,
    CheckpointError,
    IntentLog,
    IntentWriteError,
    Journal,
    PublishedWriteError,
    RotationKind,
    WalOffset,
)

__all__ = ["FLUSH_CONCURRENCY", "RETRY_FIRST_SECS", "CutOutcome", "CutRunner"]

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


class CutRunner:
    """Runs the cuts the schedule hands it, on the barrier thread (module docstring)."""

    def __init__(
        self,
        cuts: CutOwner,
        store: SnapshotStore,
        ledger: SnapshotLedger,
        journal: Journal,
        *,
        barrier_secs: float,
        segment_age_secs: float,
        request_cut: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        on_cut: Callable[[CutOutcome], None] | None = None,
        on_run: Callable[[str, str], None] | None = None,
        intents: IntentLog | None = None,
        flush_concurrency: int = FLUSH_CONCURRENCY,
        paced: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.cuts = cuts
        self.store = store
        self.ledger = ledger
        self.journal = journal
        #: the retry delay's cap
        self.barrier_secs = barrier_secs
        self.segment_age_secs = segment_age_secs
        #: the schedule's "capture again" (after a failed cut, once the delay is over)
        self._request_cut = request_cut
        #: how many of a cut's partitions are published at once (``_flush``)
        self.flush_concurrency = max(1, flush_concurrency)
        #: what each of the cut's publishes runs inside: the node's encode slots rest
        #: after a cut's publish (``server.encode_duty_percent``, TAIL.6)
        self._paced = paced
        #: the publish intents, trimmed to what lies above the frontiers after each cut
        self.intents = intents
        #: the retries' clock: monotonic, so a wall clock stepped back never stalls a cut
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._on_cut = on_cut or (lambda outcome: None)
        #: (outcome, error_type) of every tick: the metrics' cadence counter
        self.on_run = on_run
        #: the epoch of a cut that raised, for ``tick_failed`` to latch
        self._failed_epoch: int | None = None
        self.last: CutOutcome | None = None
        self.last_ok_at: float | None = None
        #: After a failed cut the fresh capture is not taken before this (monotonic):
        #: the delay doubles from ``RETRY_FIRST_SECS`` up to ``barrier_secs`` while cuts
        #: keep failing (a store outage, a latch) and resets on the first good cut, so
        #: a node whose cuts cannot succeed neither spins nor floods its log.
        self.retry_not_before = 0.0
        self._retry_delay = 0.0

    def count(self, outcome: str, error_type: str) -> None:
        if self.on_run is not None:
            self.on_run(outcome, error_type)

    def tick_failed(self, exc: BaseException) -> None:
        """A tick raised outside any publish: the tick's epoch is latched (no later cut
        stamps until a restart, RFC 0052 §3.2), the pending slot is invalidated."""
        cuts = self.cuts
        epoch = self._failed_epoch if self._failed_epoch is not None else cuts.epoch
        self._failed_epoch = None
        if cuts.latch(epoch):
            self._events("barrier.latch.set", {"epoch": epoch, "error": f"barrier tick: {exc}"})
        log.error("barrier tick failed: %s", exc, exc_info=exc)
        pending = cuts.take_pending()
        if pending is not None:
            cuts.abandon_cut(pending, "tick_failed")
        self.count("error", "cadence_panic")

    def capture(self, *, rotate_idle: bool = True) -> Cut:
        """Capture a cut under the exclusive exclusion (the timer's path)."""
        cuts = self.cuts
        started = time.perf_counter()
        # A collection the capture would trigger runs after the exclusion is released,
        # not inside the hold (app/base/gc_policy.py).
        with collection_deferred(), cuts.exclusion.exclusive():
            points.hit("barrier.after_quiesce")
            if rotate_idle:
                self._rotate_if_idle()
            cut = cuts.capture_cut_locked("timer")
        cuts.record_cut_stall(time.perf_counter() - started)
        # The turns the hold queued were just woken: let them have the interpreter
        # before this thread goes on (the flush, the deferred collection), or each would
        # wait up to a switch interval more (soak/bench/barrier.py, turns that met a cut).
        time.sleep(0)
        return cut

    def _rotate_if_idle(self) -> None:
        """The idle path: rotate first when the current segment is older than
        ``segment_age_secs`` and holds a frame, so the mark (in the closed segment) can
        release it; a failure draws on the rotation budget and is reported there."""
        journal = self.journal
        age, frames = journal.current_segment_age()
        if frames and age >= self.segment_age_secs:
            try:
                journal.rotate(RotationKind.DISCRETIONARY)
            except AppendError as exc:
                log.warning("idle rotation failed: %s", exc)

    def run_cut(self, cut: Cut) -> CutOutcome:
        self._failed_epoch = None
        try:
            return self._run_cut(cut)
        except BaseException:
            # whatever raised after the capture drained the buffers: the cut's unsettled
            # batches go back (else they wedge every later cut's wait), its snapshots are
            # dropped, and tick_failed latches this cut's own epoch
            self._failed_epoch = cut.epoch
            self.cuts.abandon_cut(cut, "tick_failed")
            raise

    def _run_cut(self, cut: Cut) -> CutOutcome:
        p = self.cuts
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
            self.retry_not_before = 0.0
        else:
            self._retry_delay = min(self.barrier_secs, max(RETRY_FIRST_SECS, 2 * self._retry_delay))
            self.retry_not_before = self._clock() + self._retry_delay
        p.forget_failures_before(cut.epoch + 1)
        self._on_cut(outcome)
        # One count per cut, and outcome "ok" only for a complete one: a cut whose
        # checkpoint or frontier write failed advanced nothing an operator relies on.
        if outcome.complete:
            self.count("ok", "")
        elif outcome.ok:
            self.count("error", outcome.checkpoint_error_type)
        elif outcome.latched:
            self.count("refused", "latched")
        elif outcome.flush_failures:
            self.count("refused", "flush_failed")
        else:
            self.count("refused", "prior_publish_failed")
        return outcome

    def _flush(self, batches: list[Detached]) -> list[bool]:
        """Publish a cut's partitions, ``flush_concurrency`` at a time, each on a thread
        of the cut's own (joined before this returns): one partition's encode, intent
        fsync and PUT wait on other processes, and one after the other the flush of a
        busy node's cut outlasted the cadence — the checkpoint fell further behind
        every cut and the WAL grew without bound (the 2026-12-03 soak). Whether each
        publish succeeded, in ``batches``' order; an unexpected exception is raised
        here once every thread has stopped."""
        publish_now = self.cuts.publisher.publish
        paced = self._paced

        def publish(d: Detached) -> PublishOutcome:
            with paced():
                return publish_now(d)

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
        p = self.cuts
        unsettled = p.unsettled()
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
            checkpointed = self.journal.checkpoint(mark, published)
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
        journal = self.journal
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
        pending = self.cuts.take_pending()
        self._request_cut()
        if pending is not None:
            self.cuts.abandon_cut(pending, "invalidated")
        if outcome.latched:
            self._events(
                "barrier.cut.refused",
                {
                    "epoch": outcome.epoch,
                    "reason": "latched",
                    "failed_epoch": self.cuts.failed_epoch,
                },
            )

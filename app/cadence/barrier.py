"""The publication barrier: the only place the checkpoint advances (RFC 0052 §3.1) — its
schedule. When to cut lives here; the cut's state and capture are the cut owner's
(``app.ingest.cuts.CutOwner``) and running a cut is ``app.cadence.cut_runner``'s.

A cut is *captured* under the barrier exclusion held exclusively (or, for a rotation-
fired cut, inside the ingest turn that observed the segment change, which the gate
already makes exclusive of every other turn): the mark is read (``last_durable``, the
last acknowledged turn's own frame end), both sinks are drained into owned batches
registered as in flight, every tenant whose folded horizon moved since its last
installed snapshot is *frozen* at that horizon, and an epoch is taken. Nothing else
happens under the exclusion: a frozen tenant's miner state is serialised afterwards by
the barrier thread, or by that tenant's next turn if it comes first, so the stall a
cut causes does not grow with the number of tenants. The cut then *runs* outside the
exclusion (``CutRunner``: flush, prior publishes, latch, snapshots, stamp).

The schedule: the timer fires every ``barrier_secs`` (rotating an idle segment older
than ``segment_age_secs`` first); a cut a turn offered at a rotation wakes it at once;
a requested cut (the housekeeper's, or the retry after a failed cut, not before the
retry delay) wakes it too; shutdown runs the pending cut once. Each tick first runs the
pending cut, if any, then settles every tenant with an unmined entry (RFC 0055 §9.4,
before a fresh capture), then captures on the timer. The schedule calls the work
directly on its own thread rather than through a queue: cuts are strictly ordered, one
at a time, and the pending slot (the cut owner's) is already the one-deep queue the
rotation fills — a second thread would add a hand-off and reorder nothing.

Cuts are strictly ordered: the single pending slot holds at most one cut captured while
another runs, coalesces a further capture into it (all-or-nothing under
``ceiling_bytes``), never installs or stamps before the running cut's outcome, and is
invalidated — batches back into the buffers, snapshots discarded — when that cut fails.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from app.cadence.cut_runner import FLUSH_CONCURRENCY, CutOutcome, CutRunner
from app.ingest.cuts import Cut, CutOwner
from app.ingest.settlement import SettleOutcome, SettleResult
from app.ingest.snapshot_store import SnapshotLedger, SnapshotStore
from app.threads import Supervised, Supervisor, start_thread
from wal import IntentLog, Journal

if TYPE_CHECKING:
    from app.ingest.settlement import Settler

__all__ = ["Barrier", "CutOutcome"]

log = logging.getLogger("ourios.barrier")


class Barrier:
    """The barrier thread: a timer every ``barrier_secs`` plus the rotation's pending
    slot; what it decides to run, its ``runner`` runs."""

    def __init__(
        self,
        cuts: CutOwner,
        store: SnapshotStore,
        ledger: SnapshotLedger,
        *,
        journal: Journal,
        settler: Settler,
        barrier_secs: float,
        segment_age_secs: float,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        on_cut: Callable[[CutOutcome], None] | None = None,
        on_run: Callable[[str, str], None] | None = None,
        intents: IntentLog | None = None,
        flush_concurrency: int = FLUSH_CONCURRENCY,
        threads: Supervisor | None = None,
        paced: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.cuts = cuts
        self.settler = settler
        #: runs the timer's loop and restarts it after an unexpected exception
        self._threads = threads
        self.barrier_secs = barrier_secs
        #: the timer's clock: monotonic, so a wall clock stepped back never stalls a cut
        #: (nothing the barrier writes carries a time)
        self._clock = clock
        #: the pending slot's condition: an offer, a request and a stop all wake the
        #: timer's wait through it, so none is missed between a check and the wait
        self._cond = cuts.slot
        self._stop = threading.Event()
        self._thread: Supervised | None = None
        self.recapture = False
        #: when the timer fires next (the settling hint reads it)
        self.next_tick_at = self._clock() + barrier_secs
        self.settlements: list[SettleOutcome] = []
        self.runner = CutRunner(
            cuts,
            store,
            ledger,
            journal,
            barrier_secs=barrier_secs,
            segment_age_secs=segment_age_secs,
            request_cut=self.request_cut,
            clock=clock,
            events=events,
            on_cut=on_cut,
            on_run=on_run,
            intents=intents,
            flush_concurrency=flush_concurrency,
            paced=paced,
        )

    def schedule(self) -> tuple[float, float]:
        """(the cadence in seconds, when the timer fires next): the settling hint."""
        return self.barrier_secs, self.next_tick_at

    def request_cut(self) -> None:
        """Capture and run a cut now rather than at the next timer (the housekeeper
        asks when the disk is low or a bound refuses batches; a failed cut asks for its
        retry); never blocks."""
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
        runner = self.runner
        while not self._stop.is_set():
            with self._cond:
                while (
                    self.cuts.pending is None
                    and not (self.recapture and self._clock() >= runner.retry_not_before)
                    and not self._stop.is_set()
                    and self._clock() < deadline
                ):
                    wake = deadline
                    if self.recapture:
                        wake = min(wake, runner.retry_not_before)
                    self._cond.wait(timeout=min(1.0, max(0.01, wake - self._clock())))
            if self._stop.is_set():
                return
            timed = self._clock() >= deadline
            try:
                self.step(timer=timed)
            except Exception as exc:  # noqa: BLE001 - latched and counted; the next tick runs
                runner.tick_failed(exc)
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
        pending = self.cuts.take_pending()
        if pending is not None and joined:
            self.runner.run_cut(pending)
        return joined

    # -- one step ------------------------------------------------------------------------

    def step(self, *, timer: bool = True) -> CutOutcome | None:
        """Run the pending cut if one waits, else (on the timer) rotate an old idle
        segment and capture a fresh cut; either way settle every unmined entry first
        (a pending cut's batches are published before, so a settlement never waits on
        them). Returns what the cut did."""
        with self._cond:
            cut = self.cuts.take_pending()
            recapture, self.recapture = self.recapture, False
        if cut is not None:
            outcome = self.runner.run_cut(cut)
            self.settle()
            return outcome
        self.settle()
        if not (timer or recapture):
            return None
        return self.runner.run_cut(self.runner.capture(rotate_idle=timer))

    def settle(self) -> list[SettleOutcome]:
        """Settle every tenant with an unmined entry (the barrier's trigger): the store
        I/O of the forced frontier is allowed here, on the barrier thread."""
        outcomes = self.settler.settle_all(force_publish=True)
        for o in outcomes:
            if o.result is SettleResult.FAILED:
                self.runner.count("error", "settlement_failed")
        self.settlements = outcomes
        return outcomes

    # -- the work, as the tests and benchmarks drive it ----------------------------------

    def capture(self, *, rotate_idle: bool = True) -> Cut:
        """Capture a cut under the exclusive exclusion (``CutRunner.capture``)."""
        return self.runner.capture(rotate_idle=rotate_idle)

    def run_cut(self, cut: Cut) -> CutOutcome:
        return self.runner.run_cut(cut)

    def tick_failed(self, exc: BaseException) -> None:
        self.runner.tick_failed(exc)

    @property
    def pending(self) -> Cut | None:
        return self.cuts.pending

    @property
    def last(self) -> CutOutcome | None:
        return self.runner.last

    @property
    def last_ok_at(self) -> float | None:
        return self.runner.last_ok_at

    @property
    def retry_not_before(self) -> float:
        """The monotonic time before which no fresh capture follows a failed cut (0.0 once
        a cut succeeds): what the retry backoff has come to."""
        return self.runner.retry_not_before

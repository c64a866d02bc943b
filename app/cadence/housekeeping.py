"""The housekeeping timer: every ``housekeeping_secs``, one capped reclamation pass
(``wal/reclamation.py``, through ``Journal.maintain``: prepare under the journal mutex →
file half with no lock → commit) with the horizons of the SnapshotLedger — installs that
returned OK, never a directory listing. A tenant with WAL frames and no installed
snapshot is therefore absent from the map and *pinned*; the ingest receiver never passes
``NoConsumerHorizons``.

It runs independently of the barrier (a latched barrier does not stop partial sweeps),
survives an exception in a pass (counted by error type; the next pass re-plans), and is
the single emitter of the floor's transitions (``wal.floor.pinned``/``wal.floor.lifted``,
exactly once each, when the categorical state changes).

Each tick first samples free space on the WAL's filesystem (statfs; the only place it is
sampled, never the append path) through ``app.base.diskspace.DiskSpace`` — which also
re-creates a released emergency reserve once the sample shows room for it — and hands
the figure (the sample less the reserve still owed) to ``Admission.observe`` with the
WAL's no-space latch read just before; a latch it has not seen yet releases the reserve
first, so what reclamation writes next finds room. When the tick is *urgent* (below low
water, or a bound refusing batches) it asks the barrier for a cut now (``request_cut``)
and, when that cut ends (``after_cut``, the barrier's hook), runs one more pass at once
— so the checkpoint a reclamation needs is not left to the barrier's own timer. The
pass itself needs no new block (RECLAIM is preallocated, CHECKPOINT has a spare), so it
keeps running on a full disk; it never depends on the sample succeeding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path

from app import points
from app.base.diskspace import DiskSpace, statvfs_free
from app.ingest.admission import Admission, TickDecision
from app.ingest.snapshot_store import SnapshotLedger
from app.threads import Supervised, Supervisor, start_thread
from wal import FloorPinned, Journal, ReclaimError, ReclamationProgress, WalError, WalOffset

log = logging.getLogger("ourios.housekeeping")


def hurry_words(every: float, *, cuts: bool) -> str:
    """What a housekeeper hurried by admission does, in the words admission's events say
    (``Admission(hurry=…)``). Said in the events, so it must be true of every path that
    emits them: the pass always follows the observation in the same tick; the cut is
    requested by regular ticks (a follow-up tick does not request another); ``cuts``:
    the housekeeper can request a cut."""
    if cuts:
        return (
            f"a housekeeping pass runs now; while this lasts every tick ({every:g} s) also "
            f"requests a barrier cut and runs another pass as soon as that cut ends"
        )
    return f"a housekeeping pass runs now and every {every:g} s"


class Housekeeper:
    def __init__(
        self,
        journal: Journal,
        ledger: SnapshotLedger,
        *,
        every: float,
        cap: int,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        admission: Admission | None = None,
        request_cut: Callable[[], None] | None = None,
        disk_free: Callable[[Path], int] | None = None,
        space: DiskSpace | None = None,
        threads: Supervisor | None = None,
        wake: threading.Event | None = None,
        on_pass: Callable[[float], None] | None = None,
        on_run: Callable[[str, str], None] | None = None,
    ) -> None:
        self.journal = journal
        #: runs the timer's loop and restarts it after an unexpected exception
        self._threads = threads
        self.admission = admission
        self._request_cut = request_cut
        if space is None and admission is not None:
            space = admission.space
        #: the WAL volume's figure: sampled here, read by admission and the metrics
        self.space = space or DiskSpace(journal.root, journal, measure=disk_free or statvfs_free)
        self._latch_seen = 0  # the last no-space latch that released the reserve
        self._follow_up = threading.Event()  # a requested cut ended: pass again now
        self._cut_requested = False
        self.last_decision: TickDecision | None = None
        self.ledger = ledger
        self.every = every
        self.cap = cap
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._stop = threading.Event()
        #: set to run a pass now; ``wake`` is the one admission was given (``on_urgent``),
        #: built before both since each is built on the other's behalf
        self._wake = wake if wake is not None else threading.Event()
        self._thread: Supervised | None = None
        self._pinned = False
        self.runs: Counter[tuple[str, str]] = Counter()  # (outcome, error_type)
        self.pass_seconds: deque[float] = deque(maxlen=1024)
        #: the metrics' observers: each pass's duration, each run's outcome
        self.on_pass = on_pass
        self.on_run = on_run
        self.last: ReclamationProgress | None = None
        #: free bytes on the WAL's filesystem as statvfs last said (the figure admission
        #: uses is ``space.free_bytes``)
        self.disk_free_bytes: int | None = None

    def sample_disk(self) -> int | None:
        """Free bytes on the WAL's filesystem now, or None when statfs failed."""
        free = self.space.sample()
        if free is not None:
            self.disk_free_bytes = free
        return free

    def observe_disk(self) -> TickDecision | None:
        """Sample, and let admission move its levels (the latch is read first)."""
        latch = self.journal.no_space
        if latch is not None and latch.seq != self._latch_seen:
            self._latch_seen = latch.seq
            self.space.no_space(f"the WAL's {latch.op} of {latch.path} failed: {latch.error}")
        raw = self.sample_disk()
        if self.admission is None:
            return None
        free = None if raw is None else self.space.free_bytes
        decision = self.admission.observe(free, latch)
        self.last_decision = decision
        return decision

    def after_cut(self) -> None:
        """The barrier's hook at the end of every cut: a cut this housekeeper asked for
        is followed by a pass at once."""
        if self._cut_requested:
            self._cut_requested = False
            self._follow_up.set()
            self._wake.set()

    def step(self, *, follow_up: bool = False) -> ReclamationProgress | None:
        """One tick: sample the disk, then one pass; the pass never raises (its outcome
        is counted and logged) — anything else that does reaches the thread's supervisor,
        which logs and restarts the loop. ``follow_up``: the pass after a requested cut (no new
        request, so an urgent state costs one extra cut per tick, not a loop)."""
        decision = self.observe_disk()
        if (
            decision is not None
            and decision.urgent
            and not follow_up
            and self._request_cut is not None
        ):
            self._cut_requested = True
            self._request_cut()
        started = time.perf_counter()
        points.hit("housekeeping.before_pass")
        progress: ReclamationProgress | None
        # Read before the horizons: a cut installs its snapshots before it stamps its
        # checkpoint, so every install this mark covers is in the horizons read next.
        checkpoint = self.journal.reclaim_state().checkpoint
        try:
            progress = self.journal.maintain(self.ledger.known(), self.cap)
        except ReclaimError as exc:
            self._count("error", exc.error_type)
            log.warning("housekeeping pass failed: %s", exc)
            progress = exc.progress
        except WalError as exc:
            self._count("error", exc.error_type)
            log.warning("housekeeping pass refused: %s", exc)
            progress = None
        except Exception:  # noqa: BLE001 - the next pass re-plans the uncommitted plan
            self._count("error", "cadence_panic")
            log.exception("housekeeping pass raised")
            progress = None
        else:
            self._count("ok", "")
        seconds = time.perf_counter() - started
        self.pass_seconds.append(seconds)
        if self.on_pass is not None:
            self.on_pass(seconds)
        if progress is not None:
            self.last = progress
            self._floor_transition(progress, checkpoint)
        return progress

    def _count(self, outcome: str, error_type: str) -> None:
        self.runs[(outcome, error_type)] += 1
        if self.on_run is not None:
            self.on_run(outcome, error_type)

    def _floor_transition(
        self, progress: ReclamationProgress, checkpoint: WalOffset | None
    ) -> None:
        """``wal.floor.pinned`` when a pin starts holding frames the checkpoint covers
        (a snapshot missing after a cut), ``wal.floor.lifted`` when that ends. A tenant
        whose frames are all above the checkpoint is pinned by design — waiting for the
        first cut after its first batch — and holds nothing a cut has released: no event
        (the floor's gauges still show it)."""
        floor = progress.floor
        held = (
            isinstance(floor, FloorPinned)
            and floor.oldest_pinned is not None
            and checkpoint is not None
            and floor.oldest_pinned.lsn <= checkpoint.lsn
        )
        if held and not self._pinned:
            assert isinstance(floor, FloorPinned)
            self._events(
                "wal.floor.pinned",
                {
                    "tenants": floor.tenants,
                    "offset": str(floor.offset),
                    "checkpoint": str(checkpoint),
                    "example_tenants": list(floor.pinned),
                    "lag_bytes": progress.lag_bytes,
                    "lag_segments": progress.lag_segments,
                },
            )
        elif not held and self._pinned:
            self._events("wal.floor.lifted", {"floor": floor.state})
        self._pinned = held

    def wake(self) -> None:
        """Run a pass now (the disk's low-water mark asks for one)."""
        self._wake.set()

    def start(self) -> None:
        # Restartable: a pass's plan is re-planned by the next pass, and the loop holds
        # nothing across ticks but the follow-up flag (DESIGN.md §5.10).
        self._thread = start_thread(
            self._threads,
            "housekeeping",
            self._run,
            thread_name="ourios-housekeeping",
            stop=self._stop,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.every)
            self._wake.clear()
            if self._stop.is_set():
                return
            follow_up = self._follow_up.is_set()
            self._follow_up.clear()
            self.step(follow_up=follow_up)

    def close(self, timeout: float = 60.0) -> bool:
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        joined = not self._thread.is_alive()
        self._thread = None
        return joined

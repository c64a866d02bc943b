"""The housekeeping thread: every ``housekeeping_secs``, one capped reclamation pass
(``Journal.maintain``: prepare under the journal mutex → file half with no lock →
commit) with the horizons of the SnapshotLedger — installs that returned OK, never a
directory listing. A tenant with WAL frames and no installed snapshot is therefore
absent from the map and *pinned*; the ingest receiver never passes ``NoConsumer``.

It runs independently of the barrier (a latched barrier does not stop partial sweeps),
survives an exception in a pass (counted by error type; the next pass re-plans), and is
the single emitter of the floor's transitions (``wal.floor.pinned``/``wal.floor.lifted``,
exactly once each, when the categorical state changes).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from app import points
from app.snapshots import SnapshotLedger
from wal import FloorPinned, HousekeepingProgress, Journal, ReclaimError, WalError

log = logging.getLogger("ourios.housekeeping")


class Housekeeper:
    def __init__(
        self,
        journal: Journal,
        ledger: SnapshotLedger,
        *,
        every: float,
        cap: int,
        clock: Callable[[], float] = time.time,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> None:
        self.journal = journal
        self.ledger = ledger
        self.every = every
        self.cap = cap
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pinned = False
        self.runs: Counter[tuple[str, str]] = Counter()  # (outcome, error_type)
        self.pass_seconds: deque[float] = deque(maxlen=1024)
        #: observers the metrics install: each pass's duration, each run's outcome
        self.on_pass: Callable[[float], None] | None = None
        self.on_run: Callable[[str, str], None] | None = None
        self.last: HousekeepingProgress | None = None
        #: free bytes on the WAL's filesystem, sampled each tick (never on the append path)
        self.disk_free_bytes: int | None = None

    def sample_disk(self) -> int | None:
        try:
            st = os.statvfs(self.journal.root)
        except OSError as exc:
            log.warning("statvfs of %s failed: %s", self.journal.root, exc)
            return self.disk_free_bytes
        self.disk_free_bytes = st.f_bavail * st.f_frsize
        return self.disk_free_bytes

    def step(self) -> HousekeepingProgress | None:
        """One pass; never raises (the outcome is counted and logged)."""
        self.sample_disk()
        started = time.perf_counter()
        points.hit("housekeeping.before_pass")
        progress: HousekeepingProgress | None
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
            self._floor_transition(progress)
        return progress

    def _count(self, outcome: str, error_type: str) -> None:
        self.runs[(outcome, error_type)] += 1
        if self.on_run is not None:
            self.on_run(outcome, error_type)

    def _floor_transition(self, progress: HousekeepingProgress) -> None:
        floor = progress.floor
        pinned = isinstance(floor, FloorPinned)
        if pinned and not self._pinned:
            assert isinstance(floor, FloorPinned)
            self._events(
                "wal.floor.pinned",
                {
                    "tenants": floor.tenants,
                    "offset": str(floor.offset),
                    "example_tenants": list(floor.pinned),
                    "lag_bytes": progress.lag_bytes,
                    "lag_segments": progress.lag_segments,
                },
            )
        elif not pinned and self._pinned:
            self._events("wal.floor.lifted", {"floor": floor.state})
        self._pinned = pinned

    def wake(self) -> None:
        """Run a pass now (the disk's low-water mark asks for one)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ourios-housekeeping", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.every)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.step()

    def close(self, timeout: float = 60.0) -> bool:
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        joined = not self._thread.is_alive()
        self._thread = None
        return joined

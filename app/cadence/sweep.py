"""The age sweep: publishes buffered partitions older than ``sink.flush_age_secs``, so a
quiet tenant's rows reach the store without waiting for the size trigger or a cut.
They are drained under the shared exclusion (as a turn holds it) and written outside
it; a partition it drained but did not write goes back into the buffers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.ingest.pipeline import Pipeline
from app.threads import Supervised, Supervisor, start_thread

__all__ = ["AgeSweep"]

log = logging.getLogger("ourios.sweep")


class AgeSweep:
    """Publishes partitions older than ``flush_age_secs``: drained under the shared
    exclusion, written outside it."""

    def __init__(
        self,
        pipeline: Pipeline,
        max_age: float,
        tick: float,
        on_run: Callable[[str, str], None] | None = None,
        threads: Supervisor | None = None,
    ) -> None:
        #: runs the loop and restarts it after an unexpected exception
        self._threads = threads
        self._on_run = on_run or (lambda outcome, error_type: None)
        self._pipeline = pipeline
        self._max_age = max_age
        self._tick = tick
        self._stop = threading.Event()
        self._thread: Supervised | None = None

    def start(self) -> None:
        # Restartable: a sweep gives back what it drained and did not write (its
        # ``finally``), so nothing is held across a crash (DESIGN.md §5.10).
        self._thread = start_thread(
            self._threads, "age_sweep", self._run, thread_name="ourios-age-sweep", stop=self._stop
        )

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def sweep_once(self) -> int:
        """One sweep; returns the partitions it drained. Counted ``ok`` only when every
        one of them reached the store."""
        p = self._pipeline
        with p.exclusion.shared(), p.miner_lock:
            # under the miner lock, where a turn mines and buffers: the template versions
            # pinned are those of the rows and events buffered (DESIGN.md §3)
            detached = p.buffers.drain_aged(self._max_age)
            p.cuts.pin_versions_locked(detached)
        failed = done = 0
        try:
            for d in detached:
                if self._stop.is_set():
                    break  # shutting down: the final cut takes the rest from the buffers
                if not p.publisher.publish(d).ok:
                    failed += 1
                done += 1
        finally:
            # Whatever an exception left unwritten goes back (a no-op for a partition
            # another thread claimed), so nothing drained here stays registered for good.
            for d in detached[done:]:
                p.buffers.requeue(d, "sweep_failed")
        if done < len(detached):
            self._on_run("refused", "stopped")
        elif detached:
            self._on_run("ok" if not failed else "refused", "" if not failed else "publish_failed")
        return len(detached)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            try:
                self.sweep_once()
            except Exception:  # noqa: BLE001 - counted; the next tick retries
                log.exception("age sweep failed")
                self._on_run("error", "cadence_panic")

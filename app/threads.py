"""Supervised long-lived threads: a loop that raises is never silent (DESIGN.md §5.10).

Every long-lived thread of the core runs its loop under the node's one ``Supervisor``.
A loop that *returns* has ended as its owner asked (its stop). A loop that *raises*:

* is logged once, with its traceback, as one ``thread.crashed`` event;
* is called again **on the same thread** after a backoff (``BACKOFF_FIRST_SECS``,
  doubling up to ``BACKOFF_MAX_SECS``; the owner's stop event cuts the wait short), and
  the restart is counted in ``restarts`` (``ourios_thread_restarts_total{thread}``). The
  same thread because the kernel ties a worker process's ``PR_SET_PDEATHSIG`` to the
  thread that started it, and a thread's identity is what the owner joins;
* is *failed* instead when its owner said a restart could break an invariant
  (``restart=False``: the turn and commit threads, the recovery thread), or when it
  crashed more than ``restarts`` times within ``RESTART_WINDOW_SECS`` — one
  ``thread.failed`` event, and ``failed`` names it from then on, so ``/healthz`` and
  ``/readyz`` answer 503 naming the thread and Kubernetes restarts the pod.

The ground floor of ``app`` (beside ``app.points``): every floor above may start a
thread through it; ``sink`` (which imports nothing of ``app``) takes any object with the
same ``start`` through a protocol of its own. Nothing here is global: the node builds
one ``Supervisor`` and hands it to each owner's constructor.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Final

__all__ = [
    "BACKOFF_FIRST_SECS",
    "BACKOFF_MAX_SECS",
    "DEFAULT_RESTARTS",
    "RESTART_WINDOW_SECS",
    "Supervised",
    "Supervisor",
    "start_thread",
]

log = logging.getLogger("ourios.threads")

#: The first restart waits this long; each further crash within the window doubles it.
BACKOFF_FIRST_SECS: Final = 0.5
#: The longest wait before a restart.
BACKOFF_MAX_SECS: Final = 30.0
#: Crashes are counted over this sliding window (``server.thread_restarts`` per window).
RESTART_WINDOW_SECS: Final = 600.0
#: Restarts a thread gets within the window before it is failed.
DEFAULT_RESTARTS: Final = 5

Events = Callable[[str, Mapping[str, object]], None]


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    pass


class Supervised:
    """A started thread, as its owner sees it: ``join`` and ``is_alive`` (what a
    ``threading.Thread`` offers), alive through its restarts."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    @property
    def name(self) -> str:
        return self.thread.name

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


class Supervisor:
    """Runs named loops on threads of their own and restarts one that raises (module
    docstring); ``failed`` is the node's liveness verdict."""

    def __init__(
        self,
        *,
        events: Events | None = None,
        restarts: int = DEFAULT_RESTARTS,
        window: float = RESTART_WINDOW_SECS,
        backoff_first: float = BACKOFF_FIRST_SECS,
        backoff_max: float = BACKOFF_MAX_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {restarts}")
        self._events = events or _no_events
        self.limit = restarts
        self.window = window
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._clock = clock
        self._lock = threading.Lock()
        self._crashes: dict[str, deque[float]] = {}
        self._failed: dict[str, str] = {}
        #: restarts so far, by thread (the metric's counter)
        self.restarts: Counter[str] = Counter()
        #: every thread started or reported so far (the metric's label values)
        self.names: set[str] = set()
        #: set by ``close``: no restart waits for longer, none is started after it
        self.closing = threading.Event()
        #: the threads started and not yet seen ended (``join``)
        self._threads: list[threading.Thread] = []

    # -- the verdict -----------------------------------------------------------------

    @property
    def failed(self) -> dict[str, str]:
        """Thread → why it is not running any more (empty while every thread is)."""
        with self._lock:
            return dict(self._failed)

    @property
    def healthy(self) -> bool:
        return not self._failed

    def verdict(self) -> str:
        """ "" while healthy, else a line naming each failed thread and why."""
        failed = self.failed
        return "; ".join(f"thread {name} stopped: {why}" for name, why in sorted(failed.items()))

    # -- running a loop ----------------------------------------------------------------

    def start(
        self,
        name: str,
        loop: Callable[[], None],
        *,
        thread_name: str | None = None,
        restart: bool = True,
        stop: threading.Event | None = None,
    ) -> Supervised:
        """Run ``loop`` on a new daemon thread under supervision. ``name`` is the
        metric's label (``housekeeping``), ``thread_name`` the thread's own
        (``ourios-housekeeping``); ``restart=False`` fails the node at the first crash;
        ``stop``, the owner's stop event, cuts a restart's wait short and ends it."""
        with self._lock:
            self.names.add(name)
        thread = threading.Thread(
            target=self.run,
            args=(name, loop),
            kwargs={"restart": restart, "stop": stop},
            name=thread_name or f"ourios-{name}",
            daemon=True,
        )
        thread.start()
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        return Supervised(thread)

    def run(
        self,
        name: str,
        loop: Callable[[], None],
        *,
        restart: bool = True,
        stop: threading.Event | None = None,
    ) -> None:
        """The supervised thread's body: ``loop`` until it returns, restarted after a
        crash while that is allowed."""
        while True:
            try:
                loop()
                return
            except BaseException as exc:  # noqa: BLE001 - logged, counted, restarted or failed
                if not self.crashed(name, exc, restart=restart, stop=stop):
                    return

    def crashed(
        self,
        name: str,
        exc: BaseException,
        *,
        restart: bool = True,
        stop: threading.Event | None = None,
    ) -> bool:
        """Report an unexpected exception out of ``name``'s loop: one ``thread.crashed``
        event with its traceback. True after the backoff when the loop may run again
        (counted as a restart); False when it may not — failed (``thread.failed``), or
        its owner is stopping. An owner that replaces its loop by other means (a
        worker's channel reader: the worker is restarted) calls this directly, with no
        ``stop``, and acts on the answer."""
        now = self._clock()
        with self._lock:
            self.names.add(name)
            recent = self._crashes.setdefault(name, deque())
            recent.append(now)
            while recent and recent[0] < now - self.window:
                recent.popleft()
            crashes = len(recent)
            allowed = restart and crashes <= self.limit
            delay = min(self._backoff_max, self._backoff_first * 2 ** (crashes - 1))
        trace = "".join(traceback.format_exception(exc))
        self._emit(
            "thread.crashed",
            {
                "thread": name,
                "error": f"{type(exc).__name__}: {exc}",
                "error_type": type(exc).__name__,
                "traceback": trace,
                "restarting": allowed,
                "crashes_in_window": crashes,
                "window_seconds": self.window,
                "backoff_seconds": delay if allowed else None,
            },
        )
        if not allowed:
            why = (
                "it may not be restarted (a restart could break an invariant it holds)"
                if not restart
                else f"it crashed {crashes} times within {self.window:g} s "
                f"(server.thread_restarts={self.limit})"
            )
            self._fail(name, f"{type(exc).__name__}: {exc}; {why}")
            return False
        if (stop if stop is not None else self.closing).wait(delay) or self.closing.is_set():
            return False  # its owner is stopping: nothing to restart
        with self._lock:
            self.restarts[name] += 1
        return True

    def close(self) -> None:
        """The node is stopping: no restart waits any longer."""
        self.closing.set()

    def join(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds in all for every thread started here to end
        (after ``close``: a loop in its restart backoff ends at once); the names of
        those still running."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sorted(t.name for t in threads if t.is_alive())

    # -- internals ---------------------------------------------------------------------

    def _fail(self, name: str, why: str) -> None:
        with self._lock:
            first = name not in self._failed
            self._failed[name] = why
        if first:
            self._emit(
                "thread.failed",
                {
                    "thread": name,
                    "error": why,
                    "action": "/healthz and /readyz answer 503 naming this thread, so "
                    "Kubernetes restarts the pod; the WAL holds every acknowledged batch",
                },
            )

    def _emit(self, event: str, fields: Mapping[str, object]) -> None:
        try:
            self._events(event, fields)
        except Exception:  # noqa: BLE001 - a broken log must not stop supervision
            log.error("%s for thread %s could not be logged", event, fields.get("thread"))


def start_thread(
    threads: Supervisor | None,
    name: str,
    loop: Callable[[], None],
    *,
    thread_name: str,
    restart: bool = True,
    stop: threading.Event | None = None,
) -> Supervised:
    """``threads.start(...)``, or — without a supervisor (a component built on its own
    in a test or a tool) — a plain daemon thread running ``loop`` once."""
    if threads is not None:
        return threads.start(name, loop, thread_name=thread_name, restart=restart, stop=stop)
    thread = threading.Thread(target=loop, name=thread_name, daemon=True)
    thread.start()
    return Supervised(thread)

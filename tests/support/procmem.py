"""Resident memory of real processes, read from ``/proc/<pid>/status``.

``MemorySampler`` reads ``VmRSS`` of a set of processes every ``every`` seconds on a
thread of its own and keeps the highest value it saw for each, plus ``VmHWM`` (the
kernel's own peak) when the process is still there at the end. It observes another
process; it never decides when anything happens in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

KIB = 1024


def status_bytes(pid: int, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` in bytes (None: no such process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * KIB
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``: the kernel's peak)
    of a process that must still be there; an AssertionError names what is missing."""
    value = status_bytes(pid, field)
    assert value is not None, f"no {field} for pid {pid}"
    return value // KIB


class MemorySampler:
    """The peak ``VmRSS`` of each watched process, sampled (module docstring)."""

    def __init__(self, pids: Callable[[], Iterable[int]], every: float = 0.1) -> None:
        self._pids = pids
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)
        self._lock = threading.Lock()
        #: pid -> the highest VmRSS seen, and VmHWM read at the end
        self.peak: dict[int, int] = {}
        self.hwm: dict[int, int] = {}
        self.samples = 0

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        for pid in self.peak:
            hwm = status_bytes(pid, "VmHWM")
            if hwm is not None:
                self.hwm[pid] = hwm

    def sample(self) -> None:
        for pid in self._pids():
            rss = status_bytes(pid, "VmRSS")
            if rss is None:
                continue
            with self._lock:
                self.peak[pid] = max(self.peak.get(pid, 0), rss)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

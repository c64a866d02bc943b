"""The spool: partitions the memory bound pushed out of memory, kept as Parquet files on
the data volume until the store takes them (DESIGN.md §5.12).

Layout: ``<data_dir>/spool/<kind>-<object name>.parquet``, each file exactly the bytes of
the object it will become (encoded once, published as it is), written as
``.<name>.<hex>.tmp`` and renamed. A spooled partition is a unit of the buffers
(``sink.buffers.Partition.spool``) whose object name and claim were decided when it was
spooled and never change: its publish intent is recorded once, every attempt writes the
same key with the conditional create, and it is never merged with other rows.

Why the spool need not be durable (no fsync): every row a spool file holds is also in
a WAL frame the checkpoint has not passed — a cut stamps only when every publish
registered before it landed in the store, and a spooled unit is such a publish until
it does — so the WAL is the truth and the spool a cache of work already done. Start-up
removes the whole directory (``Spool.clear``) before anything is written, and the replay
re-derives what it held, under the same bound, so a restart after a long outage does not
take the rows back into memory at once (the crash loop of issue 21).

Disk admission counts the spool like the WAL: each file's bytes are reported as written
(``on_write``) and, when its object is in the store or its rows were dropped, as freed
(``on_free``), so ``app.base.diskspace``'s figure sees it between two samples. A
failed write leaves the rows in memory (the turn then waits for room, and admission's
stop water refuses new batches on a full volume).

The ``Spiller`` is the thread that keeps ``Buffers.held_bytes`` under the ceiling: woken
by ``Buffers.pressure`` past three quarters of it, it takes the largest partitions in
memory one by one and hands each to the publisher's ``spill``, which writes it to the
store when the store takes writes and to the spool when it does not, until the rows in
memory are at half the ceiling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sink.buffers import Buffers, Detached, PublishOutcome
    from sink.publisher import ThreadHandle, Threads

log = logging.getLogger("ourios.sink.spool")

SUFFIX: Final = ".parquet"
#: the outcome's error type of an encoded object over ``sink.max_object_bytes`` (its
#: partition went back as two halves, which the spiller takes next)
OBJECT_TOO_LARGE: Final = "object_too_large"

Events = Callable[[str, Mapping[str, object]], None]


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    pass


class SpoolFile:
    """One spooled object: the file and its size (module docstring)."""

    __slots__ = ("_spool", "nbytes", "path")

    def __init__(self, spool: Spool, path: Path, nbytes: int) -> None:
        self._spool = spool
        self.path = path
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"SpoolFile({self.path.name}, {self.nbytes} bytes)"

    def read(self) -> bytes:
        """The object's bytes (``OSError`` when the file cannot be read)."""
        return self.path.read_bytes()

    def discard(self) -> None:
        """Remove the file (its object is in the store, or its rows were dropped);
        removing it twice does nothing."""
        self._spool._remove(self)


class Spool:
    """The spool directory (module docstring). Thread-safe."""

    def __init__(
        self,
        root: Path,
        *,
        on_write: Callable[[int], None] | None = None,
        on_free: Callable[[int], None] | None = None,
        events: Events | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_budget: int = 0,
    ) -> None:
        self.root = root
        self._on_write = on_write
        self._on_free = on_free
        self._events = events or _no_events
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[Path, int] = {}
        self._bytes = 0
        #: files written and bytes written since start (counters)
        self.written_files = 0
        self.written_bytes = 0
        #: failed writes (the rows stayed in memory)
        self.write_failures = 0
        self._since: float | None = None
        self._episode_files = 0
        #: spooled objects' bytes in memory at once while they are published
        self._reading = 0
        self._read_budget = read_budget
        self._read_cond = threading.Condition(threading.Lock())

    def clear(self) -> tuple[int, int]:
        """Start-up: remove every file of a previous run (module docstring) and create
        the directory; returns (files, bytes) removed. Nothing is reported to disk
        admission: the first sample comes after."""
        self.root.mkdir(parents=True, exist_ok=True)
        files = size = 0
        for entry in os.scandir(self.root):
            if entry.is_file(follow_symlinks=False):
                size += entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
                files += 1
        return files, size

    def write(self, kind: str, name: str, data: bytes) -> SpoolFile:
        """Write one object's bytes under its name (``OSError`` on failure, nothing
        left behind)."""
        path = self.root / f"{kind}-{name}{SUFFIX}"
        temp = self.root / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError:
            temp.unlink(missing_ok=True)
            with self._lock:
                self.write_failures += 1
            raise
        started = False
        with self._lock:
            if not self._files:
                started = True
                self._since = self._clock()
                self._episode_files = 0
            self._files[path] = len(data)
            self._bytes += len(data)
            self.written_files += 1
            self.written_bytes += len(data)
            self._episode_files += 1
        if self._on_write is not None:
            self._on_write(len(data))
        if started:
            self._events(
                "sink.spool.started",
                {
                    "path": str(self.root),
                    "bytes": len(data),
                    "action": "the rows in memory reached the spill mark (3/4 of "
                    "sink.ceiling_bytes) and the store did not take them: partitions are "
                    "spooled to the data volume and published from there when it does",
                },
            )
        return SpoolFile(self, path, len(data))

    @contextlib.contextmanager
    def reading(self, f: SpoolFile) -> Iterator[bytes]:
        """``f``'s bytes, read while the spooled bytes in memory stay within the read
        budget (one object at a time when the budget is 0 or the object is larger): the
        publishers drain the spool in parallel without taking it back into memory."""
        with self._read_cond:
            self._read_cond.wait_for(
                lambda: self._reading == 0 or self._reading + f.nbytes <= self._read_budget
            )
            self._reading += f.nbytes
        try:
            yield f.read()
        finally:
            with self._read_cond:
                self._reading -= f.nbytes
                self._read_cond.notify_all()

    def _remove(self, f: SpoolFile) -> None:
        with self._lock:
            size = self._files.pop(f.path, None)
            if size is None:
                return
            self._bytes -= size
            drained = not self._files
            since, files = self._since, self._episode_files
        try:
            f.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("removing the spool file %s failed: %s", f.path, exc)
        if self._on_free is not None:
            self._on_free(size)
        if drained:
            self._events(
                "sink.spool.drained",
                {
                    "path": str(self.root),
                    "files": files,
                    "seconds": None if since is None else round(self._clock() - since, 3),
                },
            )

    @property
    def files(self) -> int:
        with self._lock:
            return len(self._files)

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes


class Spiller:
    """Keeps the rows in memory under the ceiling (module docstring): a thread with
    ``start`` and ``close``; ``spill_once`` runs one round on the caller's thread."""

    def __init__(
        self,
        buffers: Buffers,
        spill: Callable[[Detached], PublishOutcome | None],
        *,
        idle_secs: float = 0.5,
        threads: Threads | None = None,
    ) -> None:
        self._buffers = buffers
        #: runs the spiller's loop (None: a plain thread)
        self._threads = threads
        self._spill = spill
        self._idle = idle_secs
        self._stop = threading.Event()
        self._thread: ThreadHandle | None = None
        #: partitions taken out of memory since start
        self.spilled = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._threads is not None:
            # Restartable: a round that raised left its partition requeued or spooled,
            # and the next round starts from the buffers' state.
            self._thread = self._threads.start(
                "spiller", self._run, thread_name="ourios-spiller", stop=self._stop
            )
            return
        thread = threading.Thread(target=self._run, name="ourios-spiller", daemon=True)
        thread.start()
        self._thread = thread

    def close(self, timeout: float = 60.0) -> bool:
        """Stop after the partition being spilled; True when the thread joined."""
        self._stop.set()
        self._buffers.pressure.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        joined = not self._thread.is_alive()
        self._thread = None
        return joined

    def spill_once(self) -> int:
        """Take partitions out of memory until it is at the spill target (half the
        ceiling) or nothing more can be taken; returns how many."""
        done = 0
        while not self._stop.is_set():
            d = self._buffers.detach_for_spill()
            if d is None:
                break
            outcome = self._spill(d)
            done += 1
            if outcome is None or (not outcome.ok and d.partition.spool is None):
                if outcome is None or outcome.error_type != OBJECT_TOO_LARGE:
                    break  # back in memory (a failed spool write): the next wake retries
        self.spilled += done
        return done

    def _run(self) -> None:
        pressure = self._buffers.pressure
        while not self._stop.is_set():
            pressure.wait(self._idle)
            pressure.clear()
            if self._stop.is_set():
                return
            if self._buffers.held_bytes < self._buffers.spill_mark:
                continue
            try:
                self.spill_once()
            except Exception:  # noqa: BLE001 - the partition was requeued; the next wake retries
                log.exception("spilling failed")

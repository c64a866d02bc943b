"""One writer per WAL: an exclusive ``flock`` on ``<data_dir>/ourios.lock`` for a node's
whole life (DESIGN.md §5, invariant 9).

``ourios serve`` takes the lock before it reads or writes anything else in the data
directory (the WAL, the snapshots, the template ids, the embedded store); a second
process that finds it held refuses to start, naming the directory and the holder. Two
journals on one directory would interleave their appends and rotations, and a
replacement pod whose old container is still dying (a force-deleted pod in Kubernetes,
docs/RUNBOOK.md) is exactly that second process.

The lock is the kernel's, on an open file description: it is released when the holder
closes it or exits, however it exits (SIGKILL and OOM included), so a stale lock file
never blocks a start — the file stays, its lock does not. The file holds one JSON line
naming the holder (pid, host, command, start time), written after the lock is taken;
it is information only, never trusted for the decision. A reader that finds the lock
held before the holder wrote its line falls back to ``/proc/locks`` for the pid.

``ourios wal quarantine`` takes the same lock for the duration of its move (so a node
cannot start half-way through it) and refuses while a node holds it; ``ourios wal
inspect`` and ``verify`` only read and never take it.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

LOCK_NAME: Final = "ourios.lock"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a data directory's lock, as far as anyone can tell."""

    pid: int | None
    host: str = ""
    command: str = ""
    since: float | None = None

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process whose pid is unknown"
        if self.host:
            who += f" on host {self.host}"
        if self.command:
            who += f" ({self.command}"
            if self.since is not None:
                when = dt.datetime.fromtimestamp(self.since, dt.UTC)
                who += f", since {when.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            who += ")"
        return who


class DataDirLocked(Exception):
    """Another process holds the data directory's lock: nothing was read or written."""

    error_type = "data_dir_locked"

    def __init__(self, directory: Path, holder: Holder) -> None:
        super().__init__(
            f"data directory {directory} is in use by {holder.describe()}, which holds its "
            f"lock {directory / LOCK_NAME}; one writer per WAL, so this node starts nothing. "
            f"Stop that process, or wait for it to exit (the kernel releases the lock when it "
            f"does, SIGKILL included), then start again"
        )
        self.directory = directory
        self.holder = holder


class DataDirLockError(Exception):
    """The lock could not be taken at all (the filesystem refuses ``flock``)."""

    error_type = "data_dir_lock"


class DataDirLock:
    """A held lock on a data directory; ``release()`` (or process exit) lets it go."""

    def __init__(self, directory: Path, fd: int, holder: Holder) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self.holder = holder
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: Path, *, command: str = "ourios serve") -> DataDirLock:
        """Take the lock without waiting, creating the lock file if needed; raise
        ``DataDirLocked`` naming the holder when another process has it."""
        return cls._take(directory, command, create=True)

    @classmethod
    def acquire_existing(cls, directory: Path, *, command: str) -> DataDirLock | None:
        """As ``acquire``, but only where a node has run (the lock file exists); None
        when it does not, so a tool never leaves a lock file in a directory that is not a
        data directory (a WAL copied elsewhere)."""
        if not (directory / LOCK_NAME).is_file():
            return None
        return cls._take(directory, command, create=False)

    @classmethod
    def _take(cls, directory: Path, command: str, *, create: bool) -> DataDirLock:
        path = directory / LOCK_NAME
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise DataDirLockError(f"cannot open the lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_of(fd)
            os.close(fd)
            raise DataDirLocked(directory, holder) from None
        except OSError as exc:
            os.close(fd)
            hint = (
                " (this filesystem does not support flock; the data directory must be on one "
                "that does)"
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)
                else ""
            )
            raise DataDirLockError(f"cannot lock {path}: {exc}{hint}") from exc
        holder = Holder(os.getpid(), socket.gethostname(), command, time.time())
        line = json.dumps(
            {"pid": holder.pid, "host": holder.host, "command": command, "since": holder.since}
        )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (line + "\n").encode(), 0)
        except OSError:
            pass  # the line is information only; the lock is what counts
        return cls(directory, fd, holder)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go (closing the descriptor releases it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_holder(directory: Path) -> Holder | None:
    """The holder of ``directory``'s lock, or None when nobody holds it (or there is no
    lock file). Lock-free, for the read-only tools: it asks ``/proc/locks`` (Linux) rather
    than probing with a lock of its own, which could make a starting node refuse."""
    path = directory / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _proc_locks_pid(fd) is None:
            return None
        return _holder_of(fd)
    finally:
        os.close(fd)


def _holder_of(fd: int) -> Holder:
    """What the lock file says, else the pid ``/proc/locks`` gives for its inode."""
    try:
        raw = os.pread(fd, 4096, 0)
        doc = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
        since = doc.get("since")
        return Holder(
            doc["pid"],
            str(doc.get("host", "")),
            str(doc.get("command", "")),
            float(since) if isinstance(since, int | float) else None,
        )
    return Holder(_proc_locks_pid(fd))


def _proc_locks_pid(fd: int) -> int | None:
    """The pid holding a FLOCK on ``fd``'s inode per ``/proc/locks`` (Linux), if any.
    Lines read ``1: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> 0 EOF``."""
    try:
        inode = os.fstat(fd).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE":
            continue
        if parts[5].rsplit(":", 1)[-1] == str(inode) and parts[4].isdigit():
            return int(parts[4])
    return None

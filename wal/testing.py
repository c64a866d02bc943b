"""Test doubles shipped with the WAL: ``FaultyFs`` performs the same real I/O as
``wal.fs.OsFs`` through the same seam and adds three test powers, so tests inject faults
at any step without patching:

* **Faults** — fail the k-th matching operation once or always, with any errno
  (``ENOSPC``, ``EIO``…), or tear a write after a number of bytes (``FsFault``).
* **Held points** — ``hold_at(op, glob)`` holds the thread making the matching
  operation until the test releases it (``HeldFsPoint``): the seam's sync points, with
  the same ``reached`` / ``release()`` pair as ``app.points``' named ones.
* **Crashes** — raise ``SimulatedCrash`` at a named point (an operation on a path
  pattern, the k-th time), after which every later operation on the seam raises too,
  and ``apply_crash()`` rewrites the directories to what a power loss would have left:

  - a file's bytes beyond its last ``fsync`` are cut off, and overwrites of
    already-durable bytes that were never fsynced are undone;
  - a directory's entries (creations, renames, unlinks) revert to the state of its
    last directory ``fsync``: a name created since then disappears, a name renamed
    or unlinked since then comes back with its (durable) content.

  ``apply_crash(power_loss=False)`` models a SIGKILL instead: the kernel keeps every
  write and every rename, so nothing is reverted.

The power-loss model is the strict POSIX reading (a new name — a creation, a rename's
target or a hard link — is durable only once its parent directory is fsynced). It is
what lets a test show that a missing ``fsync`` or a rename before the header fsync
loses data, rather than passing on a clean shutdown.
Limitation, stated: directories themselves (``mkdir``) are treated as durable at once.
"""

from __future__ import annotations

import errno as errno_mod
import fcntl
import fnmatch
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .fs import OsFs

#: The operations a fault or crash can be attached to.
OPS = (
    "open",
    "write",
    "pwrite",
    "read",
    "pread",
    "fsync",
    "fallocate",
    "ftruncate",
    "close",
    "rename",
    "link",
    "unlink",
    "fsync_dir",
    "mkdir",
    "listdir",
    "stat",
)


class SimulatedCrash(BaseException):
    """Raised by ``FaultyFs`` at a crash point and by every operation after it.

    A ``BaseException`` so that ``except Exception`` / ``except OSError`` handlers in
    the code under test cannot swallow it: after a crash nothing else runs.
    """


@dataclass
class FsFault:
    """One injected fault: which operations it matches and what it does."""

    op: str
    path_glob: str | None = None
    nth: int = 1  # the first matching call that fails (1-based)
    count: int | None = 1  # how many consecutive matching calls fail; None = always
    errno: int = errno_mod.EIO
    crash: bool = False
    torn_bytes: int | None = None  # for write/pwrite: write this many bytes first
    seen: int = 0
    fired: int = 0
    predicate: Callable[[str, Path | None], bool] | None = None

    def matches(self, op: str, path: Path | None) -> bool:
        if op != self.op:
            return False
        if self.path_glob is not None:
            if path is None or not fnmatch.fnmatch(path.name, self.path_glob):
                return False
        return self.predicate is None or self.predicate(op, path)

    def trigger(self) -> bool:
        """Count a matching call; True when this call must fail."""
        self.seen += 1
        if self.seen < self.nth:
            return False
        if self.count is not None and self.fired >= self.count:
            return False
        self.fired += 1
        return True


class HeldFsPoint:
    """A sync point in the seam (``FaultyFs.hold_at``): the thread making the matching
    operation is held until the test releases it.

    ``reached`` is set when the matching operation is about to run (outside the seam's
    own lock, so other threads' I/O proceeds); the operation continues after
    ``release()``. Deterministic interleavings without sleeping. The same ``reached`` /
    ``release()`` pair as ``app.points.HeldPoint``, the named sync points in the code.
    """

    def __init__(self, op: str, path_glob: str | None, nth: int) -> None:
        self.op = op
        self.path_glob = path_glob
        self.nth = nth
        self.seen = 0
        self.reached = threading.Event()
        self._go = threading.Event()

    def matches(self, op: str, path: Path | None) -> bool:
        if op != self.op:
            return False
        if self.path_glob is not None and (
            path is None or not fnmatch.fnmatch(path.name, self.path_glob)
        ):
            return False
        self.seen += 1
        return self.seen == self.nth

    def release(self) -> None:
        self._go.set()

    def wait_released(self) -> None:
        self.reached.set()
        self._go.wait()


@dataclass
class _Inode:
    shadow: Path
    durable_size: int
    pre_images: list[tuple[int, bytes]] = field(default_factory=list)


class FaultyFs(OsFs):
    """Real I/O with injectable faults and a power-loss crash model (module docstring).

    ``shadow_dir`` must be on the same filesystem as the directories under test (it
    holds hard links that keep every tracked file's content reachable for revert).
    """

    def __init__(self, shadow_dir: Path) -> None:
        self._mu = threading.RLock()
        self._faults: list[FsFault] = []
        self._holds: list[HeldFsPoint] = []
        self._shadow = shadow_dir
        self._shadow.mkdir(parents=True, exist_ok=True)
        self._inodes: dict[int, _Inode] = {}
        self._durable_dirs: dict[Path, dict[str, int]] = {}
        self._fd_paths: dict[int, Path] = {}
        self._crashed = False
        #: every operation performed, as (op, path) — for tests that assert on steps
        self.log: list[tuple[str, Path | None]] = []

    # -- configuration -------------------------------------------------------------

    def fail(
        self,
        op: str,
        path_glob: str | None = None,
        *,
        nth: int = 1,
        count: int | None = 1,
        errno: int = errno_mod.EIO,
        torn_bytes: int | None = None,
        predicate: Callable[[str, Path | None], bool] | None = None,
    ) -> FsFault:
        """Fail the ``nth`` matching call (and ``count - 1`` more; None = always)."""
        if op not in OPS:
            raise ValueError(f"unknown fs op {op!r}")
        fault = FsFault(op, path_glob, nth, count, errno, False, torn_bytes, predicate=predicate)
        with self._mu:
            self._faults.append(fault)
        return fault

    def crash_at(
        self,
        op: str,
        path_glob: str | None = None,
        *,
        nth: int = 1,
        torn_bytes: int | None = None,
        predicate: Callable[[str, Path | None], bool] | None = None,
    ) -> FsFault:
        """Crash when the ``nth`` matching call is attempted (before it takes effect,
        except that a write with ``torn_bytes`` writes that prefix first)."""
        if op not in OPS:
            raise ValueError(f"unknown fs op {op!r}")
        fault = FsFault(op, path_glob, nth, 1, 0, True, torn_bytes, predicate=predicate)
        with self._mu:
            self._faults.append(fault)
        return fault

    def hold_at(self, op: str, path_glob: str | None = None, *, nth: int = 1) -> HeldFsPoint:
        """Hold the thread that makes the ``nth`` matching call until ``release()``."""
        if op not in OPS:
            raise ValueError(f"unknown fs op {op!r}")
        hold = HeldFsPoint(op, path_glob, nth)
        with self._mu:
            self._holds.append(hold)
        return hold

    def clear_faults(self) -> None:
        with self._mu:
            self._faults.clear()
            for hold in self._holds:
                hold.release()
            self._holds.clear()

    @property
    def crashed(self) -> bool:
        return self._crashed

    def crash_now(self) -> None:
        """Declare a crash at this instant (every later operation raises)."""
        with self._mu:
            self._crashed = True

    # -- the crash -----------------------------------------------------------------

    def apply_crash(self, *, power_loss: bool = True) -> None:
        """Discard the dead process's fds and rewrite tracked directories to the state a
        crash leaves (module docstring). Call after ``SimulatedCrash`` was raised."""
        with self._mu:
            self._crashed = True
            for fd in list(self._fd_paths):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fd_paths.clear()
            if power_loss:
                self._revert_to_durable()
            # The seam is usable again, as a fresh process would find the disk.
            self._faults.clear()
            self._holds.clear()
            self._crashed = False

    def _revert_to_durable(self) -> None:
        for inode in self._inodes.values():
            try:
                size = os.stat(inode.shadow).st_size
            except FileNotFoundError:
                continue
            if size > inode.durable_size:
                os.truncate(inode.shadow, inode.durable_size)
            if inode.pre_images:
                fd = os.open(inode.shadow, os.O_WRONLY)
                try:
                    for offset, old in reversed(inode.pre_images):
                        os.pwrite(fd, old, offset)
                finally:
                    os.close(fd)
                inode.pre_images.clear()
        for directory, durable in self._durable_dirs.items():
            if not directory.is_dir():
                continue
            current = self._scan(directory)
            for name, ino in current.items():
                if durable.get(name) != ino and ino in self._inodes:
                    os.unlink(directory / name)
            for name, ino in durable.items():
                if current.get(name) == ino:
                    continue
                known = self._inodes.get(ino)
                if known is None or not known.shadow.exists():
                    continue
                target = directory / name
                if target.exists():
                    os.unlink(target)
                os.link(known.shadow, target)
        # Inode numbers may be reused by new files after this; start tracking afresh.
        self._inodes.clear()
        self._durable_dirs.clear()
        for leftover in self._shadow.iterdir():
            leftover.unlink()

    # -- tracking ------------------------------------------------------------------

    @staticmethod
    def _scan(directory: Path) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False):
                out[entry.name] = entry.inode()
        return out

    def _track_dir(self, directory: Path) -> None:
        if directory in self._durable_dirs or not directory.is_dir():
            return
        listing = self._scan(directory)
        self._durable_dirs[directory] = listing
        for name, ino in listing.items():
            self._track_inode(directory / name, ino, durable_size=None)

    def _track_inode(self, path: Path, ino: int, durable_size: int | None) -> None:
        if ino in self._inodes:
            return
        shadow = self._shadow / str(ino)
        if shadow.exists():
            shadow.unlink()
        os.link(path, shadow)
        size = os.stat(path).st_size if durable_size is None else durable_size
        self._inodes[ino] = _Inode(shadow, size)

    def _before(self, op: str, path: Path | None) -> FsFault | None:
        """Common prologue: hold if asked, refuse after a crash, record, and find a
        firing fault."""
        with self._mu:
            holds = [h for h in self._holds if h.matches(op, path)]
        for hold in holds:
            hold.wait_released()
        with self._mu:
            if self._crashed:
                raise SimulatedCrash(f"{op} {path} after the crash")
            self.log.append((op, path))
            for fault in self._faults:
                if fault.matches(op, path) and fault.trigger():
                    if fault.crash and fault.torn_bytes is None:
                        self._crashed = True
                        raise SimulatedCrash(f"crash at {op} {path}")
                    return fault
        return None

    def _raise(self, fault: FsFault, op: str, path: Path | None) -> None:
        if fault.crash:
            with self._mu:
                self._crashed = True
            raise SimulatedCrash(f"crash during {op} {path}")
        raise OSError(fault.errno, f"injected {errno_mod.errorcode.get(fault.errno, '?')}", path)

    # -- operations ----------------------------------------------------------------

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        fault = self._before("open", path)
        if fault is not None:
            self._raise(fault, "open", path)
        with self._mu:
            self._track_dir(path.parent)
            existed = path.exists()
            if existed and flags & os.O_TRUNC:
                st = os.stat(path)
                self._track_inode(path, st.st_ino, None)
                inode = self._inodes[st.st_ino]
                if inode.durable_size:
                    inode.pre_images.append((0, self._read_durable(path, inode.durable_size)))
            fd = super().open(path, flags, mode)
            st = os.fstat(fd)
            if not existed:
                self._track_inode(path, st.st_ino, durable_size=0)
            else:
                self._track_inode(path, st.st_ino, None)
            self._fd_paths[fd] = path
            return fd

    @staticmethod
    def _read_durable(path: Path, size: int) -> bytes:
        with open(path, "rb") as f:
            return f.read(size)

    def _note_overwrite(self, fd: int, offset: int, length: int) -> None:
        ino = os.fstat(fd).st_ino
        inode = self._inodes.get(ino)
        if inode is None or offset >= inode.durable_size:
            return
        end = min(offset + length, inode.durable_size)
        # The shadow is a hard link to the same inode, so it reads the bytes about to be
        # overwritten even when ``fd`` is write-only.
        with open(inode.shadow, "rb") as f:
            f.seek(offset)
            old = f.read(end - offset)
        inode.pre_images.append((offset, old))

    def write(self, fd: int, data: bytes | memoryview) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("write", path)
        with self._mu:
            # O_APPEND writes land at the end whatever the file position says.
            position = os.fstat(fd).st_size if _is_append(fd) else os.lseek(fd, 0, os.SEEK_CUR)
            self._note_overwrite(fd, position, len(data))
        if fault is not None:
            if fault.torn_bytes is not None:
                super().write(fd, memoryview(data)[: fault.torn_bytes])
            self._raise(fault, "write", path)
        super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("pwrite", path)
        with self._mu:
            self._note_overwrite(fd, offset, len(data))
        if fault is not None:
            if fault.torn_bytes is not None:
                super().pwrite(fd, memoryview(data)[: fault.torn_bytes], offset)
            self._raise(fault, "pwrite", path)
        super().pwrite(fd, data, offset)

    def read(self, fd: int, size: int) -> bytes:
        fault = self._before("read", self._fd_paths.get(fd))
        if fault is not None:
            self._raise(fault, "read", self._fd_paths.get(fd))
        return super().read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        fault = self._before("pread", self._fd_paths.get(fd))
        if fault is not None:
            self._raise(fault, "pread", self._fd_paths.get(fd))
        return super().pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("fsync", path)
        if fault is not None:
            self._raise(fault, "fsync", path)
        # Only what was written before the fsync started is known to be covered.
        st = os.fstat(fd)
        super().fsync(fd)
        with self._mu:
            inode = self._inodes.get(st.st_ino)
            if inode is not None:
                # The size it had when the fsync started: larger after appends, smaller
                # after a truncation (``ftruncate``), and durable either way now.
                inode.durable_size = st.st_size
                inode.pre_images.clear()

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("fallocate", path)
        if fault is not None:
            self._raise(fault, "fallocate", path)
        super().fallocate(fd, offset, length)

    def ftruncate(self, fd: int, length: int) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("ftruncate", path)
        if fault is not None:
            self._raise(fault, "ftruncate", path)
        with self._mu:
            # A truncation not yet fsynced is undone by a power loss: the durable bytes
            # it cut come back (the size change is metadata the crash may not keep).
            inode = self._inodes.get(os.fstat(fd).st_ino)
            if inode is not None and length < inode.durable_size:
                with open(inode.shadow, "rb") as f:
                    f.seek(length)
                    inode.pre_images.append((length, f.read(inode.durable_size - length)))
        super().ftruncate(fd, length)

    def close(self, fd: int) -> None:
        path = self._fd_paths.get(fd)
        fault = self._before("close", path)
        with self._mu:
            self._fd_paths.pop(fd, None)
        super().close(fd)
        if fault is not None:
            self._raise(fault, "close", path)

    def rename(self, src: Path, dst: Path) -> None:
        fault = self._before("rename", dst)
        if fault is not None:
            self._raise(fault, "rename", dst)
        with self._mu:
            self._track_dir(src.parent)
            self._track_dir(dst.parent)
            super().rename(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        fault = self._before("link", dst)
        if fault is not None:
            self._raise(fault, "link", dst)
        with self._mu:
            self._track_dir(src.parent)
            self._track_dir(dst.parent)
            super().link(src, dst)

    def unlink(self, path: Path) -> None:
        fault = self._before("unlink", path)
        if fault is not None:
            self._raise(fault, "unlink", path)
        with self._mu:
            self._track_dir(path.parent)
            super().unlink(path)

    def fsync_dir(self, path: Path) -> None:
        fault = self._before("fsync_dir", path)
        if fault is not None:
            self._raise(fault, "fsync_dir", path)
        with self._mu:
            self._track_dir(path)
            super().fsync_dir(path)
            current = self._scan(path)
            for name, ino in current.items():
                if ino not in self._inodes:
                    self._track_inode(path / name, ino, None)
            self._durable_dirs[path] = current

    def mkdir(self, path: Path) -> None:
        fault = self._before("mkdir", path)
        if fault is not None:
            self._raise(fault, "mkdir", path)
        super().mkdir(path)

    def listdir(self, path: Path) -> list[str]:
        fault = self._before("listdir", path)
        if fault is not None:
            self._raise(fault, "listdir", path)
        return super().listdir(path)

    def stat(self, path: Path) -> os.stat_result:
        fault = self._before("stat", path)
        if fault is not None:
            self._raise(fault, "stat", path)
        return super().stat(path)


def _is_append(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)

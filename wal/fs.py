"""The filesystem seam: every open, write, fsync, rename, unlink and directory fsync
the WAL performs goes through an ``Fs``.

``OsFs`` is the real thing. The test doubles that inject faults, holds and a power-loss
crash model through this same seam (``FaultyFs``) live in ``wal/testing.py``; nothing in
the WAL imports them.
"""

from __future__ import annotations

import errno as errno_mod
import os
from pathlib import Path
from typing import Protocol


class Fs(Protocol):
    """The file operations the WAL uses. Paths are absolute ``Path``s; fds are ints."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int: ...
    def write(self, fd: int, data: bytes | memoryview) -> None: ...
    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None: ...
    def read(self, fd: int, size: int) -> bytes: ...
    def pread(self, fd: int, size: int, offset: int) -> bytes: ...
    def fsync(self, fd: int) -> None: ...
    def fallocate(self, fd: int, offset: int, length: int) -> None: ...
    def ftruncate(self, fd: int, length: int) -> None: ...
    def close(self, fd: int) -> None: ...
    def rename(self, src: Path, dst: Path) -> None: ...
    def link(self, src: Path, dst: Path) -> None: ...
    def unlink(self, path: Path) -> None: ...
    def fsync_dir(self, path: Path) -> None: ...
    def mkdir(self, path: Path) -> None: ...
    def listdir(self, path: Path) -> list[str]: ...
    def stat(self, path: Path) -> os.stat_result: ...
    def fstat(self, fd: int) -> os.stat_result: ...


class OsFs:
    """Plain ``os`` calls. ``write`` loops until every byte is written or it raises."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:  # pragma: no cover - os.write raises rather than returning 0
                raise OSError(errno_mod.EIO, "short write")
            view = view[n:]

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            if n <= 0:  # pragma: no cover
                raise OSError(errno_mod.EIO, "short write")
            view = view[n:]
            offset += n

    def read(self, fd: int, size: int) -> bytes:
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.read(fd, min(size, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        # One call for a whole segment where the kernel allows it: joining chunks
        # copied every byte a second time (a third of a restart's WAL validation).
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.pread(fd, min(size, 1 << 30), offset)
            if len(chunk) == size and not chunks:
                return chunk
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        os.posix_fallocate(fd, offset, length)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        os.link(src, dst)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def listdir(self, path: Path) -> list[str]:
        return os.listdir(path)

    def stat(self, path: Path) -> os.stat_result:
        return os.stat(path)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)


def read_file(fs: Fs, path: Path) -> bytes:
    """Read a whole file through the seam."""
    fd = fs.open(path, os.O_RDONLY)
    try:
        size = fs.fstat(fd).st_size
        return fs.pread(fd, size, 0)
    finally:
        fs.close(fd)

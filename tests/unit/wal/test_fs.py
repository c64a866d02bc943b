"""``wal.fs``: the real filesystem seam reads and writes whole ranges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wal.fs import OsFs, read_file


def test_pread_returns_the_whole_range_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 64)
    calls: list[tuple[int, int]] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        calls.append((size, offset))
        return real(fd, size, offset)

    fs = OsFs()
    fd = fs.open(path, os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "pread", counting)
        data = fs.pread(fd, 1000, 100)
    finally:
        monkeypatch.undo()
        fs.close(fd)
    assert data == (bytes(range(256)) * 64)[100:1100]
    assert calls == [(1000, 100)]


def test_pread_past_the_end_returns_a_short_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    fs = OsFs()
    fd = fs.open(path, os.O_RDONLY)
    try:
        assert fs.pread(fd, 100, 4) == b"456789"
        assert fs.pread(fd, 5, 10) == b""
    finally:
        fs.close(fd)


def test_pread_joins_partial_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdefghij")
    real = os.pread

    def dribble(fd: int, size: int, offset: int) -> bytes:
        return real(fd, min(size, 3), offset)  # the kernel may return less than asked

    fs = OsFs()
    fd = fs.open(path, os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "pread", dribble)
        assert fs.pread(fd, 8, 1) == b"bcdefghi"
    finally:
        monkeypatch.undo()
        fs.close(fd)


def test_write_and_pwrite_write_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fs = OsFs()
    fd = fs.open(path, os.O_CREAT | os.O_RDWR)
    try:
        fs.write(fd, b"hello world")
        fs.pwrite(fd, memoryview(b"WORLD"), 6)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    assert path.read_bytes() == b"hello WORLD"
    assert read_file(fs, path) == b"hello WORLD"


def test_open_sets_close_on_exec(tmp_path: Path) -> None:
    fs = OsFs()
    fd = fs.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        assert not os.get_inheritable(fd)
    finally:
        fs.close(fd)


def test_directory_operations(tmp_path: Path) -> None:
    fs = OsFs()
    fs.mkdir(tmp_path / "d")
    (tmp_path / "d" / "a").write_bytes(b"x")
    fs.link(tmp_path / "d" / "a", tmp_path / "d" / "b")
    fs.rename(tmp_path / "d" / "b", tmp_path / "d" / "c")
    fs.fsync_dir(tmp_path / "d")
    assert sorted(fs.listdir(tmp_path / "d")) == ["a", "c"]
    assert fs.stat(tmp_path / "d" / "c").st_nlink == 2
    fs.unlink(tmp_path / "d" / "a")
    assert fs.listdir(tmp_path / "d") == ["c"]
    with pytest.raises(FileNotFoundError):
        fs.unlink(tmp_path / "d" / "a")

"""The test doubles (`wal/testing.py`): faults fire where asked, and a crash reverts to what is
durable."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from wal.testing import FaultyFs, SimulatedCrash


def _write(fs: FaultyFs, path: Path, data: bytes, *, sync: bool) -> None:
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    fs.write(fd, data)
    if sync:
        fs.fsync(fd)
    fs.close(fd)


@pytest.fixture
def fs(tmp_path: Path) -> FaultyFs:
    """A ``FaultyFs`` with its shadow beside the test's files."""
    return FaultyFs(tmp_path / ".shadow")


@pytest.fixture
def d(tmp_path: Path) -> Path:
    """An empty directory for the files a test writes through ``fs``."""
    d = tmp_path / "d"
    d.mkdir()
    return d


def test_unsynced_bytes_and_undurable_names_are_lost_on_power_loss(d: Path, fs: FaultyFs) -> None:
    _write(fs, d / "a", b"durable", sync=True)
    fs.fsync_dir(d)
    _write(fs, d / "a", b"+lost", sync=False)
    _write(fs, d / "b", b"never-named", sync=True)  # data synced, entry not
    fs.apply_crash()
    assert (d / "a").read_bytes() == b"durable"
    assert not (d / "b").exists()


def test_rename_without_directory_fsync_reverts(d: Path, fs: FaultyFs) -> None:
    _write(fs, d / "old", b"old", sync=True)
    _write(fs, d / "tmp", b"new", sync=True)
    fs.fsync_dir(d)
    fs.rename(d / "tmp", d / "old")
    fs.apply_crash()
    assert (d / "old").read_bytes() == b"old"
    assert (d / "tmp").read_bytes() == b"new"
    fs.rename(d / "tmp", d / "old")
    fs.fsync_dir(d)
    fs.apply_crash()
    assert (d / "old").read_bytes() == b"new"
    assert not (d / "tmp").exists()


def test_unlink_without_directory_fsync_comes_back(d: Path, fs: FaultyFs) -> None:
    (d / "pre").write_bytes(b"existing")  # created outside the seam: durable
    fs.unlink(d / "pre")
    fs.apply_crash()
    assert (d / "pre").read_bytes() == b"existing"


def test_unsynced_overwrite_is_undone(d: Path, fs: FaultyFs) -> None:
    _write(fs, d / "f", b"0123456789", sync=True)
    fs.fsync_dir(d)
    fd = fs.open(d / "f", os.O_WRONLY)
    fs.pwrite(fd, b"XX", 3)
    fs.apply_crash()
    assert (d / "f").read_bytes() == b"0123456789"


def test_sigkill_keeps_everything(d: Path, fs: FaultyFs) -> None:
    _write(fs, d / "f", b"unsynced", sync=False)
    fs.apply_crash(power_loss=False)
    assert (d / "f").read_bytes() == b"unsynced"


def test_fault_fires_on_nth_call_once_or_always(tmp_path: Path, fs: FaultyFs) -> None:
    fs.fail("fsync_dir", nth=2, count=1, errno=errno.ENOSPC)
    fs.fsync_dir(tmp_path)
    with pytest.raises(OSError) as info:
        fs.fsync_dir(tmp_path)
    assert info.value.errno == errno.ENOSPC
    fs.fsync_dir(tmp_path)
    fs.fail("fsync_dir", count=None)
    for _ in range(3):
        with pytest.raises(OSError):
            fs.fsync_dir(tmp_path)


def test_crash_point_stops_every_later_operation(tmp_path: Path, fs: FaultyFs) -> None:
    fs.crash_at("rename", "*.wal")
    (tmp_path / "x.partial").write_bytes(b"")
    with pytest.raises(SimulatedCrash):
        fs.rename(tmp_path / "x.partial", tmp_path / "x.wal")
    assert not (tmp_path / "x.wal").exists()
    with pytest.raises(SimulatedCrash):
        fs.fsync_dir(tmp_path)
    fs.apply_crash()
    fs.fsync_dir(tmp_path)  # usable again, as a new process would find it


def test_torn_write_leaves_a_prefix(tmp_path: Path, fs: FaultyFs) -> None:
    fs.crash_at("write", "f", torn_bytes=3)
    fd = fs.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(SimulatedCrash):
        fs.write(fd, b"abcdef")
    fs.apply_crash(power_loss=False)
    assert (tmp_path / "f").read_bytes() == b"abc"

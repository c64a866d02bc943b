"""The data directory's lock (``app.node.datalock``; issue 18 item 3, DESIGN.md §5 invariant 9):
one process holds it; another is refused naming the holder; it is taken before the node
reads or writes anything; ``ourios wal quarantine`` takes it, ``inspect`` does not."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.base.config import load_settings
from app.base.events import EventLog
from app.cli import wal as walcli
from app.node.datalock import LOCK_NAME, DataDirLock, DataDirLocked, Holder, read_holder
from app.node.server import build_node
from tests.support.noderig import request
from tests.support.serve import ROOT
from tests.support.walkit import SMALL
from wal import Journal

#: a separate process that takes the lock, says so, and holds it until stdin closes
_HOLDER = (
    "import sys\n"
    "from pathlib import Path\n"
    "from app.node.datalock import DataDirLock\n"
    "lock = DataDirLock.acquire(Path(sys.argv[1]), command='test holder')\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


class HolderProcess:
    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(directory)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == b"held\n"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def test_a_second_acquire_is_refused_naming_the_holder_and_release_lets_it_go(
    tmp_path: Path,
) -> None:
    lock = DataDirLock.acquire(tmp_path, command="ourios serve")
    doc = json.loads((tmp_path / LOCK_NAME).read_text())
    assert doc["pid"] == os.getpid() and doc["command"] == "ourios serve" and doc["host"]

    with pytest.raises(DataDirLocked) as refused:  # a second open file description
        DataDirLock.acquire(tmp_path)
    assert refused.value.holder.pid == os.getpid()
    message = str(refused.value)
    assert str(tmp_path) in message and f"pid {os.getpid()}" in message
    assert refused.value.error_type == "data_dir_locked"
    holder = read_holder(tmp_path)
    assert holder is not None and holder.pid == os.getpid()

    lock.release()
    lock.release()  # idempotent
    assert read_holder(tmp_path) is None
    again = DataDirLock.acquire(tmp_path)
    again.release()
    assert (tmp_path / LOCK_NAME).exists()  # the file stays; only the lock comes and goes


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    holder = HolderProcess(tmp_path)
    try:
        with pytest.raises(DataDirLocked) as refused:
            DataDirLock.acquire(tmp_path)
        assert refused.value.holder.pid == holder.pid
        assert refused.value.holder.command == "test holder"
    finally:
        holder.kill()
    DataDirLock.acquire(tmp_path).release()


def test_a_holder_that_has_not_written_its_line_is_named_from_proc_locks(tmp_path: Path) -> None:
    holder = HolderProcess(tmp_path)
    try:
        (tmp_path / LOCK_NAME).write_text("")  # as between its flock and its write
        with pytest.raises(DataDirLocked) as refused:
            DataDirLock.acquire(tmp_path)
        if Path("/proc/locks").exists():
            assert refused.value.holder == Holder(holder.pid)
        assert "pid" in str(refused.value)
    finally:
        holder.kill()


def test_acquire_existing_leaves_no_lock_file_where_no_node_ran(tmp_path: Path) -> None:
    assert DataDirLock.acquire_existing(tmp_path, command="ourios wal quarantine") is None
    assert not (tmp_path / LOCK_NAME).exists()


def test_nowedge_3_build_node_takes_the_lock_before_it_reads_or_writes_anything(
    tmp_path: Path,
) -> None:
    """A second node on a held directory refuses before it creates the WAL, the
    snapshots, the template ids or the embedded store: the directory holds the lock
    file and nothing else."""
    data = tmp_path / "data"
    data.mkdir()
    holder = HolderProcess(data)
    try:
        settings = load_settings({"OURIOS_SERVER_DATA_DIR": str(data)})
        with pytest.raises(DataDirLocked) as refused:
            build_node(settings, EventLog(io.StringIO()))
        assert f"pid {holder.pid}" in str(refused.value) and str(data) in str(refused.value)
        assert sorted(p.name for p in data.iterdir()) == [LOCK_NAME]
    finally:
        holder.kill()
    node = build_node(settings, EventLog(io.StringIO()))  # the holder is gone
    try:
        assert node.lock is not None and node.lock.held
        assert (data / "wal").is_dir()
    finally:
        node.journal.close()
        if node.lock is not None:  # None fails the assert above
            node.lock.release()


def test_nowedge_3_quarantine_refuses_while_a_node_holds_the_data_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    root = data / "wal"
    with Journal.open(root, SMALL) as j:
        for i in range(24):
            j.commit("t", request(f"q{i}", 3).SerializeToString())
    seg = sorted(root.glob("*.wal"))[0]
    DataDirLock.acquire(data).release()  # a node ran here: the lock file exists
    holder = HolderProcess(data)
    try:
        out = io.StringIO()
        code = walcli.quarantine(seg, out, force=True)
        text = out.getvalue()
        assert code == 1 and f"pid {holder.pid}" in text and "nothing was moved" in text
        assert str(data) in text and seg.exists() and not (root / "quarantine").exists()
        # inspect takes no lock, and says who holds the directory
        out = io.StringIO()
        assert walcli.inspect(data, out) == 0
        assert f"in use by pid {holder.pid}" in out.getvalue()
    finally:
        holder.kill()
    out = io.StringIO()
    assert walcli.quarantine(seg, out, force=True) == 0, out.getvalue()
    assert not seg.exists()
    DataDirLock.acquire(data).release()  # the command let the lock go

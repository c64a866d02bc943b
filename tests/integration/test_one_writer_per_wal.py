"""One writer per WAL (issue 18 item 3, DESIGN.md §5 invariant 9), with real processes.

A live ``ourios serve`` holds an exclusive ``flock`` on ``<data_dir>/ourios.lock``. A
second ``ourios serve`` on the same directory refuses to start (exit 1, one
``server.start_failed`` naming the directory and the first node's pid) before it reads
or writes anything there; the first keeps serving, its probes unaffected. ``ourios wal
inspect`` and ``verify`` work beside it (lock-free); ``ourios wal quarantine`` refuses.
Once the holder is gone — SIGKILLed (the kernel releases a flock with the process) or
stopped — the next node starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.noderig import request
from tests.support.serve import ROOT, ServeProcess

ENV = {
    # Idle timers: nothing but the test's own requests touches the directory, so a
    # listing taken around the refused start shows exactly what that start wrote.
    "OURIOS_WAL_BARRIER_SECS": "3600",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "3600",
    "OURIOS_WAL_SEGMENT_AGE_SECS": "3600",
    "OURIOS_SINK_FLUSH_AGE_SECS": "3600",
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time (ns)."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _refused(data: Path, first: ServeProcess) -> ServeProcess:
    """Start a second node on ``data``; assert it refused, naming the directory and
    the holder's pid, and return it (reaped)."""
    second = ServeProcess(data, ENV)
    failed = second.start_refused()
    assert second.proc is not None and second.proc.returncode == 1
    assert failed["error_type"] == "data_dir_locked", failed
    assert first.proc is not None
    assert str(data) in failed["error"] and f"pid {first.proc.pid}" in failed["error"], failed
    assert not second.event("server.listening") and not second.event("recovery.done")
    return second


def test_nowedge_3_a_second_serve_on_a_live_data_directory_refuses_and_the_first_serves_on(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first = ServeProcess(data, ENV).start()
    try:
        status, body, _ = first.post_logs(request("a0", 20).SerializeToString())
        assert status == 200, body
        first.wait_turned()  # acknowledged at its fsync: its turn (template ids) comes after
        before = _listing(data)

        _refused(data, first)

        assert _listing(data) == before, "the refused start wrote into the live directory"
        assert first.get("/healthz")[0] == 200 and first.get("/readyz")[0] == 200
        status, body, _ = first.post_logs(request("a1", 20).SerializeToString())
        assert status == 200, body

        # The read-only tools work beside the live node and take no lock.
        inspected = _cli("wal", "inspect", str(data))
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        assert f"in use by pid {first.proc.pid if first.proc else '?'}" in inspected.stdout
        verified = _cli("wal", "verify", str(data))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "clean" in verified.stdout

        # Quarantine writes: it refuses while the node holds the directory.
        segment = sorted((data / "wal").glob("*.wal"))[0]
        quarantined = _cli("wal", "quarantine", "--force", str(segment))
        assert quarantined.returncode == 1, quarantined.stdout + quarantined.stderr
        assert first.proc is not None and f"pid {first.proc.pid}" in quarantined.stdout
        assert "nothing was moved" in quarantined.stdout and segment.exists()
        assert not (data / "wal" / "quarantine").exists()
        assert first.get("/readyz")[0] == 200
    finally:
        first.kill()  # SIGKILL: the kernel releases the lock with the process

    second = ServeProcess(data, ENV).start()  # the holder is gone: this one starts
    try:
        status, body, _ = second.post_logs(request("b0", 20).SerializeToString())
        assert status == 200, body
        _refused(data, second)  # and holds the directory in turn
        second.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert second.terminate() == 0, second.tail()
    finally:
        second.kill()

    third = ServeProcess(data, ENV).start()  # after a clean stop too
    try:
        (done,) = third.event("recovery.done")
        assert done["frames"] >= 3  # a0, a1 and b0 replayed or skipped: the same WAL
    finally:
        assert third.terminate() == 0, third.tail()

"""A real full disk under a real ``ourios serve`` (issue 8; segment-set seed §6, §12.13).

The WAL directory is a size-limited tmpfs mounted by the test (root can mount; a refused
mount skips with the reason, and fails under ``CI=true``). The object store is a local
directory that is unusable at first (its parent is a regular file), so nothing can be
published, checkpointed or reclaimed: the WAL can only grow.

0. With no room for the sidecars (PUBLISHED, RECLAIM) the start fails, naming the file it
   could not allocate.
1. Once space is freed the node starts, but below stop water (a ballast file): the
   first batch is refused with 503, ``disk_stop_water`` and a Retry-After of the
   housekeeping cadence; deleting the ballast lets admission resume by itself.
2. The WAL holds data the store lacks; then an outside writer takes the whole volume
   between two samples. The node's free-space figure (the last sample less what the
   node wrote since, issue 18) cannot know, so the next batch reaches the WAL, whose
   write fails with ENOSPC: that batch is refused (nothing acknowledged), every later
   one is refused with ``disk_full`` and a Retry-After. (The node's own load no longer
   gets there: admission stops it at stop water, ``test_disk_headroom.py``.)
3. The store comes back: the barrier publishes and stamps a checkpoint and housekeeping
   reclaims on the still-full volume (RECLAIM and the checkpoint spare need no new
   block; the outside file stays); admission resumes in the same process, with no
   restart and no append needed to find out; only then is anything acknowledged again.
4. After a clean stop, every acknowledged record is in the published Parquet and
   ``ourios wal verify`` reports a clean set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tests.support.noderig import request
from tests.support.parquet_read import read_kind
from tests.support.scrape import scrape
from tests.support.serve import ROOT, ServeProcess
from tests.support.tmpfs import TmpfsMounts, free_bytes

TMPFS_BYTES = 2 << 20
STOP_WATER = 128 * 1024
CADENCE = 1


def _fill_to(path: Path, ballast: Path, free: int) -> None:
    """Write ``ballast`` until about ``free`` bytes remain on ``path``'s filesystem."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while free_bytes(path) > free + 4096:
            os.write(fd, b"\0" * min(65536, free_bytes(path) - free))
    finally:
        os.close(fd)


def _metric(server: ServeProcess, line_prefix: str) -> float | None:
    return scrape(server).series(line_prefix)


def test_a_real_full_disk_refuses_reclaims_and_resumes_without_a_restart(
    tmp_path: Path, small_tmpfs: TmpfsMounts
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mount = small_tmpfs(TMPFS_BYTES)
    wal = data / "wal"
    wal.symlink_to(mount, target_is_directory=True)  # the WAL, and only it, on the tmpfs
    blocker = tmp_path / "store"
    blocker.write_text("the store's parent is a file: every put fails until it goes")
    objects = blocker / "objects"
    env = {
        "OURIOS_STORE_URL": objects.as_uri(),
        "OURIOS_WAL_SEGMENT_MAX_BYTES": str(64 * 1024),
        "OURIOS_WAL_BARRIER_SECS": "1",
        "OURIOS_WAL_HOUSEKEEPING_SECS": str(CADENCE),
        "OURIOS_WAL_MAX_TENANTS": "16",
        "OURIOS_WAL_MAX_UNLINKS_PER_PASS": "16",
        "OURIOS_DISK_LOW_WATER_BYTES": str(4 * STOP_WATER),
        "OURIOS_DISK_STOP_WATER_BYTES": str(STOP_WATER),
    }
    ballast = mount / "ballast"
    # 0. no room to allocate the sidecars: the start fails naming the file; nothing serves
    _fill_to(mount, ballast, 0)
    failed = ServeProcess(data, env).start_refused()
    # the first sidecar a fresh root allocates (PUBLISHED, then RECLAIM) is the one named
    assert "PUBLISHED" in str(failed["error"]), failed
    assert "allocate" in str(failed["error"]), failed
    assert "No space left on device" in str(failed["error"])
    ballast.unlink()
    _fill_to(mount, ballast, STOP_WATER)  # room to open, not to admit
    acked: list[str] = []
    with ServeProcess(data, env) as server:
        pid = server.proc.pid if server.proc else None

        def post(tag: str, n: int = 200) -> tuple[int, bytes, dict[str, str]]:
            status, body, headers = server.post_logs(request(tag, n).SerializeToString())
            if status == 200:
                acked.extend(f"{tag}/{i}" for i in range(n))
            return status, body, headers

        # 1. below stop water from the start-up sample: refused, naming the bound
        status, body, headers = post("early")
        assert status == 503 and headers.get("retry-after") == str(CADENCE), (status, body)
        assert b"disk below stop water" in body and f"={STOP_WATER}".encode() in body
        assert len(server.event("disk.stop_water")) == 1
        ballast.unlink()
        server.wait_event("disk.recovered", 1, deadline_s=30)
        assert post("resumed")[0] == 200

        # 2. the WAL holds data the store lacks (nothing can be reclaimed: it is down)...
        for i in range(5000):
            assert post(f"fill{i}")[0] == 200
            if i % 10 == 0 and (_metric(server, "ourios_wal_segments") or 0) >= 6:
                break
        assert free_bytes(mount) > 4 * STOP_WATER  # healthy by the figure: still admitting
        # ...then an outside writer takes the volume between two samples, and the next
        # batch reaches the WAL. A tick sampling the ballast first would refuse it on stop
        # water instead (the figure knew): then free the volume and try again.
        recoveries = len(server.event("disk.recovered"))
        for attempt in range(5):
            _fill_to(mount, ballast, 0)
            status, body, _ = post(f"enospc{attempt}")
            if b"below stop water" not in body:
                break
            ballast.unlink()
            recoveries += 1
            server.wait_event("disk.recovered", recoveries, deadline_s=30)
        assert status == 503 and b"WAL could not make the batch durable" in body, body
        full_at = time.time()
        assert free_bytes(mount) < 16 * 1024, "the volume did not fill"
        for i in range(3):
            status, body, headers = post(f"refused{i}")
            assert status == 503 and headers.get("retry-after") == str(CADENCE)
            assert b"disk full" in body or b"below stop water" in body, body
        assert [e["cause"] for e in server.event("disk.stop_water")][-1].startswith(
            "the WAL's"
        ) or free_bytes(mount) < STOP_WATER
        assert _metric(server, 'ourios_admission_refusing{bound="disk_full"}') == 1.0
        segments_full = _metric(server, "ourios_wal_segments")
        assert segments_full is not None and segments_full > 4

        # 3. the store catches up: cut, checkpoint and reclaim on the full volume (the
        # outside file stays)
        blocker.unlink()
        recoveries += 1
        server.wait_event("disk.recovered", recoveries, deadline_s=30)
        recovered = server.event("disk.recovered")[-1]
        assert recovered["from"] == "stop_water" and recovered["refused_requests"] >= 3
        assert (_metric(server, "ourios_wal_segments") or 0) < segments_full
        assert free_bytes(mount) > STOP_WATER and ballast.exists()
        after = time.time()
        assert post("after")[0] == 200  # the same process: no restart
        assert server.proc is not None and server.proc.pid == pid
        # nothing was acknowledged between the failure and the recovery event
        at = datetime.fromisoformat(recovered["ts"]).timestamp()  # RFC 3339
        assert at >= full_at and after >= at
        assert server.terminate() == 0

    # 4. every acknowledged record is published; the set is sound
    verify = subprocess.run(
        [sys.executable, "-m", "app.cli", "wal", "verify", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0 and "clean" in verify.stdout, verify.stdout + verify.stderr
    published = {row["attributes"]["rid"] for row in read_kind(objects, "records", "pyarrow")}
    lost = [rid for rid in acked if rid not in published]
    assert not lost, f"{len(lost)} acknowledged records missing, e.g. {lost[:3]}"

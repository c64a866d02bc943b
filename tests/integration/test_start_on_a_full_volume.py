"""Starting on a full or too-small data volume (issue 22 item 2; DESIGN.md §6).

Each runs a real ``ourios serve`` whose whole data directory is one size-limited tmpfs,
as in the chart.

1. A restart on a volume with zero bytes free starts. The node stopped by SIGKILL with
   a torn record at the end of ``PUBLISHING`` (what an intent append that ran out of
   space half-way leaves, ``wal/intents.py``), and then the volume filled to the last
   byte. Open's repair must not need a block it cannot have: it truncates the file in
   place (and any start-up write that needs a block takes the emergency reserve's).
   The torn record is written by hand: on a real kernel a torn append comes only from
   a short write at ENOSPC or from a power loss, and neither can be made to happen at
   a chosen byte by SIGKILLing a process, which the kernel lets finish its ``pwrite``.
2. A volume too small for ``disk.reserve_bytes`` and ``disk.stop_water_bytes`` together
   could never admit a batch: the start is refused with one ``server.start_failed``
   naming the volume's size and both settings, instead of a node that is ready and
   refuses every request for ever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.noderig import request
from tests.support.poll import poll_until
from tests.support.serve import ServeProcess
from tests.support.tmpfs import TmpfsMounts, fill_volume, free_bytes
from wal.intents import IntentLog, IntentRecord, ObjectKind, encode_record, scan

MiB = 1 << 20
VOLUME = 16 * MiB


def _env(store: Path) -> dict[str, str]:
    return {
        "OURIOS_STORE_URL": store.as_uri(),  # another filesystem: not what is under test
        "OURIOS_WAL_SEGMENT_MAX_BYTES": str(256 * 1024),
        "OURIOS_WAL_BARRIER_SECS": "1",
        "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
        "OURIOS_WAL_MAX_TENANTS": "16",
        "OURIOS_DISK_LOW_WATER_BYTES": str(2 * MiB),
        "OURIOS_DISK_STOP_WATER_BYTES": str(1 * MiB),
        "OURIOS_DISK_RESERVE_BYTES": str(1 * MiB),
        "OURIOS_SERVER_WORKERS": "0",
    }


@pytest.mark.parametrize("loss", ["torn_intent", "spare_lost"])
def test_every_state_2_a_restart_on_a_full_volume_starts(
    tmp_path: Path, small_tmpfs: TmpfsMounts, loss: str
) -> None:
    """``torn_intent``: PUBLISHING's torn tail is cut in place. ``spare_lost``: a crash
    between a checkpoint write's first rename (the spare to the temp) and its link left
    no ``CHECKPOINT.spare``; making one needs a block, which the reserve gives."""
    data = small_tmpfs(VOLUME)
    store = tmp_path / "objects"
    env = _env(store)
    first = ServeProcess(data, env)
    with first:
        for i in range(4):
            body = request(f"full{i}", 5).SerializeToString()
            assert first.post_logs(body)[0] == 200
        poll_until(
            "published object",
            lambda: any(store.rglob("*.parquet")),
            deadline_s=60,
            detail=first.tail,
        )
        first.kill()  # SIGKILL: no final cut, no clean close
    publishing = data / "wal" / IntentLog.NAME
    whole = publishing.stat().st_size
    torn = encode_record(
        IntentRecord(
            ObjectKind.RECORDS, "default", "records/tenant=default/x.parquet", 1, (1, 2, 3)
        )
    )[:-7]
    if loss == "torn_intent":
        with publishing.open("ab") as f:  # a short append: its last bytes never came
            f.write(torn)
            os.fsync(f.fileno())
    else:
        wal = data / "wal"
        os.rename(wal / "CHECKPOINT.spare", wal / "CHECKPOINT.tmp")
    assert (data / "disk-reserve").exists()
    filler = data / "outside-filler"
    size = fill_volume(filler)
    assert free_bytes(data) == 0

    again = ServeProcess(data, env)
    with again:  # starts: listening, ready and recovered
        assert not again.event("server.start_failed")
        if loss == "torn_intent":
            (dropped,) = again.event("intents.tail_dropped")
            assert dropped["bytes"] == len(torn), dropped
            # In place: the start needed no block. (A cut since may have released the
            # reserve for a snapshot on this full volume; that is the reserve's job.)
            releases = again.event("disk.reserve.released")
            assert not [e for e in releases if "at start-up" in str(e["cause"])], releases
        else:
            (released,) = again.event("disk.reserve.released")
            assert "opening the WAL at start-up failed" in released["cause"], released
            assert "CHECKPOINT.spare" in released["cause"], released
            assert (data / "wal" / "CHECKPOINT.spare").stat().st_size == 32
        if loss == "torn_intent":  # cut at the whole records (the node may append since)
            assert f"offset {whole} " in str(dropped["reason"]), dropped
        assert not scan(publishing.read_bytes(), publishing).dropped_bytes
        status, _ = again.get("/readyz")
        assert status == 200
        assert again.terminate() in (0, 75), again.tail()
    assert filler.stat().st_size == size  # nothing outside the node was touched


@pytest.mark.parametrize("reserve_mib, stop_mib", [(8, 1), (2, 7)])
def test_every_state_2_a_volume_smaller_than_reserve_and_stop_water_refuses_to_start(
    tmp_path: Path, small_tmpfs: TmpfsMounts, reserve_mib: int, stop_mib: int
) -> None:
    data = small_tmpfs(8 * MiB)
    env = {
        **_env(tmp_path / "objects"),
        "OURIOS_DISK_LOW_WATER_BYTES": str((stop_mib + 1) * MiB),
        "OURIOS_DISK_STOP_WATER_BYTES": str(stop_mib * MiB),
        "OURIOS_DISK_RESERVE_BYTES": str(reserve_mib * MiB),
    }
    node = ServeProcess(data, env)
    failed = node.start_refused()
    message = str(failed["error"])
    assert failed["error_type"] == "volume_too_small", failed
    assert f"{8 * MiB} bytes" in message, message
    assert f"disk.reserve_bytes={reserve_mib * MiB}" in message, message
    assert f"disk.stop_water_bytes={stop_mib * MiB}" in message, message
    assert not node.event("server.listening")
    assert not (data / "disk-reserve").exists()  # refused before anything was allocated

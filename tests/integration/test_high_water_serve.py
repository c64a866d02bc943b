"""Issue 18 item 5 on a real ``ourios serve``: a bit flipped in an acknowledged frame of
a sealed segment — below the synced high-water its successor's header records — refuses
the start (exit 1, ``server.start_failed`` naming the file, the offset and the
high-water), ``ourios wal verify`` reports it, and ``ourios wal quarantine`` of the
segment lets the node start with the loss recorded.

How the sealed segment is made, all by real processes: a node acknowledges batches and
is SIGKILLed; a fragment of a frame whose write never completed is appended to its
segment (what a crash mid-write leaves); the next node seals that torn tail at open and
its first append rotates, so the successor's header records the seal and the high-water
(the end of the valid frames). Before this change the third start accepted the damage as
that sealed segment's torn tail and dropped the frames after it without an error.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from tests.support.noderig import request
from tests.support.serve import ROOT, ServeProcess
from wal.frame import scan_frames
from wal.segment import HEADER_SIZE, SegmentHeader

ENV = {
    # No cut and no housekeeping pass while the test runs: nothing is checkpointed or
    # reclaimed, so the sealed segment stays in the set with every frame above X.
    "OURIOS_WAL_BARRIER_SECS": "86400",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "86400",
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "wal", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _post(server: ServeProcess, name: str) -> None:
    status, body, _ = server.post_logs(request(name, 20).SerializeToString())
    assert status == 200, body


def test_nowedge_5_a_real_node_refuses_a_bit_flip_below_a_sealed_segments_high_water(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    wal = data / "wal"
    first = ServeProcess(data, ENV).start()
    try:
        for i in range(6):
            _post(first, f"a{i}")  # acknowledged: each answer came after its fsync
    finally:
        first.kill()
    (sealed,) = sorted(wal.glob("*.wal"))
    frames, stop = scan_frames(sealed.read_bytes(), HEADER_SIZE, path=sealed)
    assert len(frames) == 6 and not stop.damaged
    valid_end = int(sealed.name[:20]) + frames[-1].end - HEADER_SIZE
    with open(sealed, "ab") as f:  # a frame whose write never completed
        f.write(struct.pack("<II", 4096, 0) + b"never completed")

    second = ServeProcess(data, ENV).start()
    try:
        torn = second.event("wal.segment.sealed")
        assert len(torn) == 1 and torn[0]["segment"] == sealed.name
        for i in range(3):
            _post(second, f"b{i}")
    finally:
        second.kill()
    segments = sorted(wal.glob("*.wal"))
    assert segments[0] == sealed and len(segments) == 2
    header = SegmentHeader.decode(segments[1].read_bytes()[:HEADER_SIZE], segments[1])
    assert header.predecessor_sealed and header.prev_high_water == valid_end
    high_water = header.prev_high_water

    damage_at = frames[1].start  # an acknowledged frame with four more after it
    raw = bytearray(sealed.read_bytes())
    raw[damage_at + 40] ^= 0x01
    sealed.write_bytes(bytes(raw))

    event = ServeProcess(data, ENV).start_refused()
    assert event["error_type"] == "wal_corrupt"
    assert event["path"] == str(sealed) and event["offset"] == damage_at
    assert event["high_water"] == high_water
    message = str(event["error"])
    assert sealed.name in message and f"byte {damage_at}" in message
    assert f"high-water {high_water}" in message and "not a torn tail" in message

    verify = _cli("verify", str(data))
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert f"PROBLEM: {sealed.name} at byte {damage_at}" in verify.stdout
    assert f"high-water {high_water}" in verify.stdout

    quarantine = _cli("quarantine", str(sealed))
    assert quarantine.returncode == 0, quarantine.stdout + quarantine.stderr
    assert f"high-water {high_water}" in quarantine.stdout
    record = json.loads((wal / "quarantine" / f"{sealed.name}.json").read_text())
    assert record["high_water_lsn"] == high_water and record["damage_offset"] == damage_at
    assert record["frames_after_damage_below_high_water"] == 4

    with ServeProcess(data, ENV) as again:
        quarantined = again.event("wal.segment.quarantined")
        assert len(quarantined) == 1 and quarantined[0]["segment"] == sealed.name
        assert f"high-water {high_water}" in str(quarantined[0]["loss"])
        recovered = again.event("recovery.done")
        assert len(recovered) == 1
        _post(again, "c0")  # it serves
        again.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert again.terminate() == 0

"""``ourios wal quarantine`` end to end: a real node that will not start because a segment
is unreadable starts after the operator quarantines it, and the records that segment held
are the ones reported lost — no more, no fewer (issue 8).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.receive.otlp import decode_request
from tests.support.noderig import request
from tests.support.parquet_read import read_kind
from tests.support.scrape import scrape
from tests.support.serve import ROOT, ServeProcess
from wal.frame import scan_frames
from wal.segment import HEADER_SIZE

ENV = {
    "OURIOS_WAL_SEGMENT_MAX_BYTES": str(64 * 1024),
    "OURIOS_WAL_BARRIER_SECS": "3600",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "3600",
}


def _rids(segment: bytes, path: Path) -> list[str]:
    frames, _ = scan_frames(segment, HEADER_SIZE, path=path)
    out: list[str] = []
    for f in frames:
        req = decode_request(segment[f.payload_start : f.end], "application/x-protobuf")
        for rl in req.resource_logs:
            for sl in rl.scope_logs:
                for rec in sl.log_records:
                    out.extend(a.value.string_value for a in rec.attributes if a.key == "rid")
    return out


def test_quarantine_lets_a_real_node_start_and_names_exactly_what_it_lost(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # The store is unusable while the node runs (its parent is a file), so no cut can
    # publish or checkpoint anything: every frame stays above the (absent) checkpoint.
    blocker = tmp_path / "store"
    blocker.write_text("not a directory")
    env = {**ENV, "OURIOS_STORE_URL": (blocker / "objects").as_uri()}
    acked: list[str] = []
    server = ServeProcess(data, env).start()
    try:
        for i in range(40):
            req = request(f"b{i}", 150)
            status, body, _ = server.post_logs(req.SerializeToString())
            assert status == 200, body
            acked.extend(f"b{i}/{k}" for k in range(150))
    finally:
        server.kill()
    blocker.unlink()
    segments = sorted((data / "wal").glob("*.wal"))
    assert len(segments) >= 4
    bad = segments[1]
    raw = bad.read_bytes()
    lost = _rids(raw, bad)
    assert lost
    frames, _ = scan_frames(raw, HEADER_SIZE, path=bad)
    damage_at = frames[1].start
    flipped = bytearray(raw)
    flipped[damage_at + 40] ^= 0x01
    bad.write_bytes(bytes(flipped))

    failed = ServeProcess(data, env).start_refused()
    assert bad.name in str(failed["error"]) and f"byte {damage_at}" in str(failed["error"])

    cli = subprocess.run(
        [sys.executable, "-m", "app.cli", "wal", "quarantine", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    readable = len(_rids(raw[:damage_at], bad))  # the frame before the damage
    assert f"holding {readable} record(s)" in cli.stdout
    # The segment was closed by a clean rotation: its successor records its whole length
    # as its high-water, so the damage is named corruption of acknowledged frames (issue
    # 18 item 5), not bytes that "may have held" them.
    assert "below the high-water" in cli.stdout
    assert "corruption of acknowledged frames" in cli.stdout

    with ServeProcess(data, env) as again:
        events = again.event("wal.segment.quarantined")
        assert len(events) == 1 and events[0]["segment"] == bad.name
        assert events[0]["lost_records_above_checkpoint"] == readable
        assert scrape(again).value("ourios_wal_quarantined_segments") == 1.0
        assert again.terminate() == 0
    published = {
        row["attributes"]["rid"] for row in read_kind(blocker / "objects", "records", "pyarrow")
    }
    assert set(acked) - published == set(lost)  # exactly the quarantined segment's records
    assert published <= set(acked)

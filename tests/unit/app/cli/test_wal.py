"""``ourios wal inspect`` and ``ourios wal verify``: read-only, every problem with its
file and offset, and an exit code an operator can script against."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import wal as walcli
from tests.support.walkit import SMALL, payload
from wal import Journal, PublishedMarks
from wal.segment import HEADER_SIZE, segment_name

FRAME = 8 + 2 + len("tenant-0") + 9000  # prefix, kind and tenant length, tenant, payload


@pytest.fixture()
def wal_root(tmp_path: Path) -> Path:
    root = tmp_path / "data" / "wal"
    with Journal.open(root, SMALL) as j:
        for i in range(20):
            mark = j.commit(f"tenant-{i % 2}", payload(i, 9000)).offset
        j.checkpoint(mark)
    return root


def _segments(root: Path) -> list[Path]:
    return sorted(root.glob("*.wal"))


def _snapshot(root: Path) -> dict[str, tuple[int, float]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime) for p in root.iterdir()}


def run(fn: object, root: Path) -> tuple[int, str]:
    out = io.StringIO()
    code = fn(root, out)  # type: ignore[operator]
    return code, out.getvalue()


def test_inspect_lists_segments_tenants_and_the_checkpoint(wal_root: Path) -> None:
    before = _snapshot(wal_root)
    code, text = run(walcli.inspect, wal_root.parent)  # a data dir is accepted too
    assert code == 0
    assert "checkpoint: " in text and "none" not in text.split("checkpoint: ")[1][:5]
    for seg in _segments(wal_root):
        assert seg.name in text
    assert "tenant tenant-0" in text and "tenant tenant-1" in text
    assert _snapshot(wal_root) == before  # read-only


def test_verify_clean_set_exits_zero(wal_root: Path) -> None:
    before = _snapshot(wal_root)
    code, text = run(walcli.verify, wal_root)
    assert code == 0 and "clean" in text and "20 frames" in text
    assert _snapshot(wal_root) == before


def test_verify_finds_a_flipped_byte_in_a_sealed_segment(wal_root: Path) -> None:
    seg = _segments(wal_root)[1]
    data = bytearray(seg.read_bytes())
    data[HEADER_SIZE + FRAME + 100] ^= 0x10  # inside the second frame
    seg.write_bytes(bytes(data))
    code, text = run(walcli.verify, wal_root)
    assert code == 1
    assert f"PROBLEM: {seg.name} at byte {HEADER_SIZE + FRAME}" in text
    assert "checksum" in text


def test_verify_finds_a_truncated_middle_segment(wal_root: Path) -> None:
    seg = _segments(wal_root)[1]
    with open(seg, "r+b") as f:
        f.truncate(HEADER_SIZE + 3 * FRAME + 50)
    code, text = run(walcli.verify, wal_root)
    assert code == 1
    assert f"{seg.name} at byte {HEADER_SIZE + 3 * FRAME}" in text and "truncated" in text


def test_verify_finds_a_name_header_disagreement(wal_root: Path) -> None:
    seg = _segments(wal_root)[1]
    wrong = wal_root / segment_name(int(seg.name[:20]) + 1)
    os.rename(seg, wrong)
    code, text = run(walcli.verify, wal_root)
    assert code == 1
    assert f"{wrong.name} at byte 8" in text and "name/header disagreement" in text


def test_verify_reports_a_torn_newest_tail_as_a_note(tmp_path: Path) -> None:
    wal_root = tmp_path / "wal"
    with Journal.open(wal_root, SMALL) as j:
        for i in range(10):
            j.commit("t", payload(i, 9000))
    seg = _segments(wal_root)[-1]
    with open(seg, "ab") as f:  # a frame's first bytes, above the recorded high-water
        f.write(b"\x40\x00\x00\x00torn")
    code, text = run(walcli.verify, wal_root)
    assert code == 0 and "note:" in text and "torn tail" in text


def test_verify_finds_a_checkpoint_beyond_the_log(wal_root: Path) -> None:
    seg = _segments(wal_root)[-1]
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 5)
    code, text = run(walcli.verify, wal_root)
    assert code == 1 and "CHECKPOINT" in text and "beyond the end of the log" in text


def test_the_console_script_runs_verify(wal_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "wal", "verify", str(wal_root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "clean" in proc.stdout


def test_not_a_wal_exits_two(tmp_path: Path) -> None:
    code, text = run(walcli.verify, tmp_path / "nope")
    assert code == 2 and "not a directory" in text


def test_verify_finds_damage_below_the_checkpoint_in_the_newest_segment(wal_root: Path) -> None:
    # A torn tail is legal in the newest segment, but not below the checkpoint mark:
    # that frame was acknowledged, and nothing is appended behind a torn one.
    seg = _segments(wal_root)[-1]
    data = bytearray(seg.read_bytes())
    data[HEADER_SIZE + 30] ^= 0x10
    seg.write_bytes(bytes(data))
    code, text = run(walcli.verify, wal_root)
    assert code == 1
    assert f"PROBLEM: {seg.name} at byte {HEADER_SIZE}" in text and "below the checkpoint" in text


def test_inspect_reads_horizons_from_the_snapshots_beside_the_wal(wal_root: Path) -> None:
    from app.ingest.snapshot_store import SnapshotState, SnapshotStore
    from wal.inspection import verify_root

    report = verify_root(wal_root)
    last = report.segments[0].tenant_last
    store = SnapshotStore(wal_root.parent / "snapshots")
    for tenant, lsn in last.items():
        horizon = report.checkpoint
        assert horizon is not None
        store.install(SnapshotState(tenant, type(horizon)(horizon.segment, lsn), b"m"))
    (wal_root.parent / "snapshots" / "broken.snap").write_bytes(b"OSNP junk")
    before = _snapshot(wal_root)
    code, text = run(walcli.inspect, wal_root.parent)
    assert code == 0 and _snapshot(wal_root) == before
    assert "snapshots: 2 tenant horizon(s)" in text and "UNDECODABLE broken.snap" in text
    assert "CHECKPOINT.spare: allocated" in text and "RECLAIM: mode" in text
    assert "retain floor: min" in text


def test_nowedge_2_inspect_shows_the_disk_reserve_beside_the_wal(wal_root: Path) -> None:
    """Issue 18: ``$DATA/disk-reserve`` is named for what it is and inspect reads past it."""
    code, text = run(walcli.inspect, wal_root.parent)
    assert code == 0 and "disk reserve:" in text and "absent" in text.split("disk reserve:")[1]
    reserve = wal_root.parent / "disk-reserve"
    reserve.write_bytes(bytes(8192))
    for where in (wal_root.parent, wal_root):
        code, text = run(walcli.inspect, where)
        assert code == 0 and f"{reserve} in place, 8192 bytes" in text
        others = [line for line in text.splitlines() if line.startswith("other files:")]
        assert all("disk-reserve" not in line for line in others)  # not in the WAL directory
    code, text = run(walcli.verify, wal_root.parent)
    assert code == 0 and "clean" in text


def test_nowedge_6_inspect_names_an_unconfirmed_settlement_intent(wal_root: Path) -> None:
    """A PUBLISHED entry with the ``publishing`` bit: the frontier in force, the end of the
    span, and what the next start does with it."""
    with Journal.open(wal_root, SMALL) as j:
        end = j.commit("tenant-0", payload(99, 200)).offset
        j.publish_marks({"tenant-0": PublishedMarks(None, None, intent=end)})
    code, text = run(walcli.inspect, wal_root)
    assert code == 0
    (line,) = [x for x in text.splitlines() if "published through for tenant-0" in x]
    assert "records None, audit None [publishing]" in line
    assert f"publish through {end} is not confirmed" in line and "republishes" in line

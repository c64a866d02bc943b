"""``ourios wal quarantine``: an unreadable segment is moved aside with a record of what it
held, only on the command, and the node starts with the loss named (issue 8).

Also the segment-set seed's deliverables 11–13, adapted to tenant-aware reclamation:
a corrupt snapshot governs nothing, a segment deleted by hand is caught at start-up
naming the tenant and the offsets, and a crash after every k-th unlink recovers the
same records.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import wal as walcli
from app.ingest.snapshot_store import SnapshotState, SnapshotStore
from tests.support.noderig import request
from tests.support.walkit import SMALL, faulty, payload
from wal import CorruptionError, Journal, KnownHorizons, WalOffset
from wal.inspection import verify_root
from wal.reclamation import StaleGap
from wal.segment import HEADER_SIZE
from wal.testing import SimulatedCrash

FRAME_PAYLOAD = 9000


def _frame_len(tenant: str, size: int) -> int:
    return 8 + 2 + len(tenant) + size


def _otlp(i: int) -> bytes:
    """An OTLP payload of 3 records padded to a fixed-ish size (so frames rotate)."""
    req = request(f"q{i}", 3)
    rec = req.resource_logs[0].scope_logs[0].log_records[0]
    rec.body.string_value += "x" * 8000
    data: bytes = req.SerializeToString()  # protobuf's generated classes are untyped
    return data


def _build(root: Path, frames: int = 24) -> list[tuple[str, WalOffset]]:
    out = []
    with Journal.open(root, SMALL) as j:
        for i in range(frames):
            tenant = f"t{i % 2}"
            out.append((tenant, j.commit(tenant, _otlp(i)).offset))
    return out


def _segments(root: Path) -> list[Path]:
    return sorted(root.glob("*.wal"))


def _flip(seg: Path, offset: int) -> None:
    data = bytearray(seg.read_bytes())
    data[offset] ^= 0x20
    seg.write_bytes(bytes(data))


def _replayed(root: Path) -> list[WalOffset]:
    with Journal.open(root, SMALL) as j:
        return [f.offset for f in j.replay()]


def run(fn: object, *args: object, **kw: object) -> tuple[int, str]:
    out = io.StringIO()
    code = fn(*args, out, **kw)  # type: ignore[operator]
    return code, out.getvalue()


def test_quarantine_refuses_a_segment_that_verifies_clean(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _build(root)
    seg = _segments(root)[1]
    code, text = run(walcli.quarantine, seg)
    assert code == 1 and "verifies clean" in text and "nothing was moved" in text
    assert seg.exists() and not (root / "quarantine").exists()
    code, text = run(walcli.quarantine, root / "00000000000000000007.wal")
    assert code == 2 and "does not exist" in text


def test_quarantine_lets_a_wal_with_an_unreadable_segment_open_and_names_the_loss(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    acked = _build(root)
    segs = _segments(root)
    bad = segs[1]
    first_frame = _frame_len("t0", len(_otlp(0)))
    _flip(bad, HEADER_SIZE + first_frame + 100)  # inside its second frame
    with pytest.raises(CorruptionError) as refused, Journal.open(root, SMALL) as j:
        list(j.replay())
    assert refused.value.path == bad and refused.value.offset == HEADER_SIZE + first_frame
    before = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}

    code, text = run(walcli.quarantine, bad, now=1.8e9)
    assert code == 0, text
    assert not bad.exists() and (root / "quarantine" / bad.name).exists()
    record = json.loads((root / "quarantine" / f"{bad.name}.json").read_text())
    # one readable frame before the damage: 3 records, above the (absent) checkpoint
    assert record["readable_frames"] == 1 and record["lost_records_above_checkpoint"] == 3
    assert record["damage_offset"] == HEADER_SIZE + first_frame and record["unreadable_bytes"] > 0
    assert "LOSS:" in text and "1 readable frame(s) holding 3 record(s)" in text
    assert "unreadable" in text and str(HEADER_SIZE + first_frame) in text
    # the rest of the directory is untouched
    assert {p.name for p in root.iterdir()} - {"quarantine"} == set(before) - {bad.name}

    events: list[tuple[str, dict[str, object]]] = []
    with Journal.open(root, SMALL, events=lambda n, f: events.append((n, dict(f)))) as j:
        replayed = [f.offset for f in j.replay()]
        quarantined = j.quarantined
    lost = {o for _, o in acked if o.segment == _uuid_of(record)}
    assert set(replayed) == {o for _, o in acked} - lost
    assert [r.segment for r in quarantined] == [bad.name]
    q_events = [f for n, f in events if n == "wal.segment.quarantined"]
    assert len(q_events) == 1 and q_events[0]["lost_records_above_checkpoint"] == 3

    report = verify_root(root)
    assert report.ok and any("quarantined" in n.message for n in report.notes)
    code, text = run(walcli.inspect, root)
    assert f"quarantined {bad.name}" in text and "CHECKPOINT.spare: allocated" in text


def _uuid_of(record: dict[str, object]) -> object:
    import uuid

    return uuid.UUID(str(record["uuid"]))


def test_quarantining_the_newest_segment_never_reuses_its_lsns(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    acked = _build(root)
    newest = _segments(root)[-1]
    data = bytearray(newest.read_bytes())
    data[10] ^= 0xFF  # its header: open refuses the set
    newest.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        Journal.open(root, SMALL)
    code, text = run(walcli.quarantine, newest)
    assert code == 0, text
    end = max(o.lsn for _, o in acked)
    with Journal.open(root, SMALL) as j:
        list(j.replay())
        after = j.commit("t0", payload(1, 100)).offset
    assert after.lsn > end  # never at an LSN the quarantined frames held
    replayed = _replayed(root)
    assert replayed[-1] == after


def test_seg12_a_segment_deleted_by_hand_is_caught_at_start_up_naming_tenant_and_offsets(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    acked = _build(root)
    segs = _segments(root)
    gone = segs[2]
    inside = next(o for t, o in acked if t == "t1" and o.lsn > int(gone.name[:20]))
    gone.unlink()  # by hand, outside the WAL
    with Journal.open(root, SMALL) as j:
        list(j.replay())
        with pytest.raises(StaleGap) as info:
            j.check_restorable({"t1": inside, "t0": acked[-1][1]})
    message = str(info.value)
    assert "'t1'" in message and str(inside) in message and "refusing to start" in message.lower()


def test_a_horizon_inside_a_quarantined_segment_is_a_recorded_loss_not_a_stale_gap(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    acked = _build(root)
    seg = _segments(root)[2]
    inside = next(o for t, o in acked if t == "t1" and o.lsn > int(seg.name[:20]))
    code, text = run(walcli.quarantine, seg, force=True)
    assert code == 0 and "forced by the operator" in text
    with Journal.open(root, SMALL) as j:
        list(j.replay())
        j.check_restorable({"t1": inside, "t0": acked[-1][1]})  # starts


def test_quarantine_refuses_while_a_process_holds_the_wal_open(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _build(root)
    seg = _segments(root)[1]
    _flip(seg, HEADER_SIZE + 100)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"f = open({str(root / 'RECLAIM')!r}, 'rb'); print('open', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        code, text = run(walcli.quarantine, seg)
        assert code == 1 and str(holder.pid) in text and "nothing was moved" in text
        assert seg.exists() and not (root / "quarantine").exists()
    finally:
        holder.communicate(b"\n", timeout=10)


# -- seed deliverables 11 and 13 ------------------------------------------------------------


def test_seg11_a_corrupt_snapshot_removes_nothing_it_alone_covered(tmp_path: Path) -> None:
    data = tmp_path / "data"
    root = data / "wal"
    acked = _build(root)
    store = SnapshotStore(data / "snapshots")
    last = {t: o for t, o in acked}
    for tenant, horizon in last.items():
        assert store.install(SnapshotState(tenant, horizon, b"miner")).installed
    path = store.path_of("t0")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01  # CRC damage
    path.write_bytes(bytes(raw))
    loaded = SnapshotStore(data / "snapshots").load_all_durable()
    assert "t0" in loaded.undecodable and set(loaded.states) == {"t1"}
    with Journal.open(root, SMALL) as j:
        list(j.replay())
        j.checkpoint(acked[-1][1])
        j.maintain(KnownHorizons({t: s.horizon for t, s in loaded.states.items()}), 64)
    survivors = set(_replayed(root))
    # every t0 frame survives: only the corrupt snapshot covered them
    assert {o for t, o in acked if t == "t0"} <= survivors


@pytest.mark.parametrize("k", range(1, 7))
def test_seg13_a_crash_after_the_kth_unlink_recovers_the_same_records(
    tmp_path: Path, k: int
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    j = Journal.open(root, SMALL, fs=fs)
    acked = [
        (f"t{i % 2}", j.commit(f"t{i % 2}", payload(i, FRAME_PAYLOAD)).offset) for i in range(70)
    ]
    h = {"t0": acked[60][1], "t1": acked[55][1]}
    j.checkpoint(acked[-3][1])
    fs.crash_at("unlink", "*.wal", nth=k + 1)  # after k unlinks completed
    with pytest.raises(SimulatedCrash):
        j.maintain(KnownHorizons(h), 64)
    fs.apply_crash(power_loss=True)  # the process is gone; its journal is never closed
    with Journal.open(root, SMALL) as again:
        replayed = {f.offset for f in again.replay()}
        again.check_restorable(h)  # a valid set: no stale gap, nothing unrecoverable
        again.maintain(KnownHorizons(h), 64)  # and the next pass completes the interrupted one
    needed = {o for t, o in acked if o.lsn > h[t].lsn}
    assert needed <= replayed, "a record above its tenant's horizon was lost"
    assert needed <= set(_replayed(root))

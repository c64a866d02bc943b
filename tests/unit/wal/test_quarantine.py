"""``wal.quarantine``, called directly on a real WAL: what a record says a segment held,
the record written before the move, the refusals that move nothing, and reading the
records back, a version 1 record included. The operator's command around it
(``ourios wal quarantine``) is tested in ``tests/unit/app/cli/test_wal_quarantine.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import wal as walcli
from tests.support.highwater import flip as _flip
from tests.support.highwater import frame_starts as _frame_starts
from tests.support.highwater import run_cli as _run
from tests.support.highwater import sealed_after_a_failed_fsync as _sealed_after_a_failed_fsync
from tests.support.highwater import segments as _segments
from tests.support.walkit import SMALL, Ledger, faulty, payload
from wal import CorruptionError, Journal, OsFs, WalOffset
from wal.quarantine import (
    DIR_NAME,
    QuarantineError,
    QuarantineRecord,
    describe_segment,
    in_force,
    load_records,
    quarantine_segment,
)
from wal.segment import HEADER_SIZE

NOW = 1.8e9


def build(root: Path, frames: int = 30) -> list[tuple[str, WalOffset]]:
    out = []
    with Journal.open(root, SMALL) as j:
        for i in range(frames):
            tenant = f"t{i % 2}"
            out.append((tenant, j.commit(tenant, payload(i, 9000)).offset))
    return out


def segments(root: Path) -> list[Path]:
    return sorted(root.glob("*.wal"))


def test_describe_counts_each_tenants_frames_and_touches_nothing(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    acked = build(root)
    seg = segments(root)[1]
    before = seg.read_bytes()
    record = describe_segment(OsFs(), root, seg.name, reason="test", now=NOW)
    assert seg.read_bytes() == before and not (root / DIR_NAME).exists()
    held = [(t, o) for t, o in acked if o.segment == record.seg_uuid]
    assert held and record.readable_frames == len(held)
    assert record.damage_offset is None and record.unreadable_bytes == 0
    assert record.checkpoint_lsn is None  # no checkpoint: every frame counts lost
    assert record.lost_frames == len(held)
    assert record.lost_records is None  # no counter given: the records are unknown
    for tenant in ("t0", "t1"):
        mine = [o.lsn for t, o in held if t == tenant]
        loss = record.tenants[tenant]
        assert (loss.frames, loss.first_lsn, loss.last_lsn) == (len(mine), mine[0], mine[-1])
    assert record.readable_end_lsn == held[-1][1].lsn <= record.end_lsn


def test_describe_names_the_offset_of_the_damage(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root)
    seg = segments(root)[1]
    data = bytearray(seg.read_bytes())
    data[HEADER_SIZE + 50] ^= 0x20  # inside the first frame
    seg.write_bytes(bytes(data))
    record = describe_segment(OsFs(), root, seg.name, reason="test", now=NOW)
    assert record.readable_frames == 0 and record.damage_offset == HEADER_SIZE
    assert record.unreadable_bytes == len(data) - HEADER_SIZE
    assert f"after offset {HEADER_SIZE}" in record.summary()


def test_quarantine_writes_the_record_then_moves_the_segment(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root)
    seg = segments(root)[1]
    record = quarantine_segment(
        OsFs(), root, seg.name, reason="operator", now=NOW, count_records=lambda p: 2
    )
    qdir = root / DIR_NAME
    assert not seg.exists() and (qdir / seg.name).exists()
    doc = json.loads((qdir / f"{seg.name}.json").read_text())
    assert doc["segment"] == seg.name and doc["reason"] == "operator"
    assert doc["lost_records_above_checkpoint"] == 2 * record.lost_frames
    (loaded,) = load_records(OsFs(), root)
    assert loaded == record
    assert in_force([loaded], {p.name for p in segments(root)}) == [loaded]
    assert in_force([loaded], {seg.name}) == []  # still in the set: not in force


def test_quarantine_refuses_and_moves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root)
    names = [p.name for p in segments(root)]
    with pytest.raises(QuarantineError, match="is not a segment name"):
        quarantine_segment(OsFs(), root, "CHECKPOINT", reason="x", now=NOW)
    with pytest.raises(QuarantineError, match="does not exist; nothing was moved"):
        quarantine_segment(OsFs(), root, "00000000000000000007.wal", reason="x", now=NOW)
    assert [p.name for p in segments(root)] == names
    quarantine_segment(OsFs(), root, names[1], reason="x", now=NOW)
    (root / names[1]).write_bytes(b"")  # a segment of the same name again
    with pytest.raises(QuarantineError, match="already exists"):
        quarantine_segment(OsFs(), root, names[1], reason="x", now=NOW)
    assert (root / names[1]).exists()


def test_a_move_a_crash_interrupted_completes_with_the_first_record(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root)
    seg = segments(root)[1]
    first = quarantine_segment(OsFs(), root, seg.name, reason="first", now=NOW)
    (root / DIR_NAME / seg.name).rename(seg)  # as if the crash came before the move
    again = quarantine_segment(OsFs(), root, seg.name, reason="second", now=NOW + 60)
    assert again == first and again.reason == "first"
    assert not seg.exists()


def test_the_record_round_trips_and_a_foreign_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root)
    seg = segments(root)[1]
    record = describe_segment(OsFs(), root, seg.name, reason="r", now=NOW)
    path = tmp_path / "r.json"
    raw = json.dumps(record.to_json()).encode()
    assert QuarantineRecord.from_json(raw, path) == record
    with pytest.raises(CorruptionError, match="not a quarantine record") as info:
        QuarantineRecord.from_json(b'{"format": "other"}', path)
    assert info.value.path == path
    with pytest.raises(CorruptionError, match="unreadable quarantine record"):
        QuarantineRecord.from_json(b"not json", path)


def test_no_quarantine_directory_is_no_records(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    build(root, frames=2)
    assert load_records(OsFs(), root) == []
    (root / DIR_NAME).write_bytes(b"")
    with pytest.raises(CorruptionError, match="quarantine is not a directory"):
        load_records(OsFs(), root)


def test_a_version_1_quarantine_record_is_still_read(tmp_path: Path) -> None:
    """Version 2 of the quarantine record added the high-water fields; a version 1
    record (written before them) still reads, its high-water unknown."""
    root = tmp_path / "wal"
    ledger = Ledger()
    _sealed_after_a_failed_fsync(root, faulty(tmp_path), ledger)
    sealed = _segments(root)[0]
    _flip(sealed, _frame_starts(sealed)[1] + 40)
    assert _run(walcli.quarantine, sealed, now=1.8e9)[0] == walcli.EXIT_OK
    path = root / "quarantine" / f"{sealed.name}.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == 2
    for key in (
        "high_water_lsn",
        "high_water_source",
        "frames_after_damage",
        "frames_after_damage_below_high_water",
    ):
        del doc[key]
    doc["version"] = 1
    record = QuarantineRecord.from_json(json.dumps(doc).encode(), path)
    assert record.high_water_lsn is None and record.frames_after_damage == 0
    assert "may have held acknowledged frames" in record.summary()
    doc["version"] = 3
    with pytest.raises(CorruptionError, match="unknown quarantine record version 3"):
        QuarantineRecord.from_json(json.dumps(doc).encode(), path)

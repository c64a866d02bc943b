"""PUBLISHING (issue 16, ``wal/intents.py``): golden layout, what a crash can leave and
how open repairs it, refusals, appends that fail, trims that crash."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.unit.wal.golden import DATA
from tests.unit.wal.golden_intents import golden_intents_file, golden_records
from wal import CorruptionError, OsFs
from wal.intents import (
    HEADER_SIZE,
    IntentLog,
    IntentRecord,
    IntentWriteError,
    ObjectKind,
    encode_header,
    encode_record,
    scan,
)
from wal.testing import FaultyFs, SimulatedCrash


def rec(lsn: int, tenant: str = "acme", key: str = "") -> IntentRecord:
    key = key or f"records/tenant={tenant}/date=2025-11-24/n-{lsn}.parquet"
    return IntentRecord(ObjectKind.RECORDS, tenant, key, 20_416, frames=(lsn, lsn + 100))


def test_golden_intents_bytes_are_stable() -> None:
    raw = (DATA / "publishing_v1.bin").read_bytes()
    assert golden_intents_file() == raw
    assert raw[:4] == b"OWPI" and len(raw) > HEADER_SIZE


def test_golden_file_reads_back_every_record(tmp_path: Path) -> None:
    (tmp_path / IntentLog.NAME).write_bytes((DATA / "publishing_v1.bin").read_bytes())
    log = IntentLog.open(OsFs(), tmp_path)
    try:
        assert log.records() == golden_records()
        assert log.opened.dropped_bytes == 0
    finally:
        log.close()


def test_an_absent_file_is_created_and_appends_survive_a_reopen(tmp_path: Path) -> None:
    log = IntentLog.open(OsFs(), tmp_path)
    assert log.records() == []
    log.append(rec(10))
    log.append(rec(10))  # already durable: nothing written
    log.append(rec(20))
    log.close()
    data = (tmp_path / IntentLog.NAME).read_bytes()
    assert data == encode_header() + encode_record(rec(10)) + encode_record(rec(20))
    again = IntentLog.open(OsFs(), tmp_path)
    assert again.records() == [rec(10), rec(20)]
    again.close()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-3], id="torn_body"),
        pytest.param(lambda b: b[: -len(encode_record(rec(30))) + 5], id="torn_length"),
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="bad_crc"),
        pytest.param(lambda b: b + b"\xff\xff\xff\xff\0\0\0\0", id="absurd_length"),
    ],
)
def test_a_damaged_tail_is_dropped_and_the_file_cut_before_it(
    tmp_path: Path, damage: object
) -> None:
    good = encode_header() + encode_record(rec(10)) + encode_record(rec(20))
    whole = good + encode_record(rec(30))
    raw = damage(whole)  # type: ignore[operator]
    (tmp_path / IntentLog.NAME).write_bytes(raw)
    log = IntentLog.open(OsFs(), tmp_path)
    try:
        kept = log.records()
        assert kept[:2] == [rec(10), rec(20)]
        assert log.opened.dropped_bytes > 0 and log.opened.dropped_reason
        # nothing is ever appended behind damage: the file holds the good prefix only
        on_disk = (tmp_path / IntentLog.NAME).read_bytes()
        assert scan(on_disk, tmp_path / IntentLog.NAME).dropped_bytes == 0
        log.append(rec(40))
    finally:
        log.close()
    assert IntentLog.open(OsFs(), tmp_path).records()[-1] == rec(40)


@pytest.mark.parametrize(
    "offset, value, reason",
    [
        pytest.param(0, b"XWPI", "magic", id="bad_magic"),
        pytest.param(4, b"\x02\x00", "CRC", id="bad_version_breaks_crc"),
        pytest.param(12, b"\0\0\0\0", "CRC", id="bad_crc"),
    ],
)
def test_a_damaged_header_refuses_naming_the_file(
    tmp_path: Path, offset: int, value: bytes, reason: str
) -> None:
    raw = bytearray(encode_header() + encode_record(rec(10)))
    raw[offset : offset + len(value)] = value
    (tmp_path / IntentLog.NAME).write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match=reason) as caught:
        IntentLog.open(OsFs(), tmp_path)
    assert str(tmp_path / IntentLog.NAME) in str(caught.value)


def test_an_unknown_version_with_a_valid_crc_is_refused(tmp_path: Path) -> None:
    import struct

    import crc32c

    head = struct.pack("<4sHHI", b"OWPI", 2, 0, 0)
    (tmp_path / IntentLog.NAME).write_bytes(head + struct.pack("<I", crc32c.crc32c(head)))
    with pytest.raises(CorruptionError, match="version 2"):
        IntentLog.open(OsFs(), tmp_path)


def test_a_failed_append_changes_nothing_and_the_next_overwrites_its_bytes(
    tmp_path: Path,
) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "wal"
    root.mkdir()
    log = IntentLog.open(fs, root)
    log.append(rec(10))
    fs.fail("fsync", "PUBLISHING", errno=errno.EIO)
    with pytest.raises(IntentWriteError, match="PUBLISHING"):
        log.append(rec(20))
    assert log.records() == [rec(10)]
    log.append(rec(30))
    log.close()
    assert IntentLog.open(OsFs(), root).records() == [rec(10), rec(30)]


def test_fsynced_intents_survive_a_power_loss(tmp_path: Path) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "wal"
    root.mkdir()
    fs.fsync_dir(tmp_path)
    log = IntentLog.open(fs, root)
    log.append(rec(10))
    log.append(rec(20))
    fs.crash_now()
    fs.apply_crash(power_loss=True)
    assert IntentLog.open(fs, root).records() == [rec(10), rec(20)]


def test_every_state_2_a_torn_tail_is_cut_in_place_without_a_new_block(tmp_path: Path) -> None:
    """A full volume: no file can be created or written. Open's repair truncates the
    file in place (it frees blocks, never needs one), so the start succeeds."""
    good = encode_header() + encode_record(rec(10)) + encode_record(rec(20))
    (tmp_path / IntentLog.NAME).write_bytes(good + encode_record(rec(30))[:-4])
    fs = FaultyFs(tmp_path / ".shadow")
    fs.fail("write", count=None, errno=errno.ENOSPC)
    fs.fail("pwrite", count=None, errno=errno.ENOSPC)
    fs.fail("open", "*.tmp", count=None, errno=errno.ENOSPC)
    log = IntentLog.open(fs, tmp_path)
    try:
        assert log.records() == [rec(10), rec(20)]
        assert log.opened.dropped_bytes == len(encode_record(rec(30))) - 4
    finally:
        log.close()
    assert (tmp_path / IntentLog.NAME).read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if p.name != ".shadow"] == [IntentLog.NAME]


def test_a_power_loss_before_the_repair_is_fsynced_leaves_the_tail_to_cut_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    root.mkdir()
    good = encode_header() + encode_record(rec(10))
    torn = good + encode_record(rec(20))[:-4]
    (root / IntentLog.NAME).write_bytes(torn)
    fs = FaultyFs(tmp_path / ".shadow")
    fs.fsync_dir(root)
    with open(root / IntentLog.NAME, "rb+") as f:
        os.fsync(f.fileno())
    fs.crash_at("fsync", IntentLog.NAME)
    with pytest.raises(SimulatedCrash):
        IntentLog.open(fs, root)
    fs.apply_crash(power_loss=True)
    assert (root / IntentLog.NAME).read_bytes() == torn  # the truncation was undone
    again = IntentLog.open(fs, root)
    try:
        assert again.records() == [rec(10)] and again.opened.dropped_bytes > 0
    finally:
        again.close()
    assert (root / IntentLog.NAME).read_bytes() == good


@pytest.mark.parametrize("step", ["write", "fsync", "rename", "fsync_dir"])
def test_a_crash_inside_a_trim_leaves_the_old_file_or_the_new_one(
    tmp_path: Path, step: str
) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "wal"
    root.mkdir()
    fs.fsync_dir(tmp_path)
    log = IntentLog.open(fs, root)
    for lsn in (10, 20, 30):
        log.append(rec(lsn))
    glob = {"fsync_dir": "wal", "rename": "PUBLISHING"}.get(step, "PUBLISHING.tmp")
    fs.crash_at(step, glob)
    with pytest.raises(SimulatedCrash):
        log.trim(lambda r: r.highest_lsn > 115)
    fs.apply_crash(power_loss=True)
    found = IntentLog.open(fs, root).records()
    assert found in ([rec(10), rec(20), rec(30)], [rec(20), rec(30)])


def test_trim_keeps_what_the_predicate_keeps_and_appends_continue(tmp_path: Path) -> None:
    log = IntentLog.open(OsFs(), tmp_path)
    for lsn in (10, 20, 30):
        log.append(rec(lsn))
    assert log.trim(lambda r: r.highest_lsn >= 120) == 1
    assert log.trim(lambda r: True) == 0
    log.append(rec(40))
    log.close()
    assert IntentLog.open(OsFs(), tmp_path).records() == [rec(20), rec(30), rec(40)]
    assert not (tmp_path / IntentLog.TEMP).exists()


def test_a_trim_temp_left_by_a_crash_is_removed_at_open(tmp_path: Path) -> None:
    IntentLog.open(OsFs(), tmp_path).close()
    (tmp_path / IntentLog.TEMP).write_bytes(b"half a trim")
    IntentLog.open(OsFs(), tmp_path).close()
    assert not (tmp_path / IntentLog.TEMP).exists()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(IntentRecord(ObjectKind.RECORDS, "acme", "k", 1, frames=()), id="no_claim"),
        pytest.param(
            IntentRecord(ObjectKind.RECORDS, "acme", "k", 1, frames=(20, 10)), id="unordered"
        ),
        pytest.param(
            IntentRecord(ObjectKind.AUDIT, "acme", "k", 1, frames=(1,), events=((1, 2, 3),)),
            id="audit_with_frames",
        ),
        pytest.param(IntentRecord(ObjectKind.RECORDS, "", "k", 1, frames=(1,)), id="no_tenant"),
        pytest.param(IntentRecord(ObjectKind.RECORDS, "a", "", 1, frames=(1,)), id="no_key"),
    ],
)
def test_an_intent_that_cannot_be_stated_is_refused_before_anything_is_written(
    tmp_path: Path, bad: IntentRecord
) -> None:
    log = IntentLog.open(OsFs(), tmp_path)
    size = os.path.getsize(tmp_path / IntentLog.NAME)
    with pytest.raises(ValueError):
        log.append(bad)
    log.close()
    assert os.path.getsize(tmp_path / IntentLog.NAME) == size


def test_bounded_1_retracted_intents_leave_memory_at_once_and_the_file_at_compaction(
    tmp_path: Path,
) -> None:
    log = IntentLog.open(OsFs(), tmp_path)
    log.compact_floor = 0  # compact as soon as the retracted bytes outgrow the live ones
    for lsn in (10, 20, 30, 40):
        log.append(rec(lsn))
    one = len(encode_record(rec(10)))
    assert log.retract([rec(10).key]) == 1
    assert log.records() == [rec(20), rec(30), rec(40)]
    assert log.size == HEADER_SIZE + 4 * one, "one retracted record: not compacted yet"
    assert log.retract([rec(20).key, rec(30).key, "records/absent"]) == 2
    assert log.size == HEADER_SIZE + one, "compacted: only the live record is left"
    log.append(rec(20))  # taken back, so an append writes it again
    log.append(rec(20))
    log.close()
    assert IntentLog.open(OsFs(), tmp_path).records() == [rec(40), rec(20)]


def test_bounded_1_memory_holds_no_claims_and_equal_records_are_one(tmp_path: Path) -> None:
    log = IntentLog.open(OsFs(), tmp_path)
    wide = IntentRecord(ObjectKind.RECORDS, "acme", "k/one", 1, frames=tuple(range(1, 5000)))
    for _ in range(3):  # a spooled unit retried: one record
        log.append(wide)
    (entry,) = log.entries()
    assert entry.highest_lsn == 4999 and not hasattr(entry, "frames")
    assert log.records() == [wide]
    log.close()

"""CHECKPOINT: golden layout, monotonic, equal is a no-op, a failed write keeps the old mark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, faulty, payload
from tests.unit.wal.golden import DATA, SEGMENT_UUID, golden_checkpoint
from wal import CheckpointError, CorruptionError, Journal, WalOffset
from wal.checkpoint import NAME, decode_checkpoint


def test_golden_checkpoint_bytes_are_stable() -> None:
    raw = (DATA / "checkpoint_v2.bin").read_bytes()
    assert golden_checkpoint() == raw
    assert decode_checkpoint(raw, Path("CHECKPOINT")) == WalOffset(SEGMENT_UUID, 987_654_321)


@pytest.mark.parametrize(
    ("corrupt", "words"),
    [
        pytest.param(lambda b: b[:31], "31 bytes", id="short"),
        pytest.param(lambda b: b"XXXX" + b[4:], "magic", id="bad_magic"),
        pytest.param(lambda b: b[:4] + b"\x01\x00" + b[6:], "version 1", id="version_1"),
        pytest.param(lambda b: b[:6] + b"\x01\x00" + b[8:], "reserved", id="reserved_nonzero"),
    ],
)
def test_checkpoint_refusals(corrupt: Callable[[bytes], bytes], words: str) -> None:
    with pytest.raises(CorruptionError, match=words):
        decode_checkpoint(corrupt(golden_checkpoint()), Path("CHECKPOINT"))


def test_corrupt_checkpoint_fails_open_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        mark = j.commit("t", payload(1)).offset
        j.checkpoint(mark)
    raw = (root / NAME).read_bytes()
    (root / NAME).write_bytes(b"XXXX" + raw[4:])
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, SMALL)
    assert info.value.path == root / NAME


def test_checkpoint_is_monotonic_and_survives_reopen(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        a = j.commit("t", payload(1)).offset
        b = j.commit("t", payload(2)).offset
        assert j.checkpoint(b) is True
        assert j.checkpoint(b) is False  # equal: no-op
        with pytest.raises(CheckpointError, match="below"):
            j.checkpoint(a)
        assert j.last_checkpoint == b
    with Journal.open(root, SMALL) as j:
        assert j.last_checkpoint == b


def test_mark_beyond_the_durable_end_is_refused(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "wal", SMALL) as j:
        a = j.commit("t", payload(1)).offset
        with pytest.raises(CheckpointError):
            j.checkpoint(WalOffset(a.segment, a.lsn + 1))
        with pytest.raises(CheckpointError):
            j.checkpoint(WalOffset(SEGMENT_UUID, a.lsn))


@pytest.mark.parametrize("step", ["open", "write", "fsync", "rename", "fsync_dir"])
def test_failed_write_leaves_the_previous_mark_in_force(tmp_path: Path, step: str) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    with Journal.open(root, SMALL, fs=fs) as j:
        first = j.commit("t", payload(1)).offset
        j.checkpoint(first)
        second = j.commit("t", payload(2)).offset
        glob = "CHECKPOINT*" if step != "fsync_dir" else None
        fs.fail(step, glob)
        with pytest.raises(CheckpointError, match="stays in force"):
            j.checkpoint(second)
        assert j.last_checkpoint == first
    if step != "fsync_dir":  # the rename had not happened
        with Journal.open(root, SMALL) as j:
            assert j.last_checkpoint == first

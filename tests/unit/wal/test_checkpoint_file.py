"""CHECKPOINT: golden layout, refusals, and the spare. Advancing the mark through the
journal (monotonic, equal is a no-op, a failed write keeps the old mark) is tested in
``test_checkpointing.py``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, payload
from tests.unit.wal.golden import DATA, SEGMENT_UUID, golden_checkpoint
from wal import CorruptionError, Journal, OsFs, WalOffset
from wal.checkpoint_file import (
    NAME,
    SPARE_NAME,
    TMP_NAME,
    decode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)


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


def _ino(path: Path) -> int:
    return os.stat(path).st_ino


def test_nowedge_2_the_old_mark_becomes_the_next_spare(tmp_path: Path) -> None:
    """Issue 18 item 2: a write gives up no block — the old CHECKPOINT's inode is the
    next spare, linked before the rename (see ``wal/checkpoint_file.py``)."""
    fs = OsFs()
    a, b = WalOffset(SEGMENT_UUID, 100), WalOffset(SEGMENT_UUID, 200)
    write_checkpoint(fs, tmp_path, a)
    live = _ino(tmp_path / NAME)
    write_checkpoint(fs, tmp_path, b)
    assert _ino(tmp_path / SPARE_NAME) == live != _ino(tmp_path / NAME)
    assert read_checkpoint(fs, tmp_path) == b
    assert sorted(os.listdir(tmp_path)) == [NAME, SPARE_NAME]


def test_nowedge_2_a_spare_sharing_the_live_marks_inode_is_never_overwritten_in_place(
    tmp_path: Path,
) -> None:
    """A crash between the link and the rename leaves the spare as a second name of the
    live CHECKPOINT: the next write must not overwrite that inode in place (a rename of
    a name onto another name of the same inode does nothing), and open replaces it."""
    fs = OsFs()
    a, b = WalOffset(SEGMENT_UUID, 100), WalOffset(SEGMENT_UUID, 200)
    write_checkpoint(fs, tmp_path, a)
    (tmp_path / SPARE_NAME).unlink()
    os.link(tmp_path / NAME, tmp_path / SPARE_NAME)  # what the crash leaves
    write_checkpoint(fs, tmp_path, b)
    assert read_checkpoint(fs, tmp_path) == b
    assert not (tmp_path / TMP_NAME).exists()
    assert _ino(tmp_path / SPARE_NAME) != _ino(tmp_path / NAME)
    with Journal.open(tmp_path / "wal", SMALL) as j:
        j.checkpoint(j.commit("t", payload(1)).offset)
        root = j.root
    (root / SPARE_NAME).unlink()
    os.link(root / NAME, root / SPARE_NAME)
    with Journal.open(root, SMALL) as j:  # open makes a spare of its own
        assert _ino(root / SPARE_NAME) != _ino(root / NAME)
        j.checkpoint(j.commit("t", payload(2)).offset)

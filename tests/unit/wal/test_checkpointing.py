"""Advancing the checkpoint (``wal/checkpointing.py``): the mark is monotonic and an
equal one is a no-op, it must end a frame of a surviving segment within the durable
end, and a failed write keeps the previous mark in force. The file's bytes are tested in
``test_checkpoint_file.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.walkit import SMALL, faulty, payload
from tests.unit.wal.golden import SEGMENT_UUID
from wal import CheckpointError, Journal, WalOffset


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

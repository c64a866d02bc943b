"""``wal/journal.py``, the facade over the WAL's parts: its lifecycle (open, close, the
context manager) and the positions it reports. What each part does behind it is tested
in that part's file (``test_commit.py``, ``test_rotation.py``, ``test_checkpointing.py``,
``test_frontiers.py``, ``test_reading.py``, ``test_reclamation.py``, ``test_opening.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, payload
from wal import Journal
from wal.errors import JournalClosed


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def is_closed(j: Journal) -> bool:
    """A call, so that mypy does not narrow the property across ``close``."""
    return j.closed


def test_close_refuses_appends_and_releases_every_descriptor(tmp_path: Path) -> None:
    before = open_fds()
    j = Journal.open(tmp_path / "wal", SMALL)
    j.commit("t", payload(1))
    assert not is_closed(j) and open_fds() > before
    j.close()
    assert is_closed(j) and open_fds() == before
    with pytest.raises(JournalClosed, match="not acknowledged"):
        j.commit("t", payload(2))


def test_the_context_manager_closes(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "wal", SMALL) as j:
        pass
    assert j.closed


def test_positions_follow_the_appends_and_survive_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, SMALL) as j:
        assert j.tenants_with_frames() == [] and j.last_checkpoint is None
        a = j.commit("a", payload(1, 100)).offset
        b = j.commit("b", payload(2, 100)).offset
        assert j.end_lsn == b.lsn > a.lsn
        assert j.current_segment == a.segment == b.segment
        assert j.segment_names() == [p.name for p in sorted(root.glob("*.wal"))]
        assert sorted(j.tenants_with_frames()) == ["a", "b"]
        assert j.checkpoint(b)
        end = j.end_lsn
    with Journal.open(root, SMALL) as j:
        assert j.last_checkpoint == b
        assert [f.offset for f in j.replay()] == [a, b]
        assert j.end_lsn >= end
        c = j.commit("a", payload(3, 100)).offset
        assert c.lsn > b.lsn  # never an LSN an earlier process used


def test_a_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Journal.open("wal", SMALL) as j:
        j.commit("t", payload(1))
    monkeypatch.chdir("/")
    with Journal.open(tmp_path / "wal", SMALL) as j:  # found where it was created
        assert len(list(j.replay())) == 1

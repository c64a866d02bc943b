"""Archival (``wal.archive``): a segment is copied to the store and verified before it is
unlinked; any failure keeps it; an archive inside the WAL is refused (issue 8; DESIGN.md
§12; segment-set seed §5.2, §12.12)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from app.cadence.archive import (
    ArchiveFailed,
    ArchiveLocationError,
    Archiver,
    check_archive_location,
)
from app.cli import wal as walcli
from sink.store import LocalStore
from sink.testing import FailingStore, MemoryStore
from tests.support.walkit import SMALL, faulty, payload
from wal import Journal, KnownHorizons, WalOffset
from wal.reclamation import ArchiveError
from wal.segment import HEADER_SIZE
from wal.testing import FaultyFs

NODE = "ourios-0"


class LyingStore(MemoryStore):
    """Keeps what it is given but returns it with one byte flipped: a store (or a path
    to it) that corrupts in transit, which only a read-back catches."""

    def get(self, key: str) -> bytes:
        data = bytearray(super().get(key))
        if data:
            data[len(data) // 2] ^= 0xFF
        return bytes(data)


def _fill(j: Journal, frames: int = 30) -> list[WalOffset]:
    return [j.commit(f"t{i % 2}", payload(i, 9000)).offset for i in range(frames)]


def _archived(store: MemoryStore, name: str) -> bytes | None:
    key = f"wal-archive/{NODE}/{name}"
    return store.snapshot().get(key)


def test_every_unlinked_segment_is_byte_identical_in_the_archive_before_its_unlink(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    store = MemoryStore()
    events: list[tuple[str, dict[str, object]]] = []
    archiver = Archiver(store, NODE, events=lambda n, f: events.append((n, dict(f))))
    checked: list[str] = []

    def at_unlink(op: str, path: Path | None) -> bool:
        # Runs as the unlink is attempted, before it takes effect: the archived copy must
        # already be there, byte for byte.
        assert path is not None
        assert _archived(store, path.name) == path.read_bytes(), path.name
        checked.append(path.name)
        return False  # never inject a fault

    fs.fail("unlink", "*.wal", count=None, predicate=at_unlink)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs, archive=archiver) as j:
        offs = _fill(j)
        names = j.segment_names()
        j.checkpoint(offs[-1])
        progress = j.maintain(KnownHorizons({"t0": offs[-2], "t1": offs[-1]}), 64)
        assert progress.removed_segments == len(names) - 1
    assert sorted(checked) == sorted(names[:-1])
    assert archiver.archived == len(checked) and not archiver.failures
    assert not events  # no failure, so no transition


class Reads:
    """The archiver's ``read`` seam: the segment's bytes, or ``error`` while it is set."""

    def __init__(self) -> None:
        self.error: OSError | None = None

    def __call__(self, path: Path) -> bytes:
        if self.error is not None:
            raise self.error
        return path.read_bytes()


@pytest.mark.parametrize("fault", ["put", "lying", "conflict", "read"])
def test_an_archive_failure_keeps_the_segment_and_is_visible(tmp_path: Path, fault: str) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    inner: MemoryStore = LyingStore() if fault == "lying" else MemoryStore()
    store = FailingStore(inner)
    events: list[tuple[str, dict[str, object]]] = []
    reads = Reads()
    archiver = Archiver(store, NODE, read=reads, events=lambda n, f: events.append((n, dict(f))))
    root = tmp_path / "wal"
    with Journal.open(root, SMALL, fs=fs, archive=archiver) as j:
        offs = _fill(j)
        first = j.segment_names()[0]
        original = (root / first).read_bytes()
        if fault == "put":
            store.fail(ops=["put_if_absent"], always=True)
        elif fault == "conflict":
            inner.put(f"wal-archive/{NODE}/{first}", b"another segment of the same name")
        elif fault == "read":
            reads.error = OSError(5, "injected EIO")
        j.checkpoint(offs[-1])
        horizons = KnownHorizons({"t0": offs[-2], "t1": offs[-1]})
        with pytest.raises(ArchiveError) as info:
            j.maintain(horizons, 64)
        assert first in str(info.value) and "kept, not unlinked" in str(info.value)
        assert (root / first).read_bytes() == original  # kept, untouched
        assert first in j.segment_names()
        expected = {
            "put": "injected",
            "lying": "archive_verify",
            "conflict": "archive_conflict",
            "read": "archive_read",
        }[fault]
        assert set(archiver.failures) == {expected}
        failed = [f for n, f in events if n == "wal.archive.failed"]
        assert failed and {f["error_type"] for f in failed} == {expected}
        assert failed[0]["segment"] == first and failed[0]["key"] == f"wal-archive/{NODE}/{first}"
        kept = set(archiver.failing)
        assert first in kept and kept <= set(j.segment_names())
        if fault == "conflict":
            # never overwritten
            assert inner.get(f"wal-archive/{NODE}/{first}") == b"another segment of the same name"
        if fault == "lying":
            assert f"wal-archive/{NODE}/{first}" not in inner.snapshot()  # the bad copy went
        with pytest.raises(ArchiveError):
            j.maintain(horizons, 64)  # retried every pass, still kept
        # one event per segment's transition, not one per attempt
        assert len([n for n, _ in events if n == "wal.archive.failed"]) == len(kept)
        # the cause goes away: the next pass archives, verifies and only then unlinks
        store.clear()
        if fault == "conflict":
            inner.delete(f"wal-archive/{NODE}/{first}")
        if fault == "lying":
            archiver.store = FailingStore(MemoryStore())
        if fault == "read":
            reads.error = None
        j.maintain(horizons, 64)
        assert first not in j.segment_names()
        held = archiver.store.get(f"wal-archive/{NODE}/{first}")
        assert held == original
        assert [n for n, _ in events].count("wal.archive.recovered") == len(kept)
        assert not archiver.failing


def test_an_archive_left_by_an_interrupted_pass_is_accepted_when_identical(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    archiver = Archiver(store, NODE)
    root = tmp_path / "wal"
    with Journal.open(root, SMALL, archive=archiver) as j:
        offs = _fill(j)
        first = j.segment_names()[0]
        store.put(f"wal-archive/{NODE}/{first}", (root / first).read_bytes())
        j.checkpoint(offs[-1])
        j.maintain(KnownHorizons({"t0": offs[-2], "t1": offs[-1]}), 64)
        assert first not in j.segment_names() and not archiver.failures


def test_an_archive_location_inside_the_wal_is_refused(tmp_path: Path) -> None:
    wal = tmp_path / "data" / "wal"
    wal.mkdir(parents=True)
    # the store's wal-archive/<node> is the WAL directory itself
    inside = LocalStore(tmp_path / "x")
    (tmp_path / "x" / "wal-archive").mkdir(parents=True)
    (tmp_path / "x" / "wal-archive" / NODE).symlink_to(wal)
    with pytest.raises(ArchiveLocationError, match="resolves to the WAL directory"):
        check_archive_location(inside, NODE, wal)
    # a store rooted in the WAL directory puts the archive inside it
    with pytest.raises(ArchiveLocationError):
        check_archive_location(LocalStore(wal), NODE, wal)
    # by inode: a second path to the same directory (a bind mount, here a symlink)
    alias = tmp_path / "alias"
    alias.symlink_to(wal)
    with pytest.raises(ArchiveLocationError):
        check_archive_location(LocalStore(alias), NODE, wal)
    check_archive_location(LocalStore(tmp_path / "objects"), NODE, wal)  # elsewhere: fine
    check_archive_location(MemoryStore(), NODE, wal)  # not a directory at all


def test_the_archiver_refuses_to_archive_a_segment_onto_itself(tmp_path: Path) -> None:
    wal = tmp_path / "wal-archive" / NODE
    with Journal.open(wal, SMALL) as j:
        _fill(j, 12)
        name = j.segment_names()[0]
    archiver = Archiver(LocalStore(tmp_path), NODE)
    from wal import ArchiveRequest

    with pytest.raises(ArchiveFailed, match="archive_self"):
        archiver(ArchiveRequest(wal / name, 0, j.current_segment))
    assert (wal / name).exists()


def test_wal_verify_checks_archived_segments_from_a_file_or_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = tmp_path / "objects"
    store = LocalStore(objects)
    root = tmp_path / "data" / "wal"
    with Journal.open(root, SMALL, archive=Archiver(store, NODE)) as j:
        offs = _fill(j)
        j.checkpoint(offs[-1])
        j.maintain(KnownHorizons({"t0": offs[-2], "t1": offs[-1]}), 64)
    archived = sorted((objects / "wal-archive" / NODE).glob("*.wal"))
    assert len(archived) >= 2
    monkeypatch.setenv("OURIOS_STORE_URL", objects.as_uri())
    monkeypatch.setenv("OURIOS_SERVER_NODE_ID", NODE)
    monkeypatch.setenv("OURIOS_SERVER_DATA_DIR", str(tmp_path / "data"))
    out = io.StringIO()
    assert walcli.verify_archive([], out) == 0, out.getvalue()
    assert f"verified {len(archived)} archived segment(s) of {NODE}: 0 with problems" in (
        out.getvalue()
    )
    out = io.StringIO()
    assert walcli.verify(archived[0], out) == 0 and "clean" in out.getvalue()
    # a flipped byte in an archived copy: named with its key and offset
    bad = archived[1]
    data = bytearray(bad.read_bytes())
    frame = 8 + 2 + 2 + 9000
    data[HEADER_SIZE + frame + 50] ^= 0x01
    bad.write_bytes(bytes(data))
    out = io.StringIO()
    assert walcli.verify_archive([], out) == 1
    text = out.getvalue()
    assert f"PROBLEM: {bad.name} at byte {HEADER_SIZE + frame}" in text
    assert "corruption inside the segment" in text
    out = io.StringIO()
    assert walcli.verify(bad, out) == 1 and f"at byte {HEADER_SIZE + frame}" in out.getvalue()
    out = io.StringIO()
    assert walcli.verify_archive([bad.name], out) == 1


def test_a_node_whose_archive_resolves_to_its_wal_refuses_to_start(tmp_path: Path) -> None:
    from app.base.config import load_settings
    from app.base.events import EventLog
    from app.node.server import build_node

    data = tmp_path / "data"
    settings = load_settings(
        {
            "OURIOS_SERVER_DATA_DIR": str(data),
            "OURIOS_SERVER_NODE_ID": NODE,
            "OURIOS_WAL_ARCHIVE": "true",
            # the store's wal-archive/<node> lands inside data/wal
            "OURIOS_STORE_URL": (data / "wal").as_uri(),
        }
    )
    with pytest.raises(ArchiveLocationError, match="resolves to the WAL directory"):
        build_node(settings, EventLog(io.StringIO()))
    assert not (data / "wal").exists()  # refused before the WAL was opened or created

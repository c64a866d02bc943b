"""The journal's PUBLISHED side (``wal/frontiers.py``, RFC 0055): PUBLISHED written after
CHECKPOINT in the same call and alone by ``publish_marks``, intents, the one id space
shared with RECLAIM, geometry, and the seeding flags. The file's bytes are tested in
``test_published_file.py``.

Every journal test reads the files back from disk (``PublishedFile.read_only``,
``ReclaimFile.read_only``) or restarts the journal, so the assertions are about bytes a
restart would find.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.walkit import faulty, payload
from wal import (
    CorruptionError,
    Journal,
    KnownHorizons,
    OsFs,
    PublishedMarks,
    PublishedWriteError,
    WalConfig,
    WalOffset,
)
from wal.errors import OpenError
from wal.published_file import PublishedFile, PublishedRecord
from wal.reclaim_file import (
    FLAG_PUBLISHED_SEEDED_ARMED,
    FLAG_PUBLISHED_SEEDED_CONFIRMED,
    DictRecord,
    Geometry,
    ReclaimFile,
)

SEEDED = FLAG_PUBLISHED_SEEDED_ARMED | FLAG_PUBLISHED_SEEDED_CONFIRMED
CFG = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024, max_tenants=4)


def _published(root: Path) -> PublishedRecord:
    loaded = PublishedFile.read_only(OsFs(), root)
    assert loaded is not None
    return loaded[1]


def _tenant_ids(record: PublishedRecord) -> dict[str, int]:
    return {r.tenant: i for i, r in record.dictionary.items() if not r.tombstoned}


def _reclaim_ids(root: Path) -> dict[str, int]:
    loaded = ReclaimFile.read_only(OsFs(), root)
    assert loaded is not None
    return loaded[1].tenant_ids()


def _marks(lsn: int, seg: uuid.UUID | None = None) -> PublishedMarks:
    off = WalOffset(seg or uuid.UUID(int=1), lsn)
    return PublishedMarks(off, off)


# -- the journal: written after CHECKPOINT, publish_marks alone ---------------------------


def test_published_is_written_after_checkpoint_in_the_same_call(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    with Journal.open(root, CFG, fs=fs) as j:
        mark = j.commit("acme", payload(1, 200)).offset
        start = len(fs.log)
        assert j.checkpoint(mark, {"acme": PublishedMarks(mark, mark)})
        ops = [(op, p.name if p else None) for op, p in fs.log[start:]]
        renamed = ops.index(("rename", "CHECKPOINT"))
        written = ops.index(("pwrite", "PUBLISHED"))
        assert renamed < written and ("fsync", "PUBLISHED") in ops[written:]
    assert _published(root).entries[_tenant_ids(_published(root))["acme"]].records == mark
    with Journal.open(root, CFG) as again:
        assert again.published_marks() == {"acme": PublishedMarks(mark, mark)}


def test_a_failed_published_write_after_checkpoint_keeps_the_mark_and_the_old_frontiers(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    with Journal.open(root, CFG, fs=fs) as j:
        first = j.commit("acme", payload(1, 200)).offset
        j.checkpoint(first, {"acme": PublishedMarks(first, first)})
        second = j.commit("acme", payload(2, 200)).offset
        fs.fail("fsync", "PUBLISHED")
        with pytest.raises(PublishedWriteError, match="previous frontiers") as info:
            j.checkpoint(second, {"acme": PublishedMarks(second, second)})
        assert info.value.checkpointed and j.last_checkpoint == second
    with Journal.open(root, CFG) as again:
        assert again.last_checkpoint == second
        assert again.published_marks() == {"acme": PublishedMarks(first, first)}


def test_publish_marks_writes_published_alone_and_never_lowers_a_frontier(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    with Journal.open(root, CFG, fs=fs) as j:
        a = j.commit("acme", payload(1, 200)).offset
        b = j.commit("acme", payload(2, 200)).offset
        start = len(fs.log)
        j.publish_marks({"acme": PublishedMarks(b, a)})
        touched = {p.name for _, p in fs.log[start:] if p is not None}
        assert touched == {"PUBLISHED"}  # no CHECKPOINT, no RECLAIM
        j.publish_marks({"acme": PublishedMarks(a, a)})  # lower records: kept at b
        assert j.published_marks() == {"acme": PublishedMarks(b, a)}
        assert j.last_checkpoint is None


def _raw_entry(root: Path, tenant: str) -> tuple[bool, WalOffset | None, WalOffset | None]:
    """(publishing, records offset, audit offset) of ``tenant``'s entry as the bytes say."""
    record = _published(root)
    slot = _tenant_ids(record)[tenant]
    entry = record.entries[slot]
    return entry.publishing, entry.records, entry.audit


def test_nowedge_6_an_intent_is_recorded_with_its_frontier_and_kept_until_marks_reach_its_end(
    tmp_path: Path,
) -> None:
    """RFC 0055 §9.4 intent then confirm, at the journal: the intent keeps the frontier
    in force (both sides) and the span's end; a second intent, and marks short of the
    end, leave it exactly as it is; marks reaching the end on both sides — the confirm,
    or a checkpoint's write — clear it. Every state is read back from disk."""
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a, b, c = (j.commit("acme", payload(i, 200)).offset for i in range(3))
        j.publish_marks({"acme": PublishedMarks(a, a)})
        intent = PublishedMarks(a, a, intent=b)
        j.publish_marks({"acme": intent})
        assert j.published_marks() == {"acme": intent} and intent.publishing
        assert _raw_entry(root, "acme") == (True, a, b)  # the end in the audit offset
        j.publish_marks({"acme": PublishedMarks(b, b, intent=c)})  # one at a time
        j.publish_marks({"acme": PublishedMarks(b, a)})  # short of the end on one side
        assert j.published_marks() == {"acme": intent}
    with Journal.open(root, CFG) as j:
        assert j.published_marks() == {"acme": intent}  # what a restart gates on
        j.publish_marks({"acme": PublishedMarks(b, b)})  # the confirm
        assert j.published_marks() == {"acme": PublishedMarks(b, b)}
        assert _raw_entry(root, "acme") == (False, b, b)
        j.publish_marks({"acme": PublishedMarks(b, b, intent=c)})
        j.checkpoint(c, {"acme": PublishedMarks(c, c)})  # a cut whose flush covered it
    with Journal.open(root, CFG) as j:
        assert j.published_marks() == {"acme": PublishedMarks(c, c)}


def test_nowedge_6_an_intent_that_cannot_be_one_frontier_is_refused_and_nothing_changes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a, b, c = (j.commit("acme", payload(i, 200)).offset for i in range(3))
        j.publish_marks({"acme": PublishedMarks(b, b)})
        with pytest.raises(PublishedWriteError, match="below the frontiers in force"):
            j.publish_marks({"acme": PublishedMarks(a, a, intent=c)})
        with pytest.raises(PublishedWriteError, match="one position for both sides"):
            j.publish_marks({"acme": PublishedMarks(c, b, intent=c)})
        with pytest.raises(PublishedWriteError, match="below its frontier"):
            j.publish_marks({"acme": PublishedMarks(c, c, intent=b)})
        assert j.published_marks() == {"acme": PublishedMarks(b, b)}
    assert _raw_entry(root, "acme") == (False, b, b)


# -- one id space ---------------------------------------------------------------------


def test_rfc0055_5_a_tenant_introduced_by_a_published_only_write_keeps_its_slot_id(
    tmp_path: Path,
) -> None:
    """The table open seeds from is the union of both dictionaries, next_slot_id the
    larger: an id only PUBLISHED recorded is never handed to another tenant."""
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a = j.commit("A", payload(1, 200)).offset
        j.rotate()
        j.checkpoint(a)
        j.maintain(KnownHorizons({"A": a}), 8)  # RECLAIM assigns A id 0
        j.publish_marks({"B": PublishedMarks(a, a)})  # PUBLISHED alone: B id 1
    assert _reclaim_ids(root) == {"A": 0}
    assert _tenant_ids(_published(root)) == {"A": 0, "B": 1}
    with Journal.open(root, CFG) as j:
        c = j.commit("C", payload(2, 200)).offset
        j.rotate()
        j.checkpoint(c)
        j.maintain(KnownHorizons({"A": a, "C": c}), 8)
        assert j.published_marks() == {"B": PublishedMarks(a, a)}
    assert _reclaim_ids(root) == {"A": 0, "B": 1, "C": 2}
    loaded = ReclaimFile.read_only(OsFs(), root)
    assert loaded is not None and loaded[1].next_slot_id == 3


def _root_with(tmp_path: Path, flags: int, *, published: bool) -> Path:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        mark = j.commit("acme", payload(1, 200)).offset
        j.checkpoint(mark, {"acme": PublishedMarks(mark, mark)})
    fs = OsFs()
    loaded = ReclaimFile.load(fs, root)
    assert loaded is not None
    file, record = loaded
    record.flags = (record.flags & ~SEEDED) | flags
    with file:
        file.write(record)
    if not published:
        (root / "PUBLISHED").unlink()
    return root


def _flags(root: Path) -> int:
    loaded = ReclaimFile.read_only(OsFs(), root)
    assert loaded is not None
    return loaded[1].flags & SEEDED


def test_rfc0055_5_armed_without_confirmed_and_no_published_seeds_again(tmp_path: Path) -> None:
    root = _root_with(tmp_path, FLAG_PUBLISHED_SEEDED_ARMED, published=False)
    with Journal.open(root, CFG) as j:
        assert j.published_marks() == {}  # every tenant falls back to the checkpoint
    assert (root / "PUBLISHED").exists() and _flags(root) == SEEDED


def test_rfc0055_5_armed_without_confirmed_beside_published_is_promoted_not_a_fault(
    tmp_path: Path,
) -> None:
    root = _root_with(tmp_path, FLAG_PUBLISHED_SEEDED_ARMED, published=True)
    before = _published(root)
    with Journal.open(root, CFG) as j:
        assert set(j.published_marks()) == {"acme"}  # the written marks, not reseeded
    assert _flags(root) == SEEDED and _published(root).entries == before.entries


def test_confirmed_with_published_missing_fails_closed_naming_both_files(tmp_path: Path) -> None:
    root = _root_with(tmp_path, SEEDED, published=False)
    with pytest.raises(CorruptionError, match="published_seeded_confirmed") as info:
        Journal.open(root, CFG)
    assert info.value.path == root / "PUBLISHED" and "RECLAIM" in str(info.value)


def _rewrite_published(root: Path, edit: Callable[[PublishedRecord], None]) -> None:
    loaded = PublishedFile.load(OsFs(), root)
    assert loaded is not None
    file, record = loaded
    edit(record)
    with_ = file
    with_.write(record)
    with_.close()


def _assigned_root(tmp_path: Path) -> Path:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a = j.commit("A", payload(1, 200)).offset
        j.rotate()
        j.checkpoint(a, {"A": PublishedMarks(a, a)})
        j.maintain(KnownHorizons({"A": a}), 8)
    return root


def test_an_id_the_two_files_name_differently_fails_open_naming_both_files_and_the_id(
    tmp_path: Path,
) -> None:
    root = _assigned_root(tmp_path)

    def rename(record: PublishedRecord) -> None:
        record.dictionary[0] = DictRecord("Z")

    _rewrite_published(root, rename)
    with pytest.raises(CorruptionError, match="slot id 0 names tenant 'Z'") as info:
        Journal.open(root, CFG)
    assert "PUBLISHED" in str(info.value) and "RECLAIM" in str(info.value)


def test_one_tenant_at_two_ids_fails_open(tmp_path: Path) -> None:
    root = _assigned_root(tmp_path)

    def move(record: PublishedRecord) -> None:
        record.dictionary = {1: DictRecord("A")}
        record.entries = {1: record.entries[0]}
        record.next_slot_id = 2

    _rewrite_published(root, move)
    with pytest.raises(CorruptionError, match="'A' is at slot id 1 in PUBLISHED but at id 0"):
        Journal.open(root, CFG)


def test_lowering_max_tenants_below_the_union_of_ids_refuses_to_open(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        mark = j.commit("A", payload(1, 200)).offset
        j.publish_marks({t: PublishedMarks(mark, mark) for t in "ABC"})
    with pytest.raises(OpenError, match="max_tenants=2 is below the 3 tenant ids"):
        Journal.open(root, WalConfig(segment_max_bytes=64 * 1024, max_tenants=2))


# -- geometry -------------------------------------------------------------------------


@pytest.mark.parametrize("wider", ["RECLAIM", "PUBLISHED"])
def test_rfc0055_2_mixed_geometry_restart_comes_up_at_the_larger_geometry_with_ids_unchanged(
    tmp_path: Path, wider: str
) -> None:
    """A crash between the two renames of a rebuild leaves one file wider: the restart
    rebuilds the other (through its ``.new``), ids and marks unchanged."""
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a = j.commit("A", payload(1, 200)).offset
        j.rotate()
        j.checkpoint(a, {"A": PublishedMarks(a, a), "B": PublishedMarks(a, None)})
        j.maintain(KnownHorizons({"A": a}), 8)
        marks = j.published_marks()
    ids = _tenant_ids(_published(root))
    fs = OsFs()
    if wider == "RECLAIM":
        loaded = ReclaimFile.load(fs, root)
        assert loaded is not None
        loaded[0].rebuild(Geometry(9, CFG.max_unlinks_per_pass), loaded[1]).close()
    else:
        ploaded = PublishedFile.load(fs, root)
        assert ploaded is not None
        ploaded[0].rebuild(9, ploaded[1]).close()
    (root / "PUBLISHED.new").write_bytes(b"a torn rebuild" * 1000)
    with Journal.open(root, CFG) as j:
        assert j.published_marks() == marks
    reclaim = ReclaimFile.read_only(fs, root)
    published = PublishedFile.read_only(fs, root)
    assert reclaim is not None and published is not None
    assert reclaim[0].max_tenants == 9 and published[0] == 9
    assert _tenant_ids(published[1]) == ids and reclaim[1].tenant_ids() == ids  # the union
    assert not (root / "PUBLISHED.new").exists()


def test_raising_max_tenants_rebuilds_both_files_ids_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        a = j.commit("A", payload(1, 200)).offset
        j.publish_marks({"A": PublishedMarks(a, a), "B": PublishedMarks(None, a)})
    ids = _tenant_ids(_published(root))
    wider = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024, max_tenants=16)
    with Journal.open(root, wider) as j:
        j.publish_marks({"C": PublishedMarks(a, a)})  # a fourth id fits now
    published = PublishedFile.read_only(OsFs(), root)
    assert published is not None and published[0] == 16
    assert _tenant_ids(published[1]) == {**ids, "C": 2}


def test_a_tenant_without_a_slot_id_is_left_out_of_a_checkpoint_but_refuses_publish_marks(
    tmp_path: Path,
) -> None:
    cfg = WalConfig(segment_max_bytes=64 * 1024, max_tenants=2)
    with Journal.open(tmp_path / "wal", cfg) as j:
        mark = j.commit("A", payload(1, 200)).offset
        assert j.checkpoint(mark, {t: PublishedMarks(mark, mark) for t in "ABC"})
        assert set(j.published_marks()) == {"A", "B"}  # C falls back to the checkpoint
        with pytest.raises(PublishedWriteError, match="no slot id for tenant 'D'"):
            j.publish_marks({"D": PublishedMarks(mark, mark)})

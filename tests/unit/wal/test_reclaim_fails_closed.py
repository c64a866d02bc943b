"""RFC0052.17: RECLAIM is the only start-up witness, and it fails closed.

Each test drives a real WAL root through ``Journal`` (append, rotate, checkpoint,
``maintain``) and the ``FaultyFs`` seam, then reads RECLAIM back from disk with
``ReclaimFile.load`` and restarts the node (open, replay, ``check_restorable``), so
every assertion is about bytes a restart would find.

Legs of the seed scenario that do not apply here (DESIGN.md §4: "The legacy-root rows
of RFC 0052 §3.2/§5 (version-1 CHECKPOINT, pre-RFC roots, migration windows) do not
apply: this implementation has no earlier deployments"):

* a root with no record and no checkpoint "gains an empty record before its first
  pass and pins" — the pre-RFC layout; here such a root holding segments fails closed
  (``test_rfc0052_17_neither_sidecar_*``), and only an empty directory opens fresh;
* a version-1 CHECKPOINT taking the migration path, its first checkpoint rewriting the
  sidecar at version 2 (also at an equal mark), the migration-window restart and the
  migration-window housekeeping pass;
* version-1 segments opening on the legacy branch, and a legacy root rotating before
  its first checkpoint;
* a legacy root whose missing snapshot sits above its last recorded horizon;
* an armed record beside a still-version-1 CHECKPOINT;
* "with segments present it is a legacy root mid migration ... opening on the legacy
  branch": here the same on-disk state (armed, not seen, no CHECKPOINT, segments) is a
  crash between the arming write and the first CHECKPOINT rename, and opens normally
  keeping the arming
  (``test_rfc0052_17_armed_without_checkpoint_beside_segments_keeps_the_arming``);
* the two PUBLISHED legs, which the seed itself moved to RFC 0055 (RFC0055.5);
* "the ingest receiver never passes NoConsumer" is a property of the receiver
  (``app``), which no WAL test can observe; it belongs with RFC0052.13's receiver legs.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest

from tests.support.walkit import faulty, payload
from wal import (
    CheckpointError,
    CorruptionError,
    FloorPinned,
    FrameKind,
    Journal,
    KnownHorizons,
    OsFs,
    ReclaimError,
    WalConfig,
    WalOffset,
)
from wal.errors import OpenError, OpenIoError
from wal.reclaim_file import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    FLAG_PUBLISHED_SEEDED_ARMED,
    FLAG_PUBLISHED_SEEDED_CONFIRMED,
    ConsumerMode,
    Geometry,
    ReclaimEntry,
    ReclaimFile,
    ReclaimRecord,
    TenantCapacityExceeded,
)
from wal.reclamation import ModeMismatch, UnrecoverableTenant
from wal.segment import (
    FLAG_HAS_PREDECESSOR,
    FLAG_PREDECESSOR_SEALED,
    HEADER_SIZE,
    SegmentHeader,
    segment_name,
    uuid7,
)
from wal.segment_ledger import NoConsumerHorizons, SnapshotHorizons
from wal.slots import FILE_HEADER_SIZE
from wal.testing import FaultyFs, SimulatedCrash

KiB = 1024
TENANTS = 8
CAP = 4
KNOWN = ConsumerMode.KNOWN
NO_CONSUMER = ConsumerMode.NO_CONSUMER

#: RFC 0055's published_seeded bits: PUBLISHED was created (this build always has them)
SEEDED = FLAG_PUBLISHED_SEEDED_ARMED | FLAG_PUBLISHED_SEEDED_CONFIRMED
#: the RFC 0052 flags; RFC 0055's published_seeded bits ride beside them
CHECKPOINT_FLAGS = FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN


def config(**changes: int) -> WalConfig:
    values = {"max_tenants": TENANTS, "max_unlinks_per_pass": CAP} | changes
    return WalConfig(
        segment_max_bytes=64 * KiB,
        max_frame_bytes=32 * KiB,
        max_tenants=values["max_tenants"],
        max_unlinks_per_pass=values["max_unlinks_per_pass"],
    )


#: A small RECLAIM (T = 8, U = 4: 4,960 bytes) so every test can afford to rebuild it.
CFG = config()
GEOMETRY = Geometry(TENANTS, CAP)


# -- the rig ----------------------------------------------------------------------------


@dataclass
class Rig:
    root: Path
    fs: FaultyFs
    cfg: WalConfig
    journal: Journal
    frames: list[tuple[str, WalOffset, bytes]] = field(default_factory=list)
    files: dict[uuid.UUID, Path] = field(default_factory=dict)
    n: int = 0

    def segment(self, tenants: Sequence[str], *, close: bool = True) -> dict[str, WalOffset]:
        """One small frame per entry into the current segment, then rotate: the segment
        closes holding exactly these frames. Returns each tenant's last offset in it
        (the pair a RECLAIM entry takes when the segment is reclaimed)."""
        lasts: dict[str, WalOffset] = {}
        name = self.journal.segment_names()[-1]
        for tenant in tenants:
            self.n += 1
            data = payload(self.n, 200)
            offset = self.journal.commit(tenant, data).offset
            self.frames.append((tenant, offset, data))
            lasts[tenant] = offset
            self.files[offset.segment] = self.root / name
        assert len({o.segment for o in lasts.values()}) == 1
        if close:
            assert self.journal.rotate()
        return lasts

    def path_of(self, lasts: dict[str, WalOffset]) -> Path:
        return self.files[next(iter(lasts.values())).segment]

    @property
    def last(self) -> WalOffset:
        return self.frames[-1][1]

    def first(self, tenant: str) -> WalOffset:
        return next(o for t, o, _ in self.frames if t == tenant)

    def latest(self, tenant: str) -> WalOffset:
        return [o for t, o, _ in self.frames if t == tenant][-1]

    def payloads(self, segments: Sequence[WalOffset]) -> list[bytes]:
        """Payloads of every frame in the segments named by these offsets."""
        uuids = {o.segment for o in segments}
        return [d for _, o, d in self.frames if o.segment in uuids]

    def restart(
        self, cfg: WalConfig | None = None, fs: FaultyFs | OsFs | None = None
    ) -> list[bytes]:
        """A clean restart: close, open, replay (which rebuilds the ledger)."""
        self.journal.close()
        return self.start(cfg, fs)

    def start(self, cfg: WalConfig | None = None, fs: FaultyFs | OsFs | None = None) -> list[bytes]:
        """Open (after a crash: the dead journal is abandoned) and replay."""
        self.journal = Journal.open(self.root, cfg or self.cfg, fs=fs or self.fs)
        return [f.payload for f in self.journal.replay()]

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("*.wal"))

    def ops_since(self, start: int, *ops: str) -> list[tuple[str, Path | None]]:
        return [(op, p) for op, p in self.fs.log[start:] if op in ops]


def rig(tmp_path: Path, cfg: WalConfig = CFG) -> Rig:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    return Rig(root, fs, cfg, Journal.open(root, cfg, fs=fs))


def fresh_fs(tmp_path: Path, name: str) -> FaultyFs:
    """A new process's seam (its own shadow directory, no inherited tracking)."""
    return FaultyFs(tmp_path / f".shadow-{name}")


# -- reading RECLAIM back ---------------------------------------------------------------


def on_disk(root: Path) -> ReclaimRecord:
    loaded = ReclaimFile.load(OsFs(), root)
    assert loaded is not None, f"{root / 'RECLAIM'} is missing"
    file, record = loaded
    file.close()
    return record


def geometry_on_disk(root: Path) -> Geometry:
    loaded = ReclaimFile.load(OsFs(), root)
    assert loaded is not None
    file, _ = loaded
    file.close()
    return file.geometry


def entries(record: ReclaimRecord) -> dict[str, ReclaimEntry]:
    """Tenant → entry, through the dictionary (ids are positions, not names)."""
    return {record.dictionary[i].tenant: e for i, e in record.entries.items()}


def planned_segments(record: ReclaimRecord) -> set[uuid.UUID]:
    return {p.segment for p in record.planned}


def known(**horizons: WalOffset) -> KnownHorizons:
    return KnownHorizons(dict(horizons))


def reclaimed_root(tmp_path: Path, mode: str = "known") -> Rig:
    """A root that has checkpointed and reclaimed its two oldest segments (entries for
    A and B), with frames of A and B still surviving in a third."""
    r = rig(tmp_path)
    r.segment(["A", "B", "A"])
    s1 = r.segment(["B", "A", "B"])
    r.segment(["A", "B"])
    horizons: SnapshotHorizons
    if mode == "no_consumer":
        r.journal.checkpoint(s1["B"])  # only the checkpoint governs: keep the third
        horizons = NoConsumerHorizons()
    else:
        r.journal.checkpoint(r.last)
        horizons = known(A=s1["A"], B=s1["B"])
    assert r.journal.maintain(horizons, CAP).removed_segments == 2
    assert {t: e.reclaimed_through for t, e in entries(on_disk(r.root)).items()} == {
        "A": s1["A"],
        "B": s1["B"],
    }
    return r


# -- leg 1: record states × snapshot ----------------------------------------------------


@pytest.mark.parametrize(
    ("reclaim_a", "restorable_a", "halts"),
    [
        pytest.param(True, "undecodable", "no restorable snapshot", id="entry_undecodable_halts"),
        pytest.param(True, "missing", "no restorable snapshot", id="entry_missing_halts"),
        pytest.param(True, "below", "a restorable horizon at", id="entry_horizon_below_halts"),
        pytest.param(True, "at_entry", None, id="entry_horizon_at_entry_proceeds"),
        pytest.param(False, "undecodable", None, id="no_entry_undecodable_pins"),
    ],
)
def test_rfc0052_17_record_states_x_snapshot(
    tmp_path: Path, reclaim_a: bool, restorable_a: str, halts: str | None
) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["B", "C", "B", "C"])  # C's only frames
    s1 = r.segment(["A", "B", "A", "B"])
    r.segment(["A", "B"])  # A and B survive here whatever is reclaimed
    r.journal.checkpoint(r.last)
    if reclaim_a:
        horizons = known(A=s1["A"], B=s1["B"], C=s0["C"])
        want = {"A": s1["A"], "B": s1["B"], "C": s0["C"]}
    else:
        horizons = known(B=s1["B"], C=s0["C"])  # A pinned: s1 stays
        want = {"B": s0["B"], "C": s0["C"]}
    r.journal.maintain(horizons, CAP)
    assert entries(on_disk(r.root)) == {t: ReclaimEntry(KNOWN, o) for t, o in want.items()}

    replayed = r.restart()
    assert r.payloads([r.latest("A")]) == replayed[-2:]
    first_a = r.first("A")
    restorable: dict[str, WalOffset | None] = {"B": r.latest("B"), "C": None}
    if restorable_a == "undecodable":
        restorable["A"] = None
    elif restorable_a == "below":
        restorable["A"] = first_a
    elif restorable_a == "at_entry":
        restorable["A"] = s1["A"]  # inclusive: a horizon equal to the entry restores

    if halts is not None:
        with pytest.raises(UnrecoverableTenant) as info:
            r.journal.check_restorable(restorable)
        message = str(info.value)
        assert info.value.tenant == "A" and "'A'" in message and "'C'" not in message
        assert halts in message
        assert info.value.reclaimed_through == s1["A"] and str(s1["A"]) in message
        if restorable_a == "below":
            assert info.value.horizon == first_a and str(first_a) in message
        r.journal.close()
        return

    # C's entry is satisfied by C's absence: it has no surviving frame to re-mine.
    r.journal.check_restorable(restorable)
    pass_horizons = {t: h for t, h in restorable.items() if h is not None}
    progress = r.journal.maintain(KnownHorizons(pass_horizons), CAP)
    if restorable_a == "undecodable":
        # proceeds with A pinned at its oldest surviving frame, nothing of A unlinked
        assert isinstance(progress.floor, FloorPinned)
        assert progress.floor.pinned == ("A",) and progress.floor.offset == first_a
        assert r.journal.reclaim_state().pinned_tenants == 1
        assert progress.removed_segments == 0
    # every frame of A above what was reclaimed from under it is still there to re-mine
    survivors = r.restart()
    kept_a = [d for t, o, d in r.frames if t == "A" and not (reclaim_a and o <= s1["A"])]
    assert [d for t, _, d in r.frames if t == "A" and d in survivors] == kept_a
    r.journal.close()


# -- leg 2: a damaged record is never read as missing -----------------------------------


def _flip_both_slots(raw: bytearray) -> None:
    slot_len = GEOMETRY.slot_len
    for index in (0, 1):
        raw[FILE_HEADER_SIZE + index * slot_len + 100] ^= 0xFF


def _version(version: int) -> Callable[[bytearray], None]:
    def change(raw: bytearray) -> None:
        struct.pack_into("<H", raw, 4, version)
        struct.pack_into("<I", raw, 24, crc32c.crc32c(bytes(raw[:24])))  # a sound header

    return change


def _flip_header(raw: bytearray) -> None:
    raw[17] ^= 0x01  # max_tenants: the header checksum no longer holds


def _flip_slot0(raw: bytearray) -> None:
    raw[FILE_HEADER_SIZE + 100] ^= 0xFF


def _truncate(raw: bytearray) -> None:
    del raw[:]


@pytest.mark.parametrize("shape", ["reclaimed", "first_start"])
@pytest.mark.parametrize(
    ("corrupt", "words"),
    [
        pytest.param(_flip_both_slots, "both slots fail their checksum", id="both_slots_crc"),
        pytest.param(_version(2), "unknown version 2", id="version_2"),
        pytest.param(_version(0), "unknown version 0", id="version_0"),
        pytest.param(_flip_header, "file header checksum mismatch", id="header_crc"),
        pytest.param(_truncate, "shorter than its 32-byte header", id="empty_file"),
    ],
)
def test_rfc0052_17_corrupt_record_fails_open(
    tmp_path: Path, corrupt: Callable[[bytearray], None], words: str, shape: str
) -> None:
    root = tmp_path / "wal"
    if shape == "reclaimed":
        reclaimed_root(tmp_path).journal.close()
    else:  # a first start that crashed before its first segment: RECLAIM alone
        root.mkdir()
        ReclaimFile.create(OsFs(), root, GEOMETRY, ReclaimRecord()).close()
    path = root / "RECLAIM"
    raw = bytearray(path.read_bytes())
    corrupt(raw)
    path.write_bytes(bytes(raw))
    before = sorted(os.listdir(root))
    with pytest.raises(CorruptionError) as info:
        Journal.open(root, CFG)
    assert info.value.path == path and str(path) in str(info.value)
    assert words in str(info.value) and "missing" not in str(info.value)
    # never recreated over: the damaged bytes are the evidence, and nothing was added
    assert path.read_bytes() == bytes(raw)
    assert sorted(os.listdir(root)) == before


def test_rfc0052_17_corrupt_only_slot_beside_a_never_written_one_fails_open(
    tmp_path: Path,
) -> None:
    """A first start's record has one written slot; its damage leaves no other to read."""
    root = tmp_path / "wal"
    root.mkdir()
    ReclaimFile.create(OsFs(), root, GEOMETRY, ReclaimRecord()).close()
    raw = bytearray((root / "RECLAIM").read_bytes())
    _flip_slot0(raw)
    (root / "RECLAIM").write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match="both slots fail their checksum") as info:
        Journal.open(root, CFG)
    assert info.value.path == root / "RECLAIM"
    assert sorted(os.listdir(root)) == ["RECLAIM"]


# -- leg 3: entries only rise -----------------------------------------------------------


def test_rfc0052_17_entries_only_rise(tmp_path: Path) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["P", "A", "P", "A"])  # P has no snapshot at first: pinned
    s1 = r.segment(["A", "B", "A", "B"])
    s2 = r.segment(["B", "B"])
    s3 = r.segment(["C", "C"])
    r.journal.checkpoint(r.last)

    def entries_after(horizons: KnownHorizons, removed: int) -> dict[str, WalOffset]:
        generation = on_disk(r.root).generation
        assert r.journal.maintain(horizons, CAP).removed_segments == removed
        record = on_disk(r.root)
        assert record.generation > generation
        assert {e.mode for e in record.entries.values()} == {KNOWN}
        return {t: e.reclaimed_through for t, e in entries(record).items()}

    first = entries_after(known(A=s1["A"], B=s1["B"], C=s3["C"]), 2)  # s1 and s3
    assert first == {"A": s1["A"], "B": s1["B"], "C": s3["C"]}
    # a higher horizon for B alone: B's entry rises, every other entry is unchanged
    second = entries_after(known(A=s1["A"], B=s2["B"], C=s3["C"]), 1)
    assert second == first | {"B": s2["B"]}
    # P's snapshot lands: s0 goes, and A's lower offset in it never lowers A's entry
    assert s0["A"].lsn < s1["A"].lsn
    third = entries_after(known(A=s1["A"], B=s2["B"], C=s3["C"], P=s0["P"]), 1)
    assert third == second | {"P": s0["P"]}
    # a pass that reclaims nothing leaves the record's entries as they are
    r.journal.maintain(known(A=s1["A"], B=s2["B"], C=s3["C"], P=s0["P"]), CAP)
    assert {t: e.reclaimed_through for t, e in entries(on_disk(r.root)).items()} == third
    r.restart()
    assert {t: e.reclaimed_through for t, e in entries(on_disk(r.root)).items()} == third
    r.journal.close()


# -- leg 4: crashes inside a pass -------------------------------------------------------

# (op, glob, nth, torn_bytes, power_loss, planned segments gone after the crash)
SLOT_LEN = GEOMETRY.slot_len
PASS_CRASHES = [
    pytest.param("unlink", "*.wal", 1, None, True, 0, id="before_first_unlink-power_loss"),
    pytest.param("unlink", "*.wal", 1, None, False, 0, id="before_first_unlink-sigkill"),
    pytest.param("unlink", "*.wal", 2, None, True, 0, id="before_second_unlink-power_loss"),
    pytest.param("unlink", "*.wal", 2, None, False, 1, id="before_second_unlink-sigkill"),
    pytest.param("fsync_dir", None, 1, None, True, 0, id="before_parent_fsync-power_loss"),
    pytest.param("fsync_dir", None, 1, None, False, 3, id="before_parent_fsync-sigkill"),
    pytest.param("pwrite", "RECLAIM", 1, 0, False, 0, id="slot_write_torn_0"),
    pytest.param("pwrite", "RECLAIM", 1, 1, False, 0, id="slot_write_torn_1"),
    pytest.param("pwrite", "RECLAIM", 1, SLOT_LEN // 2, False, 0, id="slot_write_torn_half"),
    pytest.param("pwrite", "RECLAIM", 1, SLOT_LEN - 8, False, 0, id="slot_write_torn_crc"),
    pytest.param("pwrite", "RECLAIM", 1, SLOT_LEN // 2, True, 0, id="slot_write-power_loss"),
    pytest.param("fsync", "RECLAIM", 1, None, True, 0, id="slot_fsync-power_loss"),
    pytest.param("fsync", "RECLAIM", 1, None, False, 0, id="slot_fsync-sigkill"),
]


@pytest.mark.parametrize(("op", "glob", "nth", "torn", "power_loss", "gone"), PASS_CRASHES)
def test_rfc0052_17_crash_inside_a_pass(
    tmp_path: Path,
    op: str,
    glob: str | None,
    nth: int,
    torn: int | None,
    power_loss: bool,
    gone: int,
) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["A", "B"])
    planned = [r.segment(["A", "B", "A"]), r.segment(["B", "A", "B"]), r.segment(["A"])]
    r.journal.checkpoint(r.last)
    before = known(A=s0["A"], B=s0["B"])
    r.journal.maintain(before, CAP)  # a previous pass: the record holds entries
    previous = on_disk(r.root)
    assert entries(previous) == {
        "A": ReclaimEntry(KNOWN, s0["A"]),
        "B": ReclaimEntry(KNOWN, s0["B"]),
    }
    after = known(A=r.latest("A"), B=r.latest("B"))

    start = len(r.fs.log)
    r.fs.crash_at(op, glob, nth=nth, torn_bytes=torn)
    with pytest.raises(SimulatedCrash):
        r.journal.maintain(after, CAP)
    assert r.fs.log[-1][0] == op  # the crash landed where it was aimed
    if op in ("unlink", "fsync_dir"):  # after the record's write and fsync completed
        record_ops = [o for o, p in r.fs.log[start:] if p == r.root / "RECLAIM"]
        assert record_ops == ["pwrite", "fsync"]
    r.fs.apply_crash(power_loss=power_loss)
    if op in ("pwrite", "fsync"):
        # the slot being written lost, or (SIGKILL) the kernel kept all of it; the live
        # record is the previous one or the complete new one, never a torn one
        crashed = on_disk(r.root)
        assert entries(crashed) == entries(previous)
        assert crashed.generation in (previous.generation, previous.generation + 1)
        if torn is not None or power_loss:
            assert crashed == previous
    present = [s for s in planned if r.path_of(s).exists()]
    assert len(present) == 3 - gone

    r.start(fs=OsFs())  # a restart with a plain filesystem
    record = on_disk(r.root)
    assert record.planned == []  # reconciled, durably, before any pass
    want = {"A": s0["A"], "B": s0["B"]}
    for segment in planned[:gone]:  # an absent planned segment was reclaimed
        want |= segment
    assert {t: e.reclaimed_through for t, e in entries(record).items()} == want
    # every snapshot restorable for the record satisfies it; the segments still
    # present are there to replay
    r.journal.check_restorable(after.horizons)
    if gone == 0:
        r.journal.check_restorable(before.horizons)
    assert r.journal.reclaim_state().segments == len(present) + 1
    # the next pass re-plans what is present and reclaims it
    progress = r.journal.maintain(after, CAP)
    assert progress.removed_segments == len(present)
    final = on_disk(r.root)
    assert final.planned == []
    assert entries(final) == {
        "A": ReclaimEntry(KNOWN, r.latest("A")),
        "B": ReclaimEntry(KNOWN, r.latest("B")),
    }
    assert len(r.names()) == 1
    r.journal.close()


# -- leg 5: a deleted record ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["known", "no_consumer"])
def test_rfc0052_17_deleted_record_fails_open(tmp_path: Path, mode: str) -> None:
    r = reclaimed_root(tmp_path, mode)
    r.journal.close()
    path = r.root / "RECLAIM"
    path.unlink()
    names = r.names()
    with pytest.raises(CorruptionError) as info:
        Journal.open(r.root, CFG)
    message = str(info.value)
    assert info.value.path == path and str(path) in message
    assert "RECLAIM missing" in message and "and a CHECKPOINT at" in message
    assert not path.exists() and r.names() == names  # not recreated empty and pinned


# -- leg 6: an overlong replayed tenant -------------------------------------------------


def overlong_frame(tenant_len: int) -> bytes:
    """A CRC-valid frame whose tenant is longer than 128 bytes (a pre-amendment codec)."""
    body = bytes([FrameKind.TENANT_BATCH, tenant_len]) + b"t" * tenant_len + b"payload"
    return struct.pack("<II", len(body), crc32c.crc32c(body)) + body


@pytest.mark.parametrize(
    ("where", "tenant_len"),
    [
        pytest.param("newest", 129, id="newest_129"),
        pytest.param("newest", 255, id="newest_255"),
        pytest.param("older", 200, id="older_200"),
    ],
)
def test_rfc0052_17_overlong_replayed_tenant_fails(
    tmp_path: Path, where: str, tenant_len: int
) -> None:
    r = rig(tmp_path)
    r.segment(["A", "B"])
    r.journal.commit("A", payload(99, 200))  # the newest segment holds a frame
    r.journal.close()
    target = r.root / r.names()[-1]
    offset = target.stat().st_size
    bad = overlong_frame(tenant_len)
    with open(target, "ab") as f:
        f.write(bad)
    if where == "older":
        # a later segment makes the damaged one older: open walks only the newest
        base = int(target.name[:20]) + offset + len(bad) - HEADER_SIZE
        flags = FLAG_HAS_PREDECESSOR | FLAG_PREDECESSOR_SEALED
        # its seal's high-water: the frames before the appended one were synced
        high_water = int(target.name[:20]) + offset - HEADER_SIZE
        header = SegmentHeader(base, uuid7(2.0e9), flags, int(target.name[:20]), high_water)
        (r.root / segment_name(base)).write_bytes(header.encode())
        with Journal.open(r.root, CFG) as j, pytest.raises(CorruptionError) as info:
            list(j.replay())
    else:
        with pytest.raises(CorruptionError) as info:
            Journal.open(r.root, CFG)
    message = str(info.value)
    assert info.value.path == target and info.value.offset == offset
    assert f"at byte {offset}" in message
    assert f"frame of {len(bad)} bytes" in message and f"tenant of {tenant_len} bytes" in message
    assert target.read_bytes()[offset:] == bad  # neither truncated nor dropped


# -- leg 7: neither sidecar -------------------------------------------------------------


@pytest.mark.parametrize(
    "shape", ["reclaimed_known", "reclaimed_no_consumer", "never_checkpointed"]
)
def test_rfc0052_17_neither_sidecar_beside_segments_fails_open(tmp_path: Path, shape: str) -> None:
    if shape == "never_checkpointed":
        r = rig(tmp_path)
        r.segment(["A", "B"])
        r.journal.commit("A", payload(99, 200))
    else:
        r = reclaimed_root(tmp_path, "no_consumer" if shape.endswith("no_consumer") else "known")
    r.journal.close()
    (r.root / "RECLAIM").unlink()
    (r.root / "CHECKPOINT").unlink(missing_ok=True)
    listing = sorted(os.listdir(r.root))
    with pytest.raises(CorruptionError) as info:
        Journal.open(r.root, CFG)
    message = str(info.value)
    assert info.value.path == r.root / "RECLAIM"
    assert "RECLAIM and CHECKPOINT missing" in message
    assert f"beside {len(r.names())} segment(s)" in message
    assert sorted(os.listdir(r.root)) == listing  # no empty record recreated over them


@pytest.mark.parametrize("mode", ["known", "no_consumer"])
def test_rfc0052_17_neither_sidecar_in_an_empty_directory_opens_fresh(
    tmp_path: Path, mode: str
) -> None:
    root = tmp_path / "wal"
    root.mkdir()
    with Journal.open(root, CFG) as j:
        assert j.open_report is not None and j.open_report.fresh
        assert j.last_checkpoint is None
        mark = j.commit("A", payload(1, 200)).offset
        j.checkpoint(mark)
        horizons: SnapshotHorizons = (
            NoConsumerHorizons() if mode == "no_consumer" else known(A=mark)
        )
        j.maintain(horizons, CAP)
    record = on_disk(root)
    assert record.consumer_mode is (NO_CONSUMER if mode == "no_consumer" else KNOWN)
    assert (record.flags & CHECKPOINT_FLAGS) == FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN


# -- leg 8: geometry --------------------------------------------------------------------


def _three_tenant_root(tmp_path: Path) -> tuple[Rig, ReclaimRecord]:
    r = rig(tmp_path)
    s0 = r.segment(["A", "B", "C"])
    r.segment(["A", "B", "C"])
    r.journal.checkpoint(r.last)
    r.journal.maintain(known(A=s0["A"], B=s0["B"], C=s0["C"]), CAP)
    r.journal.close()
    record = on_disk(r.root)
    assert record.next_slot_id == 3 and len(record.entries) == 3
    return r, record


@pytest.mark.parametrize(
    ("changes", "grown"),
    [
        pytest.param({"max_tenants": 16}, Geometry(16, CAP), id="max_tenants"),
        pytest.param({"max_unlinks_per_pass": 6}, Geometry(TENANTS, 6), id="max_unlinks"),
        pytest.param({"max_tenants": 9, "max_unlinks_per_pass": 5}, Geometry(9, 5), id="both"),
        pytest.param({"max_tenants": 16, "max_unlinks_per_pass": 3}, Geometry(16, CAP), id="mixed"),
    ],
)
def test_rfc0052_17_geometry_grows_through_reclaim_new(
    tmp_path: Path, changes: dict[str, int], grown: Geometry
) -> None:
    r, record = _three_tenant_root(tmp_path)
    start = len(r.fs.log)
    r.start(config(**changes))
    assert geometry_on_disk(r.root) == grown  # a rebuild never shrinks a dimension
    assert (r.root / "RECLAIM").stat().st_size == grown.file_size
    assert on_disk(r.root) == record  # every id, entry, flag and the mode, unchanged
    renames = r.ops_since(start, "rename")
    # RFC 0055: PUBLISHED is rebuilt with it, after it (DESIGN.md §13)
    assert renames == [("rename", r.root / "RECLAIM"), ("rename", r.root / "PUBLISHED")]
    assert ("open", r.root / "RECLAIM.new") in r.fs.log[start:]
    assert not (r.root / "RECLAIM.new").exists()
    # and the grown file is usable at once
    r.journal.checkpoint(r.last)
    r.journal.maintain(known(A=r.last, B=r.last, C=r.last), grown.max_unlinks)
    assert len(entries(on_disk(r.root))) == 3
    r.journal.close()


REBUILD_STEPS = [
    pytest.param("open", "RECLAIM.new", 1, "old", id="open_new"),
    pytest.param("fallocate", "RECLAIM.new", 1, "old", id="fallocate_new"),
    pytest.param("pwrite", "RECLAIM.new", 1, "old", id="write_header"),
    pytest.param("pwrite", "RECLAIM.new", 2, "old", id="write_slot0"),
    pytest.param("pwrite", "RECLAIM.new", 3, "old", id="write_slot1"),
    pytest.param("fsync", "RECLAIM.new", 1, "old", id="fsync_new"),
    pytest.param("rename", "RECLAIM", 1, "old", id="rename"),
    # open's own directory fsync is the first; the rebuild's parent fsync the second
    pytest.param("fsync_dir", None, 2, "renamed", id="parent_fsync"),
    pytest.param("open", "RECLAIM", 2, "new", id="reopen_final"),
]


@pytest.mark.parametrize(
    "power_loss", [pytest.param(True, id="power_loss"), pytest.param(False, id="sigkill")]
)
@pytest.mark.parametrize(("op", "glob", "nth", "outcome"), REBUILD_STEPS)
def test_rfc0052_17_geometry_rebuild_crash_leaves_a_complete_file(
    tmp_path: Path, op: str, glob: str | None, nth: int, outcome: str, power_loss: bool
) -> None:
    r, record = _three_tenant_root(tmp_path)
    bigger = config(max_tenants=12, max_unlinks_per_pass=5)
    grown = Geometry(12, 5)
    r.fs.crash_at(op, glob, nth=nth)
    with pytest.raises(SimulatedCrash):
        r.start(bigger)
    assert r.fs.log[-1] == (op, r.root / glob if glob else r.root)
    if outcome == "renamed":
        assert ("rename", r.root / "RECLAIM") in r.fs.log
    r.fs.apply_crash(power_loss=power_loss)
    renamed = outcome == "new" or (outcome == "renamed" and not power_loss)
    assert geometry_on_disk(r.root) == (grown if renamed else GEOMETRY)
    assert on_disk(r.root) == record
    leftover = (r.root / "RECLAIM.new").exists()

    fs = fresh_fs(tmp_path, "after")
    replayed = r.start(bigger, fs)
    assert not (r.root / "RECLAIM.new").exists()
    if leftover:
        assert ("unlink", r.root / "RECLAIM.new") in fs.log
    assert geometry_on_disk(r.root) == grown and on_disk(r.root) == record
    assert replayed == [d for _, _, d in r.frames][3:]
    r.journal.close()


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="equal"),
        pytest.param({"max_tenants": 3}, id="tenants_at_recorded_ids"),
        pytest.param({"max_tenants": 5, "max_unlinks_per_pass": 3}, id="both_below_stored"),
    ],
)
def test_rfc0052_17_geometry_at_or_below_opens_without_rewriting(
    tmp_path: Path, changes: dict[str, int]
) -> None:
    r, record = _three_tenant_root(tmp_path)
    raw = (r.root / "RECLAIM").read_bytes()
    start = len(r.fs.log)
    r.start(config(**changes))
    touched = [
        (op, p)
        for op, p in r.fs.log[start:]
        if p is not None and p.name.startswith("RECLAIM") and op in ("pwrite", "rename", "open")
    ]
    assert touched == [("open", r.root / "RECLAIM")]  # read, never rewritten
    assert (r.root / "RECLAIM").read_bytes() == raw
    assert geometry_on_disk(r.root) == GEOMETRY and on_disk(r.root) == record
    r.journal.close()


def test_rfc0052_17_geometry_below_recorded_tenants_refuses(tmp_path: Path) -> None:
    r, _ = _three_tenant_root(tmp_path)
    raw = (r.root / "RECLAIM").read_bytes()
    with pytest.raises(OpenError) as info:
        Journal.open(r.root, config(max_tenants=2))
    message = str(info.value)
    assert "max_tenants=2" in message and "3 tenant ids" in message
    assert str(r.root / "RECLAIM") in message
    assert (r.root / "RECLAIM").read_bytes() == raw


def test_rfc0052_17_geometry_below_stored_capacity_still_bounds_new_ids(tmp_path: Path) -> None:
    """A configured max_tenants below the stored capacity opens without rewriting; the
    ids a later pass assigns must stay within the configured value, or the node refuses
    to restart under its own unchanged configuration."""
    r, record = _three_tenant_root(tmp_path)
    lowered = config(max_tenants=4)  # at or above the 3 recorded ids, below the stored 8
    r.start(lowered)
    assert geometry_on_disk(r.root) == GEOMETRY
    d = r.segment(["D"])
    e = r.segment(["E"])
    r.journal.checkpoint(r.last)
    horizons = known(A=r.last, B=r.last, C=r.last, D=d["D"], E=e["E"])
    with pytest.raises(TenantCapacityExceeded) as info:
        r.journal.maintain(horizons, CAP)
    assert info.value.limit == 4 and info.value.tenant == "E"
    assert on_disk(r.root).next_slot_id <= 4
    r.restart(lowered)  # the same configuration still opens
    r.journal.close()


# -- leg 9: a full volume at open -------------------------------------------------------


@pytest.mark.parametrize("shape", ["first_start", "rebuild"])
def test_rfc0052_17_full_volume_at_open(tmp_path: Path, shape: str) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    cfg = CFG
    record: ReclaimRecord | None = None
    if shape == "rebuild":
        r, record = _three_tenant_root(tmp_path / "r")
        root, cfg = r.root, config(max_tenants=16)
    listing = sorted(os.listdir(root)) if root.exists() else []
    fs.fail("fallocate", count=None, errno=errno.ENOSPC)
    with pytest.raises(OpenIoError) as info:
        Journal.open(root, cfg, fs=fs)
    # a first start allocates PUBLISHED first (RFC 0055), a rebuild RECLAIM first
    first = root / ("PUBLISHED" if shape == "first_start" else "RECLAIM")
    assert info.value.path == first and str(first) in str(info.value)
    assert info.value.cause.errno == errno.ENOSPC
    # nothing left behind that the next open would trip on: no temp, no segment
    assert sorted(os.listdir(root)) == listing
    if record is not None:
        assert geometry_on_disk(root) == GEOMETRY and on_disk(root) == record
    fs.clear_faults()
    with Journal.open(root, cfg, fs=fs) as j:
        assert j.open_report is not None and j.open_report.fresh is (shape == "first_start")
        j.commit("A", payload(1, 200))
    assert geometry_on_disk(root) == Geometry(cfg.max_tenants, cfg.max_unlinks_per_pass)
    if record is not None:
        assert on_disk(root) == record


# -- leg 10: passes never allocate ------------------------------------------------------


def test_rfc0052_17_passes_never_allocate(tmp_path: Path) -> None:
    r = rig(tmp_path)
    size = (r.root / "RECLAIM").stat().st_size
    assert size == GEOMETRY.file_size
    start = len(r.fs.log)
    # the volume fills after open: a pass must still commit
    r.fs.fail("fallocate", count=None, errno=errno.ENOSPC)
    writes = 0
    for i in range(12):
        tenants = [f"t{(i + k) % 7}" for k in range(1 + i % 3)]  # the set churns
        r.segment(tenants + tenants)
        r.journal.checkpoint(r.last)
        mark = len(r.fs.log)
        horizons = KnownHorizons({t: r.latest(t) for t, _, _ in r.frames})
        progress = r.journal.maintain(horizons, CAP)
        assert progress.removed_segments == 1
        writes += len(
            [1 for op, p in r.fs.log[mark:] if op == "pwrite" and p == r.root / "RECLAIM"]
        )
        assert (r.root / "RECLAIM").stat().st_size == size
    assert writes >= 12
    ops = r.fs.log[start:]
    assert [op for op, _ in ops if op == "fallocate"] == []
    assert [p for _, p in ops if p is not None and p.name == "RECLAIM.new"] == []
    assert len(entries(on_disk(r.root))) == 7
    assert geometry_on_disk(r.root) == GEOMETRY
    r.journal.close()


# -- leg 11: a node's first start -------------------------------------------------------


# where a first start can die: each step of PUBLISHED's creation (RFC 0055: created
# first, so RECLAIM can record it as seeded), then the record's, then HIGHWATER's, then
# the first segment's creation (open's own directory fsync is the first on the root)
FIRST_START_CRASHES = [
    pytest.param(("open", "PUBLISHED.new", 1), id="published_open_temp"),
    pytest.param(("fsync", "PUBLISHED.new", 1), id="published_fsync"),
    pytest.param(("rename", "PUBLISHED", 1), id="published_rename"),
    pytest.param(("fsync_dir", "wal", 2), id="published_parent_fsync"),
    pytest.param(("open", "RECLAIM.new", 1), id="record_open_temp"),
    pytest.param(("fallocate", "RECLAIM.new", 1), id="record_fallocate"),
    pytest.param(("pwrite", "RECLAIM.new", 2), id="record_write_slot0"),
    pytest.param(("fsync", "RECLAIM.new", 1), id="record_fsync"),
    pytest.param(("rename", "RECLAIM", 1), id="record_rename"),
    pytest.param(("fsync_dir", "wal", 3), id="record_parent_fsync"),
    pytest.param(("open", "HIGHWATER.new", 1), id="high_water_open_temp"),
    pytest.param(("fsync", "HIGHWATER.new", 1), id="high_water_fsync"),
    pytest.param(("rename", "HIGHWATER", 1), id="high_water_rename"),
    pytest.param(("fsync_dir", "wal", 4), id="high_water_parent_fsync"),
    pytest.param(("open", "*.wal.partial", 1), id="first_segment_create"),
    pytest.param(None, id="no_crash"),
]


@pytest.mark.parametrize(
    "power_loss", [pytest.param(True, id="power_loss"), pytest.param(False, id="sigkill")]
)
@pytest.mark.parametrize("crash", FIRST_START_CRASHES)
def test_rfc0052_17_first_start(
    tmp_path: Path, crash: tuple[str, str, int] | None, power_loss: bool
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    if crash is not None:
        op, glob, nth = crash
        fs.crash_at(op, glob, nth=nth)
        with pytest.raises(SimulatedCrash):
            Journal.open(root, CFG, fs=fs)
        assert fs.log[-1][0] == op
    else:
        j = Journal.open(root, CFG, fs=fs)
        if not power_loss:  # a clean restart; with power_loss the node dies right here
            j.close()
    reached_segment = crash is None or crash[1] == "*.wal.partial"
    if reached_segment:
        # the record was durable (file and parent fsynced) before the first segment
        log = fs.log
        installed = log.index(("rename", root / "RECLAIM"))
        parent_fsync = log.index(("fsync_dir", root), installed)
        created = next(
            i for i, (op, p) in enumerate(log) if op == "open" and p and p.suffix == ".partial"
        )
        assert installed < parent_fsync < created
    fs.apply_crash(power_loss=power_loss)
    left = sorted(os.listdir(root))
    assert set(left) <= {
        "CHECKPOINT.spare",
        "HIGHWATER",
        "HIGHWATER.new",
        "PUBLISHED",
        "PUBLISHED.new",
        "RECLAIM",
        "RECLAIM.new",
        segment_name(0),
    }
    if reached_segment:
        assert "RECLAIM" in left and on_disk(root) == ReclaimRecord(generation=1, flags=SEEDED)
        assert "PUBLISHED" in left

    with Journal.open(root, CFG) as again:  # never the segments-and-no-record row
        assert again.open_report is not None
        assert again.open_report.fresh is (segment_name(0) not in left)
        assert [f.payload for f in again.replay()] == []
        again.commit("A", payload(1, 200))
    # no temp left; the checkpoint spare is allocated at open (wal/checkpoint_file.py)
    assert sorted(os.listdir(root)) == sorted(
        ["CHECKPOINT.spare", "HIGHWATER", "PUBLISHED", "RECLAIM", segment_name(0)]
    )
    with Journal.open(root, CFG) as third:
        assert [f.payload for f in third.replay()] == [payload(1, 200)]


# -- leg 12: checkpoint_seen and no CHECKPOINT ------------------------------------------


@pytest.mark.parametrize("shape", ["no_entries", "with_entries", "segments_removed_too"])
def test_rfc0052_17_seen_without_checkpoint_fails_open(tmp_path: Path, shape: str) -> None:
    if shape == "no_entries":
        r = rig(tmp_path)
        r.segment(["A"])
        r.journal.checkpoint(r.last)
    else:
        r = reclaimed_root(tmp_path)
    r.journal.close()
    assert on_disk(r.root).flags & FLAG_CHECKPOINT_SEEN
    (r.root / "CHECKPOINT").unlink()
    if shape == "segments_removed_too":
        for name in r.names():
            (r.root / name).unlink()
    raw = (r.root / "RECLAIM").read_bytes()
    with pytest.raises(CorruptionError) as info:
        Journal.open(r.root, CFG)
    message = str(info.value)
    assert info.value.path == r.root / "CHECKPOINT" and str(r.root / "CHECKPOINT") in message
    assert "RECLAIM" in message and "checkpoint_seen" in message
    assert (r.root / "RECLAIM").read_bytes() == raw
    assert not (r.root / "CHECKPOINT").exists()


# -- leg 13: armed, not seen, no CHECKPOINT ---------------------------------------------


def test_rfc0052_17_armed_without_checkpoint_and_no_segments_opens_fresh(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    root.mkdir()
    armed = ReclaimRecord(flags=FLAG_CHECKPOINT_ARMED, consumer_mode=KNOWN)
    ReclaimFile.create(OsFs(), root, GEOMETRY, armed).close()
    with Journal.open(root, CFG) as j:
        assert j.open_report is not None and j.open_report.fresh
        record = on_disk(root)
        assert record == ReclaimRecord(generation=2, flags=SEEDED)  # empty, durable
        mark = j.commit("A", payload(1, 200)).offset
        j.checkpoint(mark)  # re-armed by the next checkpoint
        assert (
            on_disk(root).flags & CHECKPOINT_FLAGS
        ) == FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN
    with Journal.open(root, CFG) as again:
        assert again.last_checkpoint == mark


def test_rfc0052_17_armed_without_checkpoint_beside_segments_keeps_the_arming(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    r.segment(["A", "B"])
    r.journal.maintain(known(A=r.latest("A"), B=r.latest("B")), CAP)  # records the mode
    assert on_disk(r.root).consumer_mode is KNOWN
    r.fs.crash_at("open", "CHECKPOINT.tmp")  # after the arming write, before the rename
    with pytest.raises(SimulatedCrash):
        r.journal.checkpoint(r.last)
    r.fs.apply_crash(power_loss=True)
    crashed = on_disk(r.root)
    assert (
        crashed.flags & CHECKPOINT_FLAGS
    ) == FLAG_CHECKPOINT_ARMED and crashed.consumer_mode is KNOWN
    assert not (r.root / "CHECKPOINT").exists()

    replayed = r.start(fs=OsFs())
    report = r.journal.open_report
    assert report is not None and not report.fresh and report.checkpoint is None
    assert replayed == [d for _, _, d in r.frames]
    assert on_disk(r.root) == crashed  # kept as it was: arming and mode
    r.journal.checkpoint(r.last)  # the retry succeeds against the arming on disk
    assert (
        on_disk(r.root).flags & CHECKPOINT_FLAGS
    ) == FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN
    r.restart()
    assert r.journal.last_checkpoint == r.last
    r.journal.close()


# -- leg 14: armed beside a present CHECKPOINT ------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param("fail_pwrite", id="seen_write_fails"),
        pytest.param("fail_fsync", id="seen_fsync_fails"),
        pytest.param("crash_pwrite", id="crash_at_seen_write"),
    ],
)
def test_rfc0052_17_armed_beside_checkpoint_is_promoted_at_open(tmp_path: Path, fault: str) -> None:
    r = rig(tmp_path)
    r.segment(["A", "B"])
    # the first RECLAIM write after open is the arming, the second the seen write
    if fault == "fail_pwrite":
        r.fs.fail("pwrite", "RECLAIM", nth=2)
    elif fault == "fail_fsync":
        r.fs.fail("fsync", "RECLAIM", nth=2)
    else:
        r.fs.crash_at("pwrite", "RECLAIM", nth=2)
    if fault == "crash_pwrite":
        with pytest.raises(SimulatedCrash):
            r.journal.checkpoint(r.last)
        r.fs.apply_crash(power_loss=True)
    else:
        assert r.journal.checkpoint(r.last) is True  # the mark stands; seen stays owed
        r.journal.close()
    assert (on_disk(r.root).flags & CHECKPOINT_FLAGS) == FLAG_CHECKPOINT_ARMED
    assert (r.root / "CHECKPOINT").exists()

    fs = fresh_fs(tmp_path, "restart")
    r.start(fs=fs)
    assert r.journal.last_checkpoint == r.last
    writes = [(op, p) for op, p in fs.log if p == r.root / "RECLAIM" and op in ("pwrite", "fsync")]
    assert writes == [("pwrite", r.root / "RECLAIM"), ("fsync", r.root / "RECLAIM")]
    promoted = on_disk(r.root)
    assert (promoted.flags & CHECKPOINT_FLAGS) == FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN
    fs.apply_crash(power_loss=True)  # durable, not merely in memory
    assert on_disk(r.root) == promoted
    fs2 = fresh_fs(tmp_path, "again")
    r.start(fs=fs2)
    assert [op for op, p in fs2.log if p == r.root / "RECLAIM" and op == "pwrite"] == []
    r.journal.close()


def test_rfc0052_17_armed_beside_checkpoint_is_seen_by_the_next_pass(tmp_path: Path) -> None:
    """Without a restart, the owed seen write rides the next record write."""
    r = rig(tmp_path)
    s0 = r.segment(["A", "B"])
    r.fs.fail("pwrite", "RECLAIM", nth=2)  # the seen write
    assert r.journal.checkpoint(r.last) is True
    assert (on_disk(r.root).flags & CHECKPOINT_FLAGS) == FLAG_CHECKPOINT_ARMED
    r.journal.maintain(known(A=s0["A"], B=s0["B"]), CAP)
    assert (
        on_disk(r.root).flags & CHECKPOINT_FLAGS
    ) == FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN
    r.restart(fs=fresh_fs(tmp_path, "restart"))
    assert r.journal.last_checkpoint == r.last
    r.journal.close()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param("crash_after_rename", id="crash_at_the_next_record_write"),
        pytest.param("record_writes_keep_failing", id="record_writes_keep_failing"),
    ],
)
def test_rfc0052_17_failed_arming_is_rewritten_before_the_checkpoint(
    tmp_path: Path, fault: str
) -> None:
    """The arming is what makes a CHECKPOINT legal: a failed arming write must be
    retried before the next attempt renames a CHECKPOINT into place, or a crash (or a
    failed seen write) leaves a CHECKPOINT beside a record that was never armed — the
    pair open refuses."""
    r = rig(tmp_path)
    r.segment(["A", "B"])
    mark = r.last
    if fault == "crash_after_rename":
        r.fs.fail("pwrite", "RECLAIM")  # the arming write of the first attempt
        with pytest.raises(CheckpointError, match="arming RECLAIM"):
            r.journal.checkpoint(mark)
        assert not (r.root / "CHECKPOINT").exists()
        r.fs.crash_at("pwrite", "RECLAIM")  # the second attempt's first record write
        with pytest.raises(SimulatedCrash):
            r.journal.checkpoint(mark)
        r.fs.apply_crash(power_loss=True)
    else:
        r.fs.fail("pwrite", "RECLAIM", count=None)  # RECLAIM cannot be written for now
        for _ in range(2):
            try:
                r.journal.checkpoint(mark)
            except CheckpointError:
                pass
        r.journal.close()
        r.fs.clear_faults()
    if (r.root / "CHECKPOINT").exists():
        assert on_disk(r.root).flags & FLAG_CHECKPOINT_ARMED, (
            "a CHECKPOINT was renamed into place beside a RECLAIM that was never armed"
        )
    r.start(fs=fresh_fs(tmp_path, "restart"))  # opens: never the unarmed pair
    assert r.journal.last_checkpoint in (None, mark)
    r.journal.close()


# -- leg 15: NoConsumer -----------------------------------------------------------------


def test_rfc0052_17_no_consumer_restarts_without_a_snapshot(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.segment(["A", "B", "A"])
    s1 = r.segment(["B", "A", "B"])
    r.journal.commit("A", payload(500, 200))  # the current segment is never reclaimed
    r.journal.checkpoint(s1["B"])
    progress = r.journal.maintain(NoConsumerHorizons(), CAP)
    assert progress.removed_segments == 2
    record = on_disk(r.root)
    assert record.consumer_mode is NO_CONSUMER
    assert entries(record) == {
        "A": ReclaimEntry(NO_CONSUMER, s1["A"]),
        "B": ReclaimEntry(NO_CONSUMER, s1["B"]),
    }
    checkpoint = r.journal.last_checkpoint
    assert checkpoint is not None
    assert all(e.reclaimed_through <= checkpoint for e in record.entries.values())

    assert r.restart() == [payload(500, 200)]
    r.journal.check_restorable({})  # no snapshot at all
    r.journal.check_restorable({"A": None, "B": None})
    assert r.journal.maintain(NoConsumerHorizons(), CAP).removed_segments == 0
    r.journal.close()


# -- leg 16: the consumer mode ----------------------------------------------------------


def _horizons(r: Rig, mode: str) -> SnapshotHorizons:
    if mode == "no_consumer":
        return NoConsumerHorizons()
    return KnownHorizons({t: r.latest(t) for t, _, _ in r.frames})


@pytest.mark.parametrize(
    ("recorded", "history"),
    [
        pytest.param("known", "reclaimed", id="known_recorded-reclaimed"),
        pytest.param("no_consumer", "reclaimed", id="no_consumer_recorded-reclaimed"),
        pytest.param("known", "never_reclaimed", id="known_recorded-checkpointed_never_reclaimed"),
        pytest.param(
            "no_consumer", "never_reclaimed", id="no_consumer_recorded-checkpointed_never_reclaimed"
        ),
    ],
)
def test_rfc0052_17_mode_mismatch_is_refused_before_planning(
    tmp_path: Path, recorded: str, history: str
) -> None:
    r = rig(tmp_path)
    # the first pass records the mode: it reclaims a segment, or (frames only in the
    # never-eligible current segment) reclaims nothing, leaving no entry to infer from
    r.segment(["A", "B"], close=history == "reclaimed")
    r.journal.checkpoint(r.last)
    removed = r.journal.maintain(_horizons(r, recorded), CAP).removed_segments
    assert removed == (1 if history == "reclaimed" else 0)
    assert len(entries(on_disk(r.root))) == (2 if history == "reclaimed" else 0)
    mode = KNOWN if recorded == "known" else NO_CONSUMER
    assert on_disk(r.root).consumer_mode is mode
    # a closed segment that a pass in either mode would reclaim
    r.segment(["A", "B"])
    r.journal.checkpoint(r.last)
    r.restart()  # the mode is durable, not only in memory
    names = r.names()
    disk = on_disk(r.root)
    start = len(r.fs.log)

    wrong = "known" if recorded == "no_consumer" else "no_consumer"
    with pytest.raises(ModeMismatch) as info:
        r.journal.maintain(_horizons(r, wrong), CAP)
    message = str(info.value)
    assert isinstance(info.value, ReclaimError)
    assert f"pass with mode {wrong.upper()}" in message
    assert f"RECLAIM records mode {recorded.upper()}" in message
    assert info.value.progress is not None and info.value.progress.skipped == "mode_mismatch"
    assert r.ops_since(start, "unlink", "pwrite", "fsync_dir") == []
    assert r.names() == names and on_disk(r.root) == disk
    assert r.journal.reclaim_state().unlink_remaining == 0  # nothing popped
    # the refusal stranded nothing: a pass in the recorded mode reclaims normally
    assert r.journal.maintain(_horizons(r, recorded), CAP).removed_segments >= 1
    assert {e.mode for e in on_disk(r.root).entries.values()} == {mode}
    r.journal.close()


def test_rfc0052_17_mode_adopted_durably_before_the_first_unlink(tmp_path: Path) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["A", "B"])
    r.segment(["A"])
    r.journal.checkpoint(r.last)
    assert on_disk(r.root).consumer_mode is ConsumerMode.UNRECORDED
    hold = r.fs.hold_at("unlink", "*.wal")
    errors: list[BaseException] = []

    def housekeep() -> None:
        try:
            r.journal.maintain(known(A=r.latest("A"), B=s0["B"]), CAP)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    worker = threading.Thread(target=housekeep, name="housekeeping")
    worker.start()
    try:
        assert hold.reached.wait(10), "the pass never reached its first unlink"
        held = on_disk(r.root)
        assert held.consumer_mode is KNOWN
        assert planned_segments(held) == {s0["A"].segment, r.latest("A").segment}
        assert held.entries == {}
        assert len(r.names()) == 3  # nothing unlinked yet
        # the held unlink is the pass's first; the record's write and fsync precede it
        record_ops = [op for op, p in r.fs.log if p == r.root / "RECLAIM"]
        assert record_ops[-2:] == ["pwrite", "fsync"]
        assert [op for op, _ in r.fs.log].count("unlink") == 0
    finally:
        hold.release()
        worker.join()
    assert not errors
    assert {e.mode for e in on_disk(r.root).entries.values()} == {KNOWN}
    r.journal.close()


# -- leg 17: failed and uncertain steps of a pass ---------------------------------------


@pytest.mark.parametrize("op", ["pwrite", "fsync"])
def test_rfc0052_17_failed_record_write_unlinks_nothing(tmp_path: Path, op: str) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["A", "B"])
    s1 = r.segment(["A", "B"])
    r.journal.checkpoint(r.last)
    horizons = known(A=s1["A"], B=s1["B"])
    names = r.names()
    disk = on_disk(r.root)
    before = r.journal.reclaim_state()
    start = len(r.fs.log)
    r.fs.fail(op, "RECLAIM")
    with pytest.raises(ReclaimError, match="nothing was unlinked"):
        r.journal.maintain(horizons, CAP)
    assert r.ops_since(start, "unlink") == []
    assert r.names() == names and on_disk(r.root) == disk
    state = r.journal.reclaim_state()
    assert (state.segments, state.disk_bytes, state.unreclaimed_bytes) == (
        before.segments,
        before.disk_bytes,
        before.unreclaimed_bytes,
    )
    assert state.unlink_remaining == 2  # popped, then put back: eligible again
    # a later pass whose write succeeds reclaims them; the ledger never lost them
    progress = r.journal.maintain(horizons, CAP)
    assert progress.removed_segments == 2 and progress.unlink_remaining == 0
    record = on_disk(r.root)
    assert record.planned == [] and record.consumer_mode is KNOWN
    assert entries(record) == {"A": ReclaimEntry(KNOWN, s1["A"]), "B": ReclaimEntry(KNOWN, s1["B"])}
    assert not r.path_of(s0).exists() and not r.path_of(s1).exists()
    r.journal.close()


@pytest.mark.parametrize("then", ["retry_in_process", "restart_then_retry"])
def test_rfc0052_17_failed_unlink_is_retried(tmp_path: Path, then: str) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["X", "A"])  # X's only frame: its unlink will fail
    s1 = r.segment(["A", "B"])
    r.journal.checkpoint(r.last)
    horizons = known(X=s0["X"], A=s1["A"], B=s1["B"])
    stuck = r.root / r.names()[0]
    r.fs.fail("unlink", "*.wal")  # the first planned segment's unlink
    with pytest.raises(ReclaimError, match=r"1 unlink\(s\) failed") as info:
        r.journal.maintain(horizons, CAP)
    assert str(stuck) in str(info.value)
    assert stuck.exists() and len(r.names()) == 2
    state = r.journal.reclaim_state()
    assert state.segments == 2 and state.unlink_remaining == 1  # still reclaiming
    record = on_disk(r.root)
    # reclaimed_through stays behind the segment still on disk: X has no entry
    assert entries(record) == {"A": ReclaimEntry(KNOWN, s1["A"]), "B": ReclaimEntry(KNOWN, s1["B"])}
    assert planned_segments(record) == {s0["X"].segment}

    if then == "restart_then_retry":
        r.restart(fs=OsFs())
        assert on_disk(r.root).planned == []  # present: retained, re-planned later
        # X's snapshot undecodable: X is pinned, not halted — its frame is still here
        r.journal.check_restorable({"X": None, "A": s1["A"], "B": s1["B"]})
    progress = r.journal.maintain(horizons, CAP)
    assert progress.removed_segments == 1 and not stuck.exists()
    record = on_disk(r.root)
    assert record.planned == []
    assert entries(record) == {
        "X": ReclaimEntry(KNOWN, s0["X"]),
        "A": ReclaimEntry(KNOWN, s1["A"]),  # s0's lower A offset never lowers it
        "B": ReclaimEntry(KNOWN, s1["B"]),
    }
    r.journal.close()


@pytest.mark.parametrize("then", ["next_pass", "power_loss_restart", "sigkill_restart"])
def test_rfc0052_17_failed_parent_fsync_makes_removals_uncertain(tmp_path: Path, then: str) -> None:
    r = rig(tmp_path)
    s0 = r.segment(["A", "B"])
    s1 = r.segment(["A", "B"])
    r.journal.checkpoint(r.last)
    horizons = known(A=s1["A"], B=s1["B"])
    paths = [r.root / n for n in r.names()[:2]]
    before = r.journal.reclaim_state()
    start = len(r.fs.log)
    r.fs.fail("fsync_dir")  # the pass's only directory fsync follows its unlinks
    with pytest.raises(ReclaimError, match="uncertain"):
        r.journal.maintain(horizons, CAP)
    ops = r.ops_since(start, "unlink", "fsync_dir")
    assert ops == [("unlink", paths[0]), ("unlink", paths[1]), ("fsync_dir", r.root)]
    assert not any(p.exists() for p in paths)
    state = r.journal.reclaim_state()
    # the removals are uncertain: their bytes stay counted
    assert (state.segments, state.unreclaimed_bytes, state.disk_bytes) == (
        before.segments,
        before.unreclaimed_bytes,
        before.disk_bytes,
    )
    assert state.unlink_remaining == 2
    record = on_disk(r.root)
    assert entries(record) == {}  # reclaimed_through did not rise
    assert planned_segments(record) == {s0["A"].segment, s1["A"].segment}
    assert all(p.uncertain for p in record.planned)

    if then == "next_pass":
        mark = len(r.fs.log)
        progress = r.journal.maintain(horizons, CAP)
        # re-verified: the unlinks find the files gone, and that completes the removal
        assert r.ops_since(mark, "unlink", "fsync_dir") == ops
        assert progress.removed_segments == 2
    else:
        r.fs.apply_crash(power_loss=then == "power_loss_restart")
        came_back = then == "power_loss_restart"  # the removals were never durable
        assert all(p.exists() for p in paths) is came_back
        r.start(fs=OsFs())
        if came_back:
            assert entries(on_disk(r.root)) == {}
            r.journal.check_restorable({"A": None, "B": None})  # nothing was reclaimed
            assert r.journal.maintain(horizons, CAP).removed_segments == 2
        else:  # absent at open: reclaimed_through raised as the commit would have
            assert on_disk(r.root).planned == []
            r.journal.check_restorable({"A": s1["A"], "B": s1["B"]})
    final = on_disk(r.root)
    assert final.planned == []
    assert entries(final) == {"A": ReclaimEntry(KNOWN, s1["A"]), "B": ReclaimEntry(KNOWN, s1["B"])}
    assert r.journal.reclaim_state().segments == 1
    r.journal.close()

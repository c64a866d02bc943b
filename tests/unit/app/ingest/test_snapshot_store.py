"""``app.ingest.snapshot_store``: the OSNP v2 codec, the SnapshotStore (start-up listing
trusted only after the directory fsyncs, stale temps, monotonic installs) and the SnapshotLedger as
the only source of horizons — and RFC0052.13's start-up legs on the in-process node rig
(a tenant without a valid snapshot pins, never reads as NoConsumer).
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from app.cadence.barrier import CutOutcome
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import TenantMiner
from app.ingest.snapshot_store import (
    HEADER_SIZE,
    MAGIC,
    VERSION,
    SnapshotError,
    SnapshotLedger,
    SnapshotState,
    SnapshotStore,
    SnapshotStoreError,
    decode_snapshot,
    encode_snapshot,
)
from app.node.recovery import RecoveryReport
from tests.support.noderig import NodeRig, rids
from wal import FloorMin, FloorNone, FloorPinned, ReclamationProgress, WalConfig, WalOffset
from wal.reclamation import UnrecoverableTenant
from wal.testing import FaultyFs

RECORDS = 3
SEG = uuid.UUID("01900000-0000-7000-8000-000000000001")
SEG_OFF = WalOffset(SEG, 10)


# -- the codec ------------------------------------------------------------------------------


def state(
    tenant: str = "tenant-1", lsn: int = 4096, miner: bytes = b"miner-state"
) -> SnapshotState:
    return SnapshotState(tenant, WalOffset(SEG, lsn), miner)


def test_codec_round_trips_and_pins_the_layout() -> None:
    original = state("acme-prod", 123_456_789, bytes(range(256)) * 3)
    data = encode_snapshot(original)
    assert decode_snapshot(data, Path("x.snap")) == original
    assert len(data) == HEADER_SIZE + len(original.tenant) + len(original.miner)
    assert data[0:4] == MAGIC == b"OSNP"
    assert struct.unpack_from("<HH", data, 4) == (VERSION, 0) == (2, 0)
    assert struct.unpack_from("<II", data, 8) == (len(original.tenant), len(original.miner))
    assert data[16:40] == original.horizon.encode()
    body = original.tenant.encode() + original.miner
    assert struct.unpack_from("<II", data, 40) == (crc32c.crc32c(body, crc32c.crc32c(data[:40])), 0)
    assert data[HEADER_SIZE : HEADER_SIZE + len(original.tenant)] == original.tenant.encode()


def test_codec_round_trips_an_empty_miner_state() -> None:
    original = state(miner=b"")
    assert decode_snapshot(encode_snapshot(original), Path("x.snap")) == original


def _with_crc(data: bytearray) -> bytes:
    """Recompute the CRC so that only the field under test is wrong."""
    body = bytes(data[HEADER_SIZE:])
    struct.pack_into("<I", data, 40, crc32c.crc32c(body, crc32c.crc32c(bytes(data[:40]))))
    return bytes(data)


def _poke(offset: int, value: bytes, *, fix_crc: bool) -> Callable[[bytes], bytes]:
    def corrupt(data: bytes) -> bytes:
        buf = bytearray(data)
        buf[offset : offset + len(value)] = value
        return _with_crc(buf) if fix_crc else bytes(buf)

    return corrupt


def _flip(offset: int) -> Callable[[bytes], bytes]:
    def corrupt(data: bytes) -> bytes:
        buf = bytearray(data)
        buf[offset] ^= 0x01
        return bytes(buf)

    return corrupt


def _non_ascii_tenant(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[HEADER_SIZE] = 0xE9
    return _with_crc(buf)


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        pytest.param(_poke(0, b"OSNQ", fix_crc=True), "bad magic", id="bad_magic"),
        pytest.param(_poke(4, struct.pack("<H", 1), fix_crc=True), "version 1", id="old_version"),
        pytest.param(_poke(4, struct.pack("<H", 3), fix_crc=True), "version 3", id="new_version"),
        pytest.param(_poke(4, b"\0\0", fix_crc=True), "version 0", id="zero_version"),
        pytest.param(_poke(6, b"\x01", fix_crc=True), "reserved", id="reserved_flags"),
        pytest.param(_poke(44, b"\x01", fix_crc=False), "reserved", id="reserved_trailer"),
        pytest.param(lambda d: d[:-1], "the file has", id="truncated_body"),
        pytest.param(lambda d: d + b"\0", "the file has", id="trailing_byte"),
        pytest.param(lambda d: d[: HEADER_SIZE - 1], "shorter than", id="short_header"),
        pytest.param(lambda d: b"", "shorter than", id="empty_file"),
        pytest.param(
            _poke(8, struct.pack("<I", 9), fix_crc=False), "the file has", id="tenant_len"
        ),
        pytest.param(
            _poke(12, struct.pack("<I", 10), fix_crc=False), "the file has", id="miner_len"
        ),
        pytest.param(_flip(-1), "checksum", id="crc_miner_byte"),
        pytest.param(_flip(HEADER_SIZE), "checksum", id="crc_tenant_byte"),
        pytest.param(_flip(20), "checksum", id="crc_horizon_byte"),
        pytest.param(_flip(40), "checksum", id="crc_field"),
        pytest.param(_non_ascii_tenant, "not ASCII", id="non_ascii_tenant"),
    ],
)
def test_codec_refuses_every_corruption(corrupt: Callable[[bytes], bytes], reason: str) -> None:
    path = Path("/snapshots/tenant-1.snap")
    data = corrupt(encode_snapshot(state()))
    with pytest.raises(SnapshotError, match=reason) as exc:
        decode_snapshot(data, path)
    assert type(exc.value) is SnapshotError  # a decode error, never a store failure
    assert str(path) in str(exc.value)


# -- the store --------------------------------------------------------------------------------


def test_rfc0052_13_installs_are_monotonic_per_tenant(tmp_path: Path) -> None:
    """A lower or equal horizon is refused and the installed file keeps the higher one;
    the rule is per tenant, uses a temp named by tenant and horizon, and survives a
    restart of the store (seeded by the durable listing)."""
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, fs=fs)
    high = SnapshotState("a", WalOffset(SEG, 200), b"high")
    assert store.install(high).installed
    assert ("open", root / "a.200.snap.tmp") in fs.log
    for lower in (
        SnapshotState("a", WalOffset(SEG, 100), b"low"),
        SnapshotState("a", WalOffset(SEG, 200), b"equal"),
    ):
        out = store.install(lower)
        assert not out.installed and out.reason == "not above the installed horizon"
        assert decode_snapshot(store.path_of("a").read_bytes(), store.path_of("a")) == high
    # Another tenant's horizons are its own.
    assert store.install(SnapshotState("b", WalOffset(SEG, 100), b"b")).installed
    assert sorted(os.listdir(root)) == ["a.snap", "b.snap"]

    restarted = SnapshotStore(root, fs=fs)
    loaded = restarted.load_all_durable()
    assert {t: s.horizon.lsn for t, s in loaded.states.items()} == {"a": 200, "b": 100}
    assert not restarted.install(SnapshotState("a", WalOffset(SEG, 150), b"low")).installed
    assert decode_snapshot(store.path_of("a").read_bytes(), root).miner == b"high"
    assert restarted.install(SnapshotState("a", WalOffset(SEG, 300), b"higher")).installed
    assert decode_snapshot(store.path_of("a").read_bytes(), root).horizon.lsn == 300


@pytest.mark.parametrize("op", ["open", "write", "fsync", "rename"])
def test_a_failed_install_step_keeps_the_previous_snapshot_and_leaves_no_temp(
    tmp_path: Path, op: str
) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, fs=fs)
    first = SnapshotState("a", WalOffset(SEG, 100), b"first")
    assert store.install(first).installed
    fault = fs.fail(op, "a.*.snap.tmp" if op != "rename" else "a.snap")
    out = store.install(SnapshotState("a", WalOffset(SEG, 200), b"second"))
    assert fault.fired == 1
    assert not out.installed and "EIO" in out.reason
    assert sorted(os.listdir(root)) == ["a.snap"]
    assert decode_snapshot(store.path_of("a").read_bytes(), root) == first
    # Not recorded as installed: the same horizon installs on the next attempt.
    assert store.install(SnapshotState("a", WalOffset(SEG, 200), b"second")).installed


def test_a_failed_directory_fsync_after_the_rename_is_not_an_install(tmp_path: Path) -> None:
    """The hazard the ledger exists for: the new file is visible, the install failed."""
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, fs=fs)
    assert store.install(SnapshotState("a", WalOffset(SEG, 100), b"first")).installed
    fs.fail("fsync_dir", "snapshots")
    out = store.install(SnapshotState("a", WalOffset(SEG, 200), b"second"))
    assert not out.installed
    assert decode_snapshot(store.path_of("a").read_bytes(), root).horizon.lsn == 200
    # A crash drops the never-durable rename: the durable snapshot is the first one.
    fs.apply_crash(power_loss=True)
    assert decode_snapshot(store.path_of("a").read_bytes(), root).horizon.lsn == 100


def test_rfc0052_13_a_snapshot_root_that_cannot_be_fsynced_fails_and_a_missing_one_is_empty(
    tmp_path: Path,
) -> None:
    """A cold start (no directory yet) is the empty store, not a durability failure; a
    regular file where the directory should be cannot be fsynced as one and fails."""
    cold = SnapshotStore(tmp_path / "cold" / "snapshots")
    result = cold.load_all_durable()
    assert result.states == {} and result.undecodable == {} and result.stale_temps_removed == 0
    assert not (tmp_path / "cold").exists()

    blocker = tmp_path / "snapshots"
    blocker.write_bytes(b"a file in place of the directory")
    with pytest.raises(SnapshotStoreError, match="at start-up") as exc:
        SnapshotStore(blocker).load_all_durable()
    assert isinstance(exc.value.__cause__, NotADirectoryError)
    assert str(blocker) in str(exc.value)


def test_rfc0052_13_load_admits_a_horizon_only_from_a_snapshot_that_decodes_and_restores(
    tmp_path: Path,
) -> None:
    fs = FaultyFs(tmp_path / ".shadow")
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, fs=fs)
    allocator = CountingAllocator()
    cluster = MinerCluster(allocator)
    cluster.mine("good", ["user 1 logged in", "user 2 logged in"])
    good_miner = cluster.miner("good").to_snapshot()
    assert store.install(SnapshotState("good", WalOffset(SEG, 10), good_miner)).installed
    # Decodes, but its miner state does not restore.
    assert store.install(SnapshotState("garbled", WalOffset(SEG, 10), b"\x00garbage")).installed
    # Decodes and restores, but holds another tenant than its name says.
    (root / "other.snap").write_bytes(encode_snapshot(SnapshotState("good", SEG_OFF, good_miner)))
    # Fails its checksum.
    corrupt = bytearray(encode_snapshot(SnapshotState("crc", WalOffset(SEG, 10), good_miner)))
    corrupt[-1] ^= 0xFF
    (root / "crc.snap").write_bytes(bytes(corrupt))

    def restores(s: SnapshotState) -> None:
        TenantMiner.from_snapshot(s.miner, allocator)

    loaded = SnapshotStore(root, fs=fs).load_all_durable(restores=restores)
    assert set(loaded.states) == {"good"}
    assert set(loaded.undecodable) == {"garbled", "other", "crc"}
    assert "checksum" in loaded.undecodable["crc"]
    assert "holds tenant 'good'" in loaded.undecodable["other"]
    # Without the restore check, the garbled one would have been admitted.
    assert "garbled" in SnapshotStore(root, fs=fs).load_all_durable().states


def test_the_ledger_records_only_higher_horizons() -> None:
    ledger = SnapshotLedger()
    ledger.record(state("a", 200, b"x"))
    ledger.record(state("a", 100, b"lower"))
    ledger.record(state("a", 200, b"equal"))
    assert ledger.horizons() == {"a": WalOffset(SEG, 200)}
    assert ledger.state("a") == state("a", 200, b"x")
    ledger.record(state("b", 5))
    assert len(ledger) == 2 and ledger.state("c") is None


# -- RFC0052.13 on the node rig ---------------------------------------------------------------


def make_rig(tmp_path: Path) -> NodeRig:
    return NodeRig(tmp_path, config=WalConfig(segment_max_bytes=64 * 1024, max_tenants=8))


class Feed:
    """Appends with unique tags, remembering every mark per tenant."""

    def __init__(self, rig: NodeRig) -> None:
        self.rig = rig
        self.n = 0
        self.marks: dict[str, list[WalOffset]] = {}
        self.tags: dict[str, list[str]] = {}

    def __call__(self, tenant: str, frames: int = 1) -> WalOffset:
        mark: WalOffset | None = None
        for _ in range(frames):
            self.n += 1
            tag = f"{tenant}-{self.n}"
            mark = self.rig.ingest(tenant, tag, RECORDS)
            self.marks.setdefault(tenant, []).append(mark)
            self.tags.setdefault(tenant, []).append(tag)
        drain_pending(self.rig)
        assert mark is not None
        return mark

    def rids(self, tenant: str) -> list[str]:
        return sorted(r for tag in self.tags[tenant] for r in rids(tag, RECORDS))


def drain_pending(rig: NodeRig) -> list[CutOutcome]:
    """Run the rotation-fired cuts a turn handed over, as the barrier thread would."""
    out: list[CutOutcome] = []
    while rig.barrier.pending is not None:
        outcome = rig.barrier.step(timer=False)
        assert outcome is not None
        out.append(outcome)
    return out


def cut(rig: NodeRig) -> CutOutcome:
    """A timer cut (after any pending rotation-fired one)."""
    drain_pending(rig)
    outcome = rig.barrier.step(timer=True)
    assert outcome is not None and outcome.ok, outcome
    return outcome


def housekeep(rig: NodeRig) -> ReclamationProgress:
    progress = rig.housekeeper.step()
    assert progress is not None, rig.housekeeper.runs
    return progress


def name_of(feed: Feed, mark: WalOffset) -> str:
    """The segment file holding the frame that ends at ``mark``."""
    bases = sorted(int(n.split(".")[0]) for n in feed.rig.journal.segment_names())
    base = max(b for b in bases if b < mark.lsn)
    return f"{base:020d}.wal"


def restart(
    rig: NodeRig, *, power_loss: bool = False, arm: Callable[[], object] | None = None
) -> RecoveryReport:
    """``rig.restart`` with faults armed for the next process (``arm``) before it starts."""
    if power_loss:
        rig.fs.crash_now()
        rig.fs.apply_crash(power_loss=True)  # clears the dead process's faults
        rig.publisher.close(timeout=5)
    else:
        rig.close()
    if arm is not None:
        arm()
    rig.store.clear()
    return rig.start()


def corrupt_snapshot(rig: NodeRig, tenant: str) -> None:
    path = rig.snapshots.path_of(tenant)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a byte of the miner state: the checksum no longer holds
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("target", ["snapshots", "data"], ids=["snapshots_dir", "its_parent"])
def test_rfc0052_13_a_failed_startup_fsync_of_the_snapshot_dir_fails_startup(
    tmp_path: Path, target: str
) -> None:
    """Start-up fails with a SnapshotStoreError naming the directory; it neither
    discards the snapshots nor starts with an empty state, and once the disk can fsync
    again the same snapshots restore."""
    rig = make_rig(tmp_path)
    try:
        feed = Feed(rig)
        feed("a", 2)
        feed("b", 2)
        assert cut(rig).snapshots_installed == 2
        horizons = rig.ledger.horizons()
        files = {t: rig.snapshots.path_of(t).read_bytes() for t in ("a", "b")}
        rig.close()

        fault = rig.fs.fail("fsync_dir", target, count=None)
        rig.store.clear()
        with pytest.raises(SnapshotStoreError, match="at start-up") as exc:
            rig.start()
        assert fault.fired >= 1
        assert str(rig.snapshots.root) in str(exc.value)
        assert isinstance(exc.value.__cause__, OSError)
        # Nothing was started, restored, thrown away or rewritten.
        assert not rig.pipeline.ready
        assert len(rig.ledger) == 0 and rig.miners.tenants() == []
        assert {t: rig.snapshots.path_of(t).read_bytes() for t in files} == files

        rig.fs.clear_faults()
        report = restart(rig)  # closes the half-started node first
        assert report.snapshots_restored == 2 and report.snapshots_undecodable == {}
        assert rig.ledger.horizons() == horizons
        assert report.frames == report.frames_skipped == 4
    finally:
        rig.close()


def test_rfc0052_13_a_listed_snapshot_never_made_durable_never_governs_reclamation(
    tmp_path: Path,
) -> None:
    """p's snapshot is renamed into place and its directory entry never fsynced (the
    install that returned an error, or a writer that died before the fsync). Housekeeping
    does not read the directory, so p stays pinned and keeps its frames; a power loss
    then drops the entry, and the restarted node replays all of p's frames."""
    rig = make_rig(tmp_path)
    try:
        p_installs = rig.fs.fail("open", "p.*.snap.tmp", count=None)
        feed = Feed(rig)
        feed("a", 3)
        feed("p", 3)
        rig.journal.rotate()
        feed("a", 1)
        p_last = feed("p", 1)
        outcome = cut(rig)
        assert outcome.checkpointed and outcome.snapshot_failures == 1
        assert p_installs.fired >= 1 and "p" not in rig.ledger.horizons()
        closed = name_of(feed, feed.marks["p"][0])
        checkpoint = rig.journal.last_checkpoint
        assert checkpoint is not None and checkpoint.lsn >= feed.marks["p"][2].lsn

        # A snapshot covering every p frame, written through the seam, renamed into place,
        # and the directory never fsynced.
        miner = rig.miners.get("p")
        assert miner is not None
        data = encode_snapshot(SnapshotState("p", p_last, miner.to_snapshot()))
        tmp = rig.snapshots.root / "p.writer-died.tmp"
        fd = rig.fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        rig.fs.write(fd, data)
        rig.fs.fsync(fd)
        rig.fs.close(fd)
        rig.fs.rename(tmp, rig.snapshots.path_of("p"))
        assert "p.snap" in os.listdir(rig.snapshots.root)

        progress = housekeep(rig)
        assert isinstance(progress.floor, FloorPinned) and progress.floor.pinned == ("p",)
        assert progress.floor.offset == feed.marks["p"][0]
        assert progress.removed_segments == 0
        assert closed in rig.journal.segment_names()

        report = restart(
            rig, power_loss=True, arm=lambda: rig.fs.fail("open", "p.*.snap.tmp", count=None)
        )
        assert not rig.snapshots.path_of("p").exists()
        assert report.snapshots_restored == 1 and report.snapshots_undecodable == {}
        # Every a frame is at or below a's horizon; none of p's is skipped.
        assert report.frames == 8 and report.frames_skipped == 4
        assert "p" not in rig.ledger.horizons()
        progress = housekeep(rig)
        assert isinstance(progress.floor, FloorPinned) and progress.floor.pinned == ("p",)
        assert progress.removed_segments == 0
        assert closed in rig.journal.segment_names()
        assert "p" in rig.journal.tenants_with_frames()
    finally:
        rig.close()


def test_rfc0052_13_a_tenant_without_a_valid_snapshot_pins_and_is_never_no_consumer(
    tmp_path: Path,
) -> None:
    """Segments: 1 = a only, 2 = a + p, 3 = a + exactly one p frame, 4 = a only, 5 =
    current. With p's installs failing, housekeeping passes the Known map without p: the
    floor is Pinned at p's oldest frame (never None, which would reclaim by checkpoint
    alone), 2 and 3 survive, 1 (below p's oldest frame) and 4 (none of p's frames) go.
    Once p's snapshot installs, the pin lifts and the next pass reclaims 2 and 3."""
    rig = make_rig(tmp_path)
    try:
        fault = rig.fs.fail("open", "p.*.snap.tmp", count=None)
        feed = Feed(rig)
        feed("a", 2)
        rig.journal.rotate()
        feed("a", 1)
        feed("p", 2)
        rig.journal.rotate()
        feed("a", 1)
        feed("p", 1)
        feed("a", 1)
        rig.journal.rotate()
        feed("a", 2)
        rig.journal.rotate()
        feed("a", 1)
        outcome = cut(rig)
        assert outcome.checkpointed and outcome.snapshot_failures == 1 and fault.fired >= 1
        assert rig.journal.last_checkpoint == feed.marks["a"][-1]
        a = feed.marks["a"]
        seg1, seg2, seg3, seg4 = (name_of(feed, m) for m in (a[0], a[2], a[3], a[5]))
        assert name_of(feed, feed.marks["p"][2]) == seg3
        assert len({seg1, seg2, seg3, seg4, name_of(feed, a[-1])}) == 5

        progress = housekeep(rig)
        floor = progress.floor
        assert not isinstance(floor, FloorNone)
        assert isinstance(floor, FloorPinned)
        assert floor.pinned == ("p",) and floor.tenants == 1
        assert floor.offset == feed.marks["p"][0]
        assert progress.removed_segments == 2
        names = set(rig.journal.segment_names())
        assert {seg2, seg3} <= names and not ({seg1, seg4} & names)
        assert progress.lag_segments == 2
        state = rig.journal.reclaim_state()
        assert state.pinned_tenants == 1 and isinstance(state.floor, FloorPinned)
        pinned_events = [f for n, f in rig.events if n == "wal.floor.pinned"]
        assert len(pinned_events) == 1 and pinned_events[0]["example_tenants"] == ["p"]
        # A second pass changes nothing: the pin is not a transient.
        assert housekeep(rig).removed_segments == 0

        fault.count = 0  # p's snapshot can be written again
        assert cut(rig).snapshots_installed == 1
        assert rig.ledger.horizons()["p"] == feed.marks["p"][-1]
        progress = housekeep(rig)
        assert progress.removed_segments == 2
        assert isinstance(progress.floor, FloorMin)
        assert set(rig.journal.segment_names()) == {name_of(feed, a[-1])}
        assert rig.journal.tenants_with_frames() == ["a"]  # p left with its last segment
        assert [n for n, _ in rig.events if n.startswith("wal.floor.")] == [
            "wal.floor.pinned",
            "wal.floor.lifted",
        ]
    finally:
        rig.close()


def test_rfc0052_13_an_undecodable_snapshot_under_a_known_entry_halts_recovery(
    tmp_path: Path,
) -> None:
    """a's frames were reclaimed under a Known entry and a still has a surviving frame:
    with its snapshot undecodable, recovery refuses to start naming a (b, also
    undecodable but with no entry, is not the reason)."""
    rig = make_rig(tmp_path)
    try:
        feed = Feed(rig)
        feed("a", 3)
        reclaimed_through = feed.marks["a"][-1]
        rig.journal.rotate()
        feed("a", 1)
        feed("b", 2)
        assert cut(rig).snapshots_installed == 2
        assert housekeep(rig).removed_segments == 1  # a's first segment, under a Known entry
        corrupt_snapshot(rig, "a")
        corrupt_snapshot(rig, "b")
        damaged = rig.snapshots.path_of("a").read_bytes()

        with pytest.raises(UnrecoverableTenant) as exc:
            restart(rig)
        assert exc.value.tenant == "a"
        assert exc.value.horizon is None
        assert exc.value.reclaimed_through == reclaimed_through
        assert "'a'" in str(exc.value) and "refusing to start" in str(exc.value)
        assert not rig.pipeline.ready
        # Halted before writing anything over the evidence.
        assert rig.snapshots.path_of("a").read_bytes() == damaged
    finally:
        rig.close()


def test_rfc0052_13_an_undecodable_snapshot_without_an_entry_is_pinned_and_fully_replayed(
    tmp_path: Path,
) -> None:
    """Nothing was ever reclaimed for b: with its snapshot undecodable the node starts,
    feeds every one of b's surviving frames to its miner (none skipped, none
    republished: they are all at or below the checkpoint) and pins its frames."""
    rig = make_rig(tmp_path)
    try:
        feed = Feed(rig)
        feed("b", 3)
        rig.journal.rotate()
        feed("b", 1)
        assert cut(rig).snapshots_installed == 1
        assert rig.ledger.horizons()["b"] == feed.marks["b"][-1]  # covers all four
        published = sorted(rig.published_rids("b"))
        assert published == feed.rids("b")
        corrupt_snapshot(rig, "b")

        report = restart(rig, arm=lambda: rig.fs.fail("open", "b.*.snap.tmp", count=None))
        assert set(report.snapshots_undecodable) == {"b"}
        assert "checksum" in report.snapshots_undecodable["b"]
        assert report.snapshots_restored == 0
        assert report.frames == 4 and report.frames_skipped == 0
        assert report.records_suppressed == 4 * RECORDS and report.records_replayed == 0
        assert sorted(rig.published_rids("b")) == published
        assert "b" not in rig.ledger.horizons()
        first = name_of(feed, feed.marks["b"][0])

        progress = housekeep(rig)
        assert isinstance(progress.floor, FloorPinned) and progress.floor.pinned == ("b",)
        assert progress.floor.offset == feed.marks["b"][0]
        assert progress.removed_segments == 0
        assert first in rig.journal.segment_names()
    finally:
        rig.close()


def test_rfc0052_13_stale_snapshot_temps_go_at_startup_and_never_by_housekeeping(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)
    try:
        feed = Feed(rig)
        feed("a", 2)
        rig.journal.rotate()
        feed("a", 1)
        cut(rig)
        root = rig.snapshots.root
        stale = [root / "a.17.snap.tmp", root / "zz.9.snap.tmp"]
        for path in stale:
            path.write_bytes(b"left by a writer that died")
        removed = sum(housekeep(rig).removed_segments for _ in range(3))
        assert removed == 1  # the passes did reclaim; the temps are not theirs
        assert all(p.exists() for p in stale)

        report = restart(rig)
        assert report.stale_snapshot_temps == 2
        assert not any(p.exists() for p in stale)
        assert sorted(os.listdir(root)) == ["a.snap"]
        assert report.snapshots_restored == 1
        assert rig.ledger.horizons()["a"] == feed.marks["a"][-1]
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("op", "glob"),
    [("rename", "a.snap"), ("fsync_dir", "snapshots")],
    ids=["rename_fails", "dir_fsync_fails"],
)
def test_rfc0052_13_the_ledger_holds_only_installs_that_returned_ok(
    tmp_path: Path, op: str, glob: str
) -> None:
    """Segments: 1 (a ≤ h1), 2 (a above h1), 3 = current. After h1 installed and segment
    1 went, every install fails at ``op``: the checkpoint still advances past segment
    2, but the ledger keeps h1, so housekeeping reclaims nothing on the strength of the
    failed install (even when its file is visible). A power loss proves why: the
    restarted node restores h1. The next install that returns OK releases segment 2."""
    rig = make_rig(tmp_path)
    try:
        feed = Feed(rig)
        h1 = feed("a", 3)
        assert cut(rig).snapshots_installed == 1
        rig.journal.rotate()
        feed("a", 3)
        assert housekeep(rig).removed_segments == 1
        assert rig.ledger.horizons() == {"a": h1}

        fault = rig.fs.fail(op, glob, count=None)
        rig.journal.rotate()
        feed("a", 1)  # the turn hands over a rotation-fired cut at segment 2's end
        h2 = feed.marks["a"][-2]
        outcome = cut(rig)
        assert fault.fired >= 2
        assert outcome.snapshots_installed == 0 and outcome.snapshot_failures == 1
        assert rig.journal.last_checkpoint == feed.marks["a"][-1] > h2
        assert rig.ledger.horizons() == {"a": h1}
        on_disk = decode_snapshot(rig.snapshots.path_of("a").read_bytes(), Path("a.snap"))
        if op == "fsync_dir":
            assert on_disk.horizon == feed.marks["a"][-1]  # visible, never durable
        else:
            assert on_disk.horizon == h1
            assert sorted(os.listdir(rig.snapshots.root)) == ["a.snap"]
        seg2 = name_of(feed, h2)

        progress = housekeep(rig)
        assert progress.removed_segments == 0
        assert isinstance(progress.floor, FloorMin) and progress.floor.offset == h1
        assert progress.lag_segments == 1
        assert seg2 in rig.journal.segment_names()

        report = restart(rig, power_loss=True)
        # Restored at h1: every surviving frame (segment 2's three, segment 3's one) is
        # above it and is replayed; a horizon at the failed install would skip all four.
        assert report.snapshots_restored == 1
        assert report.frames == 4 and report.frames_skipped == 0
        # The post-recovery install returned OK, so it is the new horizon.
        assert report.snapshots_written == 1
        assert rig.ledger.horizons() == {"a": feed.marks["a"][-1]}
        assert housekeep(rig).removed_segments == 1
        assert seg2 not in rig.journal.segment_names()
    finally:
        rig.close()


def test_a_failed_parent_fsync_when_the_directory_is_created_is_retried_before_an_install(
    tmp_path: Path,
) -> None:
    """Creating ``snapshots/`` fsyncs its parent so the directory's own entry is durable
    (RFC 0052 §3.2). When that fsync fails, no later install may return OK until a parent
    fsync has succeeded: otherwise the ledger records horizons in a directory a power
    loss can drop whole, and housekeeping reclaims under them."""
    fs = FaultyFs(tmp_path / ".shadow")
    data = tmp_path / "data"
    data.mkdir()
    store = SnapshotStore(data / "snapshots", fs=fs)
    fault = fs.fail("fsync_dir", "data")
    assert not store.install(SnapshotState("a", WalOffset(SEG, 100), b"first")).installed
    assert fault.fired == 1
    out = store.install(SnapshotState("a", WalOffset(SEG, 200), b"second"))
    parent_fsyncs = [op for op, path in fs.log if op == "fsync_dir" and path == data]
    assert not out.installed or len(parent_fsyncs) >= 2, (
        "an install returned OK although the parent fsync that makes snapshots/ durable "
        f"failed and was never retried (parent fsyncs attempted: {len(parent_fsyncs)})"
    )

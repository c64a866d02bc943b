"""Reclamation on real files: RFC0052.2 (what is unlinked, never past the floor),
RFC0052.12 (a pass bounds its work), RFC0052.13 (a tenant without a snapshot pins
exactly its segments) and RFC0052.16 (the temp sweep's selector)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.walkit import faulty, payload
from wal import (
    FloorMin,
    FloorNone,
    FloorPinned,
    FrameKind,
    Journal,
    KnownHorizons,
    WalConfig,
    WalOffset,
)
from wal.reclamation import APPLY_STEPS_PER_UNLINK
from wal.segment import HEADER_SIZE, partial_name, uuid7
from wal.segment_ledger import NoConsumerHorizons
from wal.testing import FaultyFs

FRAME = 9000  # seven frames per 64 KiB segment


def config(cap: int = 64, tenants: int = 16) -> WalConfig:
    return WalConfig(
        segment_max_bytes=64 * 1024,
        max_frame_bytes=64 * 1024,
        max_unlinks_per_pass=cap,
        rotation_retry_attempts=min(3, cap),
        max_tenants=tenants,
    )


@dataclass
class Rig:
    root: Path
    fs: FaultyFs
    journal: Journal
    cfg: WalConfig
    frames: list[tuple[str, WalOffset, bytes]] = field(default_factory=list)
    n: int = 0

    def write(self, tenants: Sequence[str], size: int = FRAME) -> list[WalOffset]:
        """Append one frame per entry, pipelined, and wait for all of them."""
        pend = []
        for t in tenants:
            self.n += 1
            data = payload(self.n, size)
            pend.append((t, self.journal.append_batch(t, data), data))
        out = []
        for t, p, data in pend:
            off = p.wait().offset
            self.frames.append((t, off, data))
            out.append(off)
        return out

    def last(self, tenant: str, below: int | None = None) -> WalOffset:
        offs = [o for t, o, _ in self.frames if t == tenant and (below is None or o.lsn <= below)]
        return offs[-1]

    def names(self) -> list[str]:
        return self.journal.segment_names()

    def restart(self) -> list[tuple[str, bytes]]:
        self.journal.close()
        self.journal = Journal.open(self.root, self.cfg, fs=self.fs)
        return [(f.tenant, f.payload) for f in self.journal.replay()]


def rig(tmp_path: Path, cfg: WalConfig | None = None) -> Rig:
    fs = faulty(tmp_path)
    cfg = cfg or config()
    root = tmp_path / "wal"
    return Rig(root, fs, Journal.open(root, cfg, fs=fs), cfg)


def segments_holding(r: Rig, tenant: str) -> set[uuid.UUID]:
    return {o.segment for t, o, _ in r.frames if t == tenant}


def surviving_segments(r: Rig) -> set[uuid.UUID]:
    state = r.journal.reclaim_state()
    assert state.segments == len(r.names())
    return {o.segment for _, o, _ in r.frames} & _live_uuids(r)


def _live_uuids(r: Rig) -> set[uuid.UUID]:
    out = set()
    for name in r.names():
        raw = (r.root / name).read_bytes()[16:32]
        out.add(uuid.UUID(bytes=raw))
    return out


def drain(r: Rig, horizons: KnownHorizons | NoConsumerHorizons, cap: int | None = None) -> int:
    """Passes until one removes nothing; returns the segments removed."""
    total = 0
    for _ in range(200):
        p = r.journal.maintain(horizons, cap or r.cfg.max_unlinks_per_pass)
        total += p.removed_segments
        if p.removed_segments == 0 and p.removed_partials == 0 and not p.capped:
            return total
    raise AssertionError("housekeeping never settled")


# -- RFC0052.2 ------------------------------------------------------------------------


def test_rfc0052_2_only_covered_segments_below_the_checkpoint_are_unlinked(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    r.write(["A", "B"] * 21)  # six segments of alternating frames
    r.write(["A"] * 3)  # into the current segment
    segs = r.names()
    assert len(segs) == 7
    mark = r.last("A", below=None)
    closed_end = [o for _, o, _ in r.frames][41]  # the last frame of the sixth segment
    r.journal.checkpoint(closed_end)
    b_horizon = [o for t, o, _ in r.frames if t == "B"][7]  # inside the third segment
    before = set(_live_uuids(r))
    p = r.journal.maintain(KnownHorizons({"A": mark, "B": b_horizon}), 64)
    after = _live_uuids(r)
    removed = before - after
    # exactly the segments whose every B frame is at or below B's horizon
    for seg in removed:
        b_lasts = [o.lsn for t, o, _ in r.frames if t == "B" and o.segment == seg]
        assert max(b_lasts) <= b_horizon.lsn
        assert max(o.lsn for _, o, _ in r.frames if o.segment == seg) <= closed_end.lsn
    for seg in after:
        if seg == r.journal.current_segment:
            continue
        b_lasts = [o.lsn for t, o, _ in r.frames if t == "B" and o.segment == seg]
        assert b_lasts and max(b_lasts) > b_horizon.lsn, "a covered segment was retained"
    assert len(removed) == 2 and p.removed_segments == 2
    assert r.journal.current_segment in after  # the current append segment survives
    assert r.journal.reclaim_state().segments == 5
    # every frame above the lagging tenant's horizon is still there to re-mine
    replayed = r.restart()
    for t, off, data in r.frames:
        if t == "B" and off.lsn > b_horizon.lsn:
            assert ("B", data) in replayed
    # and once B's horizon reaches them, they go
    drain(r, KnownHorizons({"A": mark, "B": r.last("B")}))
    assert r.names() == [r.names()[-1]] and len(r.names()) == 1  # only the current one


def test_rfc0052_2_a_segment_holding_only_the_horizon_frame_is_unlinked(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A"] * 3)
    (c_only,) = r.write(["C"])  # idle tenant C: its one frame is its horizon
    r.write(["A"] * 3)  # the segment closes
    r.write(["A"] * 7)
    r.journal.checkpoint(r.last("A"))
    horizons = KnownHorizons({"A": r.last("A"), "C": c_only})
    drain(r, horizons)
    assert c_only.segment not in _live_uuids(r)
    r.restart()
    # RECLAIM's entry for C is at or above S, so the absent segment is explained
    r.journal.check_restorable({"A": r.last("A"), "C": c_only})


def test_rfc0052_2_a_segment_above_a_horizon_waits_for_it(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A", "B"] * 14)
    r.write(["A"])
    r.journal.checkpoint(r.last("A"))
    b_frames = [o for t, o, _ in r.frames if t == "B"]
    # the second segment holds B's frames 3..6; a horizon at frame 5 leaves frame 6 above it
    assert {b_frames[i].segment for i in (3, 6)} == {b_frames[5].segment}
    drain(r, KnownHorizons({"A": r.last("A"), "B": b_frames[5]}))
    assert b_frames[5].segment in _live_uuids(r)
    assert b_frames[2].segment not in _live_uuids(r)
    drain(r, KnownHorizons({"A": r.last("A"), "B": b_frames[6]}))
    assert b_frames[6].segment not in _live_uuids(r)


def test_rfc0052_2_a_pin_retains_exactly_the_pinned_tenants_segments(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A", "P", "A", "A", "A", "A", "A"])  # P (no snapshot) in the first segment
    r.write(["A"] * 14)  # two segments of A only
    r.write(["A"])
    r.journal.checkpoint(r.last("A"))
    stale = r.root / partial_name(uuid7(1.8e9))
    stale.write_bytes(b"debris")
    r.restart()
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    live = _live_uuids(r)
    assert segments_holding(r, "P") <= live
    assert len(live) == 2 and p.removed_segments == 2
    assert p.removed_partials == 1 and not stale.exists()  # the temp sweep still ran
    assert isinstance(p.floor, FloorPinned) and p.floor.tenants == 1


# -- RFC0052.12 -----------------------------------------------------------------------


def _backlog(tmp_path: Path, segments: int, cap: int) -> Rig:
    r = rig(tmp_path, config(cap=cap))
    big = 60_000  # one frame per segment
    r.write(["A"] * segments, size=big)
    r.write(["A"], size=100)
    r.journal.checkpoint(r.last("A"))
    return r


def test_rfc0052_12_a_pass_unlinks_at_most_the_cap_reading_nothing(tmp_path: Path) -> None:
    r = _backlog(tmp_path, 300, cap=16)
    start = len(r.fs.log)
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 16)
    ops = r.fs.log[start:]
    assert p.removed_segments == 16 and p.capped
    assert not [op for op, _ in ops if op in ("listdir", "read", "pread", "open", "stat")], ops
    assert {op for op, _ in ops} <= {"pwrite", "fsync", "unlink", "fsync_dir"}
    # 300 segments: the small last frame shares the newest (current) one; horizon
    # application is capped too (APPLY_STEPS_PER_UNLINK x cap steps)
    steps = APPLY_STEPS_PER_UNLINK * 16
    assert p.horizon_applied == min(299, steps) and p.unlink_remaining == min(299, steps) - 16
    assert r.journal.reclaim_state().segments == 300 - 16


def test_rfc0052_12_an_append_completes_while_the_file_half_is_held(tmp_path: Path) -> None:
    r = _backlog(tmp_path, 40, cap=8)
    hold = r.fs.hold_at("unlink", "*.wal")
    done = threading.Event()
    errors: list[BaseException] = []

    def housekeep() -> None:
        try:
            r.journal.maintain(KnownHorizons({"A": r.last("A")}), 8)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
        done.set()

    t = threading.Thread(target=housekeep)
    t.start()
    assert hold.reached.wait(10)
    out = r.journal.commit("A", payload(999, 100))  # the journal mutex is free
    assert out.offset.lsn > r.last("A").lsn
    assert not done.is_set()
    hold.release()
    t.join()
    assert not errors


def test_rfc0052_12_horizon_application_is_capped_and_resumes(tmp_path: Path) -> None:
    r = _backlog(tmp_path, 300, cap=2)
    steps = APPLY_STEPS_PER_UNLINK * 2  # horizon steps per pass
    first = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 2)
    assert first.horizon_applied == steps and first.capped
    remaining = first.horizon_remaining
    second = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 2)
    assert second.horizon_applied == steps
    assert second.horizon_remaining == remaining - steps


def test_rfc0052_12_an_unchanged_pinned_backlog_costs_nothing(tmp_path: Path) -> None:
    r = _backlog(tmp_path, 200, cap=4)
    for _ in range(3):
        p = r.journal.maintain(KnownHorizons({}), 4)  # A has no snapshot: pinned
        assert p.horizon_applied == 0 and p.removed_segments == 0
        assert isinstance(p.floor, FloorPinned)


def test_rfc0052_12_a_set_emptied_above_the_checkpoint_is_reclaimed_once_passed(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    r.write(["A"] * 7)
    first_mark = r.last("A")
    r.write(["A"] * 14)
    r.write(["A"])
    r.journal.checkpoint(first_mark)
    drain(r, KnownHorizons({"A": r.last("A")}))  # sets empty, but the checkpoint is low
    assert len(r.names()) == 3
    r.journal.checkpoint(r.last("A"))  # O(1): stores the mark, promotes nothing
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert p.removed_segments == 2 and len(r.names()) == 1


def test_rfc0052_12_stale_partials_of_a_previous_process_are_swept_without_listing(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    r.write(["A"] * 3)
    stale = [r.root / partial_name(uuid7(1.8e9 + i)) for i in range(3)]
    r.journal.close()
    for p in stale:
        p.write_bytes(b"debris")
    r.journal = Journal.open(r.root, r.cfg, fs=r.fs)
    list(r.journal.replay())
    start = len(r.fs.log)
    progress = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert progress.removed_partials == 3 and not any(p.exists() for p in stale)
    assert "listdir" not in [op for op, _ in r.fs.log[start:]]


def test_rfc0052_12_a_pinned_oldest_segment_does_not_shadow_a_later_one(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["P"] + ["A"] * 6)  # the oldest segment holds the pinned tenant
    r.write(["A"] * 7)
    r.write(["A"])
    r.journal.checkpoint(r.last("A"))
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert p.removed_segments == 1
    assert segments_holding(r, "P") <= _live_uuids(r)


def test_rfc0052_12_capped_passes_reach_the_uncapped_end_state(tmp_path: Path) -> None:
    layout = ["A", "B", "C", "A", "B", "A", "C"] * 9
    ends = []
    for cap in (1, 3, 100):
        r = rig(tmp_path / f"cap{cap}", config(cap=cap))
        r.write(layout)
        r.write(["A"])
        r.journal.checkpoint(r.last("A"))
        horizons = KnownHorizons(
            {"A": r.last("A"), "B": r.last("B"), "C": [o for t, o, _ in r.frames if t == "C"][4]}
        )
        drain(r, horizons, cap)
        ends.append(r.names())
        r.journal.close()
    assert ends[0] == ends[1] == ends[2]


def test_rfc0052_12_partials_first_then_the_rest_of_the_cap(tmp_path: Path) -> None:
    r = _backlog(tmp_path, 30, cap=10)
    stale = [r.root / partial_name(uuid7(1.8e9 + i)) for i in range(4)]
    r.journal.close()
    for p in stale:
        p.write_bytes(b"")
    r.journal = Journal.open(r.root, r.cfg, fs=r.fs)
    list(r.journal.replay())
    first = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 10)
    assert first.removed_partials == 4 and first.removed_segments == 6


def test_rfc0052_12_a_backlog_of_partials_is_bounded_by_the_cap(tmp_path: Path) -> None:
    r = rig(tmp_path, config(cap=3))
    r.write(["A"])
    r.journal.close()
    stale = [r.root / partial_name(uuid7(1.8e9 + i)) for i in range(7)]
    for p in stale:
        p.write_bytes(b"")
    r.journal = Journal.open(r.root, r.cfg, fs=r.fs)
    list(r.journal.replay())
    counts = [
        r.journal.maintain(KnownHorizons({"A": r.last("A")}), 3).removed_partials for _ in range(3)
    ]
    assert counts == [3, 3, 1]


# -- RFC0052.13 (the WAL side) --------------------------------------------------------


def test_rfc0052_13_the_pin_lifts_when_a_horizon_arrives(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["P", "A"] * 10)
    r.write(["A"])
    r.journal.checkpoint(r.last("A"))
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert p.removed_segments == 0 and isinstance(p.floor, FloorPinned)
    assert r.journal.reclaim_state().pinned_tenants == 1
    assert p.lag_segments == len(r.names()) - 1 and p.lag_bytes > 0
    drain(r, KnownHorizons({"A": r.last("A"), "P": r.last("P")}))
    assert len(r.names()) == 1
    assert isinstance(r.journal.reclaim_state().floor, FloorMin)


def test_rfc0052_13_a_tenant_leaves_the_ledger_with_its_last_segment(tmp_path: Path) -> None:
    r = rig(tmp_path)
    (once,) = r.write(["C"])
    r.write(["A"] * 20)
    r.journal.checkpoint(r.last("A"))
    assert "C" in r.journal.tenants_with_frames()
    drain(r, KnownHorizons({"A": r.last("A"), "C": once}))
    assert "C" not in r.journal.tenants_with_frames()
    # churn leaves no permanent pin: C's absence from later horizons changes nothing
    r.write(["A"] * 8)
    r.journal.checkpoint(r.last("A"))
    drain(r, KnownHorizons({"A": r.last("A")}))
    assert len(r.names()) == 1


def test_rfc0052_13_equality_never_unlinks_a_pinned_frame(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A"] * 6)
    (pinned,) = r.write(["P"])  # P's only frame ends exactly at the segment's end
    r.write(["A"] * 7)
    r.write(["A"])
    r.journal.checkpoint(pinned)
    # every other tenant's horizon at or beyond P's frame; P has none
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert pinned.segment in _live_uuids(r)
    assert p.removed_segments == 0  # the later segment is above the checkpoint
    r.journal.checkpoint(r.last("A"))
    r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert pinned.segment in _live_uuids(r)
    assert len(r.names()) == 2  # the later segment holding none of P's frames went


def test_rfc0052_13_pinned_is_not_no_consumer(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A"] * 8)
    r.journal.checkpoint(r.last("A"))
    pinned = r.journal.maintain(KnownHorizons({}), 64)
    assert isinstance(pinned.floor, FloorPinned) and pinned.removed_segments == 0
    other = rig(tmp_path / "nc")
    other.write(["A"] * 8)
    other.journal.checkpoint(other.last("A"))
    nc = other.journal.maintain(NoConsumerHorizons(), 64)
    assert isinstance(nc.floor, FloorNone) and nc.removed_segments == 1


def test_audit_frames_are_governed_by_the_checkpoint_alone(tmp_path: Path) -> None:
    r = rig(tmp_path)
    pend = [r.journal.append_batch("", payload(i, FRAME), FrameKind.AUDIT_EVENT) for i in range(7)]
    for p in pend:
        p.wait()
    (a,) = r.write(["A"])
    r.journal.checkpoint(a)
    progress = r.journal.maintain(KnownHorizons({}), 64)  # no tenant horizons at all
    assert progress.removed_segments == 1


# -- RFC0052.16 -----------------------------------------------------------------------


def test_rfc0052_16_the_sweep_touches_only_the_reserved_partial_shape(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.write(["A"])
    r.journal.checkpoint(r.last("A"))
    r.journal.close()
    (r.root / "CHECKPOINT.tmp").write_bytes(b"in progress")
    for snaps in (r.root / "snapshots", r.root.parent / "snapshots"):
        snaps.mkdir()
        (snaps / "acme.123.snap.tmp").write_bytes(b"snapshot temp")
    others = [r.root / "foo.wal.partial", r.root / f"{uuid7(1.8e9)}.wal.partial.bak"]
    for o in others:
        o.write_bytes(b"not ours")
    partial = r.root / partial_name(uuid7(1.8e9))
    partial.write_bytes(b"debris")
    r.journal = Journal.open(r.root, r.cfg, fs=r.fs)
    list(r.journal.replay())
    start = len(r.fs.log)
    p = r.journal.maintain(KnownHorizons({"A": r.last("A")}), 64)
    assert p.removed_partials == 1 and not partial.exists()
    assert (r.root / "CHECKPOINT.tmp").exists() and (r.root / "RECLAIM").exists()
    assert (r.root / "snapshots" / "acme.123.snap.tmp").exists()
    assert (r.root.parent / "snapshots" / "acme.123.snap.tmp").exists()
    assert all(o.exists() for o in others)
    ops = r.fs.log[start:]
    unlink_at = ops.index(("unlink", partial))
    assert ("fsync_dir", r.root) in ops[unlink_at:], "the unlink is made durable"


@pytest.mark.parametrize("segments", [3])
def test_reclaim_state_counts_are_incremental_and_honest(tmp_path: Path, segments: int) -> None:
    r = rig(tmp_path)
    r.write(["A"] * (7 * segments))
    r.write(["A"])
    state = r.journal.reclaim_state()
    frame_bytes = sum(o.lsn for _, o, _ in r.frames[-1:])  # the LSN is the byte count
    assert state.unreclaimed_bytes == frame_bytes
    assert state.segments == segments + 1
    assert state.oldest_unreclaimed_age is not None
    assert state.disk_bytes >= frame_bytes + (segments + 1) * HEADER_SIZE
    r.journal.checkpoint(r.last("A"))
    drain(r, KnownHorizons({"A": r.last("A")}))
    after = r.journal.reclaim_state()
    assert after.segments == 1
    assert after.unreclaimed_bytes == r.last("A").lsn - int(r.names()[0][:20])

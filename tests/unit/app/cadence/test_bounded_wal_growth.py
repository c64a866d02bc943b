"""RFC0052.3 (sustained ingest does not grow the WAL without bound) on the in-process node
rig, driven on a stepped clock the way the barrier and housekeeping threads would drive
it: nothing sleeps, every timer fires because the driver calls it.

The driver's second ``t`` runs, in this order: the timers due at ``t`` (housekeeping when
``t % housekeeping_secs == 0``, then the barrier when ``t % barrier_secs == 0`` — at a
coincident tick housekeeping goes first, the order that makes a segment wait longest),
the load of second ``t`` (after which any rotation-fired cut the turns left in
``barrier.pending`` runs at once, as the barrier thread would wake for it), a sample of
``reclaim_state()``, and a one-second clock step.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.cadence.barrier import CutOutcome
from tests.support.noderig import NodeRig
from wal import FloorMin, FloorPinned, Journal, ReclamationProgress, WalConfig, WalOffset
from wal.reclamation import ReclaimState
from wal.segment import HEADER_SIZE

BARRIER_SECS = 10
HOUSEKEEPING_SECS = 5
SEGMENT_AGE_SECS = 60
SEGMENT_MAX_BYTES = 64 * 1024
RECORDS_PER_FRAME = 5
# Long, fixed-width tags: every frame has the same size and a segment rolls every few
# simulated seconds without mining tens of thousands of records.
PAD = "x" * 300
TENANTS = ("ten-a", "ten-b", "ten-c")


def config() -> WalConfig:
    return WalConfig(
        segment_max_bytes=SEGMENT_MAX_BYTES,
        segment_age_secs=SEGMENT_AGE_SECS,
        barrier_secs=BARRIER_SECS,
        housekeeping_secs=HOUSEKEEPING_SECS,
        max_tenants=8,  # a small RECLAIM file, so disk_bytes is mostly segments
    )


def make_rig(tmp_path: Path) -> NodeRig:
    return NodeRig(
        tmp_path, config=config(), barrier_secs=BARRIER_SECS, housekeeping_secs=HOUSEKEEPING_SECS
    )


@dataclass(frozen=True)
class Appended:
    second: int
    tenant: str
    start: int  # the frame's first LSN
    mark: WalOffset  # its own end


@dataclass(frozen=True)
class Bound:
    """What the configuration and the load allow the WAL to hold (see ``derive_bound``)."""

    segments: int
    segment_bytes: int  # on-disk bytes of segments (disk_bytes minus the RECLAIM file)
    unreclaimed_bytes: int


def derive_bound(rate: int, frame: int) -> Bound:
    """The bound RFC0052.3 claims for a capacity-balanced load with a complete floor.

    ``rate`` is the frame bytes appended per simulated second, ``frame`` the size of one
    (every frame is the same size here), W = barrier_secs + housekeeping_secs.

    * A frame appended at second i (after the timers of i) is at or below the mark of
      the timer cut at the first barrier tick after i, so by i + barrier_secs it is in
      the checkpoint, and the same cut installs every tenant's snapshot at its folded
      horizon, which covers it. Its segment closes at the next append that does not fit
      (continuous load: by second i + 1). The first housekeeping pass after both — at
      worst the one after a coincident tick where housekeeping ran first — unlinks it:
      by i + barrier_secs + housekeeping_secs. (A rotation-fired cut only makes this
      sooner; the bound does not count on it.)
    * So after second t the only closed segments left have their last frame in the last
      W seconds, which appended W * rate bytes. Every closed segment but the oldest of
      them lies wholly inside that window, and a closed segment holds more than
      fill = segment_max_bytes - header - frame bytes (it rotated because the next frame
      did not fit). Closed survivors ≤ floor(W * rate / fill) + 1, plus the current
      segment: segments ≤ floor(W * rate / fill) + 2.
    * Each segment file is at most segment_max_bytes, so the segments' on-disk bytes are
      ≤ segments * segment_max_bytes; unreclaimed frame bytes ≤ W * rate plus the older
      part of the oldest survivor (< segment_max_bytes).
    """
    window = BARRIER_SECS + HOUSEKEEPING_SECS
    fill = SEGMENT_MAX_BYTES - HEADER_SIZE - frame
    segments = window * rate // fill + 2
    return Bound(
        segments=segments,
        segment_bytes=segments * SEGMENT_MAX_BYTES,
        unreclaimed_bytes=window * rate + SEGMENT_MAX_BYTES,
    )


@dataclass
class Driver:
    rig: NodeRig
    t: int = 0
    frames: list[Appended] = field(default_factory=list)
    passes: list[tuple[int, ReclamationProgress]] = field(default_factory=list)
    #: the current segment when each pass ran
    pass_current: list[uuid.UUID] = field(default_factory=list)
    cuts: list[tuple[int, CutOutcome]] = field(default_factory=list)
    samples: list[tuple[int, ReclaimState]] = field(default_factory=list)
    #: (second, what) whenever the current segment changed: "append" or "barrier_tick"
    rotations: list[tuple[int, str]] = field(default_factory=list)
    #: bytes appended in each second that had a load
    per_second: list[int] = field(default_factory=list)

    @property
    def journal(self) -> Journal:
        return self.rig.journal

    def _drain_pending(self) -> None:
        while self.rig.barrier.pending is not None:
            outcome = self.rig.barrier.step(timer=False)
            assert outcome is not None
            self.cuts.append((self.t, outcome))

    def _timers(self) -> None:
        if self.t > 0 and self.t % HOUSEKEEPING_SECS == 0:
            progress = self.rig.housekeeper.step()
            assert progress is not None, self.rig.housekeeper.runs
            self.passes.append((self.t, progress))
            self.pass_current.append(self.journal.current_segment)
        if self.t > 0 and self.t % BARRIER_SECS == 0:
            before = self.journal.current_segment
            outcome = self.rig.barrier.step(timer=True)
            assert outcome is not None
            self.cuts.append((self.t, outcome))
            if self.journal.current_segment != before:
                self.rotations.append((self.t, "barrier_tick"))
            self._drain_pending()

    def _load(self, tenants: Sequence[str]) -> None:
        begin = self.journal.end_lsn
        for tenant in tenants:
            before = self.journal.current_segment
            start = self.journal.end_lsn
            mark = self.rig.ingest(tenant, f"{tenant}-{self.t:05d}-{PAD}", RECORDS_PER_FRAME)
            self.frames.append(Appended(self.t, tenant, start, mark))
            if mark.segment != before:
                self.rotations.append((self.t, "append"))
        if tenants:
            self.per_second.append(self.journal.end_lsn - begin)
        self._drain_pending()

    def second(self, tenants: Sequence[str] = ()) -> ReclaimState:
        self._timers()
        self._load(tenants)
        state = self.journal.reclaim_state()
        self.samples.append((self.t, state))
        self.rig.clock.advance(1)
        self.t += 1
        return state

    def run_until(self, t_end: int) -> None:
        """Idle seconds (no load) up to and including ``t_end``."""
        while self.t <= t_end:
            self.second()

    # -- what the appends say about the segments -----------------------------------------

    def frame_size(self) -> int:
        sizes = {f.mark.lsn - f.start for f in self.frames}
        assert len(sizes) == 1, f"frames of different sizes: {sorted(sizes)}"
        return sizes.pop()

    def segments_of(self, tenant: str | None = None, before: int | None = None) -> set[uuid.UUID]:
        """Segments holding a frame of ``tenant`` (any) appended before second ``before``."""
        return {
            f.mark.segment
            for f in self.frames
            if (tenant is None or f.tenant == tenant) and (before is None or f.second < before)
        }

    def held_by_pin(self, tenant: str) -> list[tuple[int, ReclamationProgress, set[uuid.UUID]]]:
        """Per pass: (second, progress, the closed segments holding ``tenant``'s frames)."""
        return [
            (t, p, self.segments_of(tenant, before=t) - {current})
            for (t, p), current in zip(self.passes, self.pass_current, strict=True)
        ]

    def base_of(self, seg: uuid.UUID) -> int:
        return min(f.start for f in self.frames if f.mark.segment == seg)

    def name_of(self, seg: uuid.UUID) -> str:
        return f"{self.base_of(seg):020d}.wal"

    def bytes_in(self, seg: uuid.UUID) -> int:
        return sum(f.mark.lsn - f.start for f in self.frames if f.mark.segment == seg)


def reclaim_file_bytes(rig: NodeRig) -> int:
    """disk_bytes of a fresh root is one empty segment's header plus the RECLAIM file."""
    state = rig.journal.reclaim_state()
    assert state.segments == 1 and state.unreclaimed_bytes == 0
    return state.disk_bytes - HEADER_SIZE


SUSTAINED_SECS = 400


def test_rfc0052_3_sustained_balanced_ingest_keeps_the_wal_bounded(tmp_path: Path) -> None:
    """Three tenants, one frame each per second, for 400 simulated seconds: ~65 segments
    roll and the segment count, segment bytes and unreclaimed bytes stay under the bound
    ``derive_bound`` derives from the configuration and the measured rate."""
    rig = make_rig(tmp_path)
    try:
        overhead = reclaim_file_bytes(rig)
        d = Driver(rig)
        while d.t <= SUSTAINED_SECS:
            d.second(TENANTS)

        frame = d.frame_size()
        rate = 3 * frame
        assert set(d.per_second) == {rate}, "the load is not the constant rate the bound assumes"
        bound = derive_bound(rate, frame)
        rolled = len(d.segments_of())
        max_segments = max(s.segments for _, s in d.samples)
        max_disk = max(s.disk_bytes - overhead for _, s in d.samples)
        max_unreclaimed = max(s.unreclaimed_bytes for _, s in d.samples)
        observed = (
            f"bound {bound}; observed max segments={max_segments}, segment bytes={max_disk}, "
            f"unreclaimed={max_unreclaimed}; rolled {rolled}"
        )
        # The run is long enough that an unreclaiming WAL (#793) breaks the bound many
        # times over.
        assert rolled >= 10 * bound.segments, observed
        assert max_segments <= bound.segments, observed
        assert max_disk <= bound.segment_bytes, observed
        assert max_unreclaimed <= bound.unreclaimed_bytes, observed
        final = d.samples[-1][1]
        assert final.segments <= bound.segments
        # Reclamation kept pace: all but the bound's worth of the rolled segments went.
        removed = sum(p.removed_segments for _, p in d.passes)
        assert removed >= rolled - bound.segments, observed
        # A complete floor from the first timer cut on: never pinned once every tenant
        # has a snapshot, every cut flushed and stamped, no install failed.
        first_cut = BARRIER_SECS
        for t, p in d.passes:
            if t > first_cut:
                assert isinstance(p.floor, FloorMin), (t, p.floor)
        assert all(c.ok and c.snapshot_failures == 0 for _, c in d.cuts)
        assert any(c.reason == "rotation" for _, c in d.cuts)
        # The passes before the first cut find all three tenants pinned (no snapshot
        # yet), by design: their frames are above the checkpoint, so no event warns.
        assert any(isinstance(p.floor, FloorPinned) for t, p in d.passes if t <= first_cut)
        assert [n for n, _ in rig.events if n.startswith("wal.floor.")] == []
        # Every segment rotated on size under load, none on age.
        assert all(what == "append" for _, what in d.rotations)
        assert len(d.rotations) == rolled - 1
    finally:
        rig.close()


def test_rfc0052_3_after_the_last_append_the_wal_drains_by_the_timers_alone(
    tmp_path: Path,
) -> None:
    """After the last append at T (just after a barrier tick, so the cut that covers it
    is a whole barrier_secs away): by T + barrier_secs the checkpoint is the last mark,
    by T + barrier_secs + housekeeping_secs every closed segment is unlinked, and by
    T + segment_age_secs + barrier_secs + housekeeping_secs the last segment has rotated
    on a barrier tick (idle rotation, only once it was segment_age_secs old) and been
    unlinked by the following pass — leaving one empty segment and nothing
    unreclaimed."""
    rig = make_rig(tmp_path)
    try:
        d = Driver(rig)
        last_append = 200  # a multiple of barrier_secs: the append lands after that tick
        assert last_append % BARRIER_SECS == 0
        while d.t <= last_append:
            d.second(TENANTS)
        last_mark = d.frames[-1].mark
        current = rig.journal.current_segment
        assert last_mark.segment == current
        closed_at_t = set(rig.journal.segment_names()) - {d.name_of(current)}
        state = d.samples[-1][1]
        assert state.checkpoint is not None and state.checkpoint < last_mark
        last_segment_age, frames_in_last = rig.journal.current_segment_age()
        assert frames_in_last > 0

        # One barrier_secs later: the timer cut (no append since) stamped the last mark.
        d.run_until(last_append + BARRIER_SECS)
        assert rig.journal.last_checkpoint == last_mark
        assert rig.ledger.horizons() == {
            t: max(f.mark for f in d.frames if f.tenant == t) for t in TENANTS
        }
        # One housekeeping_secs more: every closed segment is gone, the last one stays.
        d.run_until(last_append + BARRIER_SECS + HOUSEKEEPING_SECS)
        names = set(rig.journal.segment_names())
        assert names == {d.name_of(current)}
        assert not (closed_at_t & names)
        state = rig.journal.reclaim_state()
        assert state.segments == 1
        assert state.unreclaimed_bytes == d.bytes_in(current) > 0
        assert rig.journal.current_segment == current  # not yet old enough to rotate

        # Within segment_age_secs + barrier_secs + housekeeping_secs of the last append.
        deadline = last_append + SEGMENT_AGE_SECS + BARRIER_SECS + HOUSEKEEPING_SECS
        d.run_until(deadline)
        idle = [(t, what) for t, what in d.rotations if t > last_append]
        assert len(idle) == 1 and idle[0][1] == "barrier_tick", d.rotations
        rotated_at = idle[0][0]
        created = last_append - last_segment_age
        assert rotated_at - created >= SEGMENT_AGE_SECS  # not before it was old enough
        assert rotated_at - created < SEGMENT_AGE_SECS + BARRIER_SECS  # the first tick after
        # The following pass unlinked it (at a coincident tick housekeeping ran first).
        next_pass = min(t for t, _ in d.passes if t > rotated_at)
        removing = [p for t, p in d.passes if t == next_pass]
        assert removing[0].removed_segments == 1
        assert rig.journal.current_segment != current
        assert d.name_of(current) not in rig.journal.segment_names()
        state = rig.journal.reclaim_state()
        assert state.segments == 1
        assert rig.journal.current_segment_age()[1] == 0
        assert state.unreclaimed_bytes == 0
        assert state.oldest_unreclaimed_age is None
        assert rig.journal.tenants_with_frames() == []
        assert state.checkpoint == last_mark
    finally:
        rig.close()


PINNED = "ten-c"
PINNED_EVERY = 30  # the pinned tenant appends one frame every PINNED_EVERY seconds
PINNED_RUN_SECS = 300


def test_rfc0052_3_a_pinned_tenant_makes_growth_visible_and_explained(tmp_path: Path) -> None:
    """One tenant's snapshot install always fails (its temp cannot be opened), so it
    never has a horizon: every segment holding one of its frames stays, the floor is
    Pinned naming it, lag rises with exactly those segments — and the segments holding
    only the other tenants' covered frames still go, so the growth is the pin's and
    nothing else."""
    rig = make_rig(tmp_path)
    try:
        fault = rig.fs.fail("open", f"{PINNED}.*.snap.tmp", count=None)
        d = Driver(rig)
        while d.t <= PINNED_RUN_SECS:
            d.second(["ten-a", "ten-b"] + ([PINNED] if d.t % PINNED_EVERY == 0 else []))
        # Let every covered segment go (one barrier plus one housekeeping period).
        d.run_until(d.t + BARRIER_SECS + HOUSEKEEPING_SECS)
        pinned_state = d.held_by_pin(PINNED)
        held = d.segments_of(PINNED) - {rig.journal.current_segment}
        final = d.passes[-1][1]
        assert pinned_state[-1][2] == held

        assert fault.fired > 0
        assert PINNED not in rig.ledger.horizons()
        assert set(rig.ledger.horizons()) == {"ten-a", "ten-b"}
        assert any(c.snapshot_failures == 1 for _, c in d.cuts)
        first_pinned = next(f.mark for f in d.frames if f.tenant == PINNED)
        frame = d.frame_size()
        bound = derive_bound(3 * frame, frame)  # the busiest second's rate
        for t, progress, held_then in pinned_state:
            if t <= BARRIER_SECS:
                continue  # before the first cut every tenant is pinned
            floor = progress.floor
            assert isinstance(floor, FloorPinned), (t, floor)
            assert floor.pinned == (PINNED,) and floor.tenants == 1
            # Its oldest surviving frame (the very first) never goes.
            assert floor.offset == first_pinned
            # Lag is at least the segments the pin holds (others may be briefly blocked
            # until the next cut covers them).
            assert progress.lag_segments >= len(held_then), t
            assert progress.lag_bytes >= sum(d.bytes_in(s) for s in held_then), t
        # Growth, explained: at every sample the WAL holds at most the pinned segments
        # plus the balanced bound; at the end exactly the pinned segments and the current.
        for t, state in d.samples:
            pinned_then = len(d.segments_of(PINNED, before=t + 1))
            assert state.segments <= pinned_then + bound.segments, t
        assert final.lag_segments == len(held) >= PINNED_RUN_SECS // PINNED_EVERY
        assert final.lag_bytes == sum(d.bytes_in(s) for s in held)
        early = next(p for t, p, _ in pinned_state if t > BARRIER_SECS)
        assert final.lag_segments > early.lag_segments
        assert final.lag_bytes > early.lag_bytes
        state = rig.journal.reclaim_state()
        assert state.pinned_tenants == 1
        assert state.segments > bound.segments  # visible growth beyond the balanced bound
        survivors = set(rig.journal.segment_names())
        expected = {d.name_of(s) for s in held} | {d.name_of(rig.journal.current_segment)}
        assert survivors == expected
        # The other tenants' covered segments went: every rolled segment without a
        # pinned frame is gone, and there were many.
        unpinned = d.segments_of() - d.segments_of(PINNED) - {rig.journal.current_segment}
        assert len(unpinned) >= 10
        assert not ({d.name_of(s) for s in unpinned} & survivors)
        assert state.unreclaimed_bytes == sum(
            d.bytes_in(s) for s in held | {rig.journal.current_segment}
        )
        # The state was announced once and never lifted.
        floor_events = [n for n, _ in rig.events if n.startswith("wal.floor.")]
        assert floor_events == ["wal.floor.pinned"]
    finally:
        rig.close()

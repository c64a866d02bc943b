"""``wal.segment_ledger``, driven directly (no I/O): which closed segments may be
unlinked under the checkpoint and the tenants' horizons, and the counters it keeps.
Reclamation through the journal (the unlinks, the RECLAIM file, the caps under load) is
tested in ``test_reclamation.py``."""

from __future__ import annotations

import uuid

from wal.segment_ledger import (
    FloorMin,
    FloorNone,
    FloorPinned,
    KnownHorizons,
    LedgerSegment,
    NoConsumerHorizons,
    SegmentLedger,
    SegState,
)
from wal.types import WalOffset

FRAME = 100


def build(layout: list[list[str | None]]) -> tuple[SegmentLedger, list[LedgerSegment]]:
    """Segments in order, each holding one frame of FRAME bytes per entry (None: an audit
    frame); the last one stays current. Frame ends are 100, 200, ... across the set."""
    ledger = SegmentLedger()
    segs: list[LedgerSegment] = []
    end = 0
    for frames in layout:
        seg = LedgerSegment(uuid.uuid4(), end, 0.0)
        ledger.add_segment(seg)
        segs.append(seg)
        for tenant in frames:
            end += FRAME
            ledger.on_frame(seg, tenant, end, FRAME)
    return ledger, segs


def at(seg: LedgerSegment, lsn: int) -> WalOffset:
    return WalOffset(seg.uuid, lsn)


def test_only_segments_at_or_below_the_checkpoint_pop() -> None:
    ledger, segs = build([["a"], ["a"], ["a"], ["a"]])
    ledger.apply_horizons(NoConsumerHorizons(), 100)
    assert ledger.pop_eligible(10) == []  # no checkpoint yet: nothing
    ledger.checkpoint = at(segs[1], 200)  # inclusive: the end of segment 1's last frame
    assert ledger.pop_eligible(10) == segs[:2]
    assert segs[0].state is SegState.RECLAIMING and ledger.reclaiming == 2


def test_the_current_segment_is_never_eligible() -> None:
    ledger, segs = build([["a"], ["a"]])
    ledger.apply_horizons(NoConsumerHorizons(), 100)
    ledger.checkpoint = at(segs[1], 10_000)
    assert ledger.pop_eligible(10) == [segs[0]]


def test_a_tenant_without_a_horizon_pins_its_segments() -> None:
    ledger, segs = build([["a", "b"], ["a"], ["b"], ["a"]])
    ledger.checkpoint = at(segs[3], 400)
    ledger.apply_horizons(KnownHorizons({"a": at(segs[3], 400)}), 100)
    # b has frames in 0 and 2 and no horizon: only segment 1 (a alone) may go
    assert ledger.pop_eligible(10) == [segs[1]]
    floor = ledger.derive_floor(KnownHorizons({"a": at(segs[3], 400)}))
    assert isinstance(floor, FloorPinned) and floor.pinned == ("b",)
    assert floor.offset == at(segs[0], 200)  # b's oldest surviving frame


def test_a_horizon_covers_a_segment_only_at_or_above_the_tenants_last_frame_in_it() -> None:
    ledger, segs = build([["a", "a"], ["a"], ["a"]])
    ledger.checkpoint = at(segs[2], 10_000)
    ledger.apply_horizons(KnownHorizons({"a": at(segs[0], 100)}), 100)
    assert ledger.pop_eligible(10) == []  # its last frame in segment 0 ends at 200
    ledger.apply_horizons(KnownHorizons({"a": at(segs[0], 200)}), 100)
    assert ledger.pop_eligible(10) == [segs[0]]


def test_audit_frames_are_governed_by_the_checkpoint_alone() -> None:
    ledger, segs = build([[None, None], ["a"]])
    ledger.apply_horizons(KnownHorizons({}), 100)
    ledger.checkpoint = at(segs[0], 200)
    assert ledger.pop_eligible(10) == [segs[0]]


def test_horizon_application_is_capped_and_resumes() -> None:
    ledger, segs = build([["a"], ["a"], ["a"], ["a"], ["a"]])
    horizons = KnownHorizons({"a": at(segs[4], 500)})
    assert ledger.horizon_remaining == 5
    assert ledger.apply_horizons(horizons, 2) == (2, True)
    assert ledger.horizon_remaining == 3
    applied, capped = ledger.apply_horizons(horizons, 100)
    # the current segment is applied only once it closes
    assert (applied, capped, ledger.horizon_remaining) == (2, False, 1)
    ledger.add_segment(LedgerSegment(uuid.uuid4(), 500, 0.0))
    assert ledger.apply_horizons(horizons, 100) == (1, False)
    assert ledger.horizon_remaining == 0


def test_removal_moves_the_counters_and_a_tenant_leaves_with_its_last_segment() -> None:
    ledger, segs = build([["a", "b"], ["b"], ["b"]])
    assert ledger.unreclaimed_bytes == 4 * FRAME
    ledger.apply_horizons(NoConsumerHorizons(), 100)
    ledger.checkpoint = at(segs[2], 10_000)
    popped = ledger.pop_eligible(10)
    assert popped == segs[:2] and ledger.unlink_remaining == 2
    ledger.removed(popped)
    assert ledger.unreclaimed_bytes == FRAME and ledger.unlink_remaining == 0
    assert sorted(ledger.tenants()) == ["b"]
    assert ledger.oldest_segment() is segs[2] and ledger.segment_count == 1
    assert ledger.oldest_frame("b") == at(segs[2], 400)


def test_a_failed_reclaim_goes_back_to_eligible_and_an_uncertain_one_is_replanned() -> None:
    ledger, segs = build([["a"], ["a"], ["a"]])
    ledger.apply_horizons(NoConsumerHorizons(), 100)
    ledger.checkpoint = at(segs[2], 10_000)
    first, second = ledger.pop_eligible(10)
    ledger.record_failed([first])
    ledger.mark_uncertain([second])
    assert first.state is SegState.LIVE and second.state is SegState.UNCERTAIN
    assert ledger.in_flight(10) == [second]
    assert ledger.pop_eligible(10) == [first]
    assert (ledger.reclaiming, ledger.uncertain) == (1, 1)


def test_the_floor_without_a_consumer_and_with_every_horizon_known() -> None:
    ledger, segs = build([["a"], ["b"], ["a"]])
    assert isinstance(ledger.derive_floor(NoConsumerHorizons()), FloorNone)
    floor = ledger.derive_floor(KnownHorizons({"a": at(segs[2], 300), "b": at(segs[1], 200)}))
    assert floor == FloorMin(at(segs[1], 200))

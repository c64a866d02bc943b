"""The segment ledger: which segments hold which tenants' frames, and which of them
may be unlinked — maintained incrementally so no housekeeping pass walks the backlog.

The eligibility rule (RFC 0052 §3.2, DESIGN.md §5.7), exactly: a closed segment may be
reclaimed when

* its highest frame offset is at or below the checkpoint (inclusive), and
* every tenant with a frame in it has a horizon at or above its last offset in it
  (inclusive: a horizon is a durably installed snapshot's folded frame), and
* a tenant with no horizon (no valid snapshot) pins every segment it has a frame in
  (strict: equality can never unlink a pinned tenant's frame).

Audit frames are governed by the checkpoint alone; the current segment is never
eligible. Under ``NoConsumerHorizons`` (no miner state exists) only the checkpoint governs.

The index, per RFC 0052 §3.7: every segment keeps the set of tenants still *blocking*
it (their horizon has not yet been applied past their last offset in it). Horizons are
applied per tenant from a cursor over that tenant's segments, oldest first, capped per
pass and round-robin across tenants; a cursor never moves back. A segment whose set
empties is pushed onto a heap keyed by its highest offset; a pass pops from the heap
while the head is at or below the checkpoint. A checkpoint advance stores a number and
nothing else (O(1)); a pinned oldest segment never shadows a later eligible one,
because eligibility is per segment, not a prefix.

Every figure the metrics read (unreclaimed bytes, lag, remaining work) is a counter
moved by these operations, O(1) to read and never re-derived by a scan.

The ledger does no I/O; the journal drives it under the journal mutex.
"""

from __future__ import annotations

import enum
import heapq
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .types import WalOffset


class SegState(enum.Enum):
    LIVE = 1
    RECLAIMING = 2  # popped by a plan; still counted until its unlink is verified
    UNCERTAIN = 3  # unlinked, but the parent fsync failed: re-verified next pass
    REMOVED = 4


@dataclass(frozen=True, slots=True)
class NoConsumerHorizons:
    """No miner state exists: the checkpoint alone governs (never the ingest receiver)."""

    name: str = "no_consumer"


@dataclass(frozen=True, slots=True)
class KnownHorizons:
    """The durable per-tenant snapshot horizons (from the SnapshotLedger only).

    A tenant with WAL frames and no entry here is pinned. ``unrecoverable`` names the
    tenants the caller already refuses as unrecoverable (RFC 0055): they are pinned like
    any tenant without a horizon, and a pass does not refuse itself over them — their
    state is decided by an operator at the next start, which halts naming them."""

    horizons: Mapping[str, WalOffset]
    name: str = "known"
    unrecoverable: frozenset[str] = frozenset()


SnapshotHorizons = NoConsumerHorizons | KnownHorizons


@dataclass(frozen=True, slots=True)
class FloorUnknown:
    """No pass has derived a floor yet: nothing is reclaimed, nothing is reported."""

    state: str = "unknown"


@dataclass(frozen=True, slots=True)
class FloorNone:
    """No snapshot consumer exists: the checkpoint alone governs."""

    state: str = "none"


@dataclass(frozen=True, slots=True)
class FloorMin:
    """The minimum over every tenant's horizon (None: no tenant holds any frame)."""

    offset: WalOffset | None
    state: str = "min"


@dataclass(frozen=True, slots=True)
class FloorPinned:
    """Some tenants with frames have no valid snapshot; the minimum includes their
    oldest surviving frames. ``oldest_pinned`` is the oldest of those frames alone: a pin
    above the checkpoint holds nothing the checkpoint would release (a new tenant
    waiting for its first cut), one at or below it does."""

    offset: WalOffset
    tenants: int
    pinned: tuple[str, ...] = ()
    oldest_pinned: WalOffset | None = None
    state: str = "pinned"


RetainFloor = FloorUnknown | FloorNone | FloorMin | FloorPinned


@dataclass(frozen=True, slots=True)
class ReclamationProgress:
    """What a pass did and what remains, as of the end of the ledger half that made it."""

    removed_segments: int = 0
    removed_partials: int = 0
    horizon_applied: int = 0  # (tenant, segment) horizon steps this pass applied
    capped: bool = False
    horizon_remaining: int = 0
    unlink_remaining: int = 0
    floor: RetainFloor = field(default_factory=FloorUnknown)
    lag_bytes: int = 0
    lag_segments: int = 0
    skipped: str = ""  # why segment planning was skipped this pass, when it was


class LedgerSegment:
    """The ledger's view of one surviving segment (the journal's segments extend it)."""

    __slots__ = (
        "uuid",
        "base",
        "created",
        "highest",
        "frame_bytes",
        "frames",
        "tenants",
        "blocking",
        "state",
        "closed",
        "scanned",
        "in_heap",
    )

    def __init__(self, seg_uuid: uuid.UUID, base: int, created: float) -> None:
        self.uuid = seg_uuid
        self.base = base
        self.created = created
        self.highest: int | None = None  # end of its last valid frame
        self.frame_bytes = 0
        self.frames = 0
        #: tenant -> [first frame end, last frame end] (tenant batch frames only)
        self.tenants: dict[str, list[int]] = {}
        self.blocking: set[str] = set()
        self.state = SegState.LIVE
        self.closed = False
        self.scanned = True
        self.in_heap = False

    @property
    def heap_key(self) -> int:
        # A segment holding no valid frame (sealed back to its header) blocks nothing.
        return -1 if self.highest is None else self.highest


class _TenantTrack:
    __slots__ = ("segments", "cursor", "head", "live")

    def __init__(self) -> None:
        self.segments: list[LedgerSegment] = []  # in base order
        self.cursor = 0  # segments[:cursor] have had this tenant's horizon applied
        self.head = 0  # segments[:head] are all removed
        self.live = 0  # surviving segments holding this tenant's frames

    def oldest(self) -> LedgerSegment:
        while self.segments[self.head].state is SegState.REMOVED:
            self.head += 1
        return self.segments[self.head]


class SegmentLedger:
    """Incremental eligibility index over the surviving segments (module docstring)."""

    def __init__(self) -> None:
        self._segments: dict[uuid.UUID, LedgerSegment] = {}
        self._order: list[LedgerSegment] = []  # base order, lazily compacted
        self._order_head = 0
        self._tenants: dict[str, _TenantTrack] = {}
        self._heap: list[tuple[int, int, uuid.UUID]] = []
        self._current: LedgerSegment | None = None
        self.checkpoint: WalOffset | None = None
        self._rr = 0
        self.mode_known: bool | None = None  # None until a pass says which
        # counters read by ReclaimState / ReclamationProgress
        self.unreclaimed_bytes = 0
        self.blocked_bytes = 0
        self.blocked_segments = 0
        self.horizon_remaining = 0
        self.heap_live = 0
        self.reclaiming = 0
        self.uncertain = 0
        self.floor: RetainFloor = FloorUnknown()
        self._in_flight: dict[uuid.UUID, LedgerSegment] = {}  # reclaiming or uncertain

    # -- membership -------------------------------------------------------------------

    def add_segment(self, seg: LedgerSegment) -> None:
        """A new current segment; the previous current closes."""
        prev = self._current
        self._segments[seg.uuid] = seg
        self._order.append(seg)
        self._current = seg
        if prev is not None:
            self.close(prev)

    def add_closed(self, seg: LedgerSegment) -> None:
        """A surviving older segment found at open (membership filled by ``on_frame``)."""
        self._segments[seg.uuid] = seg
        self._order.append(seg)
        seg.closed = True

    def set_current(self, seg: LedgerSegment) -> None:
        self._current = seg

    def close(self, seg: LedgerSegment) -> None:
        seg.closed = True
        if seg.state is not SegState.LIVE:
            return
        if seg.blocking:
            self.blocked_bytes += seg.frame_bytes
            self.blocked_segments += 1
        else:
            self._push(seg)

    def on_frame(self, seg: LedgerSegment, tenant: str | None, end: int, size: int) -> None:
        """Account one valid frame. Hot path: a few dict operations."""
        seg.frames += 1
        seg.frame_bytes += size
        seg.highest = end
        self.unreclaimed_bytes += size
        if not tenant:
            return  # audit frames: the checkpoint alone governs them
        span = seg.tenants.get(tenant)
        if span is not None:
            span[1] = end
            return
        seg.tenants[tenant] = [end, end]
        seg.blocking.add(tenant)
        track = self._tenants.get(tenant)
        if track is None:
            track = self._tenants[tenant] = _TenantTrack()
        track.segments.append(seg)
        track.live += 1
        self.horizon_remaining += 1

    def tenants(self) -> Iterable[str]:
        return self._tenants.keys()

    def oldest_frame(self, tenant: str) -> WalOffset | None:
        track = self._tenants.get(tenant)
        if track is None:
            return None
        seg = track.oldest()
        return WalOffset(seg.uuid, seg.tenants[tenant][0])

    def segments(self) -> list[LedgerSegment]:
        return [s for s in self._order[self._order_head :] if s.state is not SegState.REMOVED]

    def segment(self, seg_uuid: uuid.UUID) -> LedgerSegment | None:
        return self._segments.get(seg_uuid)

    def oldest_segment(self) -> LedgerSegment | None:
        order = self._order
        while self._order_head < len(order) and order[self._order_head].state is SegState.REMOVED:
            self._order_head += 1
        return order[self._order_head] if self._order_head < len(order) else None

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- a pass: horizons --------------------------------------------------------------

    def apply_horizons(self, horizons: SnapshotHorizons, budget: int) -> tuple[int, bool]:
        """Apply horizons to at most ``budget`` segments, round-robin across tenants.
        Returns (segments applied, whether the budget ran out with work left)."""
        infinite = isinstance(horizons, NoConsumerHorizons)
        known = {} if infinite else horizons.horizons  # type: ignore[union-attr]
        names = list(self._tenants)
        if not names or budget <= 0:
            return 0, False
        start = self._rr % len(names)
        rotated = names[start:] + names[:start]
        self._rr += 1
        active: list[tuple[str, _TenantTrack, int | None]] = []
        for name in rotated:
            track = self._tenants[name]
            if track.cursor >= len(track.segments):
                continue
            h = None if infinite else known.get(name)
            if not infinite and h is None:
                continue  # pinned: nothing to apply, and it costs nothing
            active.append((name, track, None if h is None else h.lsn))
        used = 0
        while active and used < budget:
            still: list[tuple[str, _TenantTrack, int | None]] = []
            for name, track, h in active:
                if used >= budget:
                    still.append((name, track, h))
                    continue
                if self._step(name, track, h):
                    used += 1
                    if track.cursor < len(track.segments):
                        still.append((name, track, h))
            active = still
        return used, bool(active)

    def _step(self, name: str, track: _TenantTrack, h: int | None) -> bool:
        """Advance ``name``'s cursor by one segment when its horizon covers it."""
        seg = track.segments[track.cursor]
        if seg.state is not SegState.REMOVED:
            if not seg.closed:
                return False  # the current segment: applied once it closes
            if h is not None and seg.tenants[name][1] > h:
                return False
            seg.blocking.discard(name)
            if not seg.blocking and seg.state is SegState.LIVE:
                self.blocked_bytes -= seg.frame_bytes
                self.blocked_segments -= 1
                self._push(seg)
        track.cursor += 1
        self.horizon_remaining -= 1
        return True

    # -- a pass: floor -----------------------------------------------------------------

    def derive_floor(self, horizons: SnapshotHorizons) -> RetainFloor:
        if isinstance(horizons, NoConsumerHorizons):
            self.floor = FloorNone()
            return self.floor
        known = horizons.horizons
        lowest: WalOffset | None = None
        pinned: list[str] = []
        pin_low: WalOffset | None = None
        for name in self._tenants:
            h = known.get(name)
            if h is None:
                pinned.append(name)
                first = self.oldest_frame(name)
                if first is not None and (pin_low is None or first.lsn < pin_low.lsn):
                    pin_low = first
            elif lowest is None or h.lsn < lowest.lsn:
                lowest = h
        if pinned:
            assert pin_low is not None
            offset = pin_low if lowest is None or pin_low.lsn <= lowest.lsn else lowest
            self.floor = FloorPinned(offset, len(pinned), tuple(sorted(pinned)[:16]), pin_low)
        else:
            self.floor = FloorMin(lowest)
        return self.floor

    # -- a pass: pops and outcomes -----------------------------------------------------

    def _push(self, seg: LedgerSegment) -> None:
        if seg is self._current or seg.in_heap:
            return
        seg.in_heap = True
        heapq.heappush(self._heap, (seg.heap_key, seg.base, seg.uuid))
        self.heap_live += 1

    def pop_eligible(self, cap: int) -> list[LedgerSegment]:
        """Pop at most ``cap`` eligible segments (at or below the checkpoint) and mark them
        reclaiming; the head is re-evaluated on every pass, so nothing is stranded."""
        out: list[LedgerSegment] = []
        mark = self.checkpoint
        if mark is None:
            return out
        heap = self._heap
        while heap and len(out) < cap:
            key, _, seg_uuid = heap[0]
            if key > mark.lsn:
                break
            heapq.heappop(heap)
            seg = self._segments.get(seg_uuid)
            if seg is None or not seg.in_heap:
                continue
            seg.in_heap = False
            self.heap_live -= 1
            seg.state = SegState.RECLAIMING
            self.reclaiming += 1
            self._in_flight[seg.uuid] = seg
            out.append(seg)
        return out

    def in_flight(self, cap: int) -> list[LedgerSegment]:
        """Up to ``cap`` segments left reclaiming or uncertain by an earlier pass (a failed
        unlink, an uncertain removal): re-planned first, oldest first."""
        out: list[LedgerSegment] = []
        for seg in self._in_flight.values():
            if len(out) >= cap:
                break
            out.append(seg)
        return out

    def record_failed(self, segs: Iterable[LedgerSegment]) -> None:
        """The RECLAIM write failed: nothing was unlinked; back to eligible."""
        for seg in segs:
            self._leave_reclaiming(seg)
            seg.state = SegState.LIVE
            self._push(seg)

    def mark_uncertain(self, segs: Iterable[LedgerSegment]) -> None:
        for seg in segs:
            if seg.state is SegState.RECLAIMING:
                self.reclaiming -= 1
                self.uncertain += 1
            seg.state = SegState.UNCERTAIN

    def removed(self, segs: Iterable[LedgerSegment]) -> None:
        """Verified unlinks: the segments leave the ledger and its accounting."""
        for seg in segs:
            if seg.state is SegState.REMOVED:
                continue
            self._leave_reclaiming(seg)
            seg.state = SegState.REMOVED
            del self._segments[seg.uuid]
            self.unreclaimed_bytes -= seg.frame_bytes
            for name in seg.tenants:
                track = self._tenants[name]
                track.live -= 1
                if track.live == 0:
                    # A tenant leaves the ledger with its last surviving segment.
                    self.horizon_remaining -= len(track.segments) - track.cursor
                    del self._tenants[name]

    def _leave_reclaiming(self, seg: LedgerSegment) -> None:
        if seg.state is SegState.RECLAIMING:
            self.reclaiming -= 1
        elif seg.state is SegState.UNCERTAIN:
            self.uncertain -= 1
        self._in_flight.pop(seg.uuid, None)

    @property
    def unlink_remaining(self) -> int:
        return self.heap_live + self.reclaiming + self.uncertain

    def progress(
        self,
        *,
        removed_segments: int = 0,
        removed_partials: int = 0,
        horizon_applied: int = 0,
        capped: bool = False,
        skipped: str = "",
    ) -> ReclamationProgress:
        floor = self.floor
        holds = isinstance(floor, FloorMin | FloorPinned)
        known = self.mode_known is True
        return ReclamationProgress(
            removed_segments=removed_segments,
            removed_partials=removed_partials,
            horizon_applied=horizon_applied,
            capped=capped,
            horizon_remaining=self.horizon_remaining if known else 0,
            unlink_remaining=self.unlink_remaining,
            floor=floor,
            lag_bytes=self.blocked_bytes if holds else 0,
            lag_segments=self.blocked_segments if holds else 0,
            skipped=skipped,
        )

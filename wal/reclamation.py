"""Reclamation: the capped pass that unlinks segments, as two ledger halves around a
file half, and the RECLAIM record it keeps durable. *When* a pass runs is the
housekeeping timer's business (``app/cadence/housekeeping.py``), not this module's.

``plan_reclamation`` (under the journal mutex) applies horizons within the cap,
derives the retain floor, pops stale partials first and then eligible segments, marks
them reclaiming and notes each tenant's last offset in them in the planned list.
``execute_reclamation`` (no journal mutex: appends continue) writes the RECLAIM slot
in place and fsyncs it, only then unlinks, then fsyncs the parent directory.
``commit_reclamation`` (under the mutex again) folds the outcome back:

* record write failed → nothing was unlinked; every popped segment is eligible again;
* an unlink failed → that segment stays reclaiming and is retried next pass;
* the parent fsync failed → every removal of the pass is uncertain: nothing leaves
  the ledger, ``reclaimed_through`` does not rise, the next pass re-verifies;
* otherwise the removed segments leave the ledger and ``reclaimed_through`` rises to
  the highest last-offset among them, per tenant (it never falls). It becomes durable
  at the next record write, which ``maintain`` performs at once.

The RECLAIM record is durable before the first unlink it accounts for. The consumer
mode is recorded by the first pass and persisted before that pass unlinks anything; a
pass whose mode differs is refused before anything is planned. A pass never allocates.

``Reclamation`` owns the in-memory RECLAIM record and its file (adopted at open by
``opening``, which applies the RECLAIM × CHECKPOINT × segments matrix). The record's
dictionary is the one tenant-id table both sidecars use (RFC 0055 §9.4): ``frontiers``
assigns PUBLISHED's ids in it, and ``checkpointing`` arms it before the first
CHECKPOINT; both go through the methods here.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import WalError
from .log import Log
from .reclaim_file import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    ConsumerMode,
    Geometry,
    PlannedUnlink,
    ReclaimEntry,
    ReclaimFile,
    ReclaimRecord,
    TenantCapacityExceeded,
)
from .segment import uuid7_time
from .segment_ledger import (
    KnownHorizons,
    LedgerSegment,
    NoConsumerHorizons,
    ReclamationProgress,
    RetainFloor,
    SnapshotHorizons,
)
from .types import RotationState, WalOffset

#: Horizon application is capped in (tenant, segment) steps, a constant multiple of the
#: unlink cap: each step is a few dictionary operations, so the pass stays O(cap) under
#: the journal mutex, while a node whose segments each hold many tenants still applies
#: whole segments' worth of horizons per pass.
APPLY_STEPS_PER_UNLINK = 8


class ReclaimError(WalError):
    """A housekeeping pass was refused or failed; ``progress`` says what it did."""

    error_type = "wal_reclaim"

    def __init__(self, message: str, progress: ReclamationProgress | None = None) -> None:
        super().__init__(message)
        self.progress = progress


class ModeMismatch(ReclaimError):
    error_type = "wal_reclaim_mode"


class UnrecoverableTenant(ReclaimError):
    """A tenant whose restorable horizon is below what was reclaimed from under it."""

    error_type = "wal_tenant_unrecoverable"

    def __init__(
        self, tenant: str, horizon: WalOffset | None, reclaimed_through: WalOffset, context: str
    ) -> None:
        have = "no restorable snapshot" if horizon is None else f"a restorable horizon at {horizon}"
        super().__init__(
            f"tenant {tenant!r} has {have}, but RECLAIM records its frames reclaimed through "
            f"{reclaimed_through} ({context}); its miner state cannot be rebuilt from the WAL. "
            f"Restore the tenant's snapshot, or accept the loss deliberately"
        )
        self.tenant = tenant
        self.horizon = horizon
        self.reclaimed_through = reclaimed_through


class StaleGap(ReclaimError):
    """A horizon's segment is gone and RECLAIM does not explain it."""

    error_type = "wal_stale_gap"


@dataclass(frozen=True, slots=True)
class ArchiveRequest:
    """A segment about to be unlinked, handed to the archive hook first. The file is
    closed and immutable (reclaiming); the hook reads it from ``path``."""

    path: Path
    base_lsn: int
    segment: uuid.UUID

    @property
    def name(self) -> str:
        return self.path.name


#: Copies a segment somewhere durable and verifies the copy; raises on any failure.
#: Called with the journal mutex released; the segment is unlinked only if it returns.
ArchiveHook = Callable[[ArchiveRequest], None]


class ArchiveError(ReclaimError):
    """The archive hook failed for some segments; each stays on disk (reclaiming) and
    is archived again, then unlinked, by a later pass."""

    error_type = "wal_archive"

    def __init__(
        self, failures: list[tuple[Path, BaseException]], progress: ReclamationProgress
    ) -> None:
        first_path, first_error = failures[0]
        super().__init__(
            f"archiving {len(failures)} segment(s) failed (first: {first_path.name}: "
            f"{first_error}); they were kept, not unlinked, and are retried next pass",
            progress,
        )
        self.failures = failures


@dataclass
class PlannedSegment:
    seg: LedgerSegment
    path: Path
    pairs: dict[str, WalOffset]
    #: left reclaiming or uncertain by an earlier pass (its planned entry predates this one)
    replanned: bool = False


@dataclass
class ReclaimPlan:
    """What the file half is to do; owned paths, no journal handle needed."""

    segments: list[PlannedSegment]
    partials: list[Path]
    write_record: bool
    progress: ReclamationProgress
    #: segments left eligible because a tenant in them has no RECLAIM id to be had
    refused: list[TenantCapacityExceeded] = field(default_factory=list)


@dataclass
class ReclaimOutcome:
    """What the file half did."""

    record_error: OSError | None = None
    removed: list[Path] = field(default_factory=list)
    failed: list[tuple[Path, OSError]] = field(default_factory=list)
    fsync_failed: bool = False
    #: segments the archive hook refused: kept, retried next pass
    archive_failed: list[tuple[Path, BaseException]] = field(default_factory=list)
    archived: list[Path] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReclaimState:
    """Everything RFC 0052 §3.5 exports, read O(1) under the journal mutex."""

    unflushed_bytes: int
    disk_bytes: int
    unreclaimed_bytes: int
    segments: int
    oldest_unreclaimed_age: float | None
    checkpoint: WalOffset | None
    floor: RetainFloor
    lag_bytes: int
    lag_segments: int
    pinned_tenants: int
    rotation: RotationState
    horizon_remaining: int
    unlink_remaining: int
    stale_partials: int
    last_progress: ReclamationProgress | None


class Reclamation:
    """The housekeeping pass and the RECLAIM record of one journal (module docstring).

    State: the record (``record``: the shared tenant-id table, reclaimed-through entries,
    planned unlinks, flags), its file, a version counter and the version last made
    durable (a record write is owed while they differ), whether the ``checkpoint_armed``
    flag is durable, the planned-entry index of the pass in progress, and the last
    pass's progress. The record is read and changed under the journal mutex; writes of
    it are serialised by their own lock and run without the journal mutex.
    """

    def __init__(self, log: Log, archive: ArchiveHook | None) -> None:
        self._log = log
        #: copies a segment before housekeeping unlinks it (``wal.archive``); None: off
        self._archive = archive
        self.record = ReclaimRecord()
        self._file: ReclaimFile | None = None
        self._record_lock = threading.Lock()
        self._version = 0
        self._durable_version = 0
        self._armed_durable = False
        self._planned_index: dict[uuid.UUID, PlannedUnlink] = {}
        self._last_progress: ReclamationProgress | None = None

    # -- the record and its file ---------------------------------------------------------

    def adopt(self, file: ReclaimFile, record: ReclaimRecord, *, armed_durable: bool) -> None:
        """At open: the RECLAIM file and the record the matrix settled on."""
        self._file = file
        self.record = record
        self._armed_durable = armed_durable

    @property
    def file(self) -> ReclaimFile:
        assert self._file is not None
        return self._file

    def regrow(self, geometry: Geometry) -> None:
        """At open: rebuild the file at a larger geometry through ``RECLAIM.new``
        (raises OSError; the old file stays in force)."""
        self._file = self.file.rebuild(geometry, self.record)

    def write_at_open(self) -> None:
        """At open: write the reconciled record at once (raises OSError)."""
        self.file.write(self.record)

    def release(self) -> None:
        """Close the file (a refused open, or ``close``)."""
        if self._file is not None and not self._file.closed:
            self._file.close()

    def tenant_capacity(self) -> int:
        # The configured bound, never the file's larger stored geometry: a root opened
        # with a lowered max_tenants must still reopen under that same configuration.
        return min(self.file.geometry.max_tenants, self._log.config.max_tenants)

    def touch_locked(self) -> None:
        """The in-memory record changed: a write is owed."""
        self._version += 1

    def write_record(self) -> None:
        """Write the in-memory record to the inactive slot (raises OSError)."""
        lock = self._log.lock
        with self._record_lock:
            with lock:
                snapshot = self.record.copy()
                version = self._version
            self.file.write(snapshot)
            with lock:
                self.record.generation = snapshot.generation
                self._durable_version = max(self._durable_version, version)
                if snapshot.flags & FLAG_CHECKPOINT_ARMED:
                    self._armed_durable = True

    def arm_locked(self) -> bool:
        """Before a CHECKPOINT: True when ``checkpoint_armed`` is not yet durable (the
        flag is set; the caller writes the record before any CHECKPOINT can exist).
        Decided on what is durable, not on the in-memory flag: a failed arming write
        must be retried before any CHECKPOINT exists."""
        if self._armed_durable:
            return False
        self.record.flags |= FLAG_CHECKPOINT_ARMED
        self.touch_locked()
        return True

    def see_locked(self) -> bool:
        """After a CHECKPOINT: True when ``checkpoint_seen`` was just set (a write is owed)."""
        if self.record.flags & FLAG_CHECKPOINT_SEEN:
            return False
        self.record.flags |= FLAG_CHECKPOINT_SEEN
        self.touch_locked()
        return True

    # -- the ledger half ---------------------------------------------------------------

    def prepare(self, horizons: SnapshotHorizons, cap: int) -> ReclaimPlan:
        mode = (
            ConsumerMode.NO_CONSUMER
            if isinstance(horizons, NoConsumerHorizons)
            else ConsumerMode.KNOWN
        )
        # The planned array holds at most the geometry's max_unlinks records.
        cap = max(0, min(cap, self.file.geometry.max_unlinks))
        log = self._log
        with log.lock:
            record = self.record
            ledger = log.ledger
            if record.consumer_mode not in (ConsumerMode.UNRECORDED, mode):
                raise ModeMismatch(
                    f"housekeeping pass with mode {mode.name} refused: RECLAIM records mode "
                    f"{ConsumerMode(record.consumer_mode).name} for this root",
                    ledger.progress(skipped="mode_mismatch"),
                )
            self._planned_index = {p.segment: p for p in record.planned}
            partials = log.partials[:cap]
            budget = cap - len(partials)
            skipped = ""
            planned: list[LedgerSegment] = []
            capped = False
            applied = 0
            replanned_ids: set[uuid.UUID] = set()
            if not log.rebuilt:
                skipped = "ledger_not_rebuilt"
            else:
                if isinstance(horizons, KnownHorizons):
                    self._refuse_unrecoverable_locked(horizons.horizons, horizons.unrecoverable)
                if record.consumer_mode is ConsumerMode.UNRECORDED:
                    record.consumer_mode = mode
                    self.touch_locked()
                ledger.mode_known = mode is ConsumerMode.KNOWN
                replanned = ledger.in_flight(max(budget, 0))
                planned.extend(replanned)
                replanned_ids = {seg.uuid for seg in replanned}
                applied, apply_capped = ledger.apply_horizons(
                    horizons, APPLY_STEPS_PER_UNLINK * cap
                )
                ledger.derive_floor(horizons)
                room = budget - len(planned)
                if ledger.checkpoint is None:
                    skipped = "no_checkpoint"
                elif room > 0:
                    planned.extend(ledger.pop_eligible(room))
                capped = apply_capped or (
                    len(partials) + len(planned) >= cap
                    and (ledger.heap_live > 0 or len(log.partials) > len(partials))
                )
            plan_segments: list[PlannedSegment] = []
            refused: list[TenantCapacityExceeded] = []
            for seg in planned:
                pairs = {t: WalOffset(seg.uuid, span[1]) for t, span in seg.tenants.items()}
                try:
                    self._plan_into_record_locked(seg, pairs)
                except TenantCapacityExceeded as exc:
                    # A tenant RECLAIM has no id for cannot be recorded, so this segment
                    # cannot go; it returns to eligible and the rest of the pass goes on.
                    ledger.record_failed([seg])
                    refused.append(exc)
                    continue
                plan_segments.append(
                    PlannedSegment(seg, Log.seg(seg).path, pairs, seg.uuid in replanned_ids)
                )
            if refused:
                skipped = skipped or "tenant_capacity"
            write_record = bool(plan_segments) or self._version > self._durable_version
            progress = ledger.progress(horizon_applied=applied, capped=capped, skipped=skipped)
            return ReclaimPlan(plan_segments, partials, write_record, progress, refused)

    def _plan_into_record_locked(self, seg: LedgerSegment, pairs: Mapping[str, WalOffset]) -> None:
        record = self.record
        capacity = self.tenant_capacity()
        needed = [t for t in pairs if record.slot_of(t) is None]
        if record.next_slot_id + len(needed) > capacity:
            raise TenantCapacityExceeded(needed[0], record.next_slot_id, capacity)
        slot_pairs = {record.assign_slot(t, capacity): off for t, off in pairs.items()}
        existing = self._planned_index.get(seg.uuid)
        if existing is not None:
            existing.pairs = slot_pairs
        else:
            entry = PlannedUnlink(seg.uuid, slot_pairs)
            record.planned.append(entry)
            self._planned_index[seg.uuid] = entry
        self.touch_locked()

    def _refuse_unrecoverable_locked(
        self, horizons: Mapping[str, WalOffset], known_bad: frozenset[str] = frozenset()
    ) -> None:
        record = self.record
        for tenant in self._log.ledger.tenants():
            if tenant in known_bad:
                continue  # already refused by the caller; pinned, the pass goes on
            slot = record.slot_of(tenant)
            if slot is None:
                continue
            entry = record.entries.get(slot)
            if entry is None or entry.mode is not ConsumerMode.KNOWN:
                continue
            h = horizons.get(tenant)
            if h is None or h.lsn < entry.reclaimed_through.lsn:
                raise UnrecoverableTenant(
                    tenant, h, entry.reclaimed_through, "housekeeping refused the pass"
                )

    # -- the file half -----------------------------------------------------------------

    def execute(self, plan: ReclaimPlan) -> ReclaimOutcome:
        """Record, unlinks, parent fsync — with the journal mutex released."""
        outcome = ReclaimOutcome()
        fs = self._log.fs
        segments = plan.segments
        if plan.write_record:
            try:
                self.write_record()
            except OSError as exc:
                outcome.record_error = exc
                segments = []  # nothing the record accounts for may be unlinked
        touched = False
        doomed = list(plan.partials)
        archive = self._archive
        for p in segments:
            if archive is not None:
                try:
                    archive(ArchiveRequest(p.path, p.seg.base, p.seg.uuid))
                except Exception as exc:  # noqa: BLE001 - the segment stays; reported below
                    outcome.archive_failed.append((p.path, exc))
                    continue
                outcome.archived.append(p.path)
            doomed.append(p.path)
        for path in doomed:
            try:
                fs.unlink(path)
            except FileNotFoundError:
                outcome.removed.append(path)  # already gone: the removal completed
            except OSError as exc:
                outcome.failed.append((path, exc))
            else:
                outcome.removed.append(path)
                touched = True
        if touched or outcome.removed:
            try:
                fs.fsync_dir(self._log.root)
            except OSError:
                outcome.fsync_failed = True
        return outcome

    # -- the ledger half again ---------------------------------------------------------

    def commit(self, plan: ReclaimPlan, outcome: ReclaimOutcome) -> ReclamationProgress:
        log = self._log
        with log.lock:
            ledger = log.ledger
            record = self.record
            removed = set(outcome.removed)
            removed_partials = 0
            if not outcome.fsync_failed:
                kept = []
                for p in log.partials:
                    if p in removed:
                        removed_partials += 1
                    else:
                        kept.append(p)
                log.partials = kept
            done: list[PlannedSegment] = []
            if outcome.record_error is not None:
                # Nothing this pass unlinked. Segments it popped go back to eligible; one an
                # earlier pass left reclaiming or uncertain keeps its state and its planned
                # entry (its file may already be gone).
                fresh = [p for p in plan.segments if not p.replanned]
                ledger.record_failed(p.seg for p in fresh)
                self._drop_planned_locked({p.seg.uuid for p in fresh})
            elif outcome.fsync_failed:
                uncertain = [p for p in plan.segments if p.path in removed]
                ledger.mark_uncertain(p.seg for p in uncertain)
                uuids = {p.seg.uuid for p in uncertain}
                for planned in record.planned:
                    if planned.segment in uuids:
                        planned.uncertain = True
                self.touch_locked()
            else:
                done = [p for p in plan.segments if p.path in removed]
                log.removed_locked([p.seg for p in done])
                ledger.removed(p.seg for p in done)
                self._raise_reclaimed_locked(done)
                self._drop_planned_locked({p.seg.uuid for p in done})
            progress = ledger.progress(
                removed_segments=len(done),
                removed_partials=removed_partials,
                horizon_applied=plan.progress.horizon_applied,
                capped=plan.progress.capped,
                skipped=plan.progress.skipped,
            )
            self._last_progress = progress
            return progress

    def _raise_reclaimed_locked(self, done: list[PlannedSegment]) -> None:
        if not done:
            return
        record = self.record
        mode = ConsumerMode(record.consumer_mode)
        capacity = self.tenant_capacity()
        for p in done:
            for tenant, offset in p.pairs.items():
                slot = record.assign_slot(tenant, capacity)
                entry = record.entries.get(slot)
                if entry is None:
                    record.entries[slot] = ReclaimEntry(mode, offset)
                elif offset.lsn > entry.reclaimed_through.lsn:
                    record.entries[slot] = ReclaimEntry(mode, offset)
        self.touch_locked()

    def _drop_planned_locked(self, uuids: set[uuid.UUID]) -> None:
        if not uuids:
            return
        self.record.planned = [p for p in self.record.planned if p.segment not in uuids]
        self.touch_locked()

    # -- the whole pass ----------------------------------------------------------------

    def maintain(self, horizons: SnapshotHorizons, cap: int) -> ReclamationProgress:
        """prepare → file half → commit, then make the raised ``reclaimed_through``
        durable. Raises ``ReclaimError`` (carrying progress) on a refused or failed pass."""
        plan = self.prepare(horizons, cap)
        outcome = self.execute(plan)
        progress = self.commit(plan, outcome)
        with self._log.lock:
            dirty = self._version > self._durable_version
        if dirty and outcome.record_error is None:
            try:
                self.write_record()
            except OSError as exc:
                raise ReclaimError(
                    f"the RECLAIM write after the pass failed: {exc}; it is retried next pass",
                    progress,
                ) from exc
        if outcome.record_error is not None:
            raise ReclaimError(
                f"writing RECLAIM failed: {outcome.record_error}; nothing was unlinked",
                progress,
            )
        if outcome.failed:
            first_path, first_error = outcome.failed[0]
            raise ReclaimError(
                f"{len(outcome.failed)} unlink(s) failed (first: {first_path}: {first_error}); "
                f"retried next pass",
                progress,
            )
        if outcome.fsync_failed:
            raise ReclaimError(
                "the directory fsync after the unlinks failed; the removals are uncertain and "
                "are re-verified next pass",
                progress,
            )
        if outcome.archive_failed:
            raise ArchiveError(outcome.archive_failed, progress)
        if plan.refused:
            # The rest of the pass committed; the refusal names the tenant and the limit.
            raise plan.refused[0]
        return progress

    # -- recovery's check ----------------------------------------------------------------

    def check_restorable(self, restorable: Mapping[str, WalOffset | None]) -> None:
        """After the ledger is rebuilt: refuse to start when a tenant that still has
        frames has a restorable horizon below what was reclaimed from under it, or when
        a horizon's segment is gone without RECLAIM explaining it (RFC 0052 §3.2)."""
        log = self._log
        with log.lock:
            if not log.rebuilt:
                raise WalError("check_restorable needs the rebuilt ledger (replay first)")
            record = self.record
            ledger = log.ledger
            for tenant in list(ledger.tenants()):
                slot = record.slot_of(tenant)
                entry = record.entries.get(slot) if slot is not None else None
                h = restorable.get(tenant)
                if entry is not None and entry.mode is ConsumerMode.KNOWN:
                    if h is None or h.lsn < entry.reclaimed_through.lsn:
                        raise UnrecoverableTenant(
                            tenant, h, entry.reclaimed_through, "refusing to start"
                        )
            for tenant, h in restorable.items():
                if h is None or ledger.segment(h.segment) is not None:
                    continue
                if any(q.explains(h.segment, h.lsn) for q in log.quarantined):
                    continue  # a recorded loss (``ourios wal quarantine``), not a stale gap
                slot = record.slot_of(tenant)
                entry = record.entries.get(slot) if slot is not None else None
                if entry is None or entry.reclaimed_through.lsn < h.lsn:
                    through = "nothing" if entry is None else str(entry.reclaimed_through)
                    raise StaleGap(
                        f"stale gap for tenant {tenant!r}: its snapshot horizon {h} lies in "
                        f"segment {h.segment}, which is gone, but RECLAIM records {through} "
                        f"reclaimed for it; a segment was removed outside the WAL. Refusing "
                        f"to start"
                    )

    # -- state -------------------------------------------------------------------------

    def state_locked(self, rotation: RotationState) -> ReclaimState:
        """What RFC 0052 §3.5 exports, O(1): every figure is a counter."""
        log = self._log
        ledger = log.ledger
        unflushed = log.end_lsn - log.synced_lsn
        disk_bytes = log.disk_bytes + self.file.geometry.file_size
        now = log.clock()
        progress = ledger.progress()
        oldest = ledger.oldest_segment()
        age: float | None = None
        if ledger.unreclaimed_bytes > 0 and oldest is not None:
            age = max(0.0, now - uuid7_time(oldest.uuid))
        floor = ledger.floor
        pinned = getattr(floor, "tenants", 0)
        return ReclaimState(
            unflushed_bytes=unflushed,
            disk_bytes=disk_bytes,
            unreclaimed_bytes=ledger.unreclaimed_bytes,
            segments=ledger.segment_count,
            oldest_unreclaimed_age=age,
            checkpoint=ledger.checkpoint,
            floor=floor,
            lag_bytes=progress.lag_bytes,
            lag_segments=progress.lag_segments,
            pinned_tenants=pinned,
            rotation=rotation,
            horizon_remaining=progress.horizon_remaining,
            unlink_remaining=progress.unlink_remaining,
            stale_partials=len(log.partials),
            last_progress=self._last_progress,
        )

    def reclaimed_through(self, tenant: str) -> tuple[ConsumerMode, WalOffset] | None:
        """What RECLAIM records as reclaimed from under ``tenant`` (after open reconciled
        planned entries against the directory), with the mode the pass ran under; None
        when nothing was. Settlement's proof of loss (RFC 0055 §9.4)."""
        with self._log.lock:
            slot = self.record.slot_of(tenant)
            entry = self.record.entries.get(slot) if slot is not None else None
            return None if entry is None else (entry.mode, entry.reclaimed_through)

    def tenants_with_frames(self) -> list[str]:
        """Tenants the ledger holds frames for (after the rebuild)."""
        with self._log.lock:
            return sorted(self._log.ledger.tenants())

    def record_flags(self) -> int:
        with self._log.lock:
            return self.record.flags

"""Recovery: the start-up order of DESIGN.md §6, before any listener starts.

1. ``load_all_durable`` the snapshots (after fsyncing the directory and its parent) and
   restore each tenant's miner from the one that decodes and restores;
2. replay the WAL (its walk rebuilds the segment ledger as a by-product) with the
   gates of DESIGN.md §5.8 / §13, per tenant with restored horizon S, checkpoint X and
   the tenant's PUBLISHED frontiers R (records) and A (audit), when it has them:

   * a frame at or below S is already folded: skipped (not mined);
   * above S it feeds the tenant's miner;
   * its records reach the sink only above max(S, R) — R governs its tenant and is
     never maxed with X, so a tenant whose records never published (an unrecoverable
     one, its frontier held back while X advanced for everyone else) is replayed in
     full; a tenant with no records frontier falls back to max(S, X) (at or below X
     everything is in the store, and (X, S] too when the snapshot was installed before a
     failed checkpoint write, S > X); one marked terminal with no frontier has nothing
     published since S;
   * the template events the miner regenerates reach the audit sink only above A, or X
     for a tenant without one (the barrier drained the audit sink before it stamped X);
     the rest are suppressed and counted — except an event of a template this replay
     minted afresh (an id above the allocator's high-water at start), which no published
     event binds and which is forwarded once (RFC0052.10, 2026-10-06). Stored audit
     frames are never replayed;
   * a tenant whose entry has the ``publishing`` bit (a settlement's intent, RFC 0055
     §9.4, not confirmed) has R = A = the frontier in force *before* that settlement:
     none of its span (R, E] is known to be in the store, so none of it is suppressed.
     Some of it may be — the settlement was killed between its publish and its marks —
     so the span's frames are forwarded *staged* (``sink.buffers``), exactly as the
     settlement staged them: their records, and the events of templates the snapshot
     holds, under names those rows derive, written with the conditional create; what
     the settlement's attempt wrote is found there and not written again, what it did
     not write is written now. The events of templates this replay mints are its own
     (fresh ids no stored row names) and are forwarded as above.

   * nothing an object published before the restart holds is forwarded again (issue
     16, ``app.ingest.landed``): ``prepare`` starts asking the store which objects the
     publish intents above the gates name exist, and the replay waits for the answer
     before its first frame; a frame's rows of a day a present records object claims,
     and a template event (same id, same version) a present audit object claims, are
     suppressed and counted (``records_landed``, ``audit_events_landed``);

3. ``check_restorable``: a tenant that still has frames and whose restorable horizon is
   below what RECLAIM says was reclaimed from under it refuses the start, naming it;
4. publish what replay buffered, and only if all of it reached the store confirm each
   intent (its tenant's marks raised to the span's end, the bit cleared: the span is
   in the store; a tenant whose replay failed is left to its settlement) and write
   post-recovery snapshots at each tenant's own folded horizon (a snapshot above X
   suppresses (X, S] on the next replay, so those rows must be in the store first; a
   tenant replay did not touch keeps its restored one); the SnapshotLedger is seeded
   from what installed, never from what was attempted;
5. the tenant admission table is seeded with every tenant the miner now holds, before
   any listener exists (more than ``max_tenants`` refuses the start).

A restarted node has no mark until its first acknowledged turn: replay sets none.

**A payload that does not decode** (DESIGN.md §6): the decoder tries each replayed
payload up to ``wal.frame_decode_attempts`` times — on the workers, a worker's exception
(a ``MemoryError`` included) or its death counting as one, each retry on the next
worker — and then yields ``Undecodable`` instead of failing the start. The frame is
*isolated*: it is not mined (its tenant's tree is as if the batch was never sent), its
payload is kept byte for byte in ``<data_dir>/quarantine/frames/`` with a record of what
it was (``app.node.frame_quarantine``), ``replay.frame_isolated`` names its segment,
byte offset, tenant and error, and the replay goes on with every other frame. A
transient fault clears within the attempts and loses nothing; a permanent one loses the
batch from the store, and the loss is named and its bytes kept for re-sending.

**A stop during the replay** (``cancel``): the replay ends at its next frame, the
decoder abandons its window, and what was not turned stays in the WAL for the next
start (nothing replayed is ever a mark, so no checkpoint passes it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.base.batch import FlatBatch
from app.ingest.landed import Landed, LandedCheck
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.template_ids import FileTemplateIdAllocator
from app.ingest.mining.tenant_miner import TenantMiner
from app.ingest.pipeline import Pipeline
from app.ingest.settlement import ReplayGates
from app.ingest.snapshot_store import SnapshotLedger, SnapshotState, SnapshotStore
from app.node.frame_quarantine import keep_frame
from app.receive.otlp import decode_flat
from sink import ObjectStore, StoreError
from wal import (
    HEADER_SIZE,
    Frame,
    FrameKind,
    IntentRecord,
    Journal,
    ObjectKind,
    PublishedMarks,
    PublishedWriteError,
    Replay,
    WalOffset,
)

log = logging.getLogger("ourios.recovery")

#: Default of ``wal.frame_decode_attempts``.
DEFAULT_DECODE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A replayed payload that failed to decode ``attempts`` times (module docstring)."""

    error: str
    attempts: int


class DecodeStopped(Exception):
    """The decoder ended before its input did — the replay's stop, or its workers
    stopping: what it did not yield is not replayed (it stays in the WAL)."""


class Decoder(Protocol):
    """Decodes replayed payloads ``(tenant, payload)`` into batches, yielded in input
    order; a payload that fails ``attempts`` times yields ``Undecodable``. Raises
    ``DecodeStopped`` once ``stop`` is set (between payloads, or while it waits)."""

    def __call__(
        self, frames: Iterable[tuple[str, bytes]], *, stop: threading.Event, attempts: int
    ) -> Iterator[FlatBatch | Undecodable]: ...


@dataclass(frozen=True, slots=True)
class IsolatedFrame:
    """A replayed frame isolated because its payload did not decode
    (``replay.frame_isolated``)."""

    tenant: str
    frame: str  # its end offset, ``<lsn>@<segment uuid>``
    segment: str  # the segment file's name
    offset: int  # the frame's first byte in that file
    bytes: int  # its payload
    attempts: int
    error: str
    #: its records were published before the restart (at or below the gates): only the
    #: template view of them is missing, nothing of the store
    in_store: bool
    saved: str | None  # where its payload was kept, None when that failed
    save_error: str = ""

    def fields(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "frame": self.frame,
            "segment": self.segment,
            "offset": self.offset,
            "bytes": self.bytes,
            "attempts": self.attempts,
            "error": self.error,
            "in_store": self.in_store,
            "saved": self.saved,
            "save_error": self.save_error,
            "action": "the frame is not mined and its records are not published"
            + (" (they were before the restart)" if self.in_store else "")
            + "; its payload is kept byte for byte in `saved` (an OTLP protobuf request: "
            "re-send it for the tenant once it decodes); every other frame is replayed",
        }


#: The counter bits of a template id (node ordinal << 48 | counter).
COUNTER_MASK = (1 << 48) - 1


@dataclass
class RecoveryReport:
    frames: int = 0
    frames_skipped: int = 0  # at or below the tenant's snapshot horizon
    records_replayed: int = 0
    records_suppressed: int = 0
    audit_events_suppressed: int = 0
    audit_frames_ignored: int = 0
    snapshots_restored: int = 0
    snapshots_undecodable: dict[str, str] = field(default_factory=dict)
    snapshots_written: int = 0
    snapshot_failures: int = 0
    #: frames left to settlement: the one whose mining failed and the tenant's later ones
    frames_unmined: int = 0
    #: tenant -> the frame whose mining failed during the replay
    unmined: dict[str, str] = field(default_factory=dict)
    stale_snapshot_temps: int = 0
    #: frame -> error: frames isolated because their payload did not decode
    isolated: dict[str, str] = field(default_factory=dict)
    tenants: set[str] = field(default_factory=set)
    torn_segments: list[str] = field(default_factory=list)
    checkpoint: WalOffset | None = None
    #: tenants PUBLISHED holds frontiers for (their gates are their own)
    frontiers: int = 0
    #: tenant -> the span of its unconfirmed settlement intent, republished staged
    intents: dict[str, str] = field(default_factory=dict)
    #: tenants whose intent this start confirmed
    intents_confirmed: int = 0
    #: objects published above their tenants' gates before the restart (publish
    #: intents) that recovery asked the store about, and those it found
    objects_checked: int = 0
    objects_found: int = 0
    #: of the suppressed records and events, those such an object already holds
    records_landed: int = 0
    audit_events_landed: int = 0
    seconds: float = 0.0

    def fields(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "frames_skipped": self.frames_skipped,
            "records_replayed": self.records_replayed,
            "records_suppressed": self.records_suppressed,
            "audit_events_suppressed": self.audit_events_suppressed,
            "audit_frames_ignored": self.audit_frames_ignored,
            "snapshots_restored": self.snapshots_restored,
            "snapshots_undecodable": sorted(self.snapshots_undecodable),
            "snapshots_written": self.snapshots_written,
            "snapshot_failures": self.snapshot_failures,
            "frames_unmined": self.frames_unmined,
            "unmined": dict(sorted(self.unmined.items())),
            "frames_isolated": len(self.isolated),
            "isolated": dict(sorted(self.isolated.items())),
            "tenants": len(self.tenants),
            "torn_segments": self.torn_segments,
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "frontiers": self.frontiers,
            "intents": dict(sorted(self.intents.items())),
            "intents_confirmed": self.intents_confirmed,
            "objects_checked": self.objects_checked,
            "objects_found": self.objects_found,
            "records_landed": self.records_landed,
            "audit_events_landed": self.audit_events_landed,
            "seconds": round(self.seconds, 3),
        }


def recover(
    journal: Journal,
    pipeline: Pipeline,
    store: SnapshotStore | None = None,
    ledger: SnapshotLedger | None = None,
    decode: Decoder | None = None,
    *,
    intents: list[IntentRecord] | None = None,
    objects: ObjectStore | None = None,
) -> RecoveryReport:
    """Recovery on the calling thread, start to end (module docstring): what ``ourios
    serve`` does in steps on its threads (``Recovery``), run in one go (tests, tools)."""
    recovery = Recovery(journal, pipeline, store, ledger, decode, intents=intents, objects=objects)
    recovery.prepare()
    for item in recovery.items():
        recovery.turn(item)
    recovery.replayed()
    return recovery.finish()


@dataclass(slots=True)
class ReplayItem:
    """A replayed frame to turn: decoded (or its refusal), with its tenant's horizon."""

    frame: Frame
    horizon: WalOffset | None  # the tenant's restored snapshot horizon S
    decoded: FlatBatch | Undecodable


class Recovery:
    """Recovery in the steps ``ourios serve`` runs on different threads (DESIGN.md §5):

    1. ``prepare`` (start-up, before the node is ready): restore the snapshots; make the
       replay, which covers exactly the frames that exist now, and validate it (the CRC
       walk and the high-water checks — damage refuses the start — which also walks
       the frame headers into the segment ledger, no payload decoded);
       ``check_restorable``; seed the tenant table from snapshots and frames, so
       admission knows every tenant's slot before the first request;
    2. ``items`` then ``turn`` (the turn thread, before any new frame's turn): decode
       (ahead, on the workers) and feed each replayed frame with the gates above; new
       frames are acknowledged meanwhile and turned after the last replayed one;
    3. ``replayed`` (the turn thread, right after the last replayed frame): capture the
       post-recovery snapshot states at each tenant's replayed horizon — before any new
       frame's turn folds past it;
    4. ``finish`` (any other thread): publish what was buffered, install the captured
       snapshots if all of it reached the store. ``recovery.done`` follows.

    ``backlog_bytes`` is what is left to replay (``ourios_recovery_backlog_bytes``)."""

    def __init__(
        self,
        journal: Journal,
        pipeline: Pipeline,
        store: SnapshotStore | None = None,
        ledger: SnapshotLedger | None = None,
        decode: Decoder | None = None,
        *,
        intents: list[IntentRecord] | None = None,
        objects: ObjectStore | None = None,
        on_store_unavailable: Callable[[str, StoreError], None] | None = None,
        decode_attempts: int = DEFAULT_DECODE_ATTEMPTS,
        quarantine: Path | None = None,
        on_isolated: Callable[[IsolatedFrame], None] | None = None,
        on_absent: Callable[[list[str]], object] | None = None,
    ) -> None:
        if decode_attempts < 1:
            raise ValueError(f"decode_attempts must be >= 1, got {decode_attempts}")
        self.journal = journal
        #: told which intended objects the store does not hold (their intents go)
        self._on_absent = on_absent
        self.pipeline = pipeline
        self.store = store
        self.ledger = ledger
        self._decode: Decoder = decode or decode_here
        self._decode_attempts = decode_attempts
        #: where an isolated frame's payload is kept (None: nowhere, tests)
        self._quarantine = quarantine
        self._on_isolated = on_isolated
        #: set by ``cancel``: the replay ends at its next frame
        self._stop = threading.Event()
        #: the publish intents in force at start, and the store to ask about them
        self._intents = intents or []
        self._objects = objects
        self._on_store_unavailable = on_store_unavailable
        self._check: LandedCheck | None = None
        self._landed = Landed()
        self.report = RecoveryReport()
        self._started = time.monotonic()
        self._restored: dict[str, WalOffset] = {}
        #: tenants whose replay failed (the guard), with the gates it applied to them
        self._unmined: dict[str, ReplayGates] = {}
        self._states: dict[str, SnapshotState] = {}
        self._replay: Replay | None = None
        self._position = 0
        self._end = 0
        self._mark: WalOffset | None = None
        self._x = -1
        self._frontiers: dict[str, PublishedMarks] = {}
        self._fresh_above: Callable[[int], bool] | None = None

    # -- 1. before the node is ready -------------------------------------------------

    def prepare(self) -> None:
        journal, pipeline, report = self.journal, self.pipeline, self.report
        miners = pipeline.miners
        if self.store is not None:
            loaded = self.store.load_all_durable(restores=lambda s: _check_restores(miners, s))
            report.stale_snapshot_temps = loaded.stale_temps_removed
            report.snapshots_undecodable = dict(loaded.undecodable)
            for tenant, state in loaded.states.items():
                miners.restore(tenant, state.miner)
                self._restored[tenant] = state.horizon
                pipeline.folded[tenant] = state.horizon
                if self.ledger is not None:
                    self.ledger.record(state)
            report.snapshots_restored = len(loaded.states)
        self._mark = journal.last_checkpoint
        report.checkpoint = self._mark
        self._fresh_above = _fresh_threshold(miners)
        self._x = -1 if self._mark is None else self._mark.lsn
        self._frontiers = journal.published_marks()
        report.frontiers = len(self._frontiers)
        report.intents = {
            t: f"({m.records}, {m.intent}]"
            for t, m in self._frontiers.items()
            if m.intent is not None
        }
        self._replay = journal.replay()
        # The whole log's CRC walk and high-water checks before the node serves (damage
        # refuses the start, naming file and offset), which also walks the frame headers
        # into the ledger: every tenant with frames, no payload decoded.
        self._replay.validate()
        restorable: dict[str, WalOffset | None] = dict(self._restored)
        for tenant in report.snapshots_undecodable:
            restorable.setdefault(tenant, None)
        journal.check_restorable(restorable)
        self._end = self._replay.end_lsn
        self._position = self._replay.start_lsn
        self._start_check()
        # Every tenant the node holds state or frames for has its slot before the first
        # request (more than max_tenants refuses the start), as after a full replay.
        pipeline.tenants.seed(sorted({*miners.tenants(), *journal.tenants_with_frames()}))

    def _start_check(self) -> None:
        """Ask the store, on threads of its own, which objects published above their
        tenants' gates before the restart exist (``app.ingest.landed``); the replay
        waits for the answer before its first frame, the node is ready meanwhile."""
        if self._objects is None or not self._intents:
            return
        restored, frontiers, x = self._restored, self._frontiers, self._x

        def needed(rec: IntentRecord) -> bool:
            s = restored.get(rec.tenant)
            above = -1 if s is None else s.lsn
            marks = frontiers.get(rec.tenant)
            if rec.kind is ObjectKind.RECORDS:
                return any(lsn > max(above, gates(marks, x, lsn)[0]) for lsn in rec.frames)
            return any(lsn > max(above, gates(marks, x, lsn)[1]) for lsn, _, _ in rec.events)

        wanted = [rec for rec in self._intents if needed(rec)]
        if wanted:
            self._check = LandedCheck(
                self._objects,
                wanted,
                on_unavailable=self._on_store_unavailable,
                on_absent=self._on_absent,
            ).start()

    def cancel(self) -> None:
        """Shutdown during the replay: stop waiting for the store, end the replay at its
        next frame and abandon the decoder's window (what is not turned stays in the WAL
        for the next start)."""
        self._stop.set()
        if self._check is not None:
            self._check.cancel()

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def _await_check(self) -> bool:
        """The check's answer into ``_landed``; False when cancelled first."""
        if self._check is None:
            return not self._stop.is_set()
        landed = self._check.result()
        if landed is None:
            return False
        self._landed = landed
        self.report.objects_checked = landed.checked
        self.report.objects_found = landed.present
        return True

    @property
    def backlog_bytes(self) -> int:
        """WAL bytes still to replay (0 once every replayed frame is turned)."""
        return max(0, self._end - self._position)

    # -- 2. the turn thread ------------------------------------------------------------

    def items(self) -> Iterator[ReplayItem]:
        """The frames to turn, decoded in WAL order (ahead of the turns, by ``decode``)."""
        assert self._replay is not None, "prepare() first"
        if not self._await_check():
            return  # cancelled: nothing turned, the backlog stays (the next start replays)
        replay, report, restored = self._replay, self.report, self._restored
        stop = self._stop
        waiting: deque[tuple[Frame, WalOffset | None]] = deque()

        def to_decode() -> Iterator[tuple[str, bytes]]:
            for frame in replay:
                if stop.is_set():
                    return  # the decoder raises DecodeStopped on its next wait
                if frame.kind is not FrameKind.TENANT_BATCH:
                    report.audit_frames_ignored += 1  # nothing writes them; RFC 0052 §3.7
                    continue
                report.frames += 1
                report.tenants.add(frame.tenant)
                s = restored.get(frame.tenant)
                if s is not None and frame.offset.lsn <= s.lsn:
                    report.frames_skipped += 1
                    self._position = frame.offset.lsn
                    continue
                waiting.append((frame, s))
                yield frame.tenant, frame.payload

        decoded_in_order = self._decode(to_decode(), stop=stop, attempts=self._decode_attempts)
        try:
            for decoded in decoded_in_order:
                if stop.is_set():
                    return  # stopped: the backlog stays (the next start replays it)
                frame, s = waiting.popleft()
                yield ReplayItem(frame, s, decoded)
        except DecodeStopped:
            return
        finally:
            close = getattr(decoded_in_order, "close", None)
            if close is not None:
                close()  # a window still in flight on the workers is abandoned
        if stop.is_set():
            return
        report.torn_segments = [seg.name for seg in replay.report.torn]
        self._position = self._end

    def turn(self, item: ReplayItem) -> None:
        """Feed one replayed frame (the gates of the module docstring)."""
        frame, s, decoded = item.frame, item.horizon, item.decoded
        pipeline, report = self.pipeline, self.report
        tenant = frame.tenant
        lsn = frame.offset.lsn
        self._position = lsn
        if isinstance(decoded, Undecodable):
            self._isolate(frame, s, decoded)
            return
        batch = decoded
        unmined = self._unmined
        if tenant in unmined:
            # An earlier frame of it failed: the tree is unknown; its settlement mines it.
            pipeline.replay_feed.replay_deferred(frame, unmined[tenant], self._mark)
            report.frames_unmined += 1
            return
        records_gate, audit_gate = gates(self._frontiers.get(tenant), self._x, lsn)
        gate = max(records_gate, -1 if s is None else s.lsn)
        span = intent_end(self._frontiers.get(tenant))
        landed = self._landed
        try:
            counts = pipeline.replay_feed.replay_frame(
                tenant,
                batch,
                frame.offset,
                publish_records=lsn > gate,
                publish_audit=lsn > audit_gate,
                nbytes=len(frame.payload),
                is_fresh=self._fresh_above,
                intent=lsn <= span,
                landed_days=landed.days(tenant, lsn),
                landed_event=(
                    (lambda tid, ver: landed.has_event(tenant, lsn, tid, ver))
                    if landed.events
                    else None
                ),
            )
        except Exception as exc:  # noqa: BLE001 - the guard: settled after the start
            unmined[tenant] = gate_offsets(self._frontiers.get(tenant), self._mark, s, lsn)
            pipeline.replay_feed.replay_failed(frame, exc, unmined[tenant], self._mark)
            report.frames_unmined += 1
            report.unmined[tenant] = str(frame.offset)
            # refused at admission until its settlement (the barrier's tick) has run
            pipeline.tenants.set_settling(tenant, True, still=_has_entry(pipeline, tenant))
            return
        report.records_suppressed += counts.records
        report.records_replayed += len(batch) - counts.records
        report.audit_events_suppressed += counts.events
        report.records_landed += counts.records_landed
        report.audit_events_landed += counts.events_landed

    def _isolate(self, frame: Frame, s: WalOffset | None, failed: Undecodable) -> None:
        """A frame whose payload did not decode ``attempts`` times: kept aside, named,
        left out of its tenant's tree (module docstring); the replay goes on."""
        tenant, lsn = frame.tenant, frame.offset.lsn
        records_gate, _ = gates(self._frontiers.get(tenant), self._x, lsn)
        gate = max(records_gate, -1 if s is None else s.lsn)
        segment, offset = self._where(frame)
        saved: str | None = None
        save_error = ""
        if self._quarantine is not None:
            try:
                saved = str(
                    keep_frame(
                        self._quarantine,
                        frame.payload,
                        {
                            "tenant": tenant,
                            "frame": str(frame.offset),
                            "segment": segment,
                            "offset": offset,
                            "attempts": failed.attempts,
                            "error": failed.error,
                            "in_store": lsn <= gate,
                        },
                        f"{segment}-{offset}",
                    )
                )
            except OSError as exc:
                save_error = f"{type(exc).__name__}: {exc}"
        self.pipeline.replay_feed.replay_isolated(frame, failed.error)
        isolated = IsolatedFrame(
            tenant,
            str(frame.offset),
            segment,
            offset,
            len(frame.payload),
            failed.attempts,
            failed.error,
            lsn <= gate,
            saved,
            save_error,
        )
        self.report.isolated[isolated.frame] = failed.error
        log.error(
            "replay: the frame at %s (tenant %r, %s byte %d) did not decode %d times (last: "
            "%s); it is isolated and the replay goes on",
            frame.offset,
            tenant,
            segment,
            offset,
            failed.attempts,
            failed.error,
        )
        if self._on_isolated is not None:
            self._on_isolated(isolated)

    def _where(self, frame: Frame) -> tuple[str, int]:
        """The frame's segment file and the byte its frame starts at there."""
        assert self._replay is not None
        found = [seg for seg in self._replay.report.segments if seg.base_lsn <= frame.start_lsn]
        if not found:
            return "", frame.start_lsn
        seg = max(found, key=lambda r: r.base_lsn)
        return seg.name, frame.start_lsn - seg.base_lsn + HEADER_SIZE

    def replayed(self) -> None:
        """The last replayed frame is turned: capture each replayed tenant's snapshot
        state at its replayed horizon (before a new frame's turn folds past it)."""
        self._position = self._end
        if self.store is not None:
            self._states = _replayed_states(self.pipeline, self._restored, self.report)

    # -- 4. anywhere --------------------------------------------------------------------

    def finish(self) -> RecoveryReport:
        pipeline, report = self.pipeline, self.report
        if self.store is not None:
            # A snapshot above X may only be installed once the rows of (X, S] it would
            # suppress on the next replay are in the store: publish what replay buffered
            # first, and write no snapshot when any of it failed (the barrier retries).
            if pipeline.replay_feed.publish_all_now("recovery"):
                _confirm_intents(self.journal, self._frontiers, set(self._unmined), report)
                _install(self.store, self.ledger, self._states, report)
            else:
                report.snapshot_failures += 1
        report.seconds = time.monotonic() - self._started
        return report


def decode_here(
    frames: Iterable[tuple[str, bytes]],
    *,
    stop: threading.Event | None = None,
    attempts: int = DEFAULT_DECODE_ATTEMPTS,
) -> Iterator[FlatBatch | Undecodable]:
    """Decode replayed payloads on this thread, in order (``server.workers`` 0), each up to
    ``attempts`` times (any exception is one: a refusal, a ``MemoryError``); with
    workers, ``app.node.worker_pool.Workers.decode_in_order`` decodes them there instead."""
    for tenant, payload in frames:
        if stop is not None and stop.is_set():
            raise DecodeStopped("the replay was stopped")
        error = ""
        for _ in range(attempts):
            try:
                batch = decode_flat(payload, tenant)
            except Exception as exc:  # noqa: BLE001 - counted; isolated at the bound
                error = f"{type(exc).__name__}: {exc}"
                continue
            yield batch
            break
        else:
            yield Undecodable(error, attempts)


def _has_entry(pipeline: Pipeline, tenant: str) -> Callable[[], bool]:
    return lambda: pipeline.unmined.has(tenant)


def intent_end(marks: PublishedMarks | None) -> int:
    """The LSN a tenant's unconfirmed settlement intent ends at (-1: none): its frames
    above the gates and at or below it are replayed staged (module docstring)."""
    return -1 if marks is None or marks.intent is None else marks.intent.lsn


def _confirm_intents(
    journal: Journal,
    frontiers: dict[str, PublishedMarks],
    unsettled: set[str],
    report: RecoveryReport,
) -> None:
    """Everything replay buffered is in the store, so is each intent's span: record its
    end as the tenant's frontier (clearing the bit). A tenant whose replay failed is not
    confirmed (its staged rows were dropped with its tree; its settlement re-stages the
    span). A failed write leaves the intent in force: the next cut, whose flush covers
    the span, confirms it."""
    for tenant, marks in sorted(frontiers.items()):
        if marks.intent is None or tenant in unsettled:
            continue
        try:
            journal.publish_marks({tenant: PublishedMarks(marks.intent, marks.intent)})
        except PublishedWriteError as exc:
            log.warning("tenant %r: its settlement intent was not confirmed: %s", tenant, exc)
            continue
        report.intents_confirmed += 1


def _nothing_below(marks: PublishedMarks, lsn: int) -> bool:
    """Whether a side of ``marks`` without a frontier means "nothing of it is published"
    for the frame ending at ``lsn`` rather than "consult X": a terminal entry, or a frame
    in the span of an intent recorded without a frontier (its settlement re-emitted every
    frame of the span, so its staged units start at the tenant's snapshot)."""
    return marks.terminal or (marks.intent is not None and lsn <= marks.intent.lsn)


def gate_offsets(
    marks: PublishedMarks | None, x: WalOffset | None, s: WalOffset | None, lsn: int
) -> ReplayGates:
    """``gates`` as offsets for the frame ending at ``lsn``, the records side maxed with
    the snapshot horizon S: what a replay published the tenant's rows and events above
    (None: everything)."""

    def side(offset: WalOffset | None) -> WalOffset | None:
        if marks is None:
            return x
        if offset is not None:
            return offset
        return None if _nothing_below(marks, lsn) else x

    records = side(None if marks is None else marks.records)
    if s is not None and (records is None or s.lsn > records.lsn):
        records = s
    return ReplayGates(records, side(None if marks is None else marks.audit))


def gates(marks: PublishedMarks | None, x: int, lsn: int) -> tuple[int, int]:
    """(records, audit) LSNs at or below which a tenant's replay publishes nothing of the
    frame ending at ``lsn`` (DESIGN.md §13): its own frontier where PUBLISHED has one,
    never maxed with X — for an entry with an unconfirmed intent, the frontier the
    intent kept, never its end; X where it has none; nothing (-1) for a side of a
    terminal entry that has none, and for one of an intent without a frontier within its
    span."""
    if marks is None:
        return x, x

    def side(offset: WalOffset | None) -> int:
        if offset is not None:
            return offset.lsn
        return -1 if _nothing_below(marks, lsn) else x

    return side(marks.records), side(marks.audit)


def _fresh_threshold(miners: MinerCluster) -> Callable[[int], bool] | None:
    """Whether a template id was minted by this replay (its counter above the durable
    high-water at start): no published event names such an id."""
    allocator = miners.allocator
    if isinstance(allocator, FileTemplateIdAllocator):
        high_water = allocator.high_water
        return lambda template_id: (template_id & COUNTER_MASK) > high_water
    next_id = getattr(allocator, "next_id", None)
    if isinstance(next_id, int):
        first = next_id
        return lambda template_id: template_id >= first
    return None


def _check_restores(miners: MinerCluster, state: SnapshotState) -> None:
    """A snapshot is a horizon only if it decodes and restores (RFC 0052 §3.2)."""
    TenantMiner.from_snapshot(state.miner, miners.allocator)


def _replayed_states(
    pipeline: Pipeline, restored: dict[str, WalOffset], report: RecoveryReport
) -> dict[str, SnapshotState]:
    """Each tenant replay advanced, at its own folded horizon, so the next restart skips
    what this one replayed; an untouched tenant keeps its restored one."""
    states: dict[str, SnapshotState] = {}
    unsettled = pipeline.unmined.tenants()  # their trees are unknown until settled
    with pipeline.miner_lock:
        for tenant, horizon in pipeline.folded.items():
            before = restored.get(tenant)
            if before is not None and before.lsn >= horizon.lsn:
                continue
            if tenant in unsettled:
                continue
            miner = pipeline.miners.get(tenant)
            if miner is None:
                continue
            try:
                states[tenant] = SnapshotState(tenant, horizon, miner.to_snapshot())
            except Exception:  # noqa: BLE001 - a failed miner keeps its restored horizon
                report.snapshot_failures += 1
    return states


def _install(
    store: SnapshotStore,
    ledger: SnapshotLedger | None,
    states: dict[str, SnapshotState],
    report: RecoveryReport,
) -> None:
    for tenant, outcome in store.install_all(states).items():
        if outcome.installed:
            report.snapshots_written += 1
            if ledger is not None:
                ledger.record(states[tenant])
        else:
            report.snapshot_failures += 1

"""The journal: the WAL's single writer, as one facade over its parts. It appends,
group-commits, rotates, checkpoints, reclaims and replays; *when* to checkpoint, rotate
on a timer or run a reclamation pass is the caller's business (``app/cadence/barrier.py``,
``app/cadence/housekeeping.py``: the housekeeping timer).

Each concern is one part that owns its state; all of them are given the one ``Log``:

* ``wal/log.py`` ``Log`` — the segment set (ledger, current segment), end/synced LSN,
  disk bytes, stale partials, retired descriptors, quarantine records in force, the
  no-space latch and the journal mutex: what more than one part must see;
* ``wal/opening.py`` ``Opener`` — one open: directory, listing, the RECLAIM ×
  CHECKPOINT × segments matrix, the newest segment's scan and seal, quarantine;
* ``wal/commit.py`` ``Commit`` — appends, waiters, the leader's sync round, sealing,
  closed/broken;
* ``wal/rotation.py`` ``Rotation`` — when to rotate, segment creation, the
  directory-fsync obligation, the retry budget;
* ``wal/reading.py`` ``Reader`` — replay and the bounded per-tenant reads;
* ``wal/reclamation.py`` ``Reclamation`` — the reclamation pass and the RECLAIM record;
* ``wal/frontiers.py`` ``Frontiers`` — PUBLISHED;
* ``wal/checkpointing.py`` ``Checkpointer`` — the CHECKPOINT mark and its write order;
* ``wal/highwater.py`` ``HighWater`` — HIGHWATER, the current segment's synced
  high-water, recorded at a cadence after sync rounds.

The guarantees are stated in each part's module docstring: WAL before ack and own-frame
marks (``commit``), bounded rotation retry (``rotation``), nothing appended behind a
torn frame (``commit``, ``opening``), the record before the unlink (``reclamation``),
CHECKPOINT before PUBLISHED (``checkpointing``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from .checkpointing import Checkpointer
from .commit import Commit, Pending
from .config import WalConfig
from .errors import WalError
from .frontiers import Frontiers
from .fs import Fs, OsFs
from .highwater import HighWater
from .log import Log
from .opening import Opener, OpenReport
from .quarantine import QuarantineRecord
from .reading import Reader, Replay
from .reclaim_file import ConsumerMode
from .reclamation import ArchiveHook, ReclaimOutcome, ReclaimPlan, ReclaimState, Reclamation
from .rotation import Rotation
from .segment_ledger import ReclamationProgress, SnapshotHorizons
from .types import (
    Clock,
    CommitOutcome,
    DirFsyncOrigin,
    EventSink,
    Frame,
    FrameCursor,
    FrameKind,
    FrameSpan,
    HighWaterState,
    NoSpace,
    PublishedMarks,
    RotationKind,
    RotationState,
    Timing,
    WalOffset,
)


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    return None


class Journal:
    """The WAL's single writer. Construct with ``Journal.open``."""

    def __init__(
        self,
        root: Path,
        config: WalConfig,
        fs: Fs,
        clock: Clock,
        events: EventSink,
        on_append: Timing | None = None,
        on_fsync: Timing | None = None,
        archive: ArchiveHook | None = None,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self.root = root
        self.config = config
        self._log = Log(root, config, fs, clock, events, monotonic)
        self._rotation = Rotation(self._log)
        self._high_water = HighWater(self._log)
        self._commit = Commit(
            self._log, self._rotation, on_append, on_fsync, self._high_water.after_round
        )
        self._reader = Reader(self._log)
        self._reclamation = Reclamation(self._log, archive)
        self._frontiers = Frontiers(self._log, self._reclamation)
        self._checkpointer = Checkpointer(self._log, self._reclamation, self._frontiers)
        self.open_report: OpenReport | None = None

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        root: Path | str,
        config: WalConfig | None = None,
        *,
        fs: Fs | None = None,
        clock: Clock = time.time,
        events: EventSink | None = None,
        on_append: Timing | None = None,
        on_fsync: Timing | None = None,
        archive: ArchiveHook | None = None,
        monotonic: Clock = time.monotonic,
    ) -> Journal:
        """Open (or create) the WAL at ``root`` (``wal/opening.py``).

        Validates the configuration and the directory structure, checks the newest
        segment frame by frame and seals it if its tail is torn (nothing is truncated:
        the bytes stay as evidence and the next append starts a new segment), reads
        CHECKPOINT behind an fsync of the root. An empty directory is a fresh root.
        Older segments' frames are checked by ``replay`` (recovery) and ``verify``.
        """
        root = Path(root).absolute()
        config = config or WalConfig()
        config.validate()
        fs = fs or OsFs()
        journal = cls(
            root, config, fs, clock, events or _no_events, on_append, on_fsync, archive, monotonic
        )
        try:
            report = Opener(
                journal._log,
                journal._rotation,
                journal._reclamation,
                journal._frontiers,
                journal._high_water,
            ).run()
        except BaseException:
            journal._release_files()  # a refused open leaks no descriptor
            raise
        journal._checkpointer.adopt(report.checkpoint)
        journal.open_report = report
        return journal

    def _release_files(self) -> None:
        self._reclamation.release()
        self._frontiers.release()
        self._high_water.release()
        self._log.release_files()

    @property
    def events(self) -> EventSink:
        """Where the journal reports what it did (as given to ``open``)."""
        return self._log.events

    def rebuild_ledger(self) -> None:
        """Walk every segment not yet accounted (oldest first, frames validated exactly as
        replay validates them) into the ledger. Replay does this as a by-product."""
        with self._log.lock:
            self._log.rebuild_locked()

    # ------------------------------------------------------------------ append

    def append_batch(
        self, tenant: str, payload: bytes, kind: FrameKind = FrameKind.TENANT_BATCH
    ) -> Pending:
        """Write one frame and return its ``Pending`` (call ``wait()`` before acking).

        Raises ``FrameRejected`` for an invalid tenant or an oversize payload (nothing
        written), ``RotationRetrying``/``RotationTerminal`` when a needed rotation
        failed, ``WalIoError`` when the write failed (the segment is sealed).
        """
        return self._commit.append_batch(tenant, payload, kind)

    def commit(self, tenant: str, payload: bytes) -> CommitOutcome:
        """``append_batch`` then ``wait``: the frame is durable when this returns."""
        return self.append_batch(tenant, payload).wait()

    @property
    def no_space(self) -> NoSpace | None:
        """The no-space latch, or None. A plain attribute read (no lock): admission
        consults it on every request."""
        return self._log.latch.current

    def clear_no_space(self, seq: int) -> NoSpace | None:
        """Clear the latch numbered ``seq`` (the owner saw free space return after it
        observed that latch); a newer latch stays. Returns what was cleared."""
        with self._log.lock:
            return self._log.latch.clear_locked(seq)

    @property
    def unreclaimed_bytes(self) -> int:
        """The ledger's incremental unreclaimed-bytes counter (RFC 0052 §3.5), read
        without the journal mutex: one int, for admission's per-request check."""
        return self._log.ledger.unreclaimed_bytes

    # ------------------------------------------------------------------ rotation

    def rotate(self, kind: RotationKind = RotationKind.DISCRETIONARY) -> bool:
        """Rotate now (the barrier's idle path, or an owed seal). Discharges a pending
        rotation obligation first; a no-op (False) when the current segment holds no
        frame and is not sealed. Raises ``RotationRetrying``/``RotationTerminal``."""
        with self._log.lock:
            self._commit.check_writable_locked()
            if not self._log.rebuilt:
                self._log.rebuild_locked()
            return self._rotation.rotate_now_locked(self._commit)

    @property
    def rotation_state(self) -> RotationState:
        with self._log.lock:
            return self._rotation.state

    @property
    def dir_fsync_pending(self) -> DirFsyncOrigin | None:
        with self._log.lock:
            return self._rotation.dir_pending

    # ------------------------------------------------------------------ checkpoint

    @property
    def last_checkpoint(self) -> WalOffset | None:
        with self._log.lock:
            return self._checkpointer.mark

    def checkpoint(
        self, mark: WalOffset, published: Mapping[str, PublishedMarks] | None = None
    ) -> bool:
        """Advance the CHECKPOINT to ``mark`` (a turn's own frame end), then write
        ``published`` (each tenant's frontiers) to PUBLISHED in the same call — after
        CHECKPOINT, so a crash between the two leaves a stale PUBLISHED, whose entries
        still govern their tenants (RFC 0055 §9.4).

        Monotonic: a lower mark raises ``CheckpointError``; an equal one writes no
        CHECKPOINT (False). On a failed CHECKPOINT write the previous mark stays in force
        and ``CheckpointError`` carries the cause; on a failed PUBLISHED write after it
        ``PublishedWriteError`` (``checkpointed`` says whether the mark moved). The file
        I/O runs without the journal mutex, so appends continue meanwhile.
        """
        return self._checkpointer.checkpoint(mark, published)

    # ------------------------------------------------------------------ frontiers

    def published_marks(self) -> dict[str, PublishedMarks]:
        """Each tenant's frontiers as PUBLISHED last durably recorded them (read at open,
        updated by every successful write): recovery's per-tenant gates."""
        return self._frontiers.published_marks()

    def publish_marks(self, marks: Mapping[str, PublishedMarks]) -> None:
        """Write PUBLISHED alone (settlement's forced write, an unrecoverable tenant's
        terminal entry): raises ``PublishedWriteError``, the previous slot staying live.
        Monotonic per tenant; a tenant new to the shared table takes its next slot id
        there (RECLAIM records it at its next write)."""
        self._frontiers.publish_marks(marks)

    # ------------------------------------------------------------------ replay and reads

    def replay(self, after_lsn: int | None = None) -> Replay:
        """Iterate every surviving frame, oldest first, CRC-checked, skipping frames
        that end at or below ``after_lsn``. Recovery makes it before the first append
        and may iterate it while appends go on: it covers exactly the frames that
        existed when it was made (``Replay.end_lsn``). Damage is legal only where a torn
        tail can be (module ``layout``); anywhere else it raises ``CorruptionError``
        naming the file and the offset."""
        with self._log.lock:
            if self._commit.appended:
                raise WalError("replay is recovery's: it runs before the first append")
            return self._reader.replay_locked(after_lsn)

    def oldest_frame(self, tenant: str) -> FrameCursor | None:
        """A cursor from which ``read_frames_from`` returns ``tenant``'s oldest surviving
        frame first (the start of the segment holding it); None when it has none."""
        return self._reader.oldest_frame(tenant)

    def read_frames_from(
        self, cursor: FrameCursor, to: FrameSpan, tenant: str, limit: int
    ) -> tuple[list[Frame], FrameCursor | None]:
        """``tenant``'s frames after ``cursor`` through the ``to`` frame, oldest first,
        in bounded calls (RFC 0055 §9.4; ``Reader.read_frames_from``)."""
        return self._reader.read_frames_from(cursor, to, tenant, limit)

    # ------------------------------------------------------------------ reclamation

    def plan_reclamation(self, horizons: SnapshotHorizons, cap: int) -> ReclaimPlan:
        """The first ledger half of a pass (``wal/reclamation.py``), under the mutex."""
        return self._reclamation.prepare(horizons, cap)

    def execute_reclamation(self, plan: ReclaimPlan) -> ReclaimOutcome:
        """Record, unlinks, parent fsync — with the journal mutex released."""
        return self._reclamation.execute(plan)

    def commit_reclamation(self, plan: ReclaimPlan, outcome: ReclaimOutcome) -> ReclamationProgress:
        """Fold the file half's outcome back into the ledger, under the mutex."""
        return self._reclamation.commit(plan, outcome)

    def maintain(self, horizons: SnapshotHorizons, cap: int) -> ReclamationProgress:
        """prepare → file half → commit, then make the raised ``reclaimed_through``
        durable. Raises ``ReclaimError`` (carrying progress) on a refused or failed pass."""
        return self._reclamation.maintain(horizons, cap)

    def check_restorable(self, restorable: Mapping[str, WalOffset | None]) -> None:
        """After the ledger is rebuilt: refuse to start when a tenant that still has
        frames has a restorable horizon below what was reclaimed from under it, or when
        a horizon's segment is gone without RECLAIM explaining it (RFC 0052 §3.2)."""
        self._reclamation.check_restorable(restorable)

    def reclaimed_through(self, tenant: str) -> tuple[ConsumerMode, WalOffset] | None:
        """What RECLAIM records as reclaimed from under ``tenant`` (after open reconciled
        planned entries against the directory), with the mode the pass ran under; None
        when nothing was. Settlement's proof of loss (RFC 0055 §9.4)."""
        return self._reclamation.reclaimed_through(tenant)

    def tenants_with_frames(self) -> list[str]:
        """Tenants the ledger holds frames for (after the rebuild)."""
        return self._reclamation.tenants_with_frames()

    def record_flags(self) -> int:
        return self._reclamation.record_flags()

    # ------------------------------------------------------------------ state

    @property
    def quarantined(self) -> list[QuarantineRecord]:
        """The quarantine records in force at open (their segments left the set)."""
        return list(self._log.quarantined)

    @property
    def stale_partials(self) -> list[Path]:
        """``<uuid>.wal.partial`` files left by failed rotations (seeded at open)."""
        with self._log.lock:
            return list(self._log.partials)

    @property
    def end_lsn(self) -> int:
        with self._log.lock:
            return self._log.end_lsn

    @property
    def high_water(self) -> HighWaterState:
        """The current segment's recorded high-water and the torn tail open found (what
        the metrics export)."""
        hw = self._high_water
        report = self.open_report
        return HighWaterState(
            recorded_lsn=hw.record.lsn,
            writes=hw.writes,
            failures=hw.failures,
            torn_tail_bytes=report.torn_tail_bytes if report is not None else 0,
            torn_tail_frames=report.torn_tail_frames if report is not None else 0,
        )

    @property
    def segments_created(self) -> int:
        """Segment files created since open (a failed rotation's partial included): with
        ``end_lsn`` it is what the WAL added to its volume, for a caller estimating free
        space between two samples of it (read differences; one int, no lock)."""
        return self._log.segments_created

    def unflushed_bytes(self) -> int:
        """Bytes written but not yet covered by a successful fsync."""
        return self._log.end_lsn - self._log.synced_lsn

    def reclaim_state(self) -> ReclaimState:
        """What RFC 0052 §3.5 exports, O(1) under the journal mutex."""
        with self._log.lock:
            return self._reclamation.state_locked(self._rotation.state)

    def segment_names(self) -> list[str]:
        with self._log.lock:
            return [s.path.name for s in self._log.segments()]

    def current_segment_age(self) -> tuple[float, int]:
        """(seconds since the current segment was created, on the monotonic clock; frames
        it holds) — what the barrier's idle rotation decides on."""
        with self._log.lock:
            return self._log.current_age(), self._log.current.frames

    @property
    def current_segment(self) -> uuid.UUID:
        with self._log.lock:
            return self._log.current.uuid

    # ------------------------------------------------------------------ close

    @property
    def closed(self) -> bool:
        """True once ``close`` ran: appends are refused and descriptors released."""
        with self._log.lock:
            return self._commit.closed

    def close(self) -> None:
        """Refuse new appends, let in-flight waiters finish, fsync and close files."""
        with self._log.lock:
            self._commit.close_locked()
            self._reclamation.release()
            self._frontiers.release()
            self._log.close_locked()
        # after the final fsync: the newest segment's whole length is its high-water
        self._high_water.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

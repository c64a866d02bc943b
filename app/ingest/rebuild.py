"""The rebuild of one tenant in a settlement (``app.ingest.settlement``, RFC 0055 §9.4):
restore its snapshot, read and mine its frames into a new tree off to the side, record
the intent, swap the tree in with the old tree's rows out, and force the frontier. The
settler decides when and for which entries; this room does the work with the parts it
was given (``app.ingest.settle_parts``)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from app import points
from app.base.batch import FlatBatch
from app.ingest.frame_attempts import FrameAttempts
from app.ingest.mining.tenant_miner import MineResult, TenantMiner
from app.ingest.settle_parts import SettleParts
from app.ingest.snapshot_store import SnapshotState
from app.ingest.unmined import UnminedEntry, higher, lower, lsn
from app.receive.otlp import decode_flat
from sink import Detached
from wal import Frame, FrameCursor, FrameSpan, PublishedMarks, PublishedWriteError, WalOffset

log = logging.getLogger("ourios.settlement")

#: frames per ``read_frames_from`` call: the longest the journal mutex is held
READ_LIMIT = 64

#: The ``template_id`` of a record published without a template: its frame was isolated
#: after repeated mining failures. Never allocated (a node's counter starts at 1).
NO_TEMPLATE = 0


def untemplated(records: int) -> MineResult:
    """An isolated frame's rows: no template, no parameters, no template events."""
    return MineResult([NO_TEMPLATE] * records, [()] * records, [])


class FrameFailed(Exception):
    """Mining (or emitting) one frame raised inside a rebuild: the failure is that
    frame's, counted against it (``isolated``: the frame was already isolated and the
    emit of its template-less rows raised)."""

    def __init__(self, offset: WalOffset, cause: BaseException, *, isolated: bool) -> None:
        super().__init__(f"frame {offset}: {type(cause).__name__}: {cause}")
        self.offset = offset
        self.cause = cause
        self.isolated = isolated


@dataclass
class Replayed:
    """One frame of the replay: its batch, what the new tree made of it, and whether its
    records are re-emitted (above the records frontier)."""

    frame: Frame
    batch: FlatBatch
    result: MineResult
    publish_records: bool
    isolated: bool = False


class Rebuild:
    """The steps of one tenant's rebuild, in the order the settler runs them."""

    def __init__(self, parts: SettleParts) -> None:
        self._journal = parts.journal
        self._miners = parts.miners
        self._buffers = parts.buffers
        self._in_flight = parts.in_flight
        self._publisher = parts.publisher
        self._unmined = parts.unmined
        self._exclusion = parts.exclusion
        self._miner_lock = parts.miner_lock
        self._folded = parts.folded
        self._pipeline = parts.pipeline

    def restore(
        self, tenant: str, state: SnapshotState | None
    ) -> tuple[TenantMiner | None, WalOffset | None]:
        """The tree and horizon of the tenant's installed snapshot, or (None, None) when
        there is none or it does not restore (then the rebuild replays from empty)."""
        horizon: WalOffset | None = None
        tree: TenantMiner | None = None
        if state is not None:
            try:
                tree = self._miners.build(tenant, state.miner)
                horizon = state.horizon
            except Exception as exc:  # noqa: BLE001 - as at start-up: empty + full replay
                log.warning(
                    "tenant %r: its installed snapshot at %s does not restore (%s); rebuilding "
                    "from empty with a full replay",
                    tenant,
                    state.horizon,
                    exc,
                )
        return tree, horizon

    @staticmethod
    def frontiers(
        entries: list[UnminedEntry], claim_x: WalOffset | None, marks: PublishedMarks
    ) -> tuple[WalOffset | None, WalOffset | None]:
        """The frontiers the replay re-emits above, records and audit (None: nothing of
        that side is durable), never above a replayed entry's gates."""
        from_records = higher(claim_x, marks.records)
        from_audit = higher(claim_x, marks.audit)
        for e in entries:
            if e.gates is not None:  # a start-up replay's entry: never above its gates
                from_records = lower(from_records, e.gates.records)
                from_audit = lower(from_audit, e.gates.audit)
        return from_records, from_audit

    def replay(
        self,
        tenant: str,
        tree: TenantMiner,
        horizon: WalOffset | None,
        to: FrameSpan,
        isolated: dict[int, FrameAttempts],
        frontiers: tuple[int, int],
        read_limit: int,
    ) -> list[Replayed]:
        """The tenant's frames from the horizon through ``to`` mined into the new tree,
        outside every lock; the isolated ones go without templates."""
        w_records, w_audit = frontiers
        cursor = (
            FrameCursor.after(horizon)
            if horizon is not None
            else self._journal.oldest_frame(tenant)
        )
        replayed: list[Replayed] = []
        while cursor is not None:
            frames, cursor = self._journal.read_frames_from(cursor, to, tenant, read_limit)
            points.hit("settlement.read")  # the journal mutex is free here
            for frame in frames:
                lsn = frame.offset.lsn
                if lsn in isolated and isolated[lsn].undecodable:
                    continue  # isolated at the replay: not even decoded (its rows are lost)
                batch = decode_flat(frame.payload, tenant)
                if lsn in isolated:
                    # Not mined (it fails every time): its rows go out without templates.
                    replayed.append(
                        Replayed(frame, batch, untemplated(len(batch)), lsn > w_records, True)
                    )
                    continue
                try:
                    mined = tree.mine(batch.bodies)
                except Exception as exc:  # noqa: BLE001 - counted against this frame
                    raise FrameFailed(frame.offset, exc, isolated=False) from exc
                events = [e for e in mined.events if lsn > w_audit or e.change == "created"]
                replayed.append(
                    Replayed(
                        frame,
                        batch,
                        dataclasses.replace(mined, events=events),
                        lsn > w_records,
                    )
                )
        return replayed

    def swap(
        self,
        tenant: str,
        tree: TenantMiner,
        entries: list[UnminedEntry],
        replayed: list[Replayed],
        span: WalOffset | None,
        known: set[int],
        through: WalOffset,
    ) -> tuple[list[Detached], int, int, int]:
        """The new tree in and the old tree's rows out in one exclusive section, the
        replay buffered (staged up to ``span``): the detached partitions, the records,
        template events and dropped rows."""
        detached: list[Detached] = []
        records = events_out = 0
        with self._exclusion.exclusive():
            with self._miner_lock:
                self._pipeline.replace_tenant(
                    tenant, tree
                )  # first: a failure here has dropped nothing
                dropped = self._buffers.drop_tenant(tenant)
                for r in replayed:
                    staged = span is not None and r.frame.offset.lsn <= span.lsn
                    try:
                        detached.extend(
                            self._pipeline.buffer_audit(
                                tenant,
                                r.batch,
                                r.result,
                                r.frame.offset,
                                known.__contains__ if staged else None,
                            )
                        )
                        if r.publish_records:
                            detached.extend(
                                self._pipeline.buffer_records(
                                    tenant,
                                    r.batch,
                                    r.result,
                                    r.frame.offset,
                                    len(r.frame.payload),
                                    staged=staged,
                                )
                            )
                    except Exception as exc:  # noqa: BLE001 - counted against this frame
                        raise FrameFailed(r.frame.offset, exc, isolated=r.isolated) from exc
                    events_out += len(r.result.events)
                    if r.publish_records:
                        records += len(r.batch)
                self._buffers.seal_staged(tenant)  # the span is complete: its units are final
                self._folded[tenant] = through
                self._unmined.remove(entries)
                self._pipeline.recompute_durable()
        return detached, records, events_out, dropped

    def intend(
        self,
        tenant: str,
        from_records: WalOffset | None,
        from_audit: WalOffset | None,
        horizon: WalOffset | None,
        through: WalOffset,
    ) -> WalOffset | None:
        """Record the intent before anything of the span can be published (module
        docstring): PUBLISHED keeps the frontier the replay re-emits above and marks
        (frontier, ``through``] as being published. Returns the span's end, or None when
        no intent is in force — the write failed, or the two sides start apart (a state
        this implementation does not reach) — and then nothing is published before the
        next cut: without an intent a crash would republish what landed."""
        # Frames at or below the snapshot horizon are not re-emitted on either side, so
        # the sides differ only if they differ above it.
        lo = lower(from_records, from_audit)
        if lsn(higher(horizon, from_records)) != lsn(higher(horizon, from_audit)):
            log.warning(
                "tenant %r: its records and audit frontiers (%s, %s) differ above its "
                "snapshot; the settled rows wait for the next cut instead of an intent",
                tenant,
                from_records,
                from_audit,
            )
            return None
        try:
            self._journal.publish_marks({tenant: PublishedMarks(lo, lo, intent=through)})
        except PublishedWriteError as exc:
            log.warning(
                "tenant %r: the settlement's intent could not be written (%s); the settled "
                "rows wait for the next cut",
                tenant,
                exc,
            )
            return None
        points.hit("settlement.intent")  # durable: nothing of the span is published yet
        return through

    def force_frontier(self, tenant: str, through: WalOffset, detached: list[Detached]) -> bool:
        """Publish the tenant's rows now and confirm the intent with the raised frontier
        (RFC 0055 §9.4): a crash after it replays nothing of the span, a crash before it
        replays the span under the same names. A failure leaves the intent in force —
        the next checkpoint's PUBLISHED write, whose flush covers the span, confirms
        it."""
        with self._exclusion.shared():
            batches = self._buffers.drain_tenant(tenant, "settlement")
        # what the swap's size trigger detached goes first (template events lead)
        batches = sorted(detached + batches, key=lambda d: d.partition.kind.value != "audit")
        ok = True
        for d in batches:
            ok = self._publisher.publish(d).ok and ok
        points.hit("settlement.published")  # the publish returned; the marks not written
        # Rows of it still in flight elsewhere (the publisher thread's queue, a pending
        # cut only this thread runs): not waited for; the next checkpoint covers them.
        if not ok or self._in_flight.pending_for(tenant):
            log.info("tenant %r: not all settled rows are durable yet; frontier kept", tenant)
            return False
        try:
            self._journal.publish_marks({tenant: PublishedMarks(through, through)})
        except PublishedWriteError as exc:
            log.warning("tenant %r: the settlement's frontier write failed: %s", tenant, exc)
            return False
        return True

"""Recovery's entry into the core: replayed frames fed to their miners, gated
(RFC 0052 §3.3, RFC 0055 §9.4).

A replayed frame is mined and buffered under the miner lock as a turn is, but it never
moves the mark (only a new frame's turn sets it): it folds its tenant's horizon and
forwards what the gates and the store's landed objects leave. A frame whose mining
raises becomes an unmined entry clamped at the checkpoint, settled after the start; the
tenant's later frames are deferred to that settlement. ``publish_all_now`` ends the
replay: everything buffered is published before recovery installs its snapshots.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple

from app.base.batch import FlatBatch
from app.ingest.cuts import CutOwner
from app.ingest.emit import buffer_audit, buffer_records, rows_in_days
from app.ingest.mark import DurableMark
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.tenant_miner import TemplateEvent
from app.ingest.settlement import ReplayGates, Settler
from sink.buffers import Buffers, Detached
from sink.publisher import Publisher
from wal import Frame, FrameSpan, WalOffset

__all__ = ["ReplayCounts", "ReplayFeed"]

log = logging.getLogger("ourios.pipeline")


class ReplayCounts(NamedTuple):
    """What ``replay_frame`` did not forward: records and template events suppressed
    in all (by the gates or because the store holds them), and of those the ones an
    object published before the restart holds (``app.ingest.landed``)."""

    records: int
    events: int
    records_landed: int
    events_landed: int


class ReplayFeed:
    """Feeds recovery's replayed frames to the pipeline's miners and buffers (module
    docstring); the pipeline builds it, recovery calls it."""

    def __init__(
        self,
        buffers: Buffers,
        miners: MinerCluster,
        publisher: Publisher,
        *,
        cuts: CutOwner,
        mark: DurableMark,
        settler: Settler,
        folded: dict[str, WalOffset],
        events: Callable[[str, Mapping[str, object]], None],
    ) -> None:
        self.buffers = buffers
        self.miners = miners
        self.publisher = publisher
        self.cuts = cuts
        self.mark = mark
        self.settler = settler
        #: the pipeline's locks, taken in its order (DESIGN.md §5.3)
        self.exclusion = cuts.exclusion
        self.miner_lock = cuts.miner_lock
        self.folded = folded
        self._events = events
        #: tenants whose intent span this replay is buffering staged (unsealed)
        self._staging: set[str] = set()

    def publish_all_now(self, reason: str) -> bool:
        """The replay's end: publish everything buffered (``CutOwner.publish_all_now``,
        whose drain seals every intent span staged)."""
        self._staging.clear()
        return self.cuts.publish_all_now(reason)

    def replay_frame(
        self,
        tenant: str,
        batch: FlatBatch,
        offset: WalOffset,
        *,
        publish_records: bool,
        publish_audit: bool,
        nbytes: int = 0,
        is_fresh: Callable[[int], bool] | None = None,
        intent: bool = False,
        landed_days: frozenset[int] = frozenset(),
        landed_event: Callable[[int, int], bool] | None = None,
    ) -> ReplayCounts:
        """Feed a replayed frame (above the tenant's snapshot horizon) to its miner;
        forward its rows only when ``publish_records`` and the template events it
        regenerates only when ``publish_audit`` — except an event of a template this
        replay minted afresh (``is_fresh`` of its id: above the allocator's high-water at
        start): no published event binds that id, so it is forwarded once whatever the
        gate (RFC0052.10's 2026-10-06 amendment). Returns (records, events) suppressed.

        ``intent``: the frame lies in the span of the tenant's unconfirmed settlement
        intent (RFC 0055 §9.4): what it forwards is staged as the settlement staged it —
        its records, and the events of ids not minted by this replay — so the span is
        republished under the names the settlement's attempt used (``sink.buffers``).
        The tenant's first frame past the span seals it.

        ``landed_days`` and ``landed_event`` (``app.ingest.landed``): what an object
        published before the restart already holds of this frame — its rows of those
        UTC days, those template events (by id and version; never an id this replay
        minted) — and is therefore not forwarded again, whatever the gates say."""
        if intent:
            self._staging.add(tenant)
        elif tenant in self._staging:
            self._staging.discard(tenant)
            self.buffers.seal_staged(tenant)
        self.buffers.wait_for_room()  # a replay re-derives the spool under the same bound
        # Mined and buffered under the miner lock, as a turn is (``pin_versions_locked``).
        with self.miner_lock:
            result = self.miners.mine(tenant, batch.bodies)
            self.folded[tenant] = offset
            detached: list[Detached] = []
            counts = ReplayCounts(0 if publish_records else len(batch), 0, 0, 0)
            if result.events:
                forwarded: list[TemplateEvent] = []
                gated = landed = 0
                for e in result.events:
                    if is_fresh is not None and is_fresh(e.template_id):
                        forwarded.append(e)  # minted by this replay: no stored event binds it
                    elif landed_event is not None and landed_event(e.template_id, e.version):
                        landed += 1
                    elif publish_audit:
                        forwarded.append(e)
                    else:
                        gated += 1
                if gated or landed:
                    result = dataclasses.replace(result, events=forwarded)
                counts = counts._replace(events=gated + landed, events_landed=landed)
                known = (
                    (lambda tid: not is_fresh(tid)) if is_fresh is not None else (lambda tid: True)
                )
                staged = known if intent else None
                detached.extend(buffer_audit(self.buffers, tenant, batch, result, offset, staged))
            if publish_records:
                if landed_days:
                    skipped = rows_in_days(batch, offset, landed_days)
                    counts = counts._replace(records=skipped, records_landed=skipped)
                rows = (tenant, batch, result, offset, nbytes, intent, landed_days)
                detached.extend(buffer_records(self.buffers, *rows))
            self.cuts.pin_versions_locked(detached)
        for d in detached:
            if not self.publisher.offer(d):
                self.publisher.park(d)
        return counts

    def replay_failed(
        self,
        frame: Frame,
        exc: BaseException,
        gates: ReplayGates,
        clamp: WalOffset | None,
    ) -> None:
        """Recovery's guard: mining (or emitting) a replayed frame raised. As in a turn,
        the frame becomes an unmined entry (clamped at ``clamp``, the checkpoint) and the
        tenant is settled after the start, its attempts bounded, so a frame that fails
        every time is isolated instead of failing every start. The tenant's tree is
        unknown now: its buffered rows are dropped (the settlement re-emits them above
        ``gates``, which is what this replay publishes above) and nothing more of it is
        mined here (``replay_deferred``)."""
        tenant = frame.tenant
        why = f"{type(exc).__name__}: {exc}"
        self.settler.note_failure(tenant, frame.offset, why)
        with self.exclusion.exclusive():
            with self.miner_lock:
                self.buffers.drop_tenant(tenant)  # what it staged too: its settlement re-stages
        self._staging.discard(tenant)
        self._add_replayed_entry(frame, gates, clamp)
        self._events(
            "tenant.settling",
            {
                "tenant": tenant,
                "frame": str(frame.offset),
                "clamp": None if clamp is None else str(clamp),
                "error": why,
                "during": "recovery",
            },
        )
        log.error(
            "replay: mining failed for tenant %r at %s (%s): the tenant is settled after the "
            "start (its later frames with it) and the mark is held at %s meanwhile",
            tenant,
            frame.offset,
            why,
            clamp,
            exc_info=exc,
        )

    def replay_isolated(self, frame: Frame, error: str) -> None:
        """Recovery isolated ``frame``: its payload did not decode. The tenant's tree goes
        on without it (folded past it), and a settlement of the tenant never decodes it
        in this process (it may be what killed a worker)."""
        self.settler.isolate_undecodable(frame.tenant, frame.offset, error)
        with self.miner_lock:
            folded = self.folded.get(frame.tenant)
            if folded is None or folded.lsn < frame.offset.lsn:
                self.folded[frame.tenant] = frame.offset

    def replay_deferred(self, frame: Frame, gates: ReplayGates, clamp: WalOffset | None) -> None:
        """A replayed frame of a tenant whose replay failed earlier: not mined into the
        unknown tree, but left to the settlement as an entry of its own."""
        self._add_replayed_entry(frame, gates, clamp)

    def _add_replayed_entry(
        self, frame: Frame, gates: ReplayGates, clamp: WalOffset | None
    ) -> None:
        self.mark.add_unmined(FrameSpan.of(frame), frame.tenant, clamp, gates)

"""Settlement after a mining failure (RFC 0055 §9.4, DESIGN.md §5 and §13).

An exception inside a turn's mining leaves the tenant's tree in an unknown state (a
leaf may have been widened before its template event was emitted), while the frame is
durable and acknowledged. The turn records an *unmined entry* — the frame's span, its
tenant, and ``clamp``: the last acknowledged offset before the frame — and nothing else
of the batch. From then on:

* **the clamp**: the pipeline's mark is ``min(latest, clamp)`` over every remaining
  entry (None stays None), so no barrier stamps past the frame; the latest offset is
  kept beside it and becomes the mark again when the set is empty;
* **no snapshot** of the entry's tenant is installed (the live tree is unknown), and
  admission refuses the tenant (``SettlementInProgress``, 503 with a bounded hint);
* **settlement** rebuilds the tenant, triggered by the next turn for it (before its
  own batch) or by the barrier tick (before it captures), exactly once per entry:

  1. *claim* — the settling state is published under the admission mutex, then under
     the barrier exclusion (exclusive) and the miner lock the entries move Unresolved →
     Settling (a second trigger finds them Settling: a turn waits on their signal, the
     barrier tick goes on with its cut), and the frontier W is read: the larger of the
     checkpoint X and the tenant's PUBLISHED records mark — every row at or below it is
     durable, every buffered row lies above it;
  2. *check* — the restorable horizon (the SnapshotLedger's retained state, never the
     directory) against RECLAIM's ``reclaimed_through`` written under Known: below it,
     the surviving frames cannot rebuild the tree, and the tenant is refused as
     unrecoverable (below);
  3. *read and mine* — the tenant's frames from its snapshot horizon (or its oldest
     surviving frame) through the entry's span, in bounded ``read_frames_from`` calls
     with no pipeline lock held (the journal mutex is dropped between calls), mined
     into a new tree built off to the side;
  4. *swap* — under the exclusion (exclusive) and the miner lock, in one section: the
     new tree replaces the old, every buffered row of the tenant is dropped and its
     next generation begins (``Buffers.drop_tenant``: a discarded-tree partition still
     in flight is fenced, never written after this point), the replay's rows and
     events are buffered, the entries are removed and the clamp lifted; the signal is
     set. Nothing here waits for another thread's publish;
  5. *intent, forced frontier* (barrier thread only; no I/O in an ingest turn) — RFC
     0055 §9.4 "intent then confirm". Before the swap, ``publish_marks`` records the
     intent: the frontier W (one position for both sides) and the end of the span, the
     entry's ``publishing`` bit set. The swap buffers the span *staged* (its records,
     and the events of templates the tree held before the rebuild: ``sink.buffers``),
     units named by their rows. After it the tenant's rows are published and, when
     nothing of it is left in flight, ``publish_marks`` confirms (the raised marks
     reach the span's end: the bit clears), so a crash after it replays nothing of the
     span. A crash between the two leaves the bit: recovery gates the tenant at W and
     republishes the span staged from the same snapshot, under the same names, with the
     store's conditional create — what landed is not written again, what did not is
     (``app/node/recovery.py``; the crash cases are argued in docs/ARCHITECTURE.md). One
     intent at a time: a settlement that finds one in force stages exactly its span and
     writes none of its own; a turn's settlement stages it too and never writes one.
     No intent can be written (the write failed, or the sides start apart): nothing is
     force-published, the rows wait for the next cut.

  What the replay emits: a frame's records only above W; its template events above
  the audit frontier, and always the events of templates the replay created (a fresh
  id: no published event names it). So a record at or below W is present exactly once;
  one above it at most twice (the discarded tree may have published it before the
  swap), never absent. Template ids are never rewound: a template the replay re-creates
  gets a fresh id.

* **failure inside settlement** — the entries return to Unresolved, the signal is set;
  the tenant stays refused and the next tick retries. The retries are bounded
  (``max_attempts``, ``wal.frame_mining_attempts``): a failure raised while mining or
  emitting one frame counts against that frame (so do the ingest turn's and a start-up
  replay's), and a frame at the bound is *isolated* — the rebuild, run again at once,
  does not mine it and buffers its records as they are, with ``NO_TEMPLATE`` and no
  template events — so the entry resolves and the mark moves on. Where that cannot
  help (the isolated frame's template-less rows cannot be buffered either, or the
  settlement fails ``max_attempts`` times for a reason no frame explains) the tenant is
  refused as unrecoverable (below). A start-up replay's entries carry the gates that
  replay applied (``ReplayGates``): the settlement re-emits above them.

* **unrecoverable** — PUBLISHED records a terminal entry for the tenant (its frontier
  stays at W — never above a replay's gates — so a restart replays its frames in
  full), the entries leave the clamp set (the checkpoint advances for everyone else),
  the tenant is dropped from the horizons housekeeping uses (its frames stay pinned),
  its appends are refused (``TenantUnrecoverable``, server-terminal, naming it),
  ``tenant.unrecoverable`` is emitted once. Every other tenant continues.

Settlement never takes the ingest gate: the barrier exclusion, then the miner lock.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from app import points
from app.base.batch import FlatBatch
from app.base.config import WalSettings
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.tenant_miner import MineResult, TenantMiner
from app.ingest.snapshot_store import SnapshotLedger, SnapshotState
from app.ingest.tenants import TenantTable
from app.receive.otlp import decode_flat
from sink import Buffers, Detached, Publisher
from wal import (
    ConsumerMode,
    Frame,
    FrameCursor,
    FrameSpan,
    Journal,
    PublishedMarks,
    PublishedWriteError,
    WalOffset,
)

log = logging.getLogger("ourios.settlement")


class _Exclusion(Protocol):
    """The barrier exclusion (the pipeline's reader–writer lock)."""

    def shared(self) -> AbstractContextManager[None]: ...

    def exclusive(self) -> AbstractContextManager[None]: ...


class Host(Protocol):
    """What a settlement works with — the pipeline's journal, miners, buffers,
    publisher, tenant table, unmined entries, locks and emit steps — named here so this
    module needs no import of the pipeline (which owns the settler)."""

    @property
    def journal(self) -> Journal: ...

    @property
    def miners(self) -> MinerCluster: ...

    @property
    def buffers(self) -> Buffers: ...

    @property
    def publisher(self) -> Publisher: ...

    @property
    def ledger(self) -> SnapshotLedger: ...

    @property
    def tenants(self) -> TenantTable: ...

    @property
    def unmined(self) -> UnminedSet: ...

    @property
    def exclusion(self) -> _Exclusion: ...

    @property
    def miner_lock(self) -> threading.Lock: ...

    @property
    def folded(self) -> dict[str, WalOffset]: ...

    # replaced whole by the settler (turns read them without a lock)
    refused: frozenset[str]
    refused_details: Mapping[str, str]

    def clock(self) -> float: ...

    def recompute_durable(self) -> None: ...

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> None: ...

    def buffer_audit(
        self,
        tenant: str,
        batch: FlatBatch,
        result: MineResult,
        offset: WalOffset,
        staged: Callable[[int], bool] | None = None,
    ) -> list[Detached]: ...

    def buffer_records(
        self,
        tenant: str,
        batch: FlatBatch,
        result: MineResult,
        offset: WalOffset,
        nbytes: int,
        staged: bool = False,
    ) -> list[Detached]: ...


#: frames per ``read_frames_from`` call: the longest the journal mutex is held
READ_LIMIT = 64


class EntryState(enum.Enum):
    UNRESOLVED = 1
    SETTLING = 2
    REFUSED = 3  # the tenant is unrecoverable: out of the clamp set


@dataclass(eq=False)
class UnminedEntry:
    """A frame whose mining raised: where it is, whose it is, and the clamp."""

    span: FrameSpan
    tenant: str
    #: the last acknowledged offset when the frame was appended (the previous turn's)
    clamp: WalOffset | None
    state: EntryState = EntryState.UNRESOLVED
    #: the completion signal of the current claim
    done: threading.Event = field(default_factory=threading.Event)
    #: the index of the first record of the frame not known durable (this pipeline
    #: never forwards part of a failed batch, so it is always 0)
    emit_from: int = 0
    failures: int = 0
    error: str = ""
    #: settlements of the entry that failed for a reason no frame explains (a journal
    #: read, ``replace_tenant``): at the bound the tenant is refused as unrecoverable
    unexplained: int = 0
    #: set when a start-up replay recorded the entry: the gates it applied to the tenant
    gates: ReplayGates | None = None


@dataclass(frozen=True, slots=True)
class ReplayGates:
    """The frontiers a start-up replay published a tenant's rows above (None: nothing of
    that side is known published). Its rows between these and a higher frontier were
    buffered by that replay and are dropped with the tenant's buffers, so a settlement of
    its entry re-emits above these, and a terminal entry written for it never claims
    more (``PUBLISHED`` only moves forward)."""

    records: WalOffset | None
    audit: WalOffset | None


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
class FrameAttempts:
    """One frame's failed attempts at mining or emitting in this process: the ingest
    turn, each rebuild that failed on it, the start-up replay."""

    failures: int = 0
    error: str = ""
    #: announced as isolated (the event emitted once, the counter moved once)
    announced: bool = False
    #: isolated by a start-up replay because its payload did not decode: a rebuild
    #: skips it without decoding it (it may be what killed a worker)
    undecodable: bool = False


def _lower(a: WalOffset | None, b: WalOffset | None) -> WalOffset | None:
    if a is None or b is None:
        return None
    return a if a.lsn <= b.lsn else b


class UnminedSet:
    """The entries (a set, not a slot) and the clamp over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[UnminedEntry] = []

    def add(self, entry: UnminedEntry) -> None:
        with self._lock:
            self._entries.append(entry)

    def remove(self, entries: list[UnminedEntry]) -> None:
        with self._lock:
            self._entries = [e for e in self._entries if e not in entries]

    def of(self, tenant: str) -> list[UnminedEntry]:
        """The tenant's entries that still hold it (not Refused)."""
        with self._lock:
            return [
                e for e in self._entries if e.tenant == tenant and e.state is not EntryState.REFUSED
            ]

    def has(self, tenant: str) -> bool:
        return bool(self.of(tenant))

    def tenants(self) -> set[str]:
        """Tenants with an entry that holds them (Unresolved or Settling)."""
        with self._lock:
            return {e.tenant for e in self._entries if e.state is not EntryState.REFUSED}

    def replayed(self) -> set[str]:
        """Tenants with an entry a start-up replay recorded (gates set), until settled."""
        with self._lock:
            return {e.tenant for e in self._entries if e.gates is not None}

    def clamp(self) -> tuple[bool, WalOffset | None]:
        """(whether any entry clamps, the minimum effective clamp — None stays None)."""
        with self._lock:
            active = [e for e in self._entries if e.state is not EntryState.REFUSED]
        if not active:
            return False, None
        low: WalOffset | None = active[0].clamp
        for e in active[1:]:
            low = _lower(low, e.clamp)
        return True, low

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class SettleResult(enum.Enum):
    """How one settlement ended (``SettleOutcome.result``)."""

    NOTHING = 1  # no entry for the tenant
    SETTLED = 2  # rebuilt, swapped in, entries removed
    WAITED = 3  # another trigger held the claim; this one waited for its signal
    UNRECOVERABLE = 4
    FAILED = 5  # an exception inside the settlement: entries back to Unresolved


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    tenant: str
    result: SettleResult
    frames: int = 0
    records: int = 0
    events: int = 0
    dropped: int = 0
    marks_written: bool = False
    error: str = ""


@dataclass
class _Replayed:
    frame: Frame
    batch: FlatBatch
    result: MineResult
    publish_records: bool
    isolated: bool = False


#: The ``template_id`` of a record published without a template: its frame was isolated
#: after repeated mining failures. Never allocated (a node's counter starts at 1).
NO_TEMPLATE = 0

#: Default of ``wal.frame_mining_attempts`` (declared once, in the settings table).
DEFAULT_MINING_ATTEMPTS: int = WalSettings.frame_mining_attempts


def untemplated(records: int) -> MineResult:
    """An isolated frame's rows: no template, no parameters, no template events."""
    return MineResult([NO_TEMPLATE] * records, [()] * records, [])


class Settler:
    """Runs settlements for the pipeline (module docstring)."""

    def __init__(
        self,
        pipeline: Host,
        *,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        read_limit: int = READ_LIMIT,
        max_attempts: int = DEFAULT_MINING_ATTEMPTS,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.pipeline = pipeline
        self._events = events or (lambda name, fields: None)
        self.read_limit = read_limit
        #: (cadence seconds, next tick time) of the barrier that settles refused tenants,
        #: installed by it; None: no barrier (the hint is one second)
        self.schedule: Callable[[], tuple[float, float]] | None = None
        #: failed attempts at one frame after which it is isolated (its rows published
        #: without templates), and failed settlements no frame explains after which the
        #: tenant is refused as unrecoverable (``wal.frame_mining_attempts``)
        self.max_attempts = max_attempts
        #: rebuilds swapped in (the claim makes it one per entry set)
        self.rebuilds = 0
        self.last: SettleOutcome | None = None
        #: frames isolated in this process (``ourios_wal_isolated_frames_total``)
        self.isolated_frames = 0
        self._attempts_lock = threading.Lock()
        #: tenant -> frame end LSN -> its failed attempts in this process; pruned once the
        #: tenant's restorable snapshot is past the frame (no rebuild reads it again)
        self._attempts: dict[str, dict[int, FrameAttempts]] = {}

    # -- attempts ------------------------------------------------------------------------

    def note_failure(self, tenant: str, offset: WalOffset, error: str) -> int:
        """Count a failed attempt at mining (or emitting) the frame ending at ``offset``;
        returns its failures so far."""
        with self._attempts_lock:
            attempts = self._attempts.setdefault(tenant, {}).setdefault(offset.lsn, FrameAttempts())
            attempts.failures += 1
            attempts.error = error
            return attempts.failures

    def isolate_undecodable(self, tenant: str, offset: WalOffset, error: str) -> None:
        """A replay isolated the frame ending at ``offset``: its payload did not decode
        (``app.node.recovery``, which announced it)."""
        with self._attempts_lock:
            self._attempts.setdefault(tenant, {})[offset.lsn] = FrameAttempts(
                self.max_attempts, error, announced=True, undecodable=True
            )

    def attempts(self, tenant: str, offset: WalOffset) -> int:
        with self._attempts_lock:
            found = self._attempts.get(tenant, {}).get(offset.lsn)
            return 0 if found is None else found.failures

    def _isolated(self, tenant: str, horizon: WalOffset | None) -> dict[int, FrameAttempts]:
        """The tenant's frames at the bound (a rebuild does not mine them), forgetting
        those at or below ``horizon``: the restorable snapshot has folded them."""
        with self._attempts_lock:
            frames = self._attempts.get(tenant)
            if frames is None:
                return {}
            if horizon is not None:
                for lsn in [lsn for lsn in frames if lsn <= horizon.lsn]:
                    del frames[lsn]
                if not frames:
                    del self._attempts[tenant]
                    return {}
            return {lsn: a for lsn, a in frames.items() if a.failures >= self.max_attempts}

    # -- the two triggers ----------------------------------------------------------------

    def settle_all(self, *, force_publish: bool) -> list[SettleOutcome]:
        """The barrier tick: every tenant with an entry, before the cut is captured."""
        return [
            self.settle(t, force_publish=force_publish, wait=False)
            for t in sorted(self.pipeline.unmined.tenants())
        ]

    def retry_after(self, tenant: str) -> int:
        """The hint a refused request gets: about a second while a rebuild runs, else
        until the next barrier tick retries it; at least 1 s, at most the cadence."""
        p = self.pipeline
        schedule = self.schedule() if self.schedule is not None else None
        cadence = 1.0 if schedule is None else schedule[0]
        entries = p.unmined.of(tenant)
        if any(e.state is EntryState.SETTLING for e in entries) or schedule is None:
            remaining = 1.0
        else:
            remaining = schedule[1] - p.clock()
        return int(max(1, min(math.ceil(cadence), math.ceil(remaining))))

    # -- one settlement ------------------------------------------------------------------

    def settle(self, tenant: str, *, force_publish: bool, wait: bool = True) -> SettleOutcome:
        """Settle ``tenant``'s entries, or — another trigger holding the claim — wait for
        its signal (``wait``: a turn must not mine before the rebuild is installed; the
        barrier tick need not wait, and must not: the claimant may be waiting for a cut
        only the barrier thread runs)."""
        p = self.pipeline
        if not p.unmined.has(tenant):
            p.tenants.set_settling(tenant, False)
            return SettleOutcome(tenant, SettleResult.NOTHING)
        # The claim is visible to admission before it exists (admission mutex alone).
        p.tenants.set_settling(tenant, True)
        signal: threading.Event | None = None
        done = threading.Event()
        claim_x: WalOffset | None = None
        state: SnapshotState | None = None
        with p.exclusion.exclusive():
            with p.miner_lock:
                entries = p.unmined.of(tenant)
                busy = [e for e in entries if e.state is EntryState.SETTLING]
                if busy:
                    signal = busy[0].done
                elif entries:
                    claim_x = p.journal.last_checkpoint
                    for e in entries:
                        e.state = EntryState.SETTLING
                        e.done = done
                    state = p.ledger.state(tenant)
        if not entries:
            p.tenants.set_settling(tenant, False)
            return SettleOutcome(tenant, SettleResult.NOTHING)
        if signal is not None:
            points.hit("settlement.lost")
            if wait:
                signal.wait()
            return SettleOutcome(tenant, SettleResult.WAITED)
        points.hit("settlement.claimed")
        try:
            outcome = self._rebuild(tenant, entries, state, claim_x, done, force_publish)
        except FrameFailed as exc:
            if exc.isolated:
                # Even its template-less rows cannot be buffered: isolate the tenant.
                outcome = self._refuse(
                    tenant,
                    entries,
                    done,
                    claim_x,
                    f"the rows of its frame at {exc.offset} cannot be buffered even without "
                    f"templates ({type(exc.cause).__name__}: {exc.cause}); its frames stay in "
                    f"the WAL and a restart replays them",
                    {"reason": "isolated_frame_emit_failed", "failed_frame": str(exc.offset)},
                )
            else:
                error = f"{type(exc.cause).__name__}: {exc.cause}"
                failures = self.note_failure(tenant, exc.offset, error)
                outcome = self._failed(tenant, entries, done, exc.cause, exc.offset)
                if failures >= self.max_attempts:
                    # At the bound: rebuild again at once, the frame isolated, rather than
                    # holding every tenant's mark for another barrier period.
                    return self.settle(tenant, force_publish=force_publish, wait=wait)
        except Exception as exc:  # noqa: BLE001 - the entry goes back; the next tick retries
            if max(e.unexplained for e in entries) + 1 >= self.max_attempts:
                outcome = self._refuse(
                    tenant,
                    entries,
                    done,
                    claim_x,
                    f"its settlement failed {self.max_attempts} times for a reason no frame "
                    f"explains (last: {type(exc).__name__}: {exc}); its frames stay in the WAL "
                    f"and a restart replays them",
                    {"reason": "settlement_failed", "error": f"{type(exc).__name__}: {exc}"},
                )
            else:
                outcome = self._failed(tenant, entries, done, exc, None)
        self.last = outcome
        return outcome

    def _failed(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        exc: BaseException,
        frame: WalOffset | None,
    ) -> SettleOutcome:
        """Entries back to Unresolved; ``frame`` is the frame whose mining or emit raised
        (its attempts are counted by the caller), None when no frame explains it."""
        p = self.pipeline
        with p.exclusion.exclusive():
            with p.miner_lock:
                for e in entries:
                    if e.state is EntryState.SETTLING:
                        e.state = EntryState.UNRESOLVED
                    e.failures += 1
                    if frame is None:
                        e.unexplained += 1
                    e.error = f"{type(exc).__name__}: {exc}"
        done.set()
        at = (
            f"at its frame {frame} (failure {self.attempts(tenant, frame)} of "
            f"{self.max_attempts} before the frame is isolated)"
            if frame is not None
            else f"(unexplained failure {entries[0].unexplained} of {self.max_attempts})"
        )
        log.error(
            "settlement of tenant %r failed (attempt %d) %s: %s; it stays refused and the next "
            "barrier tick retries",
            tenant,
            entries[0].failures,
            at,
            exc,
            exc_info=exc,
        )
        return SettleOutcome(tenant, SettleResult.FAILED, error=entries[0].error)

    def _rebuild(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        state: SnapshotState | None,
        claim_x: WalOffset | None,
        done: threading.Event,
        force_publish: bool,
    ) -> SettleOutcome:
        """Settle one tenant in RFC 0055 §9.4's order: restore its snapshot, refuse if the
        WAL no longer holds what it needs, replay its frames into a new tree, record the
        intent, swap the tree in, then publish and report."""
        p = self.pipeline
        to = max((e.span for e in entries), key=lambda s: s.end)
        tree, horizon = self._restore(tenant, state)
        refused = self._refuse_if_reclaimed(tenant, entries, done, claim_x, horizon)
        if refused is not None:
            return refused
        if tree is None:
            tree = p.miners.build(tenant, None)
        marks = p.journal.published_marks().get(tenant, PublishedMarks())
        from_records, from_audit = self._frontiers(entries, claim_x, marks)
        w_records, w_audit = _lsn(from_records), _lsn(from_audit)
        #: the ids the tree had before this rebuild: their events are the same in every
        #: attempt at the span, the others are this attempt's own
        known = {t.template_id for t in tree.templates()}
        isolated = self._isolated(tenant, horizon)
        replayed = self._replay(tenant, tree, horizon, to, isolated, (w_records, w_audit))
        points.hit("settlement.before_swap")
        span = marks.intent  # an earlier settlement's span not confirmed yet: kept as it is
        if span is None and force_publish:
            span = self._intend(tenant, from_records, from_audit, horizon, to.offset)
            force_publish = span is not None
        detached, records, events_out, dropped = self._swap(
            tenant, tree, entries, replayed, span, known, to.offset
        )
        self.rebuilds += 1
        done.set()
        p.tenants.set_settling(tenant, False)
        p.tenants.settled(tenant, installed=True)
        for r in replayed:
            if r.isolated:
                self._announce(tenant, r, isolated[r.frame.offset.lsn])
        if not force_publish:
            for d in detached:
                if not p.publisher.offer(d):
                    p.publisher.park(d)
        self._report_settled(
            tenant,
            (horizon, to.offset, span),
            (w_records, w_audit),
            (len(replayed), records, events_out, dropped),
        )
        written = self._force_frontier(tenant, to.offset, detached) if force_publish else False
        return SettleOutcome(
            tenant, SettleResult.SETTLED, len(replayed), records, events_out, dropped, written
        )

    def _restore(
        self, tenant: str, state: SnapshotState | None
    ) -> tuple[TenantMiner | None, WalOffset | None]:
        """The tree and horizon of the tenant's installed snapshot, or (None, None) when
        there is none or it does not restore (then the rebuild replays from empty)."""
        p = self.pipeline
        horizon: WalOffset | None = None
        tree: TenantMiner | None = None
        if state is not None:
            try:
                tree = p.miners.build(tenant, state.miner)
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

    def _refuse_if_reclaimed(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        claim_x: WalOffset | None,
        horizon: WalOffset | None,
    ) -> SettleOutcome | None:
        """The refusal when RECLAIM took frames above the horizon the rebuild starts from
        (its template state cannot be rebuilt from the WAL); None when it can."""
        p = self.pipeline
        reclaimed = p.journal.reclaimed_through(tenant)
        if (
            reclaimed is not None
            and reclaimed[0] is ConsumerMode.KNOWN
            and (horizon is None or horizon.lsn < reclaimed[1].lsn)
        ):
            have = "no restorable snapshot" if horizon is None else f"a snapshot at {horizon}"
            return self._refuse(
                tenant,
                entries,
                done,
                claim_x,
                f"it has {have}, but RECLAIM records its frames reclaimed through "
                f"{reclaimed[1]}; its template state cannot be rebuilt from the WAL (a restart "
                f"halts naming it)",
                {
                    "reason": "reclaimed",
                    "horizon": None if horizon is None else str(horizon),
                    "reclaimed_through": str(reclaimed[1]),
                },
            )
        return None

    @staticmethod
    def _frontiers(
        entries: list[UnminedEntry], claim_x: WalOffset | None, marks: PublishedMarks
    ) -> tuple[WalOffset | None, WalOffset | None]:
        """The frontiers the replay re-emits above, records and audit (None: nothing of
        that side is durable), never above a replayed entry's gates."""
        from_records = _higher(claim_x, marks.records)
        from_audit = _higher(claim_x, marks.audit)
        for e in entries:
            if e.gates is not None:  # a start-up replay's entry: never above its gates
                from_records = _lower(from_records, e.gates.records)
                from_audit = _lower(from_audit, e.gates.audit)
        return from_records, from_audit

    def _replay(
        self,
        tenant: str,
        tree: TenantMiner,
        horizon: WalOffset | None,
        to: FrameSpan,
        isolated: dict[int, FrameAttempts],
        frontiers: tuple[int, int],
    ) -> list[_Replayed]:
        """The tenant's frames from the horizon through ``to`` mined into the new tree,
        outside every lock; the isolated ones go without templates."""
        p = self.pipeline
        w_records, w_audit = frontiers
        cursor = (
            FrameCursor.after(horizon) if horizon is not None else p.journal.oldest_frame(tenant)
        )
        replayed: list[_Replayed] = []
        while cursor is not None:
            frames, cursor = p.journal.read_frames_from(cursor, to, tenant, self.read_limit)
            points.hit("settlement.read")  # the journal mutex is free here
            for frame in frames:
                lsn = frame.offset.lsn
                if lsn in isolated and isolated[lsn].undecodable:
                    continue  # isolated at the replay: not even decoded (its rows are lost)
                batch = decode_flat(frame.payload, tenant)
                if lsn in isolated:
                    # Not mined (it fails every time): its rows go out without templates.
                    replayed.append(
                        _Replayed(frame, batch, untemplated(len(batch)), lsn > w_records, True)
                    )
                    continue
                try:
                    mined = tree.mine(batch.bodies)
                except Exception as exc:  # noqa: BLE001 - counted against this frame
                    raise FrameFailed(frame.offset, exc, isolated=False) from exc
                events = [e for e in mined.events if lsn > w_audit or e.change == "created"]
                replayed.append(
                    _Replayed(
                        frame,
                        batch,
                        dataclasses.replace(mined, events=events),
                        lsn > w_records,
                    )
                )
        return replayed

    def _swap(
        self,
        tenant: str,
        tree: TenantMiner,
        entries: list[UnminedEntry],
        replayed: list[_Replayed],
        span: WalOffset | None,
        known: set[int],
        through: WalOffset,
    ) -> tuple[list[Detached], int, int, int]:
        """The new tree in and the old tree's rows out in one exclusive section, the
        replay buffered (staged up to ``span``): the detached partitions, the records,
        template events and dropped rows."""
        p = self.pipeline
        detached: list[Detached] = []
        records = events_out = 0
        with p.exclusion.exclusive():
            with p.miner_lock:
                p.replace_tenant(tenant, tree)  # first: a failure here has dropped nothing
                dropped = p.buffers.drop_tenant(tenant)
                for r in replayed:
                    staged = span is not None and r.frame.offset.lsn <= span.lsn
                    try:
                        detached.extend(
                            p.buffer_audit(
                                tenant,
                                r.batch,
                                r.result,
                                r.frame.offset,
                                known.__contains__ if staged else None,
                            )
                        )
                        if r.publish_records:
                            detached.extend(
                                p.buffer_records(
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
                p.buffers.seal_staged(tenant)  # the span is complete: its units are final
                p.folded[tenant] = through
                p.unmined.remove(entries)
                p.recompute_durable()
        return detached, records, events_out, dropped

    def _report_settled(
        self,
        tenant: str,
        where: tuple[WalOffset | None, WalOffset, WalOffset | None],
        frontiers: tuple[int, int],
        counts: tuple[int, int, int, int],
    ) -> None:
        """``tenant.settled`` and its log line: from where through where, the frontiers,
        the intent, and how many frames, records, events and dropped rows."""
        horizon, through, span = where
        w_records, w_audit = frontiers
        frames, records, events_out, dropped = counts
        self._events(
            "tenant.settled",
            {
                "tenant": tenant,
                "from": None if horizon is None else str(horizon),
                "through": str(through),
                "records_frontier": w_records,
                "audit_frontier": w_audit,
                "intent": None if span is None else str(span),
                "frames": frames,
                "records": records,
                "events": events_out,
                "dropped": dropped,
            },
        )
        log.info(
            "tenant %r settled: %d frames replayed from %s through %s, %d records and %d "
            "template events re-emitted (frontier %d), %d discarded rows dropped",
            tenant,
            frames,
            horizon if horizon is not None else "its oldest surviving frame",
            through,
            records,
            events_out,
            w_records,
            dropped,
        )

    def _announce(self, tenant: str, r: _Replayed, attempts: FrameAttempts) -> None:
        """Once per isolated frame and process: the event naming tenant and frame, the
        counter, an error line."""
        with self._attempts_lock:
            if attempts.announced:
                return
            attempts.announced = True
            self.isolated_frames += 1
        self._events(
            "tenant.frame_isolated",
            {
                "tenant": tenant,
                "frame": str(r.frame.offset),
                "attempts": attempts.failures,
                "error": attempts.error,
                "records": len(r.batch),
                "published": r.publish_records,
                "action": f"its records are published without templates (template_id "
                f"{NO_TEMPLATE}, no parameters, no template events); the tenant goes on and "
                f"the checkpoint no longer waits on the frame",
            },
        )
        log.error(
            "tenant %r: the frame at %s failed mining %d times (last: %s); it is isolated: "
            "its %d records are published without templates (template_id %d) and the tenant "
            "goes on",
            tenant,
            r.frame.offset,
            attempts.failures,
            attempts.error,
            len(r.batch),
            NO_TEMPLATE,
        )

    def _intend(
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
        p = self.pipeline
        # Frames at or below the snapshot horizon are not re-emitted on either side, so
        # the sides differ only if they differ above it.
        lo = _lower(from_records, from_audit)
        if _lsn(_higher(horizon, from_records)) != _lsn(_higher(horizon, from_audit)):
            log.warning(
                "tenant %r: its records and audit frontiers (%s, %s) differ above its "
                "snapshot; the settled rows wait for the next cut instead of an intent",
                tenant,
                from_records,
                from_audit,
            )
            return None
        try:
            p.journal.publish_marks({tenant: PublishedMarks(lo, lo, intent=through)})
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

    def _force_frontier(self, tenant: str, through: WalOffset, detached: list[Detached]) -> bool:
        """Publish the tenant's rows now and confirm the intent with the raised frontier
        (RFC 0055 §9.4): a crash after it replays nothing of the span, a crash before it
        replays the span under the same names. A failure leaves the intent in force —
        the next checkpoint's PUBLISHED write, whose flush covers the span, confirms
        it."""
        p = self.pipeline
        with p.exclusion.shared():
            batches = p.buffers.drain_tenant(tenant, "settlement")
        # what the swap's size trigger detached goes first (template events lead)
        batches = sorted(detached + batches, key=lambda d: d.partition.kind.value != "audit")
        ok = True
        for d in batches:
            ok = p.publisher.publish(d).ok and ok
        points.hit("settlement.published")  # the publish returned; the marks not written
        # Rows of it still in flight elsewhere (the publisher thread's queue, a pending
        # cut only this thread runs): not waited for; the next checkpoint covers them.
        if not ok or p.buffers.in_flight.pending_for(tenant):
            log.info("tenant %r: not all settled rows are durable yet; frontier kept", tenant)
            return False
        try:
            p.journal.publish_marks({tenant: PublishedMarks(through, through)})
        except PublishedWriteError as exc:
            log.warning("tenant %r: the settlement's frontier write failed: %s", tenant, exc)
            return False
        return True

    def _refuse(
        self,
        tenant: str,
        entries: list[UnminedEntry],
        done: threading.Event,
        claim_x: WalOffset | None,
        detail: str,
        fields: Mapping[str, object],
    ) -> SettleOutcome:
        """The tenant cannot be rebuilt (module docstring): isolate it. Its terminal
        PUBLISHED entry is durable before its entries leave the clamp set; it claims no
        more than a start-up replay's gates (the rows above them are not all durable)."""
        p = self.pipeline
        records, audit = claim_x, claim_x
        for e in entries:
            if e.gates is not None:
                records = _lower(records, e.gates.records)
                audit = _lower(audit, e.gates.audit)
        p.journal.publish_marks({tenant: PublishedMarks(records, audit, terminal=True)})
        with p.exclusion.exclusive():
            with p.miner_lock:
                for e in entries:
                    e.state = EntryState.REFUSED
                p.refused_details = {**p.refused_details, tenant: detail}
                p.refused = p.refused | {tenant}  # read by turns without a lock
                p.recompute_durable()
        done.set()
        first = p.tenants.set_unrecoverable(tenant, detail)
        p.tenants.settled(tenant, installed=False)
        p.ledger.refuse(tenant)
        if first:
            self._events(
                "tenant.unrecoverable",
                {"tenant": tenant, **fields, "frame": str(entries[0].span.offset)},
            )
        log.error("tenant %r is unrecoverable: %s", tenant, detail)
        return SettleOutcome(tenant, SettleResult.UNRECOVERABLE, error=detail)


def _lsn(offset: WalOffset | None) -> int:
    return -1 if offset is None else offset.lsn


def _higher(a: WalOffset | None, b: WalOffset | None) -> WalOffset | None:
    """The later of two frontiers (None: nothing, below every offset)."""
    if a is None:
        return b
    if b is None:
        return a
    return a if a.lsn >= b.lsn else b

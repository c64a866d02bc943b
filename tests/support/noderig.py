"""An in-process node for barrier, housekeeping and recovery tests: a real journal on a
``FaultyFs``, the real pipeline, buffers, publisher, barrier, housekeeper and snapshot
store, an in-memory (optionally failing) object store, and a stepped clock.

Nothing runs on its own: the barrier and housekeeping threads are not started, so a
test drives them with ``rig.barrier.step()`` / ``rig.housekeeper.step()`` (and
``rig.clock.advance(seconds)`` for ages), deterministically. ``restart()`` closes
everything (or, with ``crash=True``, abandons it and applies the fs crash) and runs
recovery on the same directory, as ``ourios serve`` would.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

import pyarrow.parquet as pq
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from app import points
from app.base.events import EventLog
from app.cadence.barrier import Barrier, CutOutcome
from app.cadence.housekeeping import Housekeeper
from app.ingest.landed import intent_hook, retract_hook
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.template_ids import FileTemplateIdAllocator, TemplateIdAllocator
from app.ingest.pipeline import Pipeline
from app.ingest.settle_parts import SettleSchedule
from app.ingest.settlement import DEFAULT_MINING_ATTEMPTS
from app.ingest.snapshot_store import SnapshotLedger, SnapshotStore
from app.node.recovery import Decoder, Recovery, RecoveryReport
from app.receive.otlp import decode_request, flatten
from app.threads import Supervisor
from sink.buffers import Buffers
from sink.deadletter import DeadLetter
from sink.publisher import Publisher, StoreGate
from sink.spool import Spiller, Spool
from sink.testing import FailingStore, MemoryStore
from tests.support.closing import ClosedOnExit
from tests.support.minerfaults import FaultPlan, FaultyMiners
from wal import IntentLog, Journal, OsFs, WalConfig, WalOffset
from wal.testing import FaultyFs, SimulatedCrash


class SteppedClock:
    """A clock that moves only when told (unix seconds)."""

    def __init__(self, start: float | None = None) -> None:
        self.now = start if start is not None else time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


#: when the first record of a built request happened (2025-11-24), unless a test says
FIRST_RECORD_NS = 1_764_000_000_000_000_000


def request(tag: str, n: int = 3) -> ExportLogsServiceRequest:
    """``n`` records of service ``svc`` whose bodies and ``rid`` attributes carry ``tag``."""
    bodies = [f"op {tag} step {i} took {i * 7} ms" for i in range(n)]
    return bodies_request(tag, bodies, service="svc", severity=9)


def bodies_request(
    tag: str | None,
    bodies: Sequence[str],
    *,
    service: str | None = None,
    severity: int = 0,
    times: Sequence[int] | None = None,
    observed: bool = False,
) -> ExportLogsServiceRequest:
    """One record per body, in order, with ``rid`` attributes ``tag/i`` (none when
    ``tag`` is None): a test that chooses the bodies chooses the templates the miner
    makes of them. The records happen at ``times`` (by default one nanosecond apart from
    ``FIRST_RECORD_NS``), observed then too when ``observed``; ``service`` names the one
    resource's ``service.name`` and ``severity`` is every record's number, when given."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    if service is not None:
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", service
    sl = rl.scope_logs.add()
    for i, body in enumerate(bodies):
        rec = sl.log_records.add()
        rec.time_unix_nano = FIRST_RECORD_NS + i if times is None else times[i]
        if observed:
            rec.observed_time_unix_nano = rec.time_unix_nano
        if severity:
            rec.severity_number = severity
        rec.body.string_value = body
        if tag is not None:
            kv = rec.attributes.add()
            kv.key, kv.value.string_value = "rid", f"{tag}/{i}"
    return req


@dataclass
class NodeRig(ClosedOnExit):
    root: Path
    config: WalConfig = field(default_factory=lambda: WalConfig(segment_max_bytes=64 * 1024))
    flush_bytes: int = 1 << 30
    queue_depth: int = 64
    #: how long a publish waits for another thread's write (``Publisher.wait_secs``)
    publish_wait_secs: float = 300.0
    ceiling_bytes: int = 256 << 20
    barrier_secs: float = 300
    housekeeping_secs: float = 60
    #: False: plain ``OsFs`` (no fault seam, no op log, no crash model) — for the
    #: benchmarks, where ``FaultyFs``'s ever-growing op log and inode shadow would be
    #: a heap (and a garbage-collection cost) production never has
    faulty: bool = True
    #: builds the miners each start (``tests.support.minerfaults.FaultyMiners`` injects
    #: mining failures); None: the production ``MinerCluster``
    miners_factory: Callable[[TemplateIdAllocator], MinerCluster] | None = None
    #: ``wal.frame_mining_attempts``
    mining_attempts: int = DEFAULT_MINING_ATTEMPTS
    #: the supervisor whose verdict is the pipeline's ``alive`` (None: always alive)
    threads: Supervisor | None = None
    #: False: no publish intents (the node before issue 16: a restart republishes what
    #: was published above the frontiers)
    intents: bool = True
    #: recovery's decoder (None: ``decode_here``); an isolated frame's payload is kept
    #: under ``<root>/data/quarantine/frames`` and reported as ``replay.frame_isolated``
    decode: Decoder | None = None
    #: the memory bound (DESIGN.md §5.12): ``sink.ceiling_bytes`` with the spool in
    #: ``data/spool``, the store gate and the spiller's thread; None: unbounded
    sink_ceiling: int | None = None
    max_object_bytes: int = 1 << 30
    #: ``sink.dead_letter_attempts`` with the dead-letter directory in ``data/deadletter``
    #: (DESIGN.md §5.13); None: no dead letters (a refused partition is retried for ever)
    dead_letter_attempts: int | None = None

    def __post_init__(self) -> None:
        self.fs: FaultyFs = (
            FaultyFs(self.root / ".shadow") if self.faulty else cast(FaultyFs, OsFs())
        )
        self.memory = MemoryStore()
        self.store = FailingStore(self.memory)
        self.clock = SteppedClock()
        self.start()

    # -- life cycle ----------------------------------------------------------------------

    # A replay returns its report; ``replay=False`` returns None (``replay_now`` reports).
    @overload
    def start(self, *, replay: Literal[True] = True) -> RecoveryReport: ...
    @overload
    def start(self, *, replay: bool) -> RecoveryReport | None: ...
    def start(self, *, replay: bool = True) -> RecoveryReport | None:
        """Open and recover. ``replay=False`` stops after recovery's preparation (what
        ``ourios serve`` does before it is ready): ``replay_now()`` finishes it."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.events: list[tuple[str, dict[str, object]]] = []
        #: the same events through the production ``EventLog``: the log stream
        self.log_stream = io.StringIO()
        self.event_log = EventLog(self.log_stream)
        self.journal = Journal.open(
            data / "wal",
            self.config,
            fs=self.fs,
            clock=self.clock,
            monotonic=self.clock,  # one stepped clock for names and ages
            events=self.record_event,
        )
        self.intent_log: IntentLog | None = (
            IntentLog.open(self.fs, data / "wal") if self.intents else None
        )
        holder: dict[str, Pipeline] = {}
        self.buffers = Buffers(
            flush_bytes=self.flush_bytes,
            clock=self.clock,
            epoch=lambda: holder["p"].epoch if "p" in holder else 1,
            ceiling_bytes=self.sink_ceiling,
            max_object_bytes=self.max_object_bytes,
        )
        self.spool: Spool | None = None
        gate: StoreGate | None = None
        if self.sink_ceiling is not None:
            self.spool = Spool(
                data / "spool", events=self.record_event, read_budget=self.sink_ceiling // 4
            )
            self.spool_discarded = self.spool.clear()
            gate = StoreGate(clock=self.clock, events=self.record_event)
        log = self.intent_log
        self.publisher = Publisher(
            self.store,
            self.buffers,
            node="rig-0",
            queue_depth=self.queue_depth,
            wait_secs=self.publish_wait_secs,
            intents=intent_hook(log) if log is not None else None,
            retract=retract_hook(log) if log is not None else None,
            step=lambda name: points.hit(name),
            spool=self.spool,
            gate=gate,
            max_object_bytes=self.max_object_bytes,
            dead_letter=(
                DeadLetter(data / "deadletter") if self.dead_letter_attempts is not None else None
            ),
            dead_letter_attempts=self.dead_letter_attempts or 1,
            events=self.record_event,
        )
        self.spiller: Spiller | None = None
        if self.sink_ceiling is not None:
            self.spiller = Spiller(self.buffers, self.publisher.spill)
            self.spiller.start()
        self.allocator = FileTemplateIdAllocator(data / "template-ids", 0)
        factory = self.miners_factory
        self.miners = (
            factory(self.allocator) if factory is not None else MinerCluster(self.allocator)
        )
        self.ledger = SnapshotLedger()
        schedule = SettleSchedule()
        self.pipeline = Pipeline(
            self.journal,
            self.miners,
            self.buffers,
            self.publisher,
            clock=self.clock,
            events=self.record_event,
            ledger=self.ledger,
            mining_attempts=self.mining_attempts,
            threads=self.threads,
            ceiling_bytes=self.ceiling_bytes,
            schedule=schedule,
        )
        holder["p"] = self.pipeline
        self.snapshots = SnapshotStore(data / "snapshots", fs=self.fs)
        self.barrier = Barrier(
            self.pipeline.cuts,
            self.snapshots,
            self.ledger,
            journal=self.journal,
            settler=self.pipeline.settler,
            barrier_secs=self.barrier_secs,
            segment_age_secs=self.config.segment_age_secs,
            clock=self.clock,
            events=self.record_event,
            intents=self.intent_log,
        )
        schedule.follow(self.barrier.schedule)  # as the node does: the settling hint
        self.housekeeper = Housekeeper(
            self.journal,
            self.ledger,
            every=self.housekeeping_secs,
            cap=self.config.max_unlinks_per_pass,
            clock=self.clock,
            events=self.record_event,
        )
        self.recovery = Recovery(
            self.journal,
            self.pipeline,
            self.snapshots,
            self.ledger,
            intents=self.intent_log.records() if self.intent_log is not None else None,
            objects=self.store,
            decode=self.decode,
            quarantine=data / "quarantine" / "frames",
            on_isolated=lambda f: self.record_event("replay.frame_isolated", f.fields()),
            on_absent=self.intent_log.retract if self.intent_log is not None else None,
        )
        self.recovery.prepare()
        self.pipeline.set_ready(True)
        if not replay:
            return None
        return self.replay_now()

    def replay_now(self) -> RecoveryReport:
        """The rest of recovery after ``start(replay=False)``: turn every replayed frame,
        then finish (publish, post-recovery snapshots)."""
        for item in self.recovery.items():
            self.recovery.turn(item)
        self.recovery.replayed()
        self.report = self.recovery.finish()
        return self.report

    def record_event(self, name: str, fields: object) -> None:
        """Where every component of the rig reports: kept in ``events`` and written by
        the production ``EventLog``, one ordered stream as in `ourios serve`."""
        self.events.append((name, dict(fields)))  # type: ignore[call-overload]
        self.event_log(name, fields)  # type: ignore[arg-type]

    def logged_events(self) -> list[dict[str, object]]:
        """The JSON lines the production ``EventLog`` wrote for this rig, parsed."""
        return [json.loads(line) for line in self.log_stream.getvalue().splitlines()]

    def close(self) -> None:
        if self.spiller is not None:
            self.spiller.close()
        self.publisher.close()
        self.journal.close()
        if self.intent_log is not None:
            self.intent_log.close()

    @overload
    def restart(
        self,
        *,
        crash: bool = False,
        power_loss: bool = False,
        replay: Literal[True] = True,
        store_faults: Callable[[FailingStore], object] | None = None,
    ) -> RecoveryReport: ...
    @overload
    def restart(
        self,
        *,
        crash: bool = False,
        power_loss: bool = False,
        replay: bool,
        store_faults: Callable[[FailingStore], object] | None = None,
    ) -> RecoveryReport | None: ...
    def restart(
        self,
        *,
        crash: bool = False,
        power_loss: bool = False,
        replay: bool = True,
        store_faults: Callable[[FailingStore], object] | None = None,
    ) -> RecoveryReport | None:
        """Stop (cleanly, or by abandoning the process) and start again on the disk;
        ``store_faults`` arms the store of the new start before it opens."""
        if crash:
            self.fs.crash_now()
            if self.intent_log is not None:
                try:  # the dead process's log: no later publish may append to it
                    self.intent_log.close()
                except SimulatedCrash:
                    pass
            self.fs.apply_crash(power_loss=power_loss)
            if self.spiller is not None:
                self.spiller.close(timeout=5)
            self.publisher.close(timeout=5)
        else:
            self.close()
        self.store.clear()  # the store recovers with the process
        if store_faults is not None:
            store_faults(self.store)
        return self.start(replay=replay)

    # -- traffic -------------------------------------------------------------------------

    def ingest(self, tenant: str, tag: str, n: int = 3) -> WalOffset:
        data = request(tag, n).SerializeToString()
        batch = flatten(decode_request(data, "application/x-protobuf"), tenant)
        self.pipeline.ingest(tenant, data, batch, "test")
        mark = self.pipeline.latest  # the own frame end (the mark may be clamped below it)
        assert mark is not None
        return mark

    # -- what the store holds --------------------------------------------------------------

    def published_rids(self, tenant: str | None = None) -> list[str]:
        """Every ``rid`` attribute in the published record objects (with repeats)."""
        out: list[str] = []
        for key in self.memory.list("records/"):
            table = pq.read_table(io.BytesIO(self.memory.get(key)))
            for t, attrs in zip(
                table.column("tenant").to_pylist(),
                table.column("attributes").to_pylist(),
                strict=True,
            ):
                if tenant is None or t == tenant:
                    out.extend(v for k, v in attrs if k == "rid")
        return out

    def audit_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []  # pyarrow rows: each column its own type
        for key in self.memory.list("audit/"):
            rows.extend(pq.read_table(io.BytesIO(self.memory.get(key))).to_pylist())
        return rows


def rids(tag: str, n: int = 3) -> Sequence[str]:
    return [f"{tag}/{i}" for i in range(n)]


class FaultyRigs:
    """Builds ``NodeRig``s whose miners fail as each one's own ``FaultPlan`` says (the
    ``miners_factory`` seam), each under its own directory, and closes them all on exit:
    the settlement and poison tests start a node, crash it and restart another."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rigs: list[NodeRig] = []

    def build(self, **kwargs: Any) -> tuple[NodeRig, FaultPlan]:
        plan = FaultPlan()
        rig = NodeRig(
            self.root / f"node{len(self.rigs)}",
            miners_factory=lambda allocator: FaultyMiners(allocator, plan),
            **kwargs,
        )
        self.rigs.append(rig)
        return rig, plan

    def __enter__(self) -> FaultyRigs:
        return self

    def __exit__(self, *exc: object) -> None:
        for rig in self.rigs:
            rig.close()


def record_rows(rig: NodeRig, tenant: str) -> list[tuple[str, int]]:
    """(rid, template_id) of every published record row of ``tenant``, with repeats."""
    out: list[tuple[str, int]] = []
    for key in rig.memory.list("records/"):
        table = pq.read_table(io.BytesIO(rig.memory.get(key)))
        for t, attrs, tid in zip(
            table.column("tenant").to_pylist(),
            table.column("attributes").to_pylist(),
            table.column("template_id").to_pylist(),
            strict=True,
        ):
            if t == tenant:
                out.extend((v, tid) for k, v in attrs if k == "rid")
    return out


def rig_factory(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    """The body of a ``make_rig`` fixture: makes rigs under ``tmp_path``, closes them all."""
    rigs: list[NodeRig] = []

    def make(**kwargs: object) -> NodeRig:
        rig = NodeRig(tmp_path / f"node{len(rigs)}", **kwargs)  # type: ignore[arg-type]
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def step(rig: NodeRig) -> CutOutcome:
    """One barrier cut, which must have run."""
    out = rig.barrier.step()
    assert out is not None
    return out


def checkpoint(rig: NodeRig) -> WalOffset | None:
    """The journal's checkpoint mark (a call, so that mypy does not narrow it)."""
    return rig.journal.last_checkpoint

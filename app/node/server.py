"""``ourios serve``: assembly, start-up order and shutdown (DESIGN.md §6).

Start: take the data directory's lock and open the WAL → start the publisher and the
worker processes → recovery's preparation (validate every segment, restore the
snapshots, rebuild the tenant table from the sidecars and frame headers) → the turn
thread starts with the replay ahead of every new frame → the listeners accept and the
node is ready (``server.listening`` gives the bound ports) while the replay runs → when
its last frame is turned: publish what it buffered, install the snapshots, log
``recovery.done`` (what was replayed and suppressed, how long it took) and start the age
sweep, the barrier and housekeeping.

SIGTERM/SIGINT, within ``server.shutdown_grace_secs`` + ``server.final_cut_secs`` in
every state (``StopBudget``): a replay in progress is cut short at its next frame (its
decoding on the workers abandoned; nothing new is turned on top of it) → stop the
listeners (requests in flight finish) → the turn thread turns what was acknowledged
until the drain's time is up, then stops after the frame in hand → stop the age sweep →
join the housekeeping and barrier timers → the final cut (flush every buffered
partition, install snapshots, checkpoint) → stop the publisher → close the WAL. The
timers, the cut and the publisher run on a thread of their own, which the main thread
waits for only until the budget ends. One ``server.stopped`` line says what was left
and whether every thread joined, and it is the last: a thread still running then (a
store call that never returns) does not keep the process alive — it exits at once
(``os._exit``). The exit status is 0 only when every acknowledged row reached the
store (``EXIT_ROWS_LEFT`` otherwise: the rows are in the WAL, and the next start
replays them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import uvicorn

from app import points
from app.base.config import EFFECTIVE_EVENT, Settings
from app.base.diskspace import (
    DiskSpace,
    VolumeTooSmall,
    check_volume,
    from_reserve,
    open_disk_space,
    start_reserve,
)
from app.base.events import EventLog, open_logs
from app.base.gc_policy import freeze_long_lived_heap
from app.cadence.archive import ArchiveLocationError, Archiver, check_archive_location
from app.cadence.barrier import Barrier, CutOutcome
from app.cadence.housekeeping import Housekeeper, hurry_words
from app.cadence.sweep import AgeSweep
from app.ingest.admission import Admission
from app.ingest.landed import intent_hook, retract_hook
from app.ingest.mining import native_miner
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import FileTemplateIdAllocator
from app.ingest.mining.tenant_miner import CREATE_WORK
from app.ingest.pipeline import Pipeline
from app.ingest.settle_parts import SettleSchedule
from app.ingest.shares import TurnShares
from app.ingest.snapshot_store import SnapshotLedger, SnapshotStore, SnapshotStoreError
from app.ingest.stages import LocalPort, Stages
from app.ingest.tenants import TenantCountExceeded
from app.node.datalock import DataDirLock, DataDirLocked, DataDirLockError
from app.node.encode_dispatch import EncodeSlots
from app.node.metrics import Metrics, Started
from app.node.recovery import IsolatedFrame, Recovery
from app.node.storeprobe import (
    StoreHealth,
    StoreProbe,
    StoreUnusable,
    WatchedStore,
    probe_at_start,
)
from app.node.worker_pool import Listeners, NodeState, Workers, worker_launcher
from app.receive import native
from app.receive.auth import Authenticator
from app.receive.inflight import receiver_bounds
from app.receive.otlp_grpc import create_grpc_server
from app.receive.otlp_http import (
    create_http_app,
    create_ops_app,
    http_server,
    start_in_thread,
    stop_in_thread,
)
from app.receive.tls import ServerTls, TlsError, server_tls
from app.threads import Supervised, Supervisor, start_thread
from sink.buffers import Buffers
from sink.deadletter import DeadLetter
from sink.keys import node_identity
from sink.parquet import RecordColumns, encode_records
from sink.publisher import Publisher, StoreGate
from sink.spool import Spiller, Spool
from sink.store import LocalStore, ObjectStore, from_url
from wal import CorruptionError, IntentLog, Journal, OsFs, WalError

log = logging.getLogger("ourios.server")


class _Volume:
    """The node's free-space figure as an embedded store sees it. The store is opened
    before the WAL (the WAL's archiver writes to it) and the figure after (it counts the
    WAL's writes), so the store is built on this and this follows the figure once it
    exists: the bytes each object adds (when the store is on the WAL's volume) and a
    full disk's release of the reserve."""

    def __init__(self) -> None:
        self._space: DiskSpace | None = None
        self._counted = False

    def follow(self, space: DiskSpace, root: Path) -> None:
        self._space = space
        self._counted = space.on_volume(root)

    def wrote(self, nbytes: int) -> None:
        if self._counted and self._space is not None:
            self._space.wrote(nbytes)

    def no_space(self, cause: str) -> bool:
        return self._space is not None and self._space.no_space(cause)


class _RecordsEncoder:
    """Encodes the publisher's records partitions: here until the worker processes are
    started (they are made after the publisher, by ``ourios serve``), then on them
    (``use``); a worker that cannot leaves the core to encode them itself."""

    def __init__(self) -> None:
        self._encode: Callable[[RecordColumns, str], bytes] = encode_records
        self._slots: EncodeSlots | None = None

    def use(self, encode: Callable[[RecordColumns, str], bytes], slots: EncodeSlots) -> None:
        self._encode = encode
        self._slots = slots

    def __call__(self, cols: RecordColumns, compression: str) -> bytes:
        return self._encode(cols, compression)

    def slot(self) -> AbstractContextManager[object]:
        """What a publish holds around its CPU part (TAIL.6): one of the workers' encode
        slots once they encode, nothing before."""
        slots = self._slots
        return slots.slot() if slots is not None else contextlib.nullcontext()

    def paced(self) -> AbstractContextManager[object]:
        """What a cut's flush lane publishes inside: the slots it takes rest after
        (``server.encode_duty_percent``), once the workers encode."""
        slots = self._slots
        return slots.paced() if slots is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class _Ahead:
    """Built before the parts that need each other and handed to both: the barrier's
    schedule the settler's hint reads (the barrier is built on the pipeline, which builds
    the settler), the wake admission rings when it starts refusing between ticks (the
    housekeeper that waits on it is built on admission), the disk figure an embedded
    store reports to (``_Volume``), and the records encoder the publisher is built on
    (the workers that encode are made after it, ``_RecordsEncoder``)."""

    schedule: SettleSchedule = field(default_factory=SettleSchedule)
    wake: threading.Event = field(default_factory=threading.Event)
    volume: _Volume = field(default_factory=_Volume)
    encoder: _RecordsEncoder = field(default_factory=lambda: _RecordsEncoder())


@dataclass
class Node:
    """Everything ``ourios serve`` runs, built in start-up order."""

    settings: Settings
    events: EventLog
    journal: Journal
    store: ObjectStore
    pipeline: Pipeline
    metrics: Metrics
    sweep: AgeSweep
    snapshots: SnapshotStore
    ledger: SnapshotLedger
    barrier: Barrier
    housekeeper: Housekeeper
    admission: Admission | None = None
    archiver: Archiver | None = None
    #: the data directory's lock, held from before the first read until the WAL closes
    lock: DataDirLock | None = None
    #: the publish intents (PUBLISHING in the WAL root): every object's claim before
    #: its PUT, so a restart publishes nothing twice
    intents: IntentLog | None = None
    #: where the memory bound puts what the store does not take, and its thread
    #: (DESIGN.md §5.12)
    spool: Spool | None = None
    spiller: Spiller | None = None
    #: runs every long-lived thread; one that stopped for good fails /healthz
    threads: Supervisor | None = None
    #: probes the store again while it does not answer (``ourios_store_up``)
    store_probe: StoreProbe | None = None
    #: given what ``ourios serve`` starts, for the metrics built before it
    started: Started = field(default_factory=Started)
    #: built before the parts that need each other (``_Ahead``)
    ahead: _Ahead = field(default_factory=_Ahead)


def build_node(
    settings: Settings,
    events: EventLog,
    clock: Callable[[], float] = time.time,
    *,
    store: ObjectStore | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> Node:
    """Take the data directory's lock, then build everything in start-up order. The lock
    comes first: a second node on a live directory refuses before it reads or writes
    anything there (``DataDirLocked``, naming the directory and the holder). ``store``
    replaces the one the settings name (a test's failing store). ``clock`` is the wall
    clock, for what is written (segment names); ``monotonic`` runs every timer and age,
    so a wall clock stepped back stalls no cadence."""
    server = settings.server
    server.data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock.acquire(server.data_dir)
    try:
        return _build_node(settings, events, (clock, monotonic), lock, store)
    except BaseException:
        lock.release()
        raise


#: the core's GIL switch interval (Python's default is 5 ms)
CORE_SWITCH_INTERVAL_S = 0.0005


def miner_bounds(settings: Settings) -> MinerConfig:
    """Every tenant's miner: Drain's defaults under the ``miner`` section's bounds."""
    miner = settings.miner
    return MinerConfig(
        max_clusters=miner.max_templates,
        max_body_chars=miner.mined_body_chars,
        max_body_tokens=miner.mined_body_tokens,
        max_leaf_clusters=miner.max_leaf_templates,
    )


def _build_node(
    settings: Settings,
    events: EventLog,
    clocks: tuple[Callable[[], float], Callable[[], float]],
    lock: DataDirLock,
    given_store: ObjectStore | None,
) -> Node:
    """Wire the node's parts in the order each needs the one before: the store, the
    WAL and its disk space, the pipeline, then the cadences that drive it."""
    server = settings.server
    clock, monotonic = clocks
    threads = Supervisor(events=events, restarts=server.thread_restarts)
    ahead = _Ahead()
    store, node, health, watched, archiver = _open_store(
        settings, events, given_store, ahead.volume
    )
    started = Started()
    metrics = Metrics(
        settings, threads=threads, archiver=archiver, extra=[health.gauges], started=started
    )
    journal, intents, space = _open_wal(settings, events, clocks, metrics, archiver)
    pipeline, ledger, admission, spool, spiller = _build_pipeline(
        settings,
        events,
        monotonic,
        (store, watched, node),
        journal,
        intents,
        space,
        (threads, ahead),
        on_cut_stall=metrics.cut_stall_seconds.observe,
    )
    snapshots, barrier, housekeeper, sweep = _build_cadences(
        settings,
        events,
        clocks,
        pipeline,
        ledger,
        admission,
        intents,
        space,
        metrics,
        (threads, ahead),
    )
    ahead.schedule.follow(barrier.schedule)
    return Node(
        settings,
        events,
        journal,
        watched,
        pipeline,
        metrics,
        sweep,
        snapshots,
        ledger,
        barrier,
        housekeeper,
        admission,
        archiver,
        lock,
        intents,
        spool,
        spiller,
        threads,
        StoreProbe(health, settings.store.probe_secs, threads),
        started,
        ahead,
    )


def _open_store(
    settings: Settings, events: EventLog, given_store: ObjectStore | None, volume: _Volume
) -> tuple[ObjectStore, str, StoreHealth, WatchedStore, Archiver | None]:
    """The object store, probed before anything opens so a wrong one refuses the start,
    wrapped so every call tells the store-health gauge; and the WAL archiver on it."""
    server = settings.server
    store = given_store if given_store is not None else _store(settings, volume)
    node = node_identity(server.node_id)
    if settings.wal.archive:
        check_archive_location(store, node, server.wal_dir)  # refused before anything opens
    health = StoreHealth(store, events.emit, f"probe/{node}")
    if given_store is None:  # the store the settings name: a wrong one refuses the start
        probe_at_start(
            health,
            settings.store.bucket or "",
            settings.store.endpoint_url or "the AWS endpoint of the region",
        )
    watched = WatchedStore(store, health)  # every call the node makes tells the gauge
    archiver: Archiver | None = None
    if settings.wal.archive:
        archiver = Archiver(store, node, events=events)  # it needs the LocalStore itself
    return store, node, health, watched, archiver


def _open_wal(
    settings: Settings,
    events: EventLog,
    clocks: tuple[Callable[[], float], Callable[[], float]],
    metrics: Metrics,
    archiver: Archiver | None,
) -> tuple[Journal, IntentLog, DiskSpace]:
    """The volume checked, the emergency reserve taken, then the WAL and the publish
    intents opened (on the reserve's block if the volume is full) and the disk-space
    figure that counts their writes."""
    server = settings.server
    clock, monotonic = clocks
    disk = settings.disk
    check_volume(
        server.wal_dir,
        server.data_dir,
        reserve_bytes=disk.reserve_bytes,
        stop_water_bytes=disk.stop_water_bytes,
    )
    # The reserve before the WAL: a start-up write on a full volume that needs a block
    # takes the reserve's (``from_reserve``) instead of failing every start.
    reserve = start_reserve(server.wal_dir, server.data_dir, disk.reserve_bytes, events)
    journal = from_reserve(
        reserve,
        "opening the WAL",
        lambda: Journal.open(
            server.wal_dir,
            settings.wal,
            clock=clock,
            monotonic=monotonic,
            events=events,
            on_append=metrics.append_seconds.observe,
            on_fsync=metrics.fsync_seconds.observe,
            archive=archiver,
        ),
    )
    try:
        intents = from_reserve(
            reserve, "opening the publish intents", lambda: IntentLog.open(OsFs(), server.wal_dir)
        )
    except BaseException:
        journal.close()
        raise
    if intents.opened.dropped_bytes:
        events.emit(
            "intents.tail_dropped",
            {
                "path": str(intents.path),
                "bytes": intents.opened.dropped_bytes,
                "reason": intents.opened.dropped_reason,
                "intents": len(intents),
            },
            "warning",
        )
    space = open_disk_space(
        server.wal_dir, journal, reserve=reserve, stop_water_bytes=disk.stop_water_bytes
    )
    return journal, intents, space


def _build_pipeline(
    settings: Settings,
    events: EventLog,
    monotonic: Callable[[], float],
    stores: tuple[ObjectStore, WatchedStore, str],
    journal: Journal,
    intents: IntentLog,
    space: DiskSpace,
    runs: tuple[Supervisor, _Ahead],
    *,
    on_cut_stall: Callable[[float], None],
) -> tuple[Pipeline, SnapshotLedger, Admission, Spool, Spiller]:
    """The pipeline and what it turns batches through: the miners and their template
    ids, the sink's buffers and publisher with its spool, and admission; ``runs``: the
    node's thread supervisor and what is built ahead (``_Ahead``)."""
    server = settings.server
    threads, ahead = runs
    store, watched, node = stores
    spool = _open_spool(server.data_dir, space, events, settings.sink.ceiling_bytes)
    allocator = FileTemplateIdAllocator(
        server.data_dir / "template-ids", server.node_ordinal, on_no_space=space.no_space
    )
    if isinstance(store, LocalStore):  # the embedded store: usually on this volume
        ahead.volume.follow(space, store.root)
    miners = MinerCluster(allocator, miner_bounds(settings))
    holder: dict[str, Pipeline] = {}
    buffers, publisher = _build_publisher(
        settings, events, monotonic, (watched, node), intents, space, spool, runs, holder
    )
    spiller = Spiller(buffers, publisher.spill, threads=threads)
    ledger = SnapshotLedger()
    admission = Admission(
        journal,
        low_water_bytes=settings.disk.low_water_bytes,
        stop_water_bytes=settings.disk.stop_water_bytes,
        unreclaimed_bytes_limit=settings.wal.unreclaimed_bytes_limit,
        retry_after_secs=settings.wal.housekeeping_secs,
        events=events,
        space=space,
        on_urgent=ahead.wake.set,
        hurry=hurry_words(settings.wal.housekeeping_secs, cuts=True),
    )
    pipeline = Pipeline(
        journal,
        miners,
        buffers,
        publisher,
        clock=monotonic,
        events=events,
        ledger=ledger,
        admission=admission,
        mining_attempts=settings.wal.frame_mining_attempts,
        shares=TurnShares(
            settings.miner.tenant_turn_percent,
            settings.miner.tenant_turn_burst_secs,
            events=events,
            # before its first turn a tenant's records are assumed the costliest there can
            # be: a full leaf compared and a template created
            first_per_record=1 + settings.miner.max_leaf_templates + CREATE_WORK,
        ),
        threads=threads,
        ceiling_bytes=settings.sink.ceiling_bytes,  # the barrier's pending slot
        on_cut_stall=on_cut_stall,
        schedule=ahead.schedule,
    )
    holder["p"] = pipeline
    if settings.auth.open_mode:
        # Anyone may name any tenant: bound how fast slots are taken (DESIGN.md §3).
        pipeline.tenants.limit_new_tenants(
            settings.server.open_new_tenants_per_minute,
            events=lambda name, fields: events.emit(name, fields, "warning"),
        )
    return pipeline, ledger, admission, spool, spiller


def _build_publisher(
    settings: Settings,
    events: EventLog,
    monotonic: Callable[[], float],
    store: tuple[WatchedStore, str],
    intents: IntentLog,
    space: DiskSpace,
    spool: Spool,
    runs: tuple[Supervisor, _Ahead],
    holder: dict[str, Pipeline],
) -> tuple[Buffers, Publisher]:
    """The sink's buffers (stamped with the pipeline's epoch once ``holder`` has it)
    and the publisher that writes them to the store under their intents, encoding its
    records partitions with the encoder built ahead."""
    server = settings.server
    threads, ahead = runs
    watched, node = store
    buffers = Buffers(
        flush_bytes=settings.sink.flush_bytes,
        clock=monotonic,
        epoch=lambda: holder["p"].epoch if "p" in holder else 1,
        ceiling_bytes=settings.sink.ceiling_bytes,
        max_object_bytes=settings.sink.max_object_bytes,
    )
    publisher = Publisher(
        watched,
        buffers,
        node=node,
        compression=settings.sink.parquet_compression,
        queue_depth=settings.sink.publisher_queue_depth,
        intents=intent_hook(intents),
        retract=retract_hook(intents),
        step=lambda name: points.hit(name),
        spool=spool,
        gate=StoreGate(events=events),
        max_object_bytes=settings.sink.max_object_bytes,
        threads=threads,
        dead_letter=_dead_letter(server.data_dir, space),
        dead_letter_attempts=settings.sink.dead_letter_attempts,
        events=events,
        records_encoder=ahead.encoder,
        encode_slot=ahead.encoder.slot,
    )
    return buffers, publisher


def _build_cadences(
    settings: Settings,
    events: EventLog,
    clocks: tuple[Callable[[], float], Callable[[], float]],
    pipeline: Pipeline,
    ledger: SnapshotLedger,
    admission: Admission,
    intents: IntentLog,
    space: DiskSpace,
    metrics: Metrics,
    runs: tuple[Supervisor, _Ahead],
) -> tuple[SnapshotStore, Barrier, Housekeeper, AgeSweep]:
    """The cadences that drive the pipeline: the barrier's cuts into snapshots, the
    housekeeper that reclaims after them, and the age sweep; each told to the metrics.
    They run on the monotonic clock (``clock``, the wall clock, is the WAL's alone)."""
    server = settings.server
    clock, monotonic = clocks
    threads, ahead = runs
    snapshots = SnapshotStore(server.snapshots_dir, space=space, events=events)
    wal = settings.wal
    barrier = Barrier(
        pipeline.cuts,
        snapshots,
        ledger,
        journal=pipeline.journal,
        settler=pipeline.settler,
        barrier_secs=wal.barrier_secs,
        segment_age_secs=wal.segment_age_secs,
        clock=monotonic,
        events=events,
        on_cut=lambda outcome: housekeeper.after_cut(),
        on_run=metrics.cadence_observer("barrier"),
        intents=intents,
        threads=threads,
        paced=ahead.encoder.paced,
    )
    housekeeper = Housekeeper(
        pipeline.journal,
        ledger,
        every=wal.housekeeping_secs,
        cap=wal.max_unlinks_per_pass,
        clock=monotonic,
        events=events,
        admission=admission,
        request_cut=barrier.request_cut,
        threads=threads,
        wake=ahead.wake,
        on_pass=metrics.pass_seconds.observe,
        on_run=metrics.cadence_observer("housekeeping"),
    )
    housekeeper.observe_disk()  # a node starting on a full disk refuses from its first request
    metrics.bind(pipeline, housekeeper=housekeeper, admission=admission)
    tick = max(0.1, min(5.0, settings.sink.flush_age_secs / 4))
    sweep = AgeSweep(
        pipeline,
        settings.sink.flush_age_secs,
        tick,
        metrics.cadence_observer("age_sweep"),
        threads=threads,
    )
    return snapshots, barrier, housekeeper, sweep


def _dead_letter(data_dir: Path, space: DiskSpace) -> DeadLetter:
    """The dead-letter directory (DESIGN.md §5.13): never emptied by the node; on the
    data volume its files count in disk admission's figure."""
    root = data_dir / "deadletter"
    root.mkdir(parents=True, exist_ok=True)
    return DeadLetter(root, on_write=space.wrote if space.on_volume(root) else None)


def _open_spool(data_dir: Path, space: DiskSpace, events: EventLog, ceiling: int) -> Spool:
    """The spool, emptied: the WAL re-derives what a previous run left there (DESIGN.md
    §5.12). On the data volume its files count in disk admission's figure."""
    root = data_dir / "spool"
    root.mkdir(parents=True, exist_ok=True)
    counted = space.on_volume(root)
    spool = Spool(
        root,
        on_write=space.wrote if counted else None,
        on_free=space.freed if counted else None,
        events=events,
        read_budget=ceiling // 4,  # what draining the spool holds in memory at once
    )
    files, size = spool.clear()
    if files:
        events.emit(
            "sink.spool.discarded",
            {
                "path": str(root),
                "files": files,
                "bytes": size,
                "action": "the WAL holds every row they held: the replay re-derives them",
            },
        )
    return spool


def _store(settings: Settings, volume: _Volume) -> ObjectStore:
    url = settings.store.url
    return from_url(
        url,
        settings.store.endpoint_url,
        settings.store.region,
        on_write=volume.wrote,
        on_no_space=volume.no_space,
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_serve(settings: Settings, config_file: Path | None = None) -> int:
    events = open_logs(settings.server.log_level, settings.server.log_format)
    # The whole configuration is for machines (and a debugging person); a person at a
    # terminal gets server.listening's summary instead.
    events.emit(
        EFFECTIVE_EVENT,
        {"config": settings.effective()},
        "info" if events.format == "json" else "debug",
    )
    # uvicorn restores the handler it found and re-raises the signal once it has
    # stopped; with this one in place the re-raise records a request instead of killing
    # the process before the final flush. A signal during recovery is kept too.
    stop = threading.Event()
    received: list[int] = []
    _relay_signals(stop, received)
    native.start(settings.server.decoder, events.emit)
    native_miner.start(events.emit)
    if settings.auth.open_mode:
        events.emit(
            "auth.open_mode",
            {
                "message": "no OURIOS_AUTH_TOKENS_FILE: every request is accepted; a missing "
                "X-Ourios-Tenant header means tenant 'default'"
            },
            "warning",
        )
    try:
        # Loaded here even with workers (each loads its own): files that do not load
        # refuse the start, naming the setting, before anything else is touched.
        tls = server_tls(settings, events.emit)
    except TlsError as exc:
        return _start_failed(events, exc)
    try:
        node = build_node(settings, events)
    except (
        WalError,
        ArchiveLocationError,
        DataDirLocked,
        DataDirLockError,
        VolumeTooSmall,
        StoreUnusable,
        OSError,
    ) as exc:
        return _start_failed(events, exc)
    code = _serve(node, stop, received, config_file, tls)
    if lingering_threads():
        # ``server.stopped`` named them: nothing may run on behind the last line (a store
        # call that never returns, a wedged turn), and the interpreter would wait for a
        # non-daemon one for ever. What they held is in the WAL.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    return code


#: Threads that are idle by construction and end with the process (the signal relay).
_IDLE_THREADS = frozenset({"ourios-signals"})


def lingering_threads() -> list[str]:
    """Threads still alive besides this one that ``server.stopped`` must name: every
    non-daemon thread (the interpreter would wait for it at exit), and every thread of
    the node's own (``ourios-*``)."""
    me = threading.current_thread()
    return sorted(
        t.name
        for t in threading.enumerate()
        if t is not me
        and t.is_alive()
        and t.name not in _IDLE_THREADS
        and (not t.daemon or t.name.startswith("ourios-"))
    )


def _relay_signals(stop: threading.Event, received: list[int]) -> None:
    """SIGTERM/SIGINT set ``stop`` from a thread of their own, never from the handler:
    a handler runs on the main thread between two bytecodes, and one that took
    ``stop``'s lock while the main thread held it inside ``stop.wait()`` would wait for
    itself forever — a node that ignores SIGTERM. The handler only writes the signal's
    number to a pipe (one ``os.write``, no lock); the relay thread reads it, records it
    and sets ``stop``."""
    read_end, write_end = os.pipe()

    def on_signal(signum: int, frame: object) -> None:
        os.write(write_end, bytes([signum]))

    def relay() -> None:
        while True:
            got = os.read(read_end, 16)
            if not got:
                return
            received.extend(got)
            stop.set()

    threading.Thread(target=relay, name="ourios-signals", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


#: How long the main thread sleeps at a time while it waits for ``stop``.
STOP_POLL_SECS = 0.2


def wait_for_stop(stop: threading.Event) -> None:
    """Wait on the main thread until ``stop`` is set, waking every ``STOP_POLL_SECS``.
    Python runs a signal's handler only on the main thread, and the kernel may deliver
    SIGTERM to any thread: one delivered elsewhere does not interrupt a main thread
    parked in an untimed ``stop.wait()``, so the handler — and the shutdown — would
    never run. Each wake returns to the interpreter, which runs a pending handler."""
    while not stop.wait(STOP_POLL_SECS):
        pass


#: What the budget keeps for the process's own exit after ``server.stopped``.
EXIT_MARGIN_SECS = 1.0
#: How long the stop waits, out of that margin, for the supervised threads to end once
#: the supervisor is closed (a loop in its restart backoff ends at once).
SUPERVISED_JOIN_SECS = EXIT_MARGIN_SECS / 2
#: The least time the turn thread gets to turn what was acknowledged, even when the
#: listeners' drain took the whole grace (it comes out of the final cut's share).
MIN_TURN_SECS = 1.0


@dataclass(frozen=True)
class StopBudget:
    """SIGTERM's time (DESIGN.md §6) on the monotonic clock: the drain (listeners, then
    the turns) ends at ``drain_end`` = the stop + ``server.shutdown_grace_secs``, and
    everything — the final cut, ``server.stopped`` — at ``end`` = ``drain_end`` +
    ``server.final_cut_secs`` less ``EXIT_MARGIN_SECS`` for the exit itself."""

    drain_end: float
    end: float

    @classmethod
    def since(cls, settings: Settings, stopped_at: float) -> StopBudget:
        drain_end = stopped_at + settings.server.shutdown_grace_secs
        return cls(drain_end, drain_end + settings.server.final_cut_secs - EXIT_MARGIN_SECS)

    def drain_left(self) -> float:
        return max(0.0, self.drain_end - time.monotonic())

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def turns(self) -> float:
        """How long the turn thread may drain: the rest of the drain, at least
        ``MIN_TURN_SECS``, never more than half of what is left in all."""
        return min(max(MIN_TURN_SECS, self.drain_left()), self.left() / 2)


class _Recovering:
    """The start-up's recovery once the node serves (DESIGN.md §5, §6): the replay runs
    on the turn thread ahead of every new frame; when its last frame is turned, this
    thread publishes what it buffered, installs the post-recovery snapshots, logs
    ``recovery.done`` and starts the cadences (which, as before, never cut over a
    replay in progress). A replay or a finish that fails stops the node: ``fatal``."""

    def __init__(self, node: Node, recovery: Recovery, fatal: Callable[[], None]) -> None:
        self._node = node
        self._recovery = recovery
        self._fatal = fatal
        self._replayed = threading.Event()
        self._error: BaseException | None = None
        #: the node is stopping: no cadence may start any more
        self._stopping = False
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.failed: BaseException | None = None
        self._thread: Supervised | None = None

    def replayed(self, error: BaseException | None) -> None:
        """The turn thread's call after the last replayed frame (or the replay's end)."""
        if error is None and self._recovery.backlog_bytes == 0:
            self._recovery.replayed()
        self._error = error
        self._replayed.set()

    def start(self) -> None:
        # Not restartable: it runs once, and what a crash interrupted (the publish, the
        # installs, starting the cadences) cannot be known; /healthz fails instead.
        self._thread = start_thread(
            self._node.threads, "recovery", self._run, thread_name="ourios-recovery", restart=False
        )

    def stop(self, timeout: float) -> bool:
        with self._lock:
            self._stopping = True  # shutdown joins the cadences: none may start after it
        self._replayed.set()  # a replay cut short by shutdown: nothing to finish
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        self._replayed.wait()
        node = self._node
        if self._error is None and self._recovery.backlog_bytes == 0:
            try:
                report = self._recovery.finish()
            except Exception as exc:  # noqa: BLE001 - a node without its cadences must stop
                log.exception("recovery could not finish")
                self._error = exc
            else:
                node.events.emit("recovery.done", report.fields())
                node.started.recovered.give(report)
                freeze_long_lived_heap()
                with self._lock:
                    if not self._stopping:
                        node.sweep.start()
                        node.barrier.start()
                        node.housekeeper.start()
                    self.done.set()  # the replay is complete: the final cut may run
                return
        if self._error is not None:
            self.failed = self._error
            _start_failed(node.events, self._error, event="recovery.failed")
            self._fatal()


@dataclass
class _Serving:
    """What ``_serve``'s start-up got to, shared by its phases (start-up, serve, stop)
    so the stop takes down exactly that, in the order DESIGN.md §6 gives."""

    stop: threading.Event
    #: the HTTP receiver's drain: half of ``server.shutdown_grace_secs``, at least 1 s
    grace: int
    # server.metrics_port's listener, in this process with or without workers; its
    # /metrics counts every worker's requests as theirs does (Workers.scrape).
    ops: OpsListener | None = None
    listeners: Listeners | None = None
    workers: Workers | None = None
    grpc_server: grpc.Server | None = None
    http: uvicorn.Server | None = None
    sock: socket.socket | None = None
    #: when the stop came (monotonic), the listeners' drain already taken off
    stopped_at: float | None = None

    def fatal(self) -> None:
        """A failed recovery stops the node as SIGTERM does."""
        self.stop.set()
        if self.http is not None:
            self.http.should_exit = True


def _serve(
    node: Node,
    stop: threading.Event,
    received: list[int],
    config_file: Path | None,
    tls: ServerTls | None = None,
) -> int:
    """Recovery's preparation, then serve — in worker processes (``server.workers`` >
    0) or on this process's receivers — while the replay runs on the turn thread ahead
    of every new frame (``_Recovering``); until SIGTERM/SIGINT or a failed recovery."""
    # The turn thread mines in Python while the core's other threads acknowledge: each
    # time one of them takes the GIL back after I/O it may wait the switch interval, a
    # few times a request, so a short interval bounds what another tenant's long turn
    # adds to an acknowledgement (DESIGN.md §5.14).
    sys.setswitchinterval(CORE_SWITCH_INTERVAL_S)
    run = _Serving(stop, max(1, node.settings.server.shutdown_grace_secs // 2))
    refused = _open_listeners(node, run)
    if refused is not None:
        return refused
    started = _start_core(node, run, config_file)
    if isinstance(started, int):
        return started
    stages, recovery = started
    node.started.recovery.give(recovery)
    recovering = _Recovering(node, recovery, run.fatal)
    stages.start(replay=recovery.items(), turn_replayed=recovery.turn, replayed=recovering.replayed)
    recovering.start()
    http_port, grpc_port = _start_receivers(node, run, stages, tls)
    node.pipeline.set_ready(True)
    _listening(
        node,
        http_port,
        grpc_port,
        workers=run.workers.pids() if run.workers else [],
        metrics_port=run.ops.port if run.ops is not None else 0,
        tls=tls is not None,
    )
    try:
        _until_stopped(node, run, received, recovering)
    finally:
        code = _stop(node, run, stages, recovery, recovering)
    if recovering.failed is not None:
        return 1
    return code


def _open_listeners(node: Node, run: _Serving) -> int | None:
    """The ports bound first (the metrics listener, the workers' listeners): a port
    taken refuses the start before anything else starts; its exit status, or None."""
    settings = node.settings
    try:
        if settings.server.metrics_port:
            run.ops = OpsListener(
                settings,
                node.pipeline,
                lambda: (
                    run.workers.scrape() if run.workers is not None else node.metrics.exposition()
                ),
            )
        if settings.server.workers > 0:
            run.listeners = Listeners(
                settings.server.host, settings.server.http_port, settings.server.grpc_port
            )
    except OSError as exc:
        if run.ops is not None:
            run.ops.close()
        node.journal.close()
        _release(node)
        return _start_failed(node.events, exc)
    return None


def _start_core(
    node: Node, run: _Serving, config_file: Path | None
) -> tuple[Stages, Recovery] | int:
    """The stages, the workers, the publisher and its helpers started, then recovery
    prepared while the workers launch; a failure takes them down again (``_abandon``)
    and is the exit status."""
    settings = node.settings
    pipeline = node.pipeline
    stages = Stages(
        pipeline,
        backlog_bytes=settings.wal.turn_backlog_bytes,
        tenant_backlog_bytes=settings.miner.tenant_backlog_bytes,
        threads=node.threads,
    )
    node.started.stages.give(stages)
    if run.listeners is not None:
        run.workers = Workers(
            settings.server.workers,
            stages,
            NodeState(
                lambda: pipeline.ready, lambda: pipeline.alive, lambda: pipeline.health_detail
            ),
            observe=node.metrics.observe,
            exposition=node.metrics.exposition,
            events=node.events,
            launch=worker_launcher(run.listeners, config_file),
            threads=node.threads,
            encode_slots=EncodeSlots(
                settings.server.encode_concurrency, settings.server.encode_duty_percent
            ),
        )
        node.started.workers.give(run.workers)
    pipeline.publisher.start()
    if node.store_probe is not None:
        node.store_probe.start()
    if node.spiller is not None:
        node.spiller.start()  # before the replay, which buffers under the same bound
    workers = run.workers
    if workers is not None:
        # The workers encode the publisher's records partitions (the core's CPU is the
        # node's bound); one that cannot leaves the core to encode them itself.
        node.ahead.encoder.use(workers.encode_records, workers.encoder.slots)
        workers.launch()  # starting while recovery prepares: the replay decodes on them
    recovery = _recovery(node, workers)
    try:
        recovery.prepare()
        if workers is not None:
            workers.wait_started()
    except (WalError, SnapshotStoreError, TenantCountExceeded, RuntimeError) as exc:
        return _abandon(node, run, exc)
    return stages, recovery


def _abandon(node: Node, run: _Serving, exc: BaseException) -> int:
    """A start-up that failed once the core started: stop what it started, close the
    WAL, and report what refused it."""
    if node.store_probe is not None:
        node.store_probe.close()
    if run.workers is not None:
        run.workers.stop(node.settings.server.shutdown_grace_secs)
    if run.listeners is not None:
        run.listeners.close()
    if node.spiller is not None:
        node.spiller.close()
    if run.ops is not None:
        run.ops.close()
    node.pipeline.publisher.close()
    node.journal.close()
    _release(node)
    return _start_failed(node.events, exc)


def _recovery(node: Node, workers: Workers | None) -> Recovery:
    """The start-up's recovery over this node's WAL, snapshots, intents and store,
    decoding on the workers when there are any."""
    settings = node.settings
    return Recovery(
        node.journal,
        node.pipeline,
        node.snapshots,
        node.ledger,
        workers.decode_in_order if workers is not None else None,
        intents=node.intents.records() if node.intents is not None else None,
        objects=node.store,
        decode_attempts=settings.wal.frame_decode_attempts,
        quarantine=settings.server.data_dir / "quarantine" / "frames",
        on_isolated=lambda isolated: _isolated(node, isolated),
        on_absent=node.intents.retract if node.intents is not None else None,
        on_store_unavailable=lambda key, exc: node.events.emit(
            "recovery.store_unavailable",
            {
                "key": key,
                "error": str(exc),
                "error_type": exc.error_type,
                "action": "the replay waits for the store to say which objects published "
                "before the restart exist; the node acknowledges meanwhile",
            },
            "warning",
        ),
    )


def _start_receivers(
    node: Node, run: _Serving, stages: Stages, tls: ServerTls | None
) -> tuple[int, int]:
    """The workers told to accept, or this process's gRPC and HTTP receivers started;
    the HTTP and gRPC ports they serve on."""
    settings = node.settings
    if run.workers is not None:
        assert run.listeners is not None
        run.workers.accept()
        return run.listeners.http_port, run.listeners.grpc_port
    port = LocalPort(stages, node.pipeline)
    auth = Authenticator(settings.auth.tokens or None)
    bounds = receiver_bounds(
        settings, lambda name, fields: node.events.emit(name, fields, "warning")
    )
    grpc_server, grpc_port = create_grpc_server(
        port,
        max_frame_bytes=settings.wal.max_frame_bytes,
        authenticator=auth,
        host=settings.server.host,
        port=settings.server.grpc_port,
        observer=node.metrics,
        bounds=bounds,
        credentials=tls.grpc_credentials() if tls is not None else None,
    )
    run.grpc_server = grpc_server
    grpc_server.start()
    app = create_http_app(
        port,
        max_frame_bytes=settings.wal.max_frame_bytes,
        authenticator=auth,
        metrics_text=node.metrics.exposition,
        observer=node.metrics,
        bounds=bounds,
    )
    sock = _listen(settings.server.host, settings.server.http_port)
    run.sock = sock
    http_port: int = sock.getsockname()[1]
    run.http = http_server(
        app, grace=run.grace, tls=tls.http_context() if tls is not None else None
    )
    if run.stop.is_set():
        run.http.should_exit = True  # asked to stop while starting: start nothing new
    return http_port, grpc_port


def _until_stopped(node: Node, run: _Serving, received: list[int], recovering: _Recovering) -> None:
    """Serve until SIGTERM/SIGINT (or a failed recovery), noting when the stop came:
    the stop's budget counts from there."""
    if run.http is not None:
        assert run.sock is not None
        run.http.run(sockets=[run.sock])  # returns on SIGTERM/SIGINT once requests finish
        # the HTTP drain (at most its half of the grace) was spent before this line
        run.stopped_at = time.monotonic() - run.grace - STOP_POLL_SECS
    else:
        wait_for_stop(run.stop)
        run.stopped_at = time.monotonic() - STOP_POLL_SECS
    node.events.emit(
        "server.stopping",
        {
            "signals": [signal.Signals(n).name for n in received],
            "recovery_failed": recovering.failed is not None,
        },
    )


def _stop(
    node: Node, run: _Serving, stages: Stages, recovery: Recovery, recovering: _Recovering
) -> int:
    """The stop (DESIGN.md §6) within its budget: the replay cut short, the workers and
    receivers drained, the turns joined, then ``shutdown``'s final phase; its exit status."""
    settings = node.settings
    pipeline = node.pipeline
    workers = run.workers
    grace = run.grace
    stopped_at = run.stopped_at
    budget = StopBudget.since(settings, time.monotonic() if stopped_at is None else stopped_at)
    pipeline.set_ready(False)
    # A replay still running is cut short first, before its workers go: it ends at
    # its next frame, its decoding ahead is abandoned, and nothing new is turned on
    # top of it. What it did not turn stays in the WAL for the next start; frames
    # acknowledged behind it are durable there too.
    replaying = not recovering.done.is_set()
    if replaying:
        stages.halt()
        recovery.cancel()
    workers_clean = True
    if workers is not None:
        workers_clean = workers.stop(budget.drain_left())
    if run.grpc_server is not None:
        run.grpc_server.stop(grace=min(grace, budget.drain_left())).wait(budget.drain_left())
    stages_joined = stages.close(
        budget.turns(), drain=not replaying, halt_secs=min(5.0, budget.left() / 4)
    )
    recovering.stop(min(30.0, budget.left() / 4))
    if run.listeners is not None:
        run.listeners.close()
    # never turned: those the halt skipped, and those a turn thread that did not end
    # never reached (acknowledged, in the WAL above the mark)
    frames_left, bytes_left = stages.left
    pending_bytes, pending_frames = stages.backlog
    frames_left, bytes_left = frames_left + pending_frames, bytes_left + pending_bytes
    if run.ops is not None:
        run.ops.close()
    node.events.emit(
        "stages.stopped",
        {
            "workers_clean": workers_clean,
            "stages_joined": stages_joined,
            "replay_unfinished_bytes": recovery.backlog_bytes,
            "frames_left_unturned": frames_left,
            "bytes_left_unturned": bytes_left,
        },
    )
    return shutdown(
        node,
        final_cut=recovering.done.is_set(),
        until=budget.end,
        unturned=frames_left,
    )


def _isolated(node: Node, isolated: IsolatedFrame) -> None:
    """A replayed frame isolated because its payload did not decode: one event (the
    counter, ``ourios_replay_frames_isolated_total``, reads the recovery's report)."""
    node.events.emit("replay.frame_isolated", isolated.fields(), "error")


def _listening(
    node: Node,
    http_port: int,
    grpc_port: int,
    *,
    workers: list[int],
    metrics_port: int = 0,
    tls: bool = False,
) -> None:
    """``server.listening``: the bound ports and what a person starting the node needs
    to know (the console format renders it as the start-up summary)."""
    settings = node.settings
    wal = settings.wal
    node.events.emit(
        "server.listening",
        {
            "http_port": http_port,
            "grpc_port": grpc_port,
            "host": settings.server.host,
            "metrics_port": metrics_port,
            "tls": tls,
            "node": node_identity(settings.server.node_id),
            "pid": os.getpid(),
            "data_dir": str(settings.server.data_dir),
            "wal": str(settings.server.wal_dir),
            "store": node.store.describe(),
            "workers": workers,
            # when what is acknowledged reaches the store: a cut, or rows this old
            "publish_every_secs": {
                "wal.barrier_secs": settings.wal.barrier_secs,
                "sink.flush_age_secs": settings.sink.flush_age_secs,
            },
            "cadences": f"barrier {wal.barrier_secs} s, housekeeping {wal.housekeeping_secs} s, "
            f"flush age {settings.sink.flush_age_secs} s, segment age {wal.segment_age_secs} s",
            "auth": "open mode (no tokens file: every request accepted)"
            if settings.auth.open_mode
            else f"bearer tokens from {settings.auth.tokens_file}",
            "stop": f"Ctrl-C or SIGTERM to pid {os.getpid()} (the final cut publishes "
            "what is buffered)",
        },
    )


class OpsListener:
    """``server.metrics_port``: ``/metrics``, ``/healthz`` and ``/readyz`` in plaintext on a
    uvicorn of their own, in a thread of this process, listening from construction
    (``ListenerBindError`` when the port is taken) until ``close``. It answers from the
    start: ``/healthz`` while recovery prepares, ``/readyz`` 503 until the node is ready."""

    def __init__(
        self, settings: Settings, health: Pipeline, scrape: Callable[[], tuple[bytes, str]]
    ) -> None:
        server = http_server(
            create_ops_app(health, scrape),
            settings.server.host,
            settings.server.metrics_port,
            grace=1,
        )
        self._server, self._thread, self.port = start_in_thread(server)

    def close(self) -> None:
        try:
            stop_in_thread(self._server, self._thread)
        except TimeoutError:
            # A scrape that will not end must not hold up the final cut behind it.
            log.warning("the metrics listener did not stop; the process exit ends it")


def _start_failed(events: EventLog, exc: BaseException, event: str = "server.start_failed") -> int:
    """One error event naming what refused the start (the file, the offset, the
    tenant), then exit 1: a node that cannot start safely never serves. WAL corruption
    also carries them as fields — ``path``, ``offset`` and, for damage below a segment's
    synced high-water (acknowledged frames, not a torn tail), ``high_water``."""
    fields: dict[str, object] = {
        "error": str(exc),
        "error_type": getattr(exc, "error_type", type(exc).__name__),
    }
    if isinstance(exc, CorruptionError):
        fields.update(path=str(exc.path), offset=exc.offset, high_water=exc.high_water)
    if isinstance(exc, StoreUnusable):
        fields.update(exc.fields())
    events.emit(event, fields, "error")
    return 1


#: ``ourios serve``'s exit status when it stopped with acknowledged rows (or template
#: events) not in the store: only the WAL holds them, and the next start replays them.
#: EX_TEMPFAIL from sysexits.h: the condition is temporary and a restart resolves it.
EXIT_ROWS_LEFT = 75


@dataclass
class _FinalPhase:
    """What the final phase got to (``shutdown``): filled in as it goes, so a phase cut
    short by the budget still reports what it finished."""

    housekeeping_joined: bool = False
    barrier_joined: bool = False
    final: CutOutcome | None = None
    publisher_joined: bool = False
    wal_closed: bool = False
    ended: bool = False


def _final_phase(
    node: Node, phase: _FinalPhase, join_timeout: float, final_cut: bool, until: float | None
) -> None:
    """Join the timers, run the final cut, stop the publisher, close the WAL."""

    def wait() -> float:
        if until is None:
            return join_timeout
        return max(0.1, min(join_timeout, until - time.monotonic()))

    if node.store_probe is not None:
        node.store_probe.close()
    if node.spiller is not None:
        node.spiller.close(wait())  # the turns are over: nothing more to take
    node.sweep.close(wait())
    phase.housekeeping_joined = node.housekeeper.close(wait())
    phase.barrier_joined = node.barrier.close(wait())
    if phase.barrier_joined and final_cut:
        node.barrier.settle()  # an unmined entry would hold the final mark below its frame
        phase.final = node.barrier.run_cut(node.barrier.capture(rotate_idle=False))
    phase.publisher_joined = node.pipeline.publisher.close(wait())
    if phase.housekeeping_joined:
        node.journal.close()
        _release(node)  # a WAL still open keeps its lock until the process exits
        phase.wal_closed = True
    phase.ended = True


def shutdown(
    node: Node,
    join_timeout: float = 60.0,
    *,
    final_cut: bool = True,
    until: float | None = None,
    unturned: int = 0,
) -> int:
    """Listeners are stopped: join the timers, run the final cut (flush, snapshots,
    checkpoint), close. A timer that does not join within ``join_timeout`` is read as a
    failed cut: a barrier still running a cut gets no final cut after it (two cuts at
    once would break their ordering), and a housekeeping pass still in its file half
    keeps the WAL open — closing descriptors under it could let its RECLAIM write land
    on a reused descriptor — so the process exit releases them instead. Nothing is lost
    either way: what the final cut did not stamp, the next start replays.

    With ``until`` (a monotonic time: the stop's budget) all of it runs on a thread of
    its own, waited for only until then: a cut still inside a store call is abandoned
    (``final_cut_error`` ``timed_out``), and the caller ends the process.

    Without ``final_cut`` (a start-up's replay did not finish) nothing is flushed: the
    buffers hold only replayed rows, which the next start replays again, and a flush
    without a mark to stamp would publish them twice.

    Returns the exit status: 0, or ``EXIT_ROWS_LEFT`` when acknowledged rows are not in
    the store — buffered, or in a publish that never settled (a thread that did not
    join may hold them) — which ``server.stopped`` counts in ``rows_left_in_wal``; an
    unfinished replay, and ``unturned`` acknowledged frames the turn thread never
    reached, count as rows left too."""
    phase = _FinalPhase()
    if until is None:
        _final_phase(node, phase, join_timeout, final_cut, until)
    else:
        runner = threading.Thread(
            target=_final_phase,
            args=(node, phase, join_timeout, final_cut, until),
            name="ourios-final-cut",
            daemon=True,
        )
        runner.start()
        runner.join(max(0.0, until - time.monotonic()))
    return _stopped(node, phase, final_cut, unturned)


def _stopped(node: Node, phase: _FinalPhase, final_cut: bool, unturned: int) -> int:
    """After the final phase ended or was abandoned: count what it left, end the
    supervised threads, and report it all in ``server.stopped``; the exit status."""
    events = node.events
    # Counted after the publisher stopped: what is neither buffered nor in an unsettled
    # publish reached the store. Not the buffers alone — a publish whose thread never
    # returned holds its rows outside them.
    rows_left, events_left = node.pipeline.buffers.unpublished_rows()
    final = phase.final
    if node.threads is not None:
        # the final phase ended or was abandoned: no crashed loop is restarted now, and
        # one waiting out its backoff ends instead (none outlives ``server.stopped``)
        node.threads.close()
        node.threads.join(SUPERVISED_JOIN_SECS)
    final_ok = final is not None and final.complete
    left = rows_left + events_left
    hk_joined, barrier_joined = phase.housekeeping_joined, phase.barrier_joined
    joined = phase.publisher_joined
    clean = final_ok and left == 0 and joined and hk_joined and not unturned
    # an unfinished replay left acknowledged frames unpublished too (counted in bytes)
    code = EXIT_ROWS_LEFT if left or unturned or not final_cut or not phase.ended else 0
    if not final_cut:
        error = "replay_unfinished"
    elif not phase.ended and (final is None or phase.barrier_joined):
        error = "timed_out"
    else:
        error = _final_error(final, barrier_joined)
    events.emit(
        "server.stopped",
        {
            "rows_left_in_wal": rows_left,
            "template_events_left_in_wal": events_left,
            "frames_left_unturned": unturned,
            "exit_code": code,
            "publisher_joined": joined,
            "final_cut_ok": final_ok,
            "final_cut_error": error,
            "checkpoint": None if final is None or final.mark is None else str(final.mark),
            "timers_joined": hk_joined and barrier_joined,
            "housekeeping_joined": hk_joined,
            "barrier_joined": barrier_joined,
            "wal_closed": phase.wal_closed,
            "threads_left": lingering_threads(),
            "threads_failed": sorted(node.threads.failed) if node.threads is not None else [],
        },
        "info" if clean else ("error" if code else "warning"),
    )
    return code


def _final_error(final: CutOutcome | None, barrier_joined: bool) -> str:
    """Why the final cut did not complete, in the cadence counter's words ("" if it did)."""
    if final is None:
        return "barrier_not_joined" if not barrier_joined else "not_run"
    if final.complete:
        return ""
    if final.ok:
        return final.checkpoint_error_type
    if final.latched:
        return "latched"
    return "flush_failed" if final.flush_failures else "prior_publish_failed"


def _release(node: Node) -> None:
    if node.intents is not None:
        node.intents.close()
    if node.lock is not None:
        node.lock.release()


def data_paths(settings: Settings) -> dict[str, Path]:
    return {
        "wal": settings.server.wal_dir,
        "snapshots": settings.server.snapshots_dir,
        "data": settings.server.data_dir,
    }

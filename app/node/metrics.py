"""Prometheus exposition: gauges read at collection time from ``ReclaimState`` and the
pipeline (a custom collector, never a second copy that can drift), plus the counters
the pipeline and the publisher keep. Nothing on the collection path walks a directory
but the standard ``process_*`` series' ``/proc/<pid>/fd`` of the core and each worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from app.base.config import Settings
from app.cadence.archive import Archiver
from app.cadence.housekeeping import Housekeeper
from app.ingest.admission import Admission, Bound
from app.ingest.mining import native_miner
from app.ingest.mining.tenant_miner import state_bytes_bound
from app.ingest.pipeline import LATCH_CLEAR, Pipeline
from app.ingest.stages import Stages
from app.node.encode_dispatch import EncodeSlots
from app.node.recovery import Recovery, RecoveryReport
from app.node.worker_pool import Workers
from app.receive import native
from app.threads import Supervisor
from wal import (
    FloorMin,
    FloorNone,
    FloorPinned,
    FloorUnknown,
    QuarantineRecord,
    ReclaimState,
    RotationExhausted,
    RotationFailing,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _miner_metrics(
    p: Pipeline, settings: Settings
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The miners' bounds at work (DESIGN.md §5.14): node-wide sums and the largest
    tenant's figures — no tenant label, since there may be ``wal.max_tenants`` of them."""
    for name, doc, value, counter in _miner_state_rows(p) + _turn_share_rows(p, settings):
        family: GaugeMetricFamily | CounterMetricFamily = (
            CounterMetricFamily(name, doc) if counter else GaugeMetricFamily(name, doc)
        )
        family.add_metric([], value)
        yield family


def _miner_state_rows(p: Pipeline) -> list[tuple[str, str, float, bool]]:
    """The miners' templates, state bytes and what they evicted or cut short, as
    (name, doc, value, is_counter) rows."""
    stats = p.miners.stats()
    bound = state_bytes_bound(p.miners.default_config)
    return [
        (
            "ourios_miner_templates",
            "Templates held by every tenant's miner.",
            stats.templates,
            False,
        ),
        (
            "ourios_miner_tenant_templates_max",
            "Templates of the tenant holding the most (bounded by miner.max_templates).",
            stats.tenant_templates_max,
            False,
        ),
        (
            "ourios_miner_state_bytes",
            "Heap bytes the miners' templates and trees hold (an estimate that errs high).",
            stats.state_bytes,
            False,
        ),
        (
            "ourios_miner_tenant_state_bytes_max",
            "The largest tenant's ourios_miner_state_bytes.",
            stats.tenant_state_bytes_max,
            False,
        ),
        (
            "ourios_miner_tenant_state_bytes_limit",
            "What the miner bounds allow one tenant's miner state (max_templates templates "
            "of the largest mined body head).",
            0 if bound is None else bound,
            False,
        ),
        (
            "ourios_miner_evictions",
            "Templates evicted by miner.max_templates or miner.max_leaf_templates; a body "
            "like an evicted template gets a new one with a new id.",
            stats.evictions,
            True,
        ),
        (
            "ourios_miner_truncated_bodies",
            "Bodies mined only in part (miner.mined_body_chars or miner.mined_body_tokens); "
            "the records keep their whole bodies.",
            stats.truncated_bodies,
            True,
        ),
    ]


def _turn_share_rows(p: Pipeline, settings: Settings) -> list[tuple[str, str, float, bool]]:
    """The tenants' turn shares (miner.tenant_turn_percent) as measured and as allowed, as
    (name, doc, value, is_counter) rows."""
    return [
        (
            "ourios_miner_work_units",
            "Mining work charged to the tenants' turn shares (miner.tenant_turn_percent).",
            0 if p.shares is None else p.shares.charged,
            True,
        ),
        (
            "ourios_miner_work_unit_seconds",
            "The turn thread's CPU seconds one mining work unit takes, as the turn "
            "measures it (over about the last 10 s): what a tenant's work is charged at.",
            0 if p.shares is None else p.shares.unit_secs,
            False,
        ),
        (
            "ourios_ingest_tenant_turn_share_max",
            "The largest fraction of the turn thread's time one tenant's mining took over "
            "about the last 10 s (measured).",
            0 if p.shares is None else p.shares.share_max,
            False,
        ),
        (
            "ourios_ingest_tenant_turn_share_limit",
            "The fraction of the turn's time a tenant may take while others are served "
            "(miner.tenant_turn_percent / 100).",
            settings.miner.tenant_turn_percent / 100,
            False,
        ),
        (
            "ourios_ingest_tenants_over_share",
            "Tenants refused for their share of the turn or of the backlog since they were "
            "last admitted (503 tenant_turn_share / tenant_backlog).",
            0 if p.shares is None else p.shares.over_share,
            False,
        ),
    ]


class _BuildInfo(Collector):
    """``ourios_build_info``: the version, the decoder this process uses (read at
    collection time: ``app.receive.native.start`` chooses it as ``ourios serve``
    starts; the workers choose alike from the same install and settings) and the miner
    (``app.ingest.mining.native_miner``: the fast path in C, or Python alone)."""

    def __init__(self) -> None:
        try:
            self._version = metadata.version("ourios")
        except metadata.PackageNotFoundError:
            self._version = "unknown"

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "ourios_build_info",
            "1, labelled with the version, the OTLP decoder in use (native or upb) and the "
            "miner (native or python).",
            labels=["version", "decoder", "miner"],
        )
        info.add_metric([self._version, native.active(), native_miner.active()], 1.0)
        yield info


def _encode_metrics(slots: EncodeSlots | None) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The publisher's records encodes on the workers and their slots
    (``app.node.encode_dispatch``); zeros with server.workers 0."""
    yield _gauge(
        "ourios_encode_jobs_in_flight",
        "Encode slots held now: a publish re-matching, encoding (on a worker, or the "
        "core's fallback) or settling a records partition; at most server.encode_concurrency.",
        0 if slots is None else slots.in_flight,
    )
    yield _gauge(
        "ourios_encode_jobs_in_flight_max",
        "The most encodes that were in flight at once since the node started.",
        0 if slots is None else slots.max_in_flight,
    )
    yield _gauge(
        "ourios_encode_jobs_limit",
        "The configured server.encode_concurrency (0 with server.workers 0).",
        0 if slots is None else slots.limit,
    )
    yield _gauge(
        "ourios_encode_jobs_waiting",
        "Publishes waiting now for an encode slot (their partitions count in "
        "ourios_sink_memory_bytes).",
        0 if slots is None else slots.waiting,
    )
    yield _counter(
        "ourios_encode_slot_waits",
        "Publishes that found every encode slot taken and waited for one.",
        0 if slots is None else slots.waited,
    )
    yield _counter(
        "ourios_encode_slot_wait_seconds",
        "Seconds publishes spent waiting for an encode slot, summed.",
        0.0 if slots is None else slots.wait_seconds,
    )
    yield _counter(
        "ourios_encode_slot_rest_seconds",
        "Seconds encode slots rested after a cut's publishes gave them back "
        "(server.encode_duty_percent), summed.",
        0.0 if slots is None else slots.rest_seconds,
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """One unlabelled gauge: most state families are a single figure."""
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """One unlabelled counter (``name`` without ``_total``: the family adds it)."""
    c = CounterMetricFamily(name, doc)
    c.add_metric([], value)
    return c


@dataclass(frozen=True)
class _Sources:
    """What the state families read, given when the collector is registered."""

    pipeline: Pipeline
    housekeeper: Housekeeper | None
    admission: Admission | None
    started: Started


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics, sources: _Sources) -> None:
        self._m = metrics
        self._s = sources

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Every state family, group by group, in the order they have always been exposed."""
        p = self._s.pipeline
        st = p.journal.reclaim_state()
        yield from self._wal_space(st)
        yield from self._wal_floor_and_rotation(st)
        yield from self._barrier_and_sink_memory(p)
        yield from self._tenants_and_high_water(p)
        yield from self._disk(p)
        yield from self._backlog_and_workers(p)
        yield from self._sink_publishes(p)
        yield from self._recovery()
        for extra in self._m.extra:
            yield from extra()

    def _wal_space(self, st: ReclaimState) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The WAL's bytes, segments and checkpoint mark, from one read of its reclaim state."""
        yield _gauge(
            "ourios_wal_unflushed_bytes", "WAL bytes written, not yet fsynced.", st.unflushed_bytes
        )
        yield _gauge(
            "ourios_wal_disk_bytes", "WAL bytes on disk (segments and RECLAIM).", st.disk_bytes
        )
        yield _gauge(
            "ourios_wal_unreclaimed_bytes",
            "Frame bytes in every surviving segment, the current one and the post-checkpoint "
            "tail included.",
            st.unreclaimed_bytes,
        )
        yield _gauge("ourios_wal_segments", "Surviving WAL segments.", st.segments)
        if st.oldest_unreclaimed_age is not None:
            yield _gauge(
                "ourios_wal_oldest_unreclaimed_age_seconds",
                "Age of the oldest surviving segment holding frames (absent when none).",
                st.oldest_unreclaimed_age,
            )
        yield _gauge(
            "ourios_wal_checkpoint_lsn_bytes",
            "The CHECKPOINT mark, a byte offset in the WAL's log (0 before the first checkpoint).",
            st.checkpoint.lsn if st.checkpoint is not None else 0,
        )

    def _wal_floor_and_rotation(
        self, st: ReclaimState
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The retain floor, rotation and housekeeping state: what holds WAL bytes back."""
        floor = GaugeMetricFamily(
            "ourios_wal_retain_floor",
            "The retain floor's state (1 for the current one).",
            labels=["state"],
        )
        current = st.floor
        for name, cls in (
            ("unknown", FloorUnknown),
            ("none", FloorNone),
            ("min", FloorMin),
            ("pinned", FloorPinned),
        ):
            floor.add_metric([name], 1.0 if isinstance(current, cls) else 0.0)
        yield floor
        yield _gauge(
            "ourios_wal_retain_floor_lag_bytes",
            "Frame bytes some tenant still holds back.",
            st.lag_bytes,
        )
        yield _gauge(
            "ourios_wal_retain_floor_lag_segments",
            "Closed segments some tenant still holds back.",
            st.lag_segments,
        )
        yield _gauge(
            "ourios_wal_retain_floor_pinned_tenants",
            "Tenants with frames and no valid snapshot.",
            st.pinned_tenants,
        )
        rot = GaugeMetricFamily(
            "ourios_wal_rotation_state", "Rotation state (1 for the current one).", labels=["state"]
        )
        for state_name in ("healthy", "retrying", "terminal"):
            rot.add_metric([state_name], 1.0 if st.rotation.name == state_name else 0.0)
        yield rot
        attempts = (
            st.rotation.attempts
            if isinstance(st.rotation, RotationFailing | RotationExhausted)
            else 0
        )
        yield _gauge(
            "ourios_wal_rotation_failed_attempts", "Consecutive failed rotation attempts.", attempts
        )
        yield _gauge(
            "ourios_wal_housekeeping_horizon_remaining_segments",
            "Horizon applications still owed, in (tenant, segment) units.",
            st.horizon_remaining,
        )
        yield _gauge(
            "ourios_wal_housekeeping_unlink_remaining_segments",
            "Segments eligible or reclaiming and not yet unlinked.",
            st.unlink_remaining,
        )

    def _barrier_and_sink_memory(
        self, p: Pipeline
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The barrier's epochs and the sink's memory, spool and parked partitions."""
        yield _gauge("ourios_barrier_epoch", "The number of the next barrier cut.", p.epoch)
        if p.failed_epoch != LATCH_CLEAR:
            yield _gauge(
                "ourios_barrier_failed_epoch",
                "The lowest cut epoch a failure invalidated.",
                p.failed_epoch,
            )
        yield _gauge(
            "ourios_sink_publisher_queue_depth",
            "Partitions queued for the publisher.",
            p.publisher.queue_depth,
        )
        yield _gauge(
            "ourios_sink_buffered_bytes", "Bytes buffered in the sinks.", p.buffers.buffered_bytes
        )
        buffers = p.buffers
        yield _gauge(
            "ourios_sink_memory_bytes",
            "Rows the sink holds in memory (buffered, and in publishes under way); kept "
            "under sink.ceiling_bytes by spilling to the spool (DESIGN.md §5.12).",
            buffers.held_bytes,
        )
        yield _gauge(
            "ourios_sink_ceiling_bytes",
            "The configured sink.ceiling_bytes (alerts compare the memory with it).",
            self._m.settings.sink.ceiling_bytes,
        )
        spooled_units, spooled_bytes = buffers.spooled
        yield _gauge(
            "ourios_sink_spool_objects",
            "Objects in the spool (on the data volume) waiting for the store.",
            spooled_units,
        )
        yield _gauge(
            "ourios_sink_spool_bytes",
            "Bytes of the objects in the spool waiting for the store.",
            spooled_bytes,
        )
        waits = CounterMetricFamily(
            "ourios_sink_memory_wait_seconds",
            "Time ingest turns waited for room under sink.ceiling_bytes.",
        )
        waits.add_metric([], buffers.room_wait_seconds)
        yield waits
        yield _gauge(
            "ourios_sink_parked_partitions",
            "Buffered partitions a failed or refused publish put back.",
            p.buffers.parked_partitions,
        )

    def _tenants_and_high_water(
        self, p: Pipeline
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Tenant slots and refusals, the high-water mark and the frames torn or isolated."""
        usage = p.tenants.usage()  # one read of the table: the states sum to the limit
        tenants = GaugeMetricFamily(
            "ourios_wal_tenants",
            "Tenant slots by state (of ourios_wal_tenants_limit).",
            labels=["state"],
        )
        tenants.add_metric(["held"], usage.held)
        tenants.add_metric(["reserved"], usage.reserved)
        tenants.add_metric(["free"], usage.free)
        yield tenants
        yield _gauge("ourios_wal_tenants_limit", "The configured max_tenants.", usage.limit)
        yield _gauge(
            "ourios_wal_tenant_unrecoverable",
            "Tenants whose snapshot is below what was reclaimed (their appends are refused).",
            len(p.refused),
        )
        yield _gauge(
            "ourios_wal_settling_tenants",
            "Tenants with an unmined entry awaiting or undergoing settlement (refused with a "
            "hint meanwhile).",
            len(p.unmined.tenants()),
        )
        hw = p.journal.high_water
        yield _gauge(
            "ourios_wal_high_water_lsn_bytes",
            "The current segment's synced high-water HIGHWATER records (damage below it is "
            "corruption, above it a torn tail).",
            hw.recorded_lsn,
        )
        hw_failures = CounterMetricFamily(
            "ourios_wal_high_water_write_failures",
            "HIGHWATER writes that failed (the previous high-water stayed in force).",
        )
        hw_failures.add_metric([], hw.failures)
        yield hw_failures
        torn = CounterMetricFamily(
            "ourios_wal_torn_tail_frames",
            "Frames that still verified after a torn tail open found in the newest segment "
            "(left behind it, never replayed).",
        )
        torn.add_metric([], hw.torn_tail_frames)
        yield torn
        torn_bytes = CounterMetricFamily(
            "ourios_wal_torn_tail_bytes",
            "Bytes of the torn tail open found in the newest segment (kept, never replayed).",
        )
        torn_bytes.add_metric([], hw.torn_tail_bytes)
        yield torn_bytes
        isolated = CounterMetricFamily(
            "ourios_wal_isolated_frames",
            "Frames isolated after wal.frame_mining_attempts failed minings: their records "
            "were published without templates (template_id 0).",
        )
        isolated.add_metric([], p.settler.isolated_frames)
        yield isolated

    def _disk(self, p: Pipeline) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Free disk space against its water marks, and the quarantine and archive."""
        housekeeper = self._s.housekeeper
        free = None if housekeeper is None else housekeeper.space.free_bytes
        if free is not None:
            yield _gauge(
                "ourios_disk_free_bytes",
                "Free bytes on the WAL's filesystem as of the last write: the last sample "
                "less what the node wrote since, less the emergency reserve while released "
                "(the figure admission compares with the water marks).",
                free,
            )
        disk = self._m.settings.disk
        yield _gauge(
            "ourios_disk_low_water_bytes",
            "The configured disk.low_water_bytes (alerts compare free bytes with it).",
            disk.low_water_bytes,
        )
        yield _gauge(
            "ourios_disk_stop_water_bytes",
            "The configured disk.stop_water_bytes (alerts compare free bytes with it).",
            disk.stop_water_bytes,
        )
        yield from self._m.disk_and_archive(p.journal.quarantined, self._s.admission)

    def _backlog_and_workers(
        self, p: Pipeline
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The turn's backlog, the miners, the recovery backlog, workers and threads."""
        stages = self._s.started.stages()
        backlog_bytes, backlog_frames = (0, 0) if stages is None else stages.backlog
        yield _gauge(
            "ourios_ingest_backlog_bytes",
            "Frames acknowledged (durable) and not yet turned (mined and buffered), in "
            "bytes; at wal.turn_backlog_bytes new batches are refused (ingest_backlog).",
            backlog_bytes,
        )
        yield _gauge(
            "ourios_ingest_backlog_frames",
            "Frames acknowledged (durable) and not yet turned.",
            backlog_frames,
        )
        yield _gauge(
            "ourios_ingest_backlog_limit_bytes",
            "The configured wal.turn_backlog_bytes (the alert on the backlog follows it).",
            self._m.settings.wal.turn_backlog_bytes,
        )
        yield from _miner_metrics(p, self._m.settings)
        recovery = self._s.started.recovery()
        yield _gauge(
            "ourios_recovery_backlog_bytes",
            "WAL bytes the start-up's replay has still to turn (0 once recovery.done).",
            0 if recovery is None else recovery.backlog_bytes,
        )
        workers = self._s.started.workers()
        yield _counter(
            "ourios_worker_restarts",
            "Worker processes restarted after they exited (each also logs worker.exited); "
            "0 with server.workers 0.",
            0 if workers is None else workers.restarts,
        )
        yield from _encode_metrics(None if workers is None else workers.encoder.slots)
        yield from self._m.thread_families()

    def _sink_publishes(self, p: Pipeline) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """What the publisher wrote, failed, spooled and dead-lettered, and the store gate."""
        stats = p.publisher.stats
        objects = CounterMetricFamily(
            "ourios_sink_objects", "Objects written to the store.", labels=["kind"]
        )
        written = CounterMetricFamily(
            "ourios_sink_bytes", "Bytes written to the store.", labels=["kind"]
        )
        for kind in ("records", "audit"):
            objects.add_metric([kind], stats.objects[kind])
            written.add_metric([kind], stats.bytes[kind])
        yield objects
        yield written
        failures = CounterMetricFamily(
            "ourios_sink_publish_failures",
            "Failed publishes (their rows were requeued).",
            labels=["kind", "error_type"],
        )
        for (kind, error_type), count in sorted(stats.failures.items()):
            failures.add_metric([kind, error_type], count)
        yield failures
        intents = CounterMetricFamily(
            "ourios_sink_intent_failures",
            "Publishes whose intent (PUBLISHING) could not be made durable: written anyway; "
            "a crash before the next checkpoint may publish their rows again.",
        )
        intents.add_metric([], stats.intent_failures)
        yield intents
        spooled = CounterMetricFamily(
            "ourios_sink_spooled_objects",
            "Partitions the memory bound wrote to the spool because the store did not take them.",
        )
        spooled.add_metric([], stats.spooled)
        yield spooled
        dead = CounterMetricFamily(
            "ourios_sink_dead_lettered",
            "Partitions the store refused for good (a permanent error class after "
            "sink.dead_letter_attempts), written to <data_dir>/deadletter instead so the "
            "checkpoint advances (DESIGN.md §5.13).",
            labels=["kind", "error_type"],
        )
        for (kind, error_type), count in sorted(stats.dead_lettered.items()):
            dead.add_metric([kind, error_type], count)
        yield dead
        gate = p.publisher.gate
        yield _gauge(
            "ourios_sink_store_down",
            "1 while the store is not taking writes (one publish a second probes it).",
            1 if gate is not None and gate.down else 0,
        )

    def _recovery(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The start-up replay's duration and what it suppressed or isolated (0 until it
        is done)."""
        report = self._s.started.recovered()
        yield _gauge(
            "ourios_recovery_duration_seconds",
            "How long the start-up replay took.",
            0.0 if report is None else report.seconds,
        )
        suppressed = CounterMetricFamily(
            "ourios_recovery_records_suppressed",
            "Replayed records not republished (at or below the gates).",
        )
        suppressed.add_metric([], 0 if report is None else report.records_suppressed)
        yield suppressed
        audit = CounterMetricFamily(
            "ourios_recovery_audit_events_suppressed",
            "Regenerated template events not republished (their frames at or below X).",
        )
        audit.add_metric([], 0 if report is None else report.audit_events_suppressed)
        yield audit
        replay_isolated = CounterMetricFamily(
            "ourios_replay_frames_isolated",
            "Replayed frames isolated because their payload did not decode "
            "wal.frame_decode_attempts times: not mined, their records not published, their "
            "payload kept in <data_dir>/quarantine/frames/ (replay.frame_isolated).",
        )
        recovery = self._s.started.recovery()
        replay_isolated.add_metric([], 0 if recovery is None else len(recovery.report.isolated))
        yield replay_isolated


class _ProcessesCollector(Collector):
    """The standard ``process_*`` series (resident memory, CPU seconds, open and maximum
    fds, start time) of the core, unlabelled, and of each worker process, labelled
    ``worker="<index>"``: read from ``/proc/<pid>`` by the core at collection time (the
    workers are its children), so a worker needs no metrics of its own to report them."""

    def __init__(self, workers: Callable[[], dict[int, int]]) -> None:
        self._workers = workers
        self._readers: dict[int | str, ProcessCollector] = {}

    def _reader(self, pid: int | str) -> ProcessCollector:
        reader = self._readers.get(pid)
        if reader is None:
            reader = ProcessCollector(pid=lambda: pid, registry=None)
            self._readers[pid] = reader
        return reader

    def collect(self) -> Iterator[Metric]:
        processes: list[tuple[dict[str, str], int | str]] = [({}, "self")]
        processes += [({"worker": str(i)}, pid) for i, pid in sorted(self._workers().items())]
        for gone in set(self._readers) - {pid for _, pid in processes}:
            del self._readers[gone]  # a restarted worker's old pid
        families: dict[str, Metric] = {}
        for labels, pid in processes:
            for family in self._reader(pid).collect():
                out = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    out.samples.append(
                        Sample(sample.name, {**sample.labels, **labels}, sample.value)
                    )
        yield from families.values()


#: Latency buckets (seconds): fsync-scale at the bottom, stalls at the top.
_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


T = TypeVar("T")


class Later(Generic[T]):
    """One part the metrics read that is made after them: given once it exists
    (``give``), None until then."""

    def __init__(self) -> None:
        self._part: T | None = None

    def give(self, part: T) -> None:
        self._part = part

    def __call__(self) -> T | None:
        return self._part


@dataclass(frozen=True)
class Started:
    """What ``ourios serve`` starts after the node is built, and the metrics read: the
    stages (their backlog), the start-up's recovery (what is left to replay) and its
    report once done, the worker pool (restarts, processes). The metrics come first —
    the WAL's timing hooks are their histograms, the workers report through them — so
    they are built on this provider, built before them, which the assembly gives each
    part once it exists (``app.node.server``); until then the families read 0."""

    stages: Later[Stages] = field(default_factory=Later)
    recovery: Later[Recovery] = field(default_factory=Later)
    recovered: Later[RecoveryReport] = field(default_factory=Later)
    workers: Later[Workers] = field(default_factory=Later)


class Metrics:
    """The registry. Built before the journal (whose timing hooks it provides) with what
    exists by then — the supervised threads, the archiver, the store's health gauges —
    and the provider of what ``ourios serve`` starts later (``Started``); bound to the
    pipeline, the housekeeper and admission once they exist (``bind`` registers the
    collector that reads them at collection time, ``_StateCollector``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        threads: Supervisor | None = None,
        archiver: Archiver | None = None,
        extra: Iterable[Callable[[], Iterator[GaugeMetricFamily]]] = (),
        started: Started | None = None,
    ) -> None:
        self.settings = settings
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        r.register(_BuildInfo())
        self.requests = Counter(
            "ourios_ingest_requests",
            "Export requests answered, by transport, outcome (ok, refused, error) and error type.",
            ["transport", "outcome", "error_type"],
            registry=r,
        )
        self.records = Counter(
            "ourios_ingest_records",
            "Log records acknowledged (outcome ok) or refused with their request.",
            ["transport", "outcome"],
            registry=r,
        )
        self.ack_seconds = Histogram(
            "ourios_ingest_ack_seconds",
            "Time from a request's arrival to its answer (acknowledged requests).",
            buckets=_BUCKETS,
            registry=r,
        )
        self.append_seconds = Histogram(
            "ourios_wal_append_seconds",
            "Time to write one frame to the WAL.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "ourios_wal_fsync_seconds",
            "Time of one group-commit data fsync.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.cut_stall_seconds = Histogram(
            "ourios_barrier_cut_stall_seconds",
            "Time a cut's capture held the ingest exclusion (the stall every turn waits out).",
            buckets=_BUCKETS,
            registry=r,
        )
        self.pass_seconds = Histogram(
            "ourios_housekeeping_pass_seconds",
            "Wall time of one housekeeping pass (its two ledger halves and its file half).",
            buckets=_BUCKETS,
            registry=r,
        )
        self.cadence = Counter(
            "ourios_cadence_runs",
            "Background cadence runs (barrier, housekeeping, age_sweep) by outcome and error type.",
            ["cadence", "outcome", "error_type"],
            registry=r,
        )
        #: None with wal.archive off
        self.archiver = archiver
        #: the stages, the recovery, the workers: made by ``ourios serve`` after these
        self.started = started if started is not None else Started()
        #: the node's supervised threads (their restarts and failures)
        self.threads = threads
        #: further gauge families (the store's health)
        self.extra = list(extra)
        workers = self.started.workers
        r.register(_ProcessesCollector(lambda: {} if (w := workers()) is None else w.processes()))

    def disk_and_archive(
        self, quarantined: list[QuarantineRecord], admission: Admission | None
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Admission's bounds, archival and quarantine (issue 8's additions)."""
        refusing = GaugeMetricFamily(
            "ourios_admission_refusing",
            "1 while new batches are refused for this bound (503 with Retry-After).",
            labels=["bound"],
        )
        active = set(admission.refusing) if admission is not None else set()
        for bound in Bound:
            refusing.add_metric([bound.value], 1.0 if bound in active else 0.0)
        yield refusing
        q = GaugeMetricFamily(
            "ourios_wal_quarantined_segments",
            "Segments an operator quarantined (ourios wal quarantine); each is a recorded loss.",
        )
        q.add_metric([], len(quarantined))
        yield q
        archiver = self.archiver  # None with wal.archive off: 0 and no failure series
        archived = CounterMetricFamily(
            "ourios_wal_archived_segments", "Segments archived (copied and verified) before unlink."
        )
        archived.add_metric([], 0 if archiver is None else archiver.archived)
        yield archived
        failures = CounterMetricFamily(
            "ourios_wal_archive_failures",
            "Archive attempts that failed (the segment was kept).",
            labels=["error_type"],
        )
        for error_type, count in sorted(archiver.failures.items() if archiver else ()):
            failures.add_metric([error_type], count)
        yield failures

    def thread_families(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The supervised threads' restarts and failures (``app.threads``)."""
        threads = self.threads
        names = sorted(threads.names) if threads is not None else []
        failed = threads.failed if threads is not None else {}
        restarts = CounterMetricFamily(
            "ourios_thread_restarts",
            "Background threads restarted after an unexpected exception (each also logs "
            "thread.crashed with its traceback), by thread.",
            labels=["thread"],
        )
        stopped = GaugeMetricFamily(
            "ourios_thread_failed",
            "1 for a thread that crashed and may not run again (thread.failed): /healthz "
            "answers 503 naming it.",
            labels=["thread"],
        )
        for name in names:
            assert threads is not None
            restarts.add_metric([name], threads.restarts[name])
            stopped.add_metric([name], 1.0 if name in failed else 0.0)
        yield restarts
        yield stopped

    def bind(
        self,
        pipeline: Pipeline,
        *,
        housekeeper: Housekeeper | None = None,
        admission: Admission | None = None,
    ) -> None:
        """Register the state families on the parts they read (built after the registry)."""
        self.registry.register(
            _StateCollector(self, _Sources(pipeline, housekeeper, admission, self.started))
        )

    def cadence_observer(self, cadence: str) -> Callable[[str, str], None]:
        def run(outcome: str, error_type: str) -> None:
            self.cadence.labels(cadence, outcome, error_type).inc()

        return run

    # -- the receivers' observer ---------------------------------------------------------

    def observe(
        self, transport: str, outcome: str, error_type: str, records: int, seconds: float
    ) -> None:
        self.requests.labels(transport, outcome, error_type).inc()
        if outcome == "ok":
            self.records.labels(transport, "ok").inc(records)
            self.ack_seconds.observe(seconds)
        elif records:
            self.records.labels(transport, outcome).inc(records)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE

"""Prometheus exposition: gauges read at collection time from ``ReclaimState`` and the
pipeline (a custom collector, never a second copy that can drift), plus the counters
the pipeline and the publisher keep. Nothing on the collection path walks a directory.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.config import Settings
from app.pipeline import LATCH_CLEAR, Pipeline
from wal import FloorMin, FloorNone, FloorPinned, FloorUnknown, Retrying, Terminal

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = self._m.pipeline
        st = p.journal.reclaim_state()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            return g

        yield gauge(
            "ourios_wal_unflushed_bytes", "WAL bytes written, not yet fsynced.", st.unflushed_bytes
        )
        yield gauge(
            "ourios_wal_disk_bytes", "WAL bytes on disk (segments and RECLAIM).", st.disk_bytes
        )
        yield gauge(
            "ourios_wal_unreclaimed_bytes",
            "Frame bytes in every surviving segment, the current one and the post-checkpoint "
            "tail included.",
            st.unreclaimed_bytes,
        )
        yield gauge("ourios_wal_segments", "Surviving WAL segments.", st.segments)
        if st.oldest_unreclaimed_age is not None:
            yield gauge(
                "ourios_wal_oldest_unreclaimed_age_seconds",
                "Age of the oldest surviving segment holding frames (absent when none).",
                st.oldest_unreclaimed_age,
            )
        yield gauge(
            "ourios_wal_checkpoint_lsn",
            "The CHECKPOINT mark (0 before the first checkpoint).",
            st.checkpoint.lsn if st.checkpoint is not None else 0,
        )
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
        yield gauge(
            "ourios_wal_retain_floor_lag_bytes",
            "Frame bytes some tenant still holds back.",
            st.lag_bytes,
        )
        yield gauge(
            "ourios_wal_retain_floor_lag_segments",
            "Closed segments some tenant still holds back.",
            st.lag_segments,
        )
        yield gauge(
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
        attempts = st.rotation.attempts if isinstance(st.rotation, Retrying | Terminal) else 0
        yield gauge(
            "ourios_wal_rotation_failed_attempts", "Consecutive failed rotation attempts.", attempts
        )
        yield gauge(
            "ourios_wal_housekeeping_horizon_remaining_segments",
            "Horizon applications still owed, in (tenant, segment) units.",
            st.horizon_remaining,
        )
        yield gauge(
            "ourios_wal_housekeeping_unlink_remaining_segments",
            "Segments eligible or reclaiming and not yet unlinked.",
            st.unlink_remaining,
        )
        yield gauge("ourios_barrier_epoch", "The number of the next barrier cut.", p.epoch)
        if p.failed_epoch != LATCH_CLEAR:
            yield gauge(
                "ourios_barrier_failed_epoch",
                "The lowest cut epoch a failure invalidated.",
                p.failed_epoch,
            )
        yield gauge(
            "ourios_sink_publisher_queue_depth",
            "Partitions queued for the publisher.",
            p.publisher.queue_depth,
        )
        yield gauge(
            "ourios_sink_buffered_bytes", "Bytes buffered in the sinks.", p.buffers.buffered_bytes
        )
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
        yield gauge(
            "ourios_recovery_duration_seconds",
            "How long the start-up replay took.",
            self._m.recovery_seconds,
        )
        suppressed = CounterMetricFamily(
            "ourios_recovery_records_suppressed",
            "Replayed records not republished (at or below the gates).",
        )
        suppressed.add_metric([], self._m.records_suppressed)
        yield suppressed


class Metrics:
    def __init__(self, pipeline: Pipeline, settings: Settings) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.registry = CollectorRegistry(auto_describe=False)
        self.recovery_seconds = 0.0
        self.records_suppressed = 0
        self.registry.register(_StateCollector(self))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE

"""``app.node.metrics``: the receivers' observer and the cadences' counters count what
they are told, and the gauges are read from the live pipeline at collection time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.base.config import load_settings
from app.node.metrics import CONTENT_TYPE, Metrics
from tests.support.noderig import NodeRig


@pytest.fixture
def metrics(tmp_path: Path) -> Metrics:
    return Metrics(load_settings({"OURIOS_SERVER_DATA_DIR": str(tmp_path / "m")}))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[NodeRig]:
    rig = NodeRig(tmp_path / "node")
    try:
        yield rig
    finally:
        rig.close()


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text, content_type = metrics.exposition()
    assert content_type == CONTENT_TYPE
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_observer_counts_requests_and_records_by_outcome(metrics: Metrics) -> None:
    metrics.observe("http", "ok", "", 5, 0.01)
    metrics.observe("http", "ok", "", 2, 0.02)
    metrics.observe("grpc", "refused", "settling", 3, 0.0)
    metrics.observe("grpc", "error", "internal", 0, 0.0)
    got = samples(metrics)
    ok = (("error_type", ""), ("outcome", "ok"), ("transport", "http"))
    refused = (("error_type", "settling"), ("outcome", "refused"), ("transport", "grpc"))
    assert got[("ourios_ingest_requests_total", ok)] == 2
    assert got[("ourios_ingest_requests_total", refused)] == 1
    assert got[("ourios_ingest_records_total", (("outcome", "ok"), ("transport", "http")))] == 7
    refused_records = (("outcome", "refused"), ("transport", "grpc"))
    assert got[("ourios_ingest_records_total", refused_records)] == 3
    # an error with no decoded records adds no records series
    assert ("ourios_ingest_records_total", (("outcome", "error"), ("transport", "grpc"))) not in got
    assert got[("ourios_ingest_ack_seconds_count", ())] == 2  # acknowledged requests only


def test_a_cadence_observer_counts_runs_by_outcome(metrics: Metrics) -> None:
    run = metrics.cadence_observer("age_sweep")
    run("ok", "")
    run("ok", "")
    run("refused", "publish_failed")
    got = samples(metrics)
    key = "ourios_cadence_runs_total"
    assert got[(key, (("cadence", "age_sweep"), ("error_type", ""), ("outcome", "ok")))] == 2
    refused = (("cadence", "age_sweep"), ("error_type", "publish_failed"), ("outcome", "refused"))
    assert got[(key, refused)] == 1


def test_gauges_are_read_from_the_bound_pipeline_at_collection(
    metrics: Metrics, rig: NodeRig
) -> None:
    metrics.bind(rig.pipeline)
    before = samples(metrics)
    assert before[("ourios_wal_segments", ())] == 1
    rig.ingest("t", "a")
    after = samples(metrics)
    assert (
        after[("ourios_wal_unreclaimed_bytes", ())] > before[("ourios_wal_unreclaimed_bytes", ())]
    )
    assert after[("ourios_sink_buffered_bytes", ())] > 0
    step = rig.barrier.step()
    assert step is not None and step.checkpointed
    stamped = samples(metrics)
    mark = rig.journal.last_checkpoint
    assert mark is not None
    assert stamped[("ourios_wal_checkpoint_lsn_bytes", ())] == mark.lsn
    assert stamped[("ourios_sink_buffered_bytes", ())] == 0

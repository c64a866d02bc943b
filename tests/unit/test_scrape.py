"""``tests/support/scrape.py``: one ``/metrics`` parse for every real-process test, read
by series name and labels, here against the node's own collector."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from app.base.config import load_settings
from app.node.metrics import Metrics
from tests.support.noderig import NodeRig
from tests.support.scrape import Scrape, scrape, try_scrape

TEXT = """\
# TYPE ourios_wal_segments gauge
ourios_wal_segments 3.0
# TYPE ourios_cadence_runs_total counter
ourios_cadence_runs_total{cadence="barrier",error_type="",outcome="ok"} 4.0
ourios_cadence_runs_total{cadence="barrier",error_type="s3_5xx",outcome="error"} 1.0
ourios_cadence_runs_total{cadence="sweep",error_type="",outcome="ok"} 2.0
"""


class Node:
    def __init__(self, status: int, text: str) -> None:
        self.answer = (status, text.encode())

    def get(self, path: str) -> tuple[int, bytes]:
        assert path == "/metrics"
        return self.answer


def test_a_scrape_reads_a_series_by_name_labels_or_its_spelling() -> None:
    s = scrape(Node(200, TEXT))
    assert s.value("ourios_wal_segments") == 3.0 == s["ourios_wal_segments"]
    assert s.total("ourios_cadence_runs_total", cadence="barrier") == 5.0
    assert s.total("ourios_cadence_runs_total", outcome="ok") == 6.0
    assert s.series('ourios_cadence_runs_total{outcome="error",cadence="barrier"}') == 1.0
    assert 'ourios_cadence_runs_total{cadence="sweep"}' in s
    assert "ourios_wal_tenants" not in s and s.value("ourios_wal_tenants") is None
    assert s.total("ourios_wal_tenants") == 0.0
    with pytest.raises(KeyError, match="ourios_wal_tenants"):
        s["ourios_wal_tenants"]
    with pytest.raises(AssertionError):  # several series: say which one
        s.value("ourios_cadence_runs_total", outcome="ok")


def test_a_node_that_does_not_answer_is_none_or_a_failure() -> None:
    assert try_scrape(Node(503, "")) is None
    with pytest.raises(AssertionError, match="answered 503"):
        scrape(Node(503, ""))


def test_the_nodes_own_exposition_parses(tmp_path: Path) -> None:
    rig = NodeRig(tmp_path / "node")
    try:
        metrics = Metrics(load_settings({"OURIOS_SERVER_DATA_DIR": str(tmp_path / "settings")}))
        metrics.bind(rig.pipeline)
        s = Scrape.parse(generate_latest(metrics.registry).decode())
    finally:
        rig.close()
    assert s.value("ourios_wal_segments") is not None

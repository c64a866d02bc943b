"""The shipped alerts and dashboard against promtool and the metric interface.

`charts/ourios/files/alerts.yaml` must pass `promtool check rules` and the unit tests in
`tests/chart/alerts_test.yaml`, where every alert fires on its condition and stays
quiet on a healthy look-alike. Every expression, in the alerts and in
`charts/ourios/files/dashboard.json`, may reference only names of the metric interface
(DESIGN.md §9, listed once here as ``INTERFACE`` and documented in docs/METRICS.md);
every alert links to a section of docs/RUNBOOK.md that exists.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts" / "ourios" / "files" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "chart" / "alerts_test.yaml"
DASHBOARD = ROOT / "charts" / "ourios" / "files" / "dashboard.json"
RUNBOOK = ROOT / "docs" / "RUNBOOK.md"
METRICS_DOC = ROOT / "docs" / "METRICS.md"

#: The exported names (DESIGN.md §9): name -> (type, label names). Counters carry their
#: ``_total`` suffix as scraped; histograms their base name.
INTERFACE: dict[str, tuple[str, frozenset[str]]] = {
    "ourios_wal_unflushed_bytes": ("gauge", frozenset()),
    "ourios_wal_disk_bytes": ("gauge", frozenset()),
    "ourios_wal_unreclaimed_bytes": ("gauge", frozenset()),
    "ourios_wal_segments": ("gauge", frozenset()),
    "ourios_wal_oldest_unreclaimed_age_seconds": ("gauge", frozenset()),
    "ourios_wal_high_water_lsn_bytes": ("gauge", frozenset()),
    "ourios_wal_high_water_write_failures_total": ("counter", frozenset()),
    "ourios_wal_torn_tail_frames_total": ("counter", frozenset()),
    "ourios_wal_torn_tail_bytes_total": ("counter", frozenset()),
    "ourios_wal_checkpoint_lsn_bytes": ("gauge", frozenset()),
    "ourios_wal_retain_floor": ("gauge", frozenset({"state"})),
    "ourios_wal_retain_floor_lag_bytes": ("gauge", frozenset()),
    "ourios_wal_retain_floor_lag_segments": ("gauge", frozenset()),
    "ourios_wal_retain_floor_pinned_tenants": ("gauge", frozenset()),
    "ourios_wal_rotation_state": ("gauge", frozenset({"state"})),
    "ourios_wal_rotation_failed_attempts": ("gauge", frozenset()),
    "ourios_wal_housekeeping_horizon_remaining_segments": ("gauge", frozenset()),
    "ourios_wal_housekeeping_unlink_remaining_segments": ("gauge", frozenset()),
    "ourios_barrier_epoch": ("gauge", frozenset()),
    "ourios_barrier_failed_epoch": ("gauge", frozenset()),
    "ourios_wal_tenants": ("gauge", frozenset({"state"})),
    "ourios_wal_tenants_limit": ("gauge", frozenset()),
    "ourios_wal_tenant_unrecoverable": ("gauge", frozenset()),
    "ourios_wal_settling_tenants": ("gauge", frozenset()),
    "ourios_wal_isolated_frames_total": ("counter", frozenset()),
    "ourios_worker_restarts_total": ("counter", frozenset()),
    "ourios_encode_jobs_in_flight": ("gauge", frozenset()),
    "ourios_encode_jobs_in_flight_max": ("gauge", frozenset()),
    "ourios_encode_jobs_limit": ("gauge", frozenset()),
    "ourios_encode_jobs_waiting": ("gauge", frozenset()),
    "ourios_encode_slot_waits_total": ("counter", frozenset()),
    "ourios_encode_slot_wait_seconds_total": ("counter", frozenset()),
    "ourios_encode_slot_rest_seconds_total": ("counter", frozenset()),
    "ourios_thread_restarts_total": ("counter", frozenset({"thread"})),
    "ourios_thread_failed": ("gauge", frozenset({"thread"})),
    "ourios_ingest_backlog_bytes": ("gauge", frozenset()),
    "ourios_ingest_backlog_frames": ("gauge", frozenset()),
    "ourios_ingest_backlog_limit_bytes": ("gauge", frozenset()),
    "ourios_miner_templates": ("gauge", frozenset()),
    "ourios_miner_tenant_templates_max": ("gauge", frozenset()),
    "ourios_miner_state_bytes": ("gauge", frozenset()),
    "ourios_miner_tenant_state_bytes_max": ("gauge", frozenset()),
    "ourios_miner_tenant_state_bytes_limit": ("gauge", frozenset()),
    "ourios_miner_evictions_total": ("counter", frozenset()),
    "ourios_miner_truncated_bodies_total": ("counter", frozenset()),
    "ourios_miner_work_units_total": ("counter", frozenset()),
    "ourios_miner_work_unit_seconds": ("gauge", frozenset()),
    "ourios_ingest_tenant_turn_share_max": ("gauge", frozenset()),
    "ourios_ingest_tenant_turn_share_limit": ("gauge", frozenset()),
    "ourios_ingest_tenants_over_share": ("gauge", frozenset()),
    "ourios_recovery_backlog_bytes": ("gauge", frozenset()),
    "ourios_sink_publisher_queue_depth": ("gauge", frozenset()),
    "ourios_sink_parked_partitions": ("gauge", frozenset()),
    "ourios_sink_buffered_bytes": ("gauge", frozenset()),
    "ourios_sink_memory_bytes": ("gauge", frozenset()),
    "ourios_sink_ceiling_bytes": ("gauge", frozenset()),
    "ourios_sink_spool_objects": ("gauge", frozenset()),
    "ourios_sink_spool_bytes": ("gauge", frozenset()),
    "ourios_sink_spooled_objects_total": ("counter", frozenset()),
    "ourios_sink_dead_lettered_total": ("counter", frozenset({"kind", "error_type"})),
    "ourios_sink_memory_wait_seconds_total": ("counter", frozenset()),
    "ourios_sink_store_down": ("gauge", frozenset()),
    "ourios_sink_objects_total": ("counter", frozenset({"kind"})),
    "ourios_sink_bytes_total": ("counter", frozenset({"kind"})),
    "ourios_sink_publish_failures_total": ("counter", frozenset({"kind", "error_type"})),
    "ourios_store_up": ("gauge", frozenset()),
    "ourios_sink_intent_failures_total": ("counter", frozenset()),
    "ourios_recovery_records_suppressed_total": ("counter", frozenset()),
    "ourios_recovery_audit_events_suppressed_total": ("counter", frozenset()),
    "ourios_recovery_duration_seconds": ("gauge", frozenset()),
    "ourios_replay_frames_isolated_total": ("counter", frozenset()),
    "ourios_ingest_requests_total": (
        "counter",
        frozenset({"transport", "outcome", "error_type"}),
    ),
    "ourios_ingest_records_total": ("counter", frozenset({"transport", "outcome"})),
    "ourios_cadence_runs_total": ("counter", frozenset({"cadence", "outcome", "error_type"})),
    "ourios_disk_free_bytes": ("gauge", frozenset()),
    "ourios_disk_low_water_bytes": ("gauge", frozenset()),
    "ourios_disk_stop_water_bytes": ("gauge", frozenset()),
    "ourios_admission_refusing": ("gauge", frozenset({"bound"})),
    "ourios_wal_quarantined_segments": ("gauge", frozenset()),
    "ourios_wal_archived_segments_total": ("counter", frozenset()),
    "ourios_wal_archive_failures_total": ("counter", frozenset({"error_type"})),
    "ourios_wal_append_seconds": ("histogram", frozenset()),
    "ourios_wal_fsync_seconds": ("histogram", frozenset()),
    "ourios_ingest_ack_seconds": ("histogram", frozenset()),
    "ourios_barrier_cut_stall_seconds": ("histogram", frozenset()),
    "ourios_housekeeping_pass_seconds": ("histogram", frozenset()),
    "ourios_build_info": ("gauge", frozenset({"version", "decoder", "miner"})),
}

#: The standard series beside the interface: Prometheus's own ``up`` of each target, and
#: the process collector's ``process_*`` of the core (unlabelled) and of each worker
#: (``worker``), listed in docs/METRICS.md's "Process series".
STANDARD: dict[str, tuple[str, frozenset[str]]] = {
    "up": ("gauge", frozenset()),
    "process_resident_memory_bytes": ("gauge", frozenset({"worker"})),
    "process_virtual_memory_bytes": ("gauge", frozenset({"worker"})),
    "process_cpu_seconds_total": ("counter", frozenset({"worker"})),
    "process_open_fds": ("gauge", frozenset({"worker"})),
    "process_max_fds": ("gauge", frozenset({"worker"})),
    "process_start_time_seconds": ("gauge", frozenset({"worker"})),
}

#: Exported only while the state holds (DESIGN.md §9).
ABSENT_WHEN_CLEAR = frozenset(
    {"ourios_barrier_failed_epoch", "ourios_wal_oldest_unreclaimed_age_seconds"}
)


def series_names() -> frozenset[str]:
    """Every series name a query may select: the names, plus a histogram's parts."""
    names = set(INTERFACE) | set(STANDARD)
    for name, (kind, _) in INTERFACE.items():
        if kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return frozenset(names)


_OURIOS_NAME = re.compile(r"\bourios_[a-z0-9_]+\b")
# An identifier right before a selector's braces is a metric name (label matchers and
# `by (...)` lists never are).
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{")


def unknown_names(expr: str) -> set[str]:
    """Metric names in ``expr`` that are not in the interface."""
    known = series_names()
    found = set(_OURIOS_NAME.findall(expr)) | set(_SELECTOR.findall(expr))
    return {name for name in found if name not in known}


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)


def load_alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}, "a plain rule group file: the chart adds the wrapper"
    return [rule for group in doc["groups"] for rule in group["rules"]]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    anchors: set[str] = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


# -- alerts --------------------------------------------------------------------------


def test_alert_rules_pass_promtool_check() -> None:
    promtool = require_tool("promtool")
    out = run([promtool, "check", "rules", str(ALERTS)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "WARNING" not in out.stdout + out.stderr, out.stdout


def test_alert_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    out = run([promtool, "test", "rules", str(ALERT_TESTS)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_every_alert_fires_in_a_unit_test_and_a_healthy_series_stays_quiet() -> None:
    """Each alert is asserted firing somewhere, and every group that tests it also holds
    an instance it never fires for (promtool compares the full list, so a firing healthy
    series fails the run)."""
    alerts = {rule["alert"] for rule in load_alerts()}
    fired: dict[str, set[str]] = {name: set() for name in alerts}
    quiet: dict[str, set[str]] = {name: set() for name in alerts}
    for group in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        instances = {
            m.group(1)
            for s in group["input_series"]
            if (m := re.search(r'instance="([^"]+)"', s["series"]))
        }
        tested: dict[str, set[str]] = {}
        for case in group["alert_rule_test"]:
            name = case["alertname"]
            assert name in alerts, f"test for an unknown alert {name}"
            # an absent() alert has no instance: it fires for the job
            hits = {
                a["exp_labels"].get("instance", "(no target)") for a in case.get("exp_alerts") or []
            }
            tested.setdefault(name, set()).update(hits)
        for name, hits in tested.items():
            fired[name] |= hits
            quiet[name] |= instances - hits
    assert [n for n in sorted(alerts) if not fired[n]] == [], "alerts never asserted firing"
    assert [n for n in sorted(alerts) if not quiet[n]] == [], "alerts without a healthy series"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    for rule in load_alerts():
        name = rule["alert"]
        assert name.startswith("Ourios"), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        assert url == f"docs/RUNBOOK.md#{name.lower()}", (name, url)
        assert url.split("#", 1)[1] in anchors, f"{name}: no section {url} in {RUNBOOK.name}"


def test_alert_expressions_reference_only_exported_names() -> None:
    for rule in load_alerts():
        # an Ourios name, or the Ourios job's own `up`
        assert _OURIOS_NAME.search(rule["expr"]) or 'up{job="ourios"}' in rule["expr"]
        assert unknown_names(rule["expr"]) == set(), rule["alert"]


def test_unknown_names_catches_a_misspelt_metric() -> None:
    # The check above is only as good as its extraction.
    assert unknown_names('rate(ourios_wal_segment{state="x"}[5m])') == {"ourios_wal_segment"}
    assert unknown_names('upp{job="x"} and ourios_wal_segments') == {"upp"}
    assert unknown_names('process_resident_memory_byte{pod="x"}') == {
        "process_resident_memory_byte"
    }
    assert unknown_names("histogram_quantile(0.9, rate(ourios_wal_fsync_seconds_bucket[1m]))") == (
        set()
    )


# -- dashboard -----------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def all_panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in doc["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row's children
    return out


def dashboard_exprs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in all_panels(doc)
        for t in p.get("targets", [])
    ]


def test_dashboard_is_a_grafana_dashboard_with_a_datasource_variable() -> None:
    doc = load_dashboard()
    assert doc["schemaVersion"] >= 36
    assert doc["uid"] and doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_dashboard_panel_has_a_datasource_and_a_target() -> None:
    doc = load_dashboard()
    panels = all_panels(doc)
    assert len(panels) >= 10
    for panel in panels:
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        targets = panel.get("targets", [])
        assert targets, f"{title}: no target"
        for t in targets:
            assert t["expr"].strip(), title
            assert t.get("datasource", panel["datasource"])["uid"] == "${datasource}", title


def test_dashboard_expressions_reference_only_exported_names() -> None:
    for where, expr in dashboard_exprs(load_dashboard()):
        assert unknown_names(expr) == set(), where


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule, Grafana's variables filled in."""
    promtool = require_tool("promtool")
    rules = []
    for i, (_, expr) in enumerate(dashboard_exprs(load_dashboard())):
        filled = expr.replace("$__rate_interval", "5m")
        for variable in ("$namespace", "$pod", "$instance"):
            filled = filled.replace(variable, ".*")
        assert "$" not in filled, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": filled})
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run([promtool, "check", "rules", str(path)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_clone_7_dashboard_filters_by_namespace_pod_and_instance() -> None:
    """Three chained variables (namespace, then its pods, then their instances), and
    every query of an Ourios or process series selects all three."""
    doc = load_dashboard()
    variables = [v["name"] for v in doc["templating"]["list"]]
    assert variables[:4] == ["datasource", "namespace", "pod", "instance"]
    queries = {v["name"]: v["definition"] for v in doc["templating"]["list"][1:4]}
    assert '{namespace=~"$namespace"}' in queries["pod"]
    assert 'pod=~"$pod"' in queries["instance"]
    selectors = re.compile(r"\b((?:ourios|process)_[a-z0-9_]+)\{([^}]*)\}")
    for where, expr in dashboard_exprs(doc):
        found = selectors.findall(expr)
        assert found, where
        for name, matchers in found:
            for label in ("namespace", "pod", "instance"):
                assert f'{label}=~"${label}"' in matchers, (where, name)


def test_clone_7_dashboard_shows_memory_and_cpu_per_process() -> None:
    used: set[str] = set()
    for _, expr in dashboard_exprs(load_dashboard()):
        used.update(re.findall(r"\bprocess_[a-z_]+", expr))
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= used


@pytest.mark.parametrize(
    ("area", "names"),
    [
        ("ingest rate and outcomes", {"ourios_ingest_requests_total"}),
        ("ack latency", {"ourios_ingest_ack_seconds_bucket"}),
        (
            "WAL bytes and segments against the checkpoint",
            {
                "ourios_wal_unreclaimed_bytes",
                "ourios_wal_segments",
                "ourios_wal_checkpoint_lsn_bytes",
            },
        ),
        ("floor state and lag", {"ourios_wal_retain_floor", "ourios_wal_retain_floor_lag_bytes"}),
        ("rotation state", {"ourios_wal_rotation_state"}),
        (
            "publisher queue and parks",
            {"ourios_sink_publisher_queue_depth", "ourios_sink_parked_partitions"},
        ),
        ("publish failures", {"ourios_sink_publish_failures_total"}),
        ("disk free", {"ourios_disk_free_bytes"}),
        ("barrier epoch and latch", {"ourios_barrier_epoch", "ourios_barrier_failed_epoch"}),
        (
            "housekeeping remaining work",
            {
                "ourios_wal_housekeeping_horizon_remaining_segments",
                "ourios_wal_housekeeping_unlink_remaining_segments",
            },
        ),
    ],
)
def test_dashboard_shows(area: str, names: set[str]) -> None:
    used: set[str] = set()
    for _, expr in dashboard_exprs(load_dashboard()):
        used.update(_OURIOS_NAME.findall(expr))
    assert names <= used, f"{area}: {sorted(names - used)} not on the dashboard"


# -- docs ----------------------------------------------------------------------------


def test_metrics_doc_describes_every_name_with_its_type_and_labels() -> None:
    text = METRICS_DOC.read_text()
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`(ourios_[a-z0-9_]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    assert set(rows) == set(INTERFACE), sorted(set(rows) ^ set(INTERFACE))
    standard = set(re.findall(r"^\|\s*`((?:process)_[a-z_]+)`", text, re.MULTILINE))
    assert standard == {n for n in STANDARD if n.startswith("process_")}, standard
    for name, (kind, labels) in INTERFACE.items():
        cells = rows[name]
        assert cells[0] == kind, (name, cells[0])
        documented = set(re.findall(r"`([a-z_]+)`", cells[1]))
        assert documented == labels, (name, documented)

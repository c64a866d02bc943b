"""The sampler and the report (soak/sampler.py, soak/report.py).

The sampler is pointed at a real ``ourios serve``: the gauges and the histogram it
reads are the product's (DESIGN.md §9), so a renamed metric fails here, not in an
hour-long soak. The report is fed a synthetic run whose numbers are known.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from soak.chaos import Kill
from soak.ledger import LedgerWriter, read_ledgers
from soak.node import ServeNode, free_port
from soak.report import PLOTS, estimate_wal_rate, report_dir, segment_bound, write_report
from soak.sampler import (
    GAUGES,
    Sampler,
    counter_deltas,
    histogram_quantile,
    interval_quantiles,
    load_samples,
    restarts,
)
from tests.support.otel import sample_request

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} B)"


# --- the sampler --------------------------------------------------------------------------


def test_the_sampler_reads_the_products_metrics(tmp_path: Path) -> None:
    node = ServeNode(
        tmp_path / "data",
        {"OURIOS_WAL_BARRIER_SECS": "1"},
        http_port=free_port(),
        log_path=tmp_path / "serve.log",
    )
    node.start()
    try:
        body = sample_request("soak", 7, time_base_ns=time.time_ns()).SerializeToString()
        proc = node.process
        assert proc is not None
        status, _, _ = proc.post_logs(body, {"X-Ourios-Tenant": "t1"})
        assert status == 200
        sampler = Sampler(node.metrics_url, tmp_path / "samples.jsonl", 60)
        row = sampler.sample_once()
        node.kill()
        down = sampler.sample_once()
    finally:
        node.close()
    assert row["up"] is True
    # Every gauge the report plots is exposed (the oldest-unreclaimed age may be absent,
    # DESIGN.md §9; recovery duration and free disk are set at start-up).
    for key in ("wal_segments", "wal_disk_bytes", "wal_unreclaimed_bytes", "wal_checkpoint_lsn"):
        assert key in row, f"{key} missing from {sorted(row)}"
    structured = {"t", "up", "ingest_requests", "ingest_records", "ack_count", "ack_sum",
                  "ack_buckets", "rotation_state", "retain_floor"}  # fmt: skip
    assert set(row) - structured <= set(GAUGES.values())
    assert row["ingest_records"] == {"ok": 7.0}
    assert row["ingest_requests"] == {"ok": 1.0}
    assert row["ack_count"] == 1.0 and row["ack_buckets"][-1] == ["+Inf", 1.0]
    assert row["rotation_state"] == "healthy" and row["barrier_epoch"] >= 1
    assert down["up"] is False and "Connection" in down["error"]
    assert load_samples(tmp_path / "samples.jsonl") == [row, down]
    assert sampler.samples == 2 and sampler.down == 1


def test_the_sampler_thread_stops_at_once(tmp_path: Path) -> None:
    calls: list[str] = []

    def fetch(url: str) -> str:
        calls.append(url)
        return "# EOF\n"

    sampler = Sampler("http://127.0.0.1:9/metrics", tmp_path / "s.jsonl", 3600, fetch=fetch)
    began = time.monotonic()
    with sampler:
        pass
    assert time.monotonic() - began < 5
    assert calls == ["http://127.0.0.1:9/metrics"]


def test_counter_deltas_treat_a_decrease_as_a_restart() -> None:
    assert counter_deltas([0, 5, 12, None, 20, 3, 9]) == [None, 5, 7, None, None, 3, 6]
    restarted = [False, False, True]
    assert counter_deltas([10, 15, 18], restarted) == [None, 5, 18]


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 50.0), (0.2, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.99, [(0.1, 0.0), (math.inf, 10.0)]) == 0.1
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None


def test_interval_quantiles_use_bucket_deltas_across_a_restart() -> None:
    def row(t: float, epoch: float, counts: list[float]) -> dict[str, Any]:
        buckets = [[le, n] for le, n in zip([0.01, 0.1, "+Inf"], counts, strict=True)]
        return {"t": t, "up": True, "barrier_epoch": epoch, "ack_buckets": buckets}

    samples = [
        row(0, 5, [10, 10, 10]),
        row(2, 6, [10, 20, 20]),  # ten acks in (0.01, 0.1]
        {"t": 4, "up": False},
        row(6, 1, [4, 4, 4]),  # a new process: its four acks are all new
    ]
    assert restarts(samples) == [False, False, False, True]
    q = interval_quantiles(samples, (0.5,))
    assert q[0] == {} and q[2] == {}
    assert q[1][0.5] == pytest.approx(0.055)
    assert q[3] == {}  # the previous sample was down: no interval to speak of


# --- the bound and the report ----------------------------------------------------------------


def test_the_segment_bound() -> None:
    # 0.5 MiB/s into 1 MiB segments plus one age rotation per 10 s: 0.6 segments/s;
    # the oldest closed segment lives 3*5 + 2 + 5 = 22 s; 13.2 -> 14, plus 2.
    bound = segment_bound(
        wal_bytes_per_s=0.5 * 2**20,
        segment_max_bytes=2**20,
        segment_age_s=10,
        barrier_s=5,
        housekeeping_s=5,
        down_s=2,
    )
    assert bound == 16
    samples = [{"wal_checkpoint_lsn": 10 * 2**20}, {"wal_checkpoint_lsn": 30 * 2**20}]
    assert estimate_wal_rate(samples, 60) == pytest.approx(0.75 * 2**20)
    assert estimate_wal_rate([], 60) == 0.0


def _synthetic_run(out: Path, *, segments: int, lost: int) -> dict[str, Any]:
    t0 = 1_796_000_000.0
    samples = []
    for i in range(60):
        up = not 20 <= i < 22
        samples.append(
            {"t": t0 + 1 + i, "up": up}
            | (
                {
                    "wal_segments": 2 + (i % 3) + (segments if i == 40 else 0),
                    "wal_disk_bytes": 9e6 + i * 1e4,
                    "wal_unreclaimed_bytes": 1e6,
                    "wal_checkpoint_lsn": i * 2e5,
                    "barrier_epoch": i if i < 20 else i - 19,
                    "ingest_records": {"ok": 500.0 * (i if i < 20 else i - 21)},
                    "ingest_requests": {"ok": 10.0 * i, "error": 1.0},
                    "ack_buckets": [[0.01, 5.0 * i], [0.1, 10.0 * i], ["+Inf", 10.0 * i]],
                }
                if up
                else {"error": "ConnectionRefusedError"}
            )
        )
    with (out / "samples.jsonl").open("w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    kill = Kill(1, t0 + 20.5, "pid 42", 19.0, 1.5, "", "pid 43")
    (out / "kills.jsonl").write_text(json.dumps(kill.__dict__) + "\n")
    with LedgerWriter(out / "ledger", "w0p1") as ledger:
        for i in range(100):
            ledger.sent(f"r.{i}", 50, f"t{i % 4}")
            if i % 10 == 3:
                ledger.error(f"r.{i}", "refused")
            else:
                ledger.acked(f"r.{i}", 200, 5.0 + i)
    verified = {"ok": lost == 0, "lost": lost, "records_sent": 5000, "records_acked": 4500,
                "records_error": 500, "lines": ["verify OK"]}  # fmt: skip
    (out / "verify.json").write_text(json.dumps(verified))
    run = {
        "label": "synthetic",
        "started_at": t0,
        "load_seconds": 60.0,
        "duration_s": 60.0,
        "settings": {
            "segment_max_bytes": 2**20,
            "segment_age_secs": 10.0,
            "barrier_secs": 5.0,
            "housekeeping_secs": 5.0,
        },  # fmt: skip
        "recovery_seconds": [0.1, 0.4],
        "problems": [],
    }
    (out / "run.json").write_text(json.dumps(run))
    return run


def test_the_report_writes_plots_and_a_summary(tmp_path: Path) -> None:
    _synthetic_run(tmp_path, segments=0, lost=0)
    summary = report_dir(tmp_path)
    for name in PLOTS:
        assert_png(tmp_path / name)
    assert summary.passed, summary.verdict
    assert summary.kills == 1 and summary.max_down_s == 1.5
    assert summary.max_segments == 4 and summary.segment_bound is not None
    assert summary.max_segments <= summary.segment_bound
    assert summary.max_recovery_s == 0.4
    assert summary.client_ack_max_ms == 104.0
    assert summary.acked_records_per_s == 75.0
    text = (tmp_path / "summary.md").read_text()
    assert "| verdict | PASS |" in text and "| 1 | 20.5 | pid 42 |" in text
    assert json.loads((tmp_path / "summary.json").read_text())["verdict"] == "PASS"


@pytest.mark.parametrize(
    ("segments", "lost", "words"),
    [
        pytest.param(100, 0, "segments 103 > bound", id="segments_over_the_bound"),
        pytest.param(0, 3, "verifier", id="lost_records"),
    ],
)
def test_the_report_fails_what_must_fail(
    tmp_path: Path, segments: int, lost: int, words: str
) -> None:
    run = _synthetic_run(tmp_path, segments=segments, lost=lost)
    summary = write_report(
        tmp_path,
        load_samples(tmp_path / "samples.jsonl"),
        [],
        json.loads((tmp_path / "verify.json").read_text()),
        run,
        ledger=read_ledgers(tmp_path / "ledger"),
    )
    assert not summary.passed and words in summary.verdict

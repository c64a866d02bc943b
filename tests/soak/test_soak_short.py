"""The short soak: ``soak.run`` end to end inside the normal test run (docs/SOAK.md).

About a hundred seconds of locust load (OTLP/HTTP protobuf, 32 tenants, 20 requests/s
of 50 records) against a real ``ourios serve`` publishing to a real SeaweedFS bucket,
SIGKILLed three times by pid at seeded intervals and restarted on its data directory,
then SIGTERMed for the final cut. It must end with:

- zero acknowledged records lost, zero published twice, zero template events published
  twice (and none published that were never sent, none under
  the wrong tenant), over tens of thousands of acknowledged records;
- three kills, each followed by a new process that recovered and became ready;
- WAL segments never above the bound derived from the node's settings
  (``soak.report.segment_bound``): with segments of S = 1 MiB rotating at A = 10 s,
  barrier B = 5 s and housekeeping H = 5 s, downtime D and WAL write rate r,
  ``ceil((r/S + 1/A)(3B + D + H)) + 2`` — about 14 at this load — while several times
  more WAL than that was written, so reclamation did the bounding;
- the report: three non-empty PNG plots, ``summary.md`` with the verdict.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from soak.chaos import KillSchedule
from soak.report import PLOTS, segment_bound
from soak.run import NODE_SETTINGS, ExternalS3, SoakConfig, run
from tests.support.seaweed import S3Bucket

DURATION_S = 100.0
KILL_EVERY_S = 20.0
KILLS = 3
SEED = 2
#: Generous time for a restart under load on a busy two-core machine (seen: 1–4 s).
RESTART_ALLOWANCE_S = 8.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_short_soak_with_three_sigkills(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    config = SoakConfig(
        duration_s=DURATION_S,
        out=tmp_path / "soak",
        kill_every_s=KILL_EVERY_S,
        rate=20.0,
        batch=50,
        tenants=32,
        users=8,
        seed=SEED,
        store=ExternalS3(s3_bucket.url("soak"), s3_bucket.server.env(), s3_bucket.server.client()),
        max_kills=KILLS,
        label="short soak (tests)",
    )
    # The seeded schedule leaves room for all three kills before the quiet period.
    intervals = KillSchedule(KILL_EVERY_S, SEED).intervals()
    planned = sum(next(intervals) for _ in range(KILLS)) + KILLS * RESTART_ALLOWANCE_S
    assert planned <= DURATION_S - config.quiet, "pick a seed whose kills fit the run"

    result = run(config)
    out = result.out
    summary = result.summary
    verified = json.loads((out / "verify.json").read_text())
    run_meta = json.loads((out / "run.json").read_text())
    context = (out / "summary.md").read_text()
    print(context)  # the figures, for -rP and for the log of a failing run

    # Nothing acknowledged was lost, over a load that really ran.
    assert verified["lost"] == 0, context
    assert verified["never_sent"] == 0 and verified["wrong_tenant"] == 0, context
    # ... and nothing was published twice, records or template events (issue 16).
    assert verified["duplicates"] == 0 and verified["audit_duplicates"] == 0, context
    assert verified["template_events"] > 0, context
    assert not verified["unreadable_objects"] and not verified["ledger_anomalies"], context
    assert verified["records_acked"] >= 30_000, context
    assert verified["distinct_ids"] >= verified["records_acked"]
    assert result.verify_ok and not result.problems, result.problems

    # Three SIGKILLs, each answered by a new process that recovered and became ready.
    assert summary.kills == KILLS, context
    lifetimes = run_meta["lifetimes"]
    assert [life["ended_by"] for life in lifetimes] == ["sigkill"] * KILLS + ["sigterm"]
    assert len({life["pid"] for life in lifetimes}) == KILLS + 1
    assert all(life["recovery"] for life in lifetimes), "a start without recovery.done"
    replayed = [life["recovery"]["frames"] for life in lifetimes[1:]]
    assert any(n > 0 for n in replayed), f"no restart replayed anything: {replayed}"
    assert lifetimes[-1]["exit_code"] == 0

    # WAL segments stayed under the bound derived from the node's settings.
    settings = run_meta["settings"]
    assert settings == {
        "segment_max_bytes": int(NODE_SETTINGS["OURIOS_WAL_SEGMENT_MAX_BYTES"]),
        "segment_age_secs": 10.0,
        "barrier_secs": 5.0,
        "housekeeping_secs": 5.0,
    }
    assert summary.segment_bound is not None and summary.max_segments is not None
    assert summary.segment_bound == segment_bound(
        wal_bytes_per_s=summary.final_checkpoint_lsn / run_meta["load_seconds"] * 1.5
        if summary.final_checkpoint_lsn
        else 0.0,
        segment_max_bytes=settings["segment_max_bytes"],
        segment_age_s=settings["segment_age_secs"],
        barrier_s=settings["barrier_secs"],
        housekeeping_s=settings["housekeeping_secs"],
        down_s=summary.max_down_s or 0.0,
    )
    assert summary.segment_bound <= 30, f"a bound of {summary.segment_bound} proves little"
    assert summary.max_segments <= summary.segment_bound, context
    # Several times more WAL went through than was ever held: reclamation bounded it.
    assert summary.final_checkpoint_lsn is not None
    held = summary.max_segments * settings["segment_max_bytes"]
    assert summary.final_checkpoint_lsn >= 2 * held, context
    left = sorted((out / "data" / "wal").glob("*.wal"))
    assert len(left) <= summary.segment_bound, left

    # The report.
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
    assert summary.passed, summary.verdict
    assert "| verdict | PASS |" in context
    kill_rows = [r for r in context.splitlines() if re.match(r"\| \d+ \| [\d.]+ \| pid \d+ \|", r)]
    assert len(kill_rows) == KILLS, context
    samples = (out / "samples.jsonl").read_text().splitlines()
    assert len(samples) >= DURATION_S / config.sample_interval_s * 0.8

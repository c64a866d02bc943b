"""Issue 18 item 0, on a real ``ourios serve`` and a real SeaweedFS: a store outage under
load never wedges the node, and a shutdown never hides what it could not publish.

The wedge this guards against: with the store down, a cut's audit publish failed and
went back into the buffers, a rotation-fired cut drained it again into the barrier's
pending slot, and the running cut's records waited for it for good (so did the age
sweep); after the store returned the node completed no cut and published nothing, and
SIGTERM exited 0 with ``rows_left_in_wal: 0`` while acknowledged rows were only in the
WAL. Small segments (a rotation every few requests), a one-second barrier and small
flush thresholds make that interleaving an ordinary one here.

- ``test_nowedge_0_..._after_a_store_outage_under_load``: several senders and tenants
  over HTTP, a fifth of the records making new templates (so template events keep
  flowing); SeaweedFS is SIGKILLed (publishes fail, requests are still acknowledged),
  then started again on the same ports and data: the node
  publishes again (new objects), the barrier completes cuts again (its ``ok`` count
  rises), and after the load stops SIGTERM exits 0 with nothing left and every
  acknowledged record in the store (read back with pyarrow).
- ``test_nowedge_0_a_shutdown_with_the_store_down_...``: SIGTERM while the store is
  still down exits non-zero and ``server.stopped`` counts the rows only the WAL holds;
  a restart with the store back publishes every acknowledged record.

Everything waits on real conditions with deadlines (the server's ``/metrics``, the
bucket's listing, acknowledgement counts); nothing sleeps to hope. The seed is printed
(``NOWEDGE_SEED`` reruns one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import seed_from
from tests.support.parquet_read import download_prefix, read_kind
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape
from tests.support.seaweed import S3Bucket, SeaweedS3
from tests.support.serve import ServeProcess

pytestmark = pytest.mark.slow

TENANTS = ("acme", "globex", "initech", "umbrella")
PREFIX = "nowedge"
#: the share of records that make a new template: template events keep flowing, so
#: every cut and sweep has audit partitions its records depend on
FRESH = 0.2
#: every condition below is awaited at most this long (a bound on a failure, not a pace:
#: each holds within a few seconds on an idle machine)
DEADLINE_S = 45.0

ENV = {
    "OURIOS_WAL_BARRIER_SECS": "1",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",  # a rotation (and its cut) every few requests
    "OURIOS_SINK_FLUSH_BYTES": "8192",  # the size trigger fires under load
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",  # and the age sweep runs every quarter second
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "5",
}


def wait_for(condition: Callable[[], bool], what: str, detail: Callable[[], str]) -> None:
    """Poll a real external condition until it holds (bounded by ``DEADLINE_S``)."""
    poll_until(what, condition, deadline_s=DEADLINE_S, detail=detail, every_s=0.1)


def cadence(serve: ServeProcess, name: str, outcome: str) -> float:
    """``ourios_cadence_runs_total`` for one cadence and outcome, over every error type."""
    s = try_scrape(serve)
    return s.total("ourios_cadence_runs_total", cadence=name, outcome=outcome) if s else 0.0


def publish_failures(serve: ServeProcess) -> float:
    """``ourios_sink_publish_failures_total`` over every kind and error type."""
    s = try_scrape(serve)
    return s.total("ourios_sink_publish_failures_total") if s else 0.0


def records_objects(bucket: S3Bucket) -> int:
    return len(bucket.keys(f"{PREFIX}/records/"))


def published_rids(bucket: S3Bucket, dest: Path) -> dict[str, str]:
    """Every ``rid`` in the published records, with its tenant (read with pyarrow)."""
    download_prefix(bucket.server.client(), bucket.name, PREFIX, dest)
    if not (dest / "records").exists():
        return {}
    return {
        row["attributes"]["rid"]: row["tenant"] for row in read_kind(dest, "records", "pyarrow")
    }


def serve_env(seaweed: SeaweedS3, bucket: S3Bucket) -> dict[str, str]:
    return {**ENV, **seaweed.env(), "OURIOS_STORE_URL": bucket.url(PREFIX)}


def check_acked_published(ledger: AckLedger, bucket: S3Bucket, dest: Path) -> int:
    published = published_rids(bucket, dest)
    acked = ledger.rids(Outcome.ACKED)
    missing = sorted(acked - published.keys())
    assert not missing, f"{len(missing)} acknowledged records not in the store: {missing[:5]}"
    for rid, tenant in published.items():
        request = ledger.request_of(rid)
        assert request is not None and request.outcome is not Outcome.UNSENT, rid
        assert request.tenant == tenant, (rid, tenant, request.tenant)
    return len(acked)


def test_nowedge_0_the_node_publishes_and_cuts_again_after_a_store_outage_under_load(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    seed = seed_from("NOWEDGE_SEED")
    bucket = S3Bucket.create(seaweed, "nowedge")
    ledger = AckLedger()
    serve = ServeProcess(tmp_path / "node", serve_env(seaweed, bucket))
    with serve:
        with AckLoad(
            ledger,
            serve.http_port,
            senders=6,
            tenants=TENANTS,
            seed=seed,
            fresh_templates=FRESH,
        ) as load:
            load.wait_acked(100)
            wait_for(
                lambda: cadence(serve, "barrier", "ok") >= 2 and records_objects(bucket) > 0,
                "healthy cuts and published objects before the outage",
                serve.tail,
            )

            seaweed.kill()  # the store is gone: every publish fails from now on
            acked_at_kill = load.acked
            wait_for(
                lambda: publish_failures(serve) > 0,
                "publishes failing during the outage",
                serve.tail,
            )
            load.wait_acked(acked_at_kill + 300)  # acknowledgement goes on: the WAL holds it

            seaweed.restart()  # the store returns, same endpoint, same data
            objects_back = records_objects(bucket)
            ok_back = cadence(serve, "barrier", "ok")
            acked_back = load.acked
            wait_for(
                lambda: records_objects(bucket) > objects_back,
                "new objects after the store returned",
                serve.tail,
            )
            wait_for(
                lambda: cadence(serve, "barrier", "ok") >= ok_back + 3,
                "the barrier completing cuts after the store returned",
                lambda: f"barrier ok {cadence(serve, 'barrier', 'ok')}\n{serve.tail()}",
            )
            load.wait_acked(acked_back + 100)  # and it still acknowledges
            load.stop()
            serve.wait_turned()  # a stop leaves the unturned to the WAL (exit 75)
        code = serve.terminate()

    (stopped,) = serve.event("server.stopped")
    assert code == 0, f"exit {code}: {stopped}\n{serve.tail()}"
    assert stopped["rows_left_in_wal"] == 0 and stopped["template_events_left_in_wal"] == 0
    assert stopped["final_cut_ok"] is True and stopped["timers_joined"] is True, stopped
    acked = check_acked_published(ledger, bucket, tmp_path / "published")
    assert acked >= ledger.records_with(Outcome.ACKED) > 0


def test_nowedge_0_a_shutdown_with_the_store_down_exits_non_zero_and_counts_the_rows(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    seed = seed_from("NOWEDGE_SEED")
    bucket = S3Bucket.create(seaweed, "nowedge")
    ledger = AckLedger()
    data = tmp_path / "node"
    env = serve_env(seaweed, bucket)
    serve = ServeProcess(data, env)
    with serve:
        with AckLoad(ledger, serve.http_port, senders=4, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(50)
            seaweed.kill()
            load.wait_acked(load.acked + 200)  # acknowledged while nothing can publish
            load.stop()
        code = serve.terminate()

    (stopped,) = serve.event("server.stopped")
    left = stopped["rows_left_in_wal"]
    assert code == stopped["exit_code"] != 0, f"exit {code}: {stopped}\n{serve.tail()}"
    assert stopped["level"] == "error" and stopped["final_cut_ok"] is False, stopped

    seaweed.restart()
    published = published_rids(bucket, tmp_path / "before-restart")
    missing = ledger.rids(Outcome.ACKED) - published.keys()
    # Every acknowledged record the store lacks is counted (a publish whose reply the
    # outage cut off may have landed and still be counted, never the other way round).
    assert left >= len(missing) > 0, (left, len(missing))

    # Nothing was lost: the next start replays the WAL and publishes them.
    again = ServeProcess(data, env)
    with again:
        assert again.terminate() == 0, again.tail()
    check_acked_published(ledger, bucket, tmp_path / "after-restart")

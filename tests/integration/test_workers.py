"""Worker processes (DESIGN.md §5, ``server.workers``): a real ``ourios serve`` with two
workers, real OTel SDK clients, SIGKILLs of a worker and of the core, SIGTERM, the one
HTTP port's /metrics, and a client that writes an oversize body whole.

Nothing here sleeps on a guess: kills are placed by counting acknowledgements, a
restarted worker is awaited by its ``worker.ready`` event, a process's end by polling
``/proc`` with a deadline (an external condition).
"""

from __future__ import annotations

import os
import random
import re
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.resources import Resource

from tests.support.ackload import AckLedger, AckLoad, Outcome, rid_of_body
from tests.support.crashrig import seed_from
from tests.support.otel import grpc_client, http_client
from tests.support.poll import poll_until
from tests.support.serve import ServeProcess

TENANTS = ("acme", "globex", "initech")

ENV = {
    "OURIOS_SERVER_WORKERS": "2",
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "20",
}


def _objects(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "objects" / "records").glob("tenant=*/date=*/*.parquet"))


def _published_rids(data_dir: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in _objects(data_dir):
        for body in pq.read_table(path, columns=["body"]).column("body").to_pylist():
            rid = rid_of_body(body)
            if rid is not None:
                counts[rid] += 1
    return counts


def _published_bodies(data_dir: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in _objects(data_dir):
        counts.update(pq.read_table(path, columns=["body"]).column("body").to_pylist())
    return counts


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    """Until none of ``pids`` is alive (the kernel's process table: polled)."""
    poll_until(
        "end of every worker",
        lambda: not any(_alive(pid) for pid in pids),
        deadline_s=timeout,
        detail=lambda: f"orphaned workers: {[pid for pid in pids if _alive(pid)]}",
    )


def _workers(serve: ServeProcess) -> list[int]:
    (listening,) = serve.event("server.listening")
    pids: list[int] = listening["workers"]
    return pids


def _check_acked_published(ledger: AckLedger, data_dir: Path) -> Counter[str]:
    counts = _published_rids(data_dir)
    acked = ledger.rids(Outcome.ACKED)
    missing = sorted(acked - counts.keys())
    assert not missing, f"{len(missing)} acknowledged records not published: {missing[:10]}"
    unsent = ledger.rids(Outcome.UNSENT) & counts.keys()
    assert not unsent, f"records never sent were published: {sorted(unsent)[:10]}"
    return counts


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


# ── OTel SDK clients, both transports ─────────────────────────────────────────────────


def test_workers_sdk_http_and_grpc_records_are_each_published_once(data_dir: Path) -> None:
    run = uuid.uuid4().hex[:8]
    sent: list[str] = []
    with ServeProcess(data_dir, ENV) as serve:
        assert len(_workers(serve)) == 2
        for transport, make in (("http", http_client), ("grpc", grpc_client)):
            port = serve.http_port if transport == "http" else serve.grpc_port
            resource = Resource({"service.name": f"workers-{transport}"})
            with make(
                port, headers={"x-ourios-tenant": "acme"}, resource=resource, batch_size=50
            ) as client:
                logger = client.provider.get_logger(f"workers.{transport}")
                for i in range(400):
                    body = f"{transport} request {i} of run {run} took {i % 17} ms"
                    logger.emit(body=body)
                    sent.append(body)
                report = client.flush()
            assert report.ok, (transport, report)
            assert report.records_acknowledged == 400
        assert serve.terminate() == 0
    published = _published_bodies(data_dir)
    assert {body: published[body] for body in sent} == dict.fromkeys(sent, 1)


# ── SIGKILL of a worker ─────────────────────────────────────────────────────────────────


def test_workers_sigkill_of_a_worker_under_load_loses_nothing_and_it_comes_back(
    data_dir: Path,
) -> None:
    seed = seed_from("WORKERS_SEED")
    rng = random.Random(seed)
    ledger = AckLedger()
    with ServeProcess(data_dir, ENV) as serve:
        victim = rng.choice(_workers(serve))
        with AckLoad(ledger, serve.http_port, senders=6, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(rng.randrange(40, 120))
            os.kill(victim, 9)
            serve.wait_event("worker.exited", 1)
            serve.wait_event("worker.ready", 3)  # two at start, one replacement
            status, _ = serve.get("/readyz")
            assert status == 200, serve.tail()
        (exited,) = serve.event("worker.exited")
        assert exited["pid"] == victim and exited["returncode"] == -9
        assert not _alive(victim)
        # the replacement serves: a fresh load is acknowledged through both workers
        with AckLoad(ledger, serve.http_port, senders=6, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(60)
        serve.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert serve.terminate() == 0, serve.tail()
    _check_acked_published(ledger, data_dir)


# ── SIGKILL of the core ─────────────────────────────────────────────────────────────────


def test_workers_sigkill_of_the_core_leaves_no_orphan_and_loses_nothing(
    data_dir: Path,
) -> None:
    seed = seed_from("WORKERS_SEED")
    rng = random.Random(seed)
    ledger = AckLedger()
    for _ in range(2):
        serve = ServeProcess(data_dir, ENV).start()
        try:
            workers = _workers(serve)
            with AckLoad(ledger, serve.http_port, senders=6, tenants=TENANTS, seed=seed) as load:
                load.wait_acked(rng.randrange(30, 90))
                serve.kill()
                _wait_gone(workers)
                load.stop()
        finally:
            serve.close()
    with ServeProcess(data_dir, ENV) as serve:
        assert serve.terminate() == 0, serve.tail()
    _check_acked_published(ledger, data_dir)


# ── SIGTERM ─────────────────────────────────────────────────────────────────────────────


def test_workers_sigterm_drains_cleanly(data_dir: Path) -> None:
    seed = seed_from("WORKERS_SEED")
    ledger = AckLedger()
    with ServeProcess(data_dir, ENV) as serve:
        workers = _workers(serve)
        with AckLoad(ledger, serve.http_port, senders=6, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(80)
            code = serve.terminate()
            load.join()
        assert code == 0, serve.tail()
        (stopped,) = serve.event("stages.stopped")
        assert stopped == {**stopped, "workers_clean": True, "stages_joined": True}, stopped
        (server,) = serve.event("server.stopped")
        assert server["rows_left_in_wal"] == 0 and server["final_cut_ok"], server
        assert len(serve.event("worker.stopped")) == 2
    _wait_gone(workers)
    _check_acked_published(ledger, data_dir)


# ── /metrics on the one port ────────────────────────────────────────────────────────────

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _samples(text: str) -> list[tuple[str, str, float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m is not None, line
        out.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return out


def _counter(samples: list[tuple[str, str, float]], name: str, **labels: str) -> float:
    want = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for sample_name, label_text, value in samples:
        if sample_name == name and want <= set(label_text.strip("{}").split(",")):
            total += value
    return total


def test_workers_metrics_have_each_series_once_and_count_every_request(data_dir: Path) -> None:
    ok_requests, bad_requests = 37, 5
    with ServeProcess(data_dir, ENV) as serve:
        for i in range(ok_requests):
            body = (
                '{"resourceLogs":[{"scopeLogs":[{"logRecords":['
                f'{{"body":{{"stringValue":"metrics {i} a"}}}},'
                f'{{"body":{{"stringValue":"metrics {i} b"}}}}]}}]}}]}}'
            )
            status, _, _ = serve.post_logs(
                body.encode(), {"Content-Type": "application/json", "X-Ourios-Tenant": "acme"}
            )
            assert status == 200
        for _ in range(bad_requests):
            status, _, _ = serve.post_logs(b"{not json", {"Content-Type": "application/json"})
            assert status == 400
        # every scrape (whichever worker accepts it) sees the same full counts
        for _ in range(6):
            status, text = serve.get("/metrics")
            assert status == 200
            samples = _samples(text.decode())
            series = Counter((name, labels) for name, labels, _ in samples)
            assert [s for s, n in series.items() if n > 1] == []
            http = {"transport": "http"}
            assert _counter(samples, "ourios_ingest_requests_total", outcome="ok", **http) == (
                ok_requests
            )
            assert _counter(samples, "ourios_ingest_requests_total", outcome="refused", **http) == (
                bad_requests
            )
            assert _counter(samples, "ourios_ingest_records_total", outcome="ok", **http) == (
                2 * ok_requests
            )
            assert _counter(samples, "ourios_ingest_ack_seconds_count") == ok_requests
            assert _counter(samples, "ourios_wal_segments") >= 1  # the core's gauges too
        assert serve.terminate() == 0


# ── an oversize body, written whole before the answer is read ─────────────────────────


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_blocking_client_writing_an_oversize_body_reads_the_413(
    data_dir: Path, workers: str
) -> None:
    """urllib writes the whole body before it reads: it must read the 413 (which OTLP
    clients do not retry), not a connection reset (which they do)."""
    env = {**ENV, "OURIOS_SERVER_WORKERS": workers, "OURIOS_WAL_MAX_FRAME_BYTES": "1MiB"}
    with ServeProcess(data_dir, env) as serve:
        body = b"\x00" * (10 * 1024 * 1024)
        for _ in range(3):
            request = urllib.request.Request(
                f"http://127.0.0.1:{serve.http_port}/v1/logs",
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
            )
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, timeout=30)
            assert info.value.code == 413
            assert b"1048576" in info.value.read()
        assert serve.terminate() == 0

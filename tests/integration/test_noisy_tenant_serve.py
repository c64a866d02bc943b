"""Issue 21 item 2 against a real ``ourios serve``: one tenant cannot stall the others.

31 quiet tenants send the ingest benchmark's traffic (``soak/bench/loadgen.py``: 100-record
requests of service-log templates, four attributes a record) at a fixed rate, in an open
loop timed from each request's scheduled send (so a node that falls behind shows as
latency, not as a lower rate). A noisy tenant sends batches of unique lines as fast as it
can: a closed loop, the next batch as soon as the last is answered, after the Retry-After
a 503 names — what an OTLP exporter does.

The node runs the default turn share (``miner.tenant_turn_percent``,
``miner.tenant_turn_burst_secs``): it is a fraction of the turn's measured time, so it
means the same on this machine, loaded or not. Pass or fail is never decided by the
machine's speed: the run alternates short windows without and with the noisy tenant on
the same node, so the quiet baseline is measured at the same time as the noisy windows
and under the same load, and the criterion is a ratio of the two (the issue's: the quiet
p99 with the noisy tenant within 2× of their p99 without it). Each window's p99 is taken
on its own and the ratio is of the median window of each kind: the noisy tenant sends in
every odd window, so what it costs the others shows in each of them, while a stall of
the machine itself (50–170 ms measured here, in either kind of window, the test's own
client late with it) lands in one window and would otherwise set a pooled p99 of its
kind alone (docs/BENCHMARKS.md, "a creation searches its leaf once"). Beside the ratio the test
asserts the mechanisms, which do not depend on speed at all: no quiet request refused;
the noisy tenant refused 503 naming it and the reason, with a Retry-After, and
``tenant.share.exceeded`` naming it and no other; the measured share of the turn its
mining took (``ourios_ingest_tenant_turn_share_max``) at its bound and not above it;
its miner's state and its snapshot under their bounds while its templates are evicted.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import string
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from app.base.config import load_settings
from app.ingest.mining.tenant_miner import snapshot_bytes_bound
from app.ingest.snapshot_store import HEADER_SIZE
from app.node.server import miner_bounds
from soak.bench.loadgen import HttpConnection, LoadConfig, build_pool, http_requests
from tests.support.serve import ServeProcess

QUIET = [f"quiet-{i:02d}" for i in range(31)]
NOISY = "noisy"
#: the quiet tenants' requests a second, together (100 records each)
QUIET_RATE = 80.0
#: windows without, then with, the noisy tenant, alternating; seconds each (short, so
#: the machine's load, which moves between seconds, falls on both kinds alike)
WINDOWS = 10
WINDOW_S = 1.25
#: requests sent before the first window (slots, first templates) are not measured; the
#: noisy tenant sends during its first NOISY_WARMUP_S too, so its own start-up (its slot,
#: its first templates, a full leaf) is paid before any window is measured
WARMUP_S = 2.0
NOISY_WARMUP_S = 1.5
NOISY_RECORDS = 200
#: a quiet request unanswered this long is counted as a timeout (it never passes)
REQUEST_TIMEOUT_S = 10.0
#: One worker (the default on two cores). Small bounds so that what the issue measured
#: over minutes happens within seconds: a 2 MiB turn backlog (a turn thread a tenant
#: stalls fills it, and every tenant is refused ``ingest_backlog``), each tenant's share
#: of it 512 KiB, a small template bound. The turn share is the default.
ENV = {
    "OURIOS_SERVER_WORKERS": "1",
    "OURIOS_WAL_TURN_BACKLOG_BYTES": str(2 << 20),
    "OURIOS_MINER_TENANT_BACKLOG_BYTES": str(512 << 10),
    "OURIOS_MINER_MAX_TEMPLATES": "1024",
}
#: The quiet tenants' p99 with the noisy tenant, at most this many times their p99
#: without it: the issue's criterion. The defaults meet it with room (docs/BENCHMARKS.md,
#: "Miner bounds": 0.88-1.61 in twelve runs beside two to six CPU-bound processes). The
#: mechanisms below are asserted too, exactly: a node the noisy tenant stalls fails
#: either way (main before the shares: 829 of 1,000 quiet requests refused; the share
#: ignored: no 503 for the noisy tenant, its measured share far above its bound).
P99_RATIO = 2.0


def metrics(serve: ServeProcess) -> dict[str, float]:
    status, text = serve.get("/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def noisy_requests(port: int, count: int, seed: int = 7) -> list[bytes]:
    """``count`` requests of ``NOISY_RECORDS`` lines no two alike, all in one leaf of
    Drain's tree — the same first two tokens and token count, then ten random lowercase
    words (nothing Drain would take for a number), so no two share a template and every
    search compares the leaf's every template: the most a line can cost the miner."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        req = ExportLogsServiceRequest()
        records = req.resource_logs.add().scope_logs.add()
        for _ in range(NOISY_RECORDS):
            record = records.log_records.add()
            record.time_unix_nano = 1_764_000_000_000_000_000 + rng.randrange(10**12)
            words = ("".join(rng.choices(string.ascii_lowercase, k=8)) for _ in range(10))
            record.body.string_value = "noisy line " + " ".join(words)
        body = req.SerializeToString()
        head = (
            f"POST /v1/logs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/x-protobuf\r\nContent-Length: {len(body)}\r\n"
            f"X-Ourios-Tenant: {NOISY}\r\n\r\n"
        )
        out.append(head.encode("ascii") + body)
    return out


@dataclass
class Run:
    """What the clients saw, by window (even: without the noisy tenant, odd: with it)."""

    t0: float
    latencies: dict[int, list[float]] = field(default_factory=dict)
    quiet: Counter[str] = field(default_factory=Counter)
    noisy: Counter[str] = field(default_factory=Counter)
    #: each 503's Status message and Retry-After header
    noisy_refusals: list[tuple[str, str | None]] = field(default_factory=list)
    late: int = 0

    def window(self, at: float) -> int | None:
        offset = at - self.t0 - WARMUP_S
        index = math.floor(offset / WINDOW_S)
        return index if 0 <= index < WINDOWS else None

    @property
    def end(self) -> float:
        return self.t0 + WARMUP_S + WINDOWS * WINDOW_S


async def quiet_client(
    run: Run, worker: int, workers: int, requests: list[bytes], port: int
) -> None:
    """Worker ``worker`` of ``workers`` sends at its fixed schedule (the open loop): a
    request is timed from when it was due, not from when the connection was free."""
    interval = workers / QUIET_RATE
    conn = await HttpConnection.open("127.0.0.1", port)
    k = 0
    try:
        while True:
            due = run.t0 + worker * interval / workers + k * interval
            if due >= run.end:
                return
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.005:
                run.late += 1
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    response = await conn.exchange(requests[(worker + k * workers) % len(requests)])
            except TimeoutError:
                status = "timeout"
                await conn.aclose()
                conn = await HttpConnection.open("127.0.0.1", port)
            else:
                status = str(response.status)
            done = time.perf_counter()
            k += 1
            window = run.window(due)
            if window is None:
                continue
            run.quiet[status] += 1
            run.latencies.setdefault(window, []).append(done - due)
    finally:
        await conn.aclose()


async def noisy_client(run: Run, requests: list[bytes], port: int) -> None:
    """In the warm-up and the odd windows: the next batch as soon as the last is answered, after the
    Retry-After of a 503 (the OTLP exporters honour it)."""
    conn = await HttpConnection.open("127.0.0.1", port)
    index = 0
    try:
        while (now := time.perf_counter()) < run.end:
            window = run.window(now)
            if now < run.t0:
                await asyncio.sleep(run.t0 - now)  # with the quiet tenants' first requests
                continue
            warming = now < run.t0 + NOISY_WARMUP_S
            if not warming and (window is None or window % 2 == 0):
                await asyncio.sleep(0.01)
                continue
            try:
                response = await conn.exchange(requests[index % len(requests)])
            except (asyncio.IncompleteReadError, ConnectionError):
                # the server closed the idle keep-alive connection while the client
                # waited a Retry-After: reconnect and send again, as a client does
                await conn.aclose()
                conn = await HttpConnection.open("127.0.0.1", port)
                continue
            index += 1
            run.noisy[f"{response.status}"] += 1
            if response.status == 503:
                message = status_pb2.Status.FromString(response.body).message
                retry = response.retry_after
                run.noisy_refusals.append((message, retry))
                await asyncio.sleep(float(retry or 1))
    finally:
        await conn.aclose()


async def drive(port: int, quiet: list[bytes], noisy: list[bytes]) -> Run:
    run = Run(time.perf_counter() + 0.5)
    workers = 8
    await asyncio.gather(
        *(quiet_client(run, w, workers, quiet, port) for w in range(workers)),
        noisy_client(run, noisy, port),
    )
    return run


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(0.99 * len(ordered))) - 1]


def median_window_p99(run: Run, parity: int) -> float:
    """The median of the p99s of the windows of one kind (0: without, 1: with)."""
    return statistics.median(p99(xs) for w, xs in run.latencies.items() if w % 2 == parity)


def test_bounded_2_a_noisy_tenant_does_not_stall_31_others(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = load_settings(ENV)
    bounds = miner_bounds(settings)
    with ServeProcess(data, ENV) as serve:
        port = serve.http_port
        pool = build_pool(64, 100, QUIET, seed=1, attributes=4)
        quiet = list(http_requests(LoadConfig(port=port), pool))
        noisy = noisy_requests(port, 48)
        run = asyncio.run(drive(port, quiet, noisy))
        after = metrics(serve)
        without = [x for w, xs in run.latencies.items() if w % 2 == 0 for x in xs]
        noisy_on = [x for w, xs in run.latencies.items() if w % 2 == 1 for x in xs]
        typical_without, typical_with = median_window_p99(run, 0), median_window_p99(run, 1)
        report = (
            f"quiet p99 of the median window without {typical_without * 1000:.1f} ms, with "
            f"{typical_with * 1000:.1f} ms (pooled: without {p99(without) * 1000:.1f} ms, with "
            f"{p99(noisy_on) * 1000:.1f} ms); by window (ms): "
            f"{ {w: round(p99(xs) * 1000, 1) for w, xs in sorted(run.latencies.items())} }; "
            f"quiet {dict(run.quiet)}, noisy {dict(run.noisy)}, late {run.late}; "
            f"turn share max {after['ourios_ingest_tenant_turn_share_max']:.4f}, "
            f"µs a unit {after['ourios_miner_work_unit_seconds'] * 1e6:.2f}"
        )
        print(report)
        # The 31: every request answered 200, none refused, none lost; their p99 with the
        # noisy tenant within 2x of their p99 without it, measured in the same run (the
        # median window of each kind: the module docstring).
        expected = int(QUIET_RATE * WINDOWS * WINDOW_S)
        assert run.quiet == Counter({"200": len(without) + len(noisy_on)}), report
        assert len(without) + len(noisy_on) >= expected - 8, report
        assert len(run.latencies) == WINDOWS, report
        assert typical_with <= P99_RATIO * typical_without, report
        exceeded = serve.event("tenant.share.exceeded")
        assert serve.terminate() == 0  # a clean stop writes every tenant's snapshot
    # The noisy tenant: refused for its share of the turn, named, with a Retry-After; the
    # event names it and no other tenant.
    assert run.noisy["200"] and run.noisy["503"], report
    for message, retry in run.noisy_refusals:
        assert "tenant 'noisy' is over its share of the ingest " in message, message
        assert retry is not None and int(retry) >= 1, message
    assert any("miner.tenant_turn_percent=" in message for message, _ in run.noisy_refusals)
    others = [e for e in exceeded if e["tenant"] != NOISY]
    assert exceeded and not others, (report, others)
    # The share of the turn's time its mining took, measured by the node over ~10 s: at
    # most its bound. The bucket lets a tenant take at most its share of any interval
    # plus a full bucket and one batch (admitted with nothing waiting), a tenth of each
    # over a 10 s window: a bound plus ~25 %; the rest of the margin is the measurement's.
    # From below: it sends in half the windows and sleeps a Retry-After (1 s) after each
    # refusal, and the measure decays over its 10 s, so it shows 0.3-0.6 of the bound
    # (0.0068-0.0121 against 0.02 in 22 runs, docs/BENCHMARKS.md); a tenant refused
    # from its first batch on would show one batch in 10 s, about 0.0006.
    limit = after["ourios_ingest_tenant_turn_share_limit"]
    assert limit == settings.miner.tenant_turn_percent / 100
    assert limit / 8 <= after["ourios_ingest_tenant_turn_share_max"] <= 1.5 * limit, report
    # Its miner: its one leaf full (miner.max_leaf_templates) and evicting, its templates
    # and its state under their bounds.
    assert after["ourios_miner_tenant_templates_max"] == 128, after
    assert after["ourios_miner_evictions_total"] > 0
    state_limit = after["ourios_miner_tenant_state_bytes_limit"]
    assert 0 < after["ourios_miner_tenant_state_bytes_max"] <= state_limit
    # Its snapshot, written at the stop: under the bound the miner settings give.
    snapshot = data / "snapshots" / f"{NOISY}.snap"
    bound = snapshot_bytes_bound(bounds)
    assert bound is not None
    assert snapshot.stat().st_size <= HEADER_SIZE + len(NOISY) + bound, snapshot.stat()

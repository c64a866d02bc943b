"""Ready while replaying (issue 15): the time from a restart to the first 200 on a new
batch, against the cold start of the same build, at 1×, 10× and 100× the backlog; and
ack latency at half the maximum rate, this build against an earlier one.

Phases, all in one run:

1. **Cold start.** ``ourios serve`` (default cadences, the workers on) on an empty data
   directory: the time from spawning the process to the first 200 on a new batch
   (a POST retried every 10 ms until it is acknowledged), median of ``--repeats``.
2. **Restart over a backlog.** For each multiple m of ``--multiples``: a fresh node is
   loaded at its maximum rate (``soak.bench.loadgen``, closed loop, ``--connections``
   connections of ``--records-per-request``-record requests over ``--tenants``
   tenants) for ``m × --base-seconds``, SIGKILLed (no cut ran: the default barrier is
   300 s, so all of it replays), and restarted: the same time to the first 200, and
   the replay's own figures from ``recovery.done`` (frames, records, seconds, and when
   it came after the first 200).
3. **Ack latency** (``--before REF``): for this build and for the build at ``REF`` (a git
   worktree made here), a closed-loop phase finds the maximum rate, then an open-loop
   phase at half of it gives p50/p99 (from the scheduled send time).

Targets (the issue), printed as met / NOT met, never asserted: restart-to-first-200
≤ 1.5 × the cold start at every multiple.

Run: ``.venv/bin/python soak/bench/ready.py [--base-seconds 0.6] [--multiples 1,10,100]
[--before <commit>] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from soak.bench.loadgen import LoadConfig, RequestPool, build_pool, run  # noqa: E402

TARGET_RATIO: Final = 1.5
START_TIMEOUT_S: Final = 600.0


class Node:
    """``ourios serve`` from ``tree`` on ``data``: ports 0, stderr watched for events."""

    def __init__(self, tree: Path, data: Path, env: dict[str, str] | None = None) -> None:
        self.tree = tree
        self.data = data
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.events: list[dict[str, Any]] = []
        self.http_port = 0
        self.grpc_port = 0
        self.spawned_at = 0.0
        self._listening = threading.Event()
        self._lock = threading.Lock()

    def spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OURIOS_")} | {
            "OURIOS_SERVER_DATA_DIR": str(self.data),
            "OURIOS_SERVER_HOST": "127.0.0.1",
            "OURIOS_SERVER_HTTP_PORT": "0",
            "OURIOS_SERVER_GRPC_PORT": "0",
            "PYTHONPATH": str(self.tree),
            **self.env,
        }
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            cwd=self.tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            event["_at"] = time.monotonic()
            with self._lock:
                self.events.append(event)
            if event.get("event") == "server.listening":
                self.http_port = int(event["http_port"])
                self.grpc_port = int(event["grpc_port"])
                self._listening.set()

    def event(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in self.events if e.get("event") == name), None)

    def first_ack(self, body: bytes) -> float:
        """Seconds from the spawn to the first 200 on ``body`` (retried every 10 ms)."""
        deadline = self.spawned_at + START_TIMEOUT_S
        while not self._listening.wait(0.01):
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                raise RuntimeError("ourios serve did not start")
        url = f"http://127.0.0.1:{self.http_port}/v1/logs"
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/x-protobuf"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    if response.status == 200:
                        return time.monotonic() - self.spawned_at
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.01)  # a benchmark's poll of an external process
        raise RuntimeError("no 200 within the start timeout")

    def wait_event(self, name: str, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (found := self.event(name)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {name} within {timeout} s")
            time.sleep(0.05)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the workers, should any be left


@dataclass
class Restart:
    multiple: int
    loaded_s: float
    records_acked: int
    first_ack_s: float
    ratio: float
    recovery_done_after_first_ack_s: float
    replay_frames: int
    replay_seconds: float


def _probe_body(pool: RequestPool) -> bytes:
    return pool.bodies[0]


def cold_start(tree: Path, pool: RequestPool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="ourios-ready-cold-") as tmp:
            node = Node(tree, Path(tmp))
            node.spawn()
            try:
                times.append(node.first_ack(_probe_body(pool)))
            finally:
                node.stop()
    return statistics.median(times)


def restart_over_backlog(
    tree: Path, pool: RequestPool, seconds: float, connections: int, cold: float, multiple: int
) -> Restart:
    with tempfile.TemporaryDirectory(prefix="ourios-ready-") as tmp:
        data = Path(tmp)
        node = Node(tree, data)
        node.spawn()
        node.first_ack(_probe_body(pool))
        result = run(
            LoadConfig(port=node.http_port, connections=connections, duration_s=seconds),
            pool,
        )
        node.stop(signal.SIGKILL)
        again = Node(tree, data)
        again.spawn()
        first = again.first_ack(_probe_body(pool))
        done = again.wait_event("recovery.done")
        again.stop()
        return Restart(
            multiple,
            seconds,
            result.records_acked,
            first,
            first / cold,
            done["_at"] - again.spawned_at - first,
            int(done.get("frames", 0)),
            float(done.get("seconds", 0.0)),
        )


@dataclass
class Latency:
    build: str
    max_records_per_s: float
    half_rate_p50_ms: float
    half_rate_p99_ms: float


def ack_latency(tree: Path, name: str, pool: RequestPool, seconds: float, conns: int) -> Latency:
    with tempfile.TemporaryDirectory(prefix="ourios-ready-lat-") as tmp:
        node = Node(tree, Path(tmp))
        node.spawn()
        try:
            node.first_ack(_probe_body(pool))
            closed = run(
                LoadConfig(port=node.http_port, connections=conns, duration_s=seconds), pool
            )
            rate = closed.requests / max(closed.elapsed_s, 1e-9) / 2
            half = run(
                LoadConfig(port=node.http_port, connections=conns, duration_s=seconds, rate=rate),
                pool,
            )
            return Latency(
                name,
                closed.records_acked / max(closed.elapsed_s, 1e-9),
                1000 * half.percentile(0.5),
                1000 * half.percentile(0.99),
            )
        finally:
            node.stop()


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A git worktree of ``ref`` in a temp dir (removed on the way out)."""
    path = Path(tempfile.mkdtemp(prefix="ourios-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-seconds", type=float, default=0.6, help="load at 1×")
    ap.add_argument("--multiples", default="1,10,100")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--records-per-request", type=int, default=100)
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="cold starts (median)")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--before", default=None, help="a git ref to compare ack latency with")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    tenants = [f"bench-{i:02d}" for i in range(args.tenants)]
    pool = build_pool(200, args.records_per_request, tenants, seed=1)
    cold = cold_start(ROOT, pool, args.repeats)
    print(f"cold start to the first 200: {cold:.3f} s (median of {args.repeats})")
    rows = []
    for m in (int(x) for x in args.multiples.split(",")):
        row = restart_over_backlog(ROOT, pool, args.base_seconds * m, args.connections, cold, m)
        rows.append(row)
        verdict = "met" if row.ratio <= TARGET_RATIO else "NOT met"
        print(
            f"{m:>4}× backlog: {row.records_acked:>9,} records acked in {row.loaded_s:.1f} s;"
            f" restart to the first 200 {row.first_ack_s:.3f} s = {row.ratio:.2f}× cold"
            f" (target ≤ {TARGET_RATIO}×: {verdict}); replay {row.replay_frames:,} frames in"
            f" {row.replay_seconds:.1f} s, recovery.done {row.recovery_done_after_first_ack_s:.1f}"
            f" s after the first 200"
        )
    latencies = [ack_latency(ROOT, "this build", pool, args.latency_seconds, args.connections)]
    if args.before:
        with checkout(args.before) as tree:
            latencies.append(
                ack_latency(tree, args.before, pool, args.latency_seconds, args.connections)
            )
    for lat in latencies:
        print(
            f"ack latency at half the maximum rate, {lat.build}: p50 {lat.half_rate_p50_ms:.1f}"
            f" ms, p99 {lat.half_rate_p99_ms:.1f} ms (maximum {lat.max_records_per_s:,.0f}"
            " records/s)"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "cold_first_ack_s": cold,
                    "restarts": [asdict(r) for r in rows],
                    "latency": [asdict(x) for x in latencies],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

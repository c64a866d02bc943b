"""End-to-end OTLP ingest: records/s with durable acks and ack latency, against the
decode-only ceiling, all measured in one run.

Phases, each ``--seconds`` long after a ``--warmup``, driven by ``soak.bench.loadgen``
from this process (``--connections`` keep-alive connections / in-flight calls,
``--records-per-request`` records per request, tenants rotated over ``--tenants``):

(a) the ceiling (``soak.bench.ceiling_server``: same FastAPI/uvicorn stack, parse and
    answer 200, nothing else), HTTP closed loop → ceiling records/s;
(a') the same with ``flatten`` added, for information only (not a target);
(b) ``ourios serve`` (a fresh temp data dir, the embedded ``file://`` store), HTTP
    closed loop → the maximum records/s with durable acks, p50/p99;
(c) ``ourios serve``, HTTP open loop at half of (b)'s acknowledged request rate → p99;
(d) ``ourios serve``, gRPC closed loop → records/s and the ratio to (b).

Targets (the ingest issue), each reported "met" / "NOT met" — a benchmark prints, it
never fails on speed:

- ≥ 60,000 records/s sustained with durable acks (b);
- (b) ≥ 0.5 × the ceiling (a);
- p99 ≤ 25 ms at half the maximum rate (c);
- gRPC within 0.8 × of HTTP: (d) ≥ 0.8 × (b).

The load generator shares the machine's cores with the server, so every row also says
how many cores the server and the generator used and what the generator spent per
request; with that a reader can tell a server-bound figure from a generator-bound one.

Every process started here is stopped on the way out — normal end, exception, Ctrl-C
or SIGTERM — with SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``.

Run: ``.venv/bin/python soak/bench/ingest.py [--seconds 10] [--connections 16]
[--records-per-request 100] [--tenants bench-a,bench-b,bench-c,bench-d] [--json FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from soak.bench.loadgen import LoadConfig, LoadResult, RequestPool, build_pool, run  # noqa: E402

TARGET_RECORDS_PER_S: Final = 60_000
TARGET_CEILING_RATIO: Final = 0.5
TARGET_HALF_RATE_P99_MS: Final = 25.0
TARGET_GRPC_RATIO: Final = 0.8

STARTUP_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


# ── processes ───────────────────────────────────────────────────────────────────────


class _LineWatcher:
    """Drains one pipe of a child in a thread (so the child never blocks on a full
    pipe), keeps the last lines for error messages, counts warning/error events, and
    hands the first JSON line matching `want` to `wait`."""

    def __init__(self, name: str, stream: IO[bytes], want: Callable[[dict[str, Any]], bool]):
        self.name = name
        self._stream = stream
        self._want = want
        self._found: dict[str, Any] | None = None
        self._done = threading.Event()  # set on the match or at EOF
        self.tail: deque[str] = deque(maxlen=40)
        self.problems: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        for raw in self._stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            if doc.get("level") in ("warning", "error", "critical"):
                self.problems[f"{doc.get('level')}:{doc.get('event')}"] += 1
            if self._found is None and self._want(doc):
                self._found = doc
                self._done.set()
        self._done.set()

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """The matching line, or None if the stream ended or `timeout` passed first."""
        self._done.wait(timeout)
        return self._found

    def close(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)


class ServerProcess:
    """A child server: started, waited for until it announces itself, and stopped with
    SIGTERM, then SIGKILL. `announce` picks the JSON line (on stdout or stderr, as
    `announce_on` says) that carries its ports."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        announce: Callable[[dict[str, Any]], bool],
        announce_on: str = "stdout",
    ) -> None:
        self.name = name
        self._argv = list(argv)
        self._env = dict(env)
        self._announce = announce
        self._announce_on = announce_on
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchers: dict[str, _LineWatcher] = {}
        self.announcement: dict[str, Any] = {}

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> dict[str, Any]:
        self._proc = subprocess.Popen(
            self._argv,
            cwd=ROOT,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        streams = {"stdout": self._proc.stdout, "stderr": self._proc.stderr}
        for key, stream in streams.items():
            assert stream is not None
            want = self._announce if key == self._announce_on else _never
            self._watchers[key] = _LineWatcher(f"{self.name}-{key}", stream, want)
            self._watchers[key].start()
        found = self._watchers[self._announce_on].wait(timeout)
        if found is None:
            code = self._proc.poll()
            raise RuntimeError(
                f"{self.name} did not announce itself within {timeout:.0f}s "
                f"(exit code {code}); last output:\n{self.output_tail()}"
            )
        self.announcement = found
        return found

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU of the child (all its threads) so far, from /proc."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return math.nan
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime

    def output_tail(self) -> str:
        return "\n".join(line for w in self._watchers.values() for line in w.tail)

    @property
    def problems(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for w in self._watchers.values():
            total.update(w.problems)
        return total

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  {self.name}: no exit {timeout:.0f}s after SIGTERM, SIGKILL", flush=True)
                proc.kill()
                proc.wait()
        for w in self._watchers.values():
            w.close()
        return proc.returncode


def _never(_: dict[str, Any]) -> bool:
    return False


def wait_ready(url: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll `url` (GET) until it answers 200."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s: {last}")


def ourios_env(data_dir: Path) -> dict[str, str]:
    """The caller's environment with what this benchmark pins: a fresh data dir, free
    ports on 127.0.0.1, and the embedded store under the data dir."""
    env = dict(os.environ)
    for name in ("OURIOS_STORE_URL", "OURIOS_STORE_ENDPOINT_URL"):
        env.pop(name, None)
    env.update(
        OURIOS_SERVER_DATA_DIR=str(data_dir),
        OURIOS_SERVER_HOST="127.0.0.1",
        OURIOS_SERVER_HTTP_PORT="0",
        OURIOS_SERVER_GRPC_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    return env


# ── phases ──────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured run. `other_cores`: what every process other than the server and
    this generator used meanwhile (the machine is shared), from /proc/stat."""

    name: str
    result: LoadResult
    server_cores: float
    other_cores: float

    def row(self) -> dict[str, Any]:
        r = self.result
        per_request_us = r.cpu_s / _sent(r) * 1e6 if _sent(r) else math.nan
        return {
            "phase": self.name,
            **r.summary(),
            "server_cores": round(self.server_cores, 3),
            "other_cores": round(self.other_cores, 3),
            "generator_us_per_request": round(per_request_us, 1),
        }


def _sent(r: LoadResult) -> float:
    # Requests sent over the whole wall time, warm-up included, estimated from the
    # measured rate: what the generator's CPU time was spent on.
    return r.requests_per_s * r.wall_s


def measure(name: str, server: ServerProcess, config: LoadConfig, pool: RequestPool) -> Phase:
    print(f"  {name} …", flush=True)
    before, busy_before = server.cpu_seconds(), system_busy_seconds()
    result = run(config, pool)
    used, busy = server.cpu_seconds() - before, system_busy_seconds() - busy_before
    if not result.wall_s:
        return Phase(name, result, math.nan, math.nan)
    other = max(0.0, busy - used - result.cpu_s)
    return Phase(name, result, used / result.wall_s, other / result.wall_s)


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: everything but idle
    and iowait; guest time is already inside user)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, first[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def _ms(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.1f}"


def print_table(phases: Sequence[Phase]) -> None:
    header = (
        f"{'phase':<36} {'req/s':>8} {'records/s':>10} {'p50 ms':>7} {'p90 ms':>7} "
        f"{'p99 ms':>7} {'srv cores':>9} {'gen cores':>9} {'other':>6} {'gen µs/req':>10}  "
        "statuses"
    )
    print(header)
    print("─" * len(header))
    for p in phases:
        r = p.result
        row = p.row()
        statuses = " ".join(f"{k}×{v}" for k, v in sorted(r.statuses.items()))
        if r.late:
            statuses += f" (late {r.late})"
        print(
            f"{p.name:<36} {r.requests_per_s:>8.0f} {r.records_per_s:>10,.0f} "
            f"{_ms(row['p50_ms']):>7} {_ms(row['p90_ms']):>7} {_ms(row['p99_ms']):>7} "
            f"{p.server_cores:>9.2f} {r.generator_cores:>9.2f} {p.other_cores:>6.2f} "
            f"{row['generator_us_per_request']:>10.0f}  {statuses}"
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: not measured

    @property
    def word(self) -> str:
        return "not measured" if self.met is None else "met" if self.met else "NOT met"


def verdicts(
    ceiling: Phase | None, http: Phase | None, half: Phase | None, grpc: Phase | None
) -> list[Verdict]:
    out = []
    if http is not None:
        rps = http.result.records_per_s
        out.append(
            Verdict(
                f"≥ {TARGET_RECORDS_PER_S:,} records/s with durable acks (HTTP)",
                f"{rps:,.0f} records/s",
                rps >= TARGET_RECORDS_PER_S,
            )
        )
    else:
        out.append(Verdict(f"≥ {TARGET_RECORDS_PER_S:,} records/s (HTTP)", "—", None))
    if http is not None and ceiling is not None and ceiling.result.records_per_s > 0:
        ratio = http.result.records_per_s / ceiling.result.records_per_s
        out.append(
            Verdict(
                f"≥ {TARGET_CEILING_RATIO}× the decode-only ceiling",
                f"{ratio:.2f}× ({ceiling.result.records_per_s:,.0f} records/s ceiling)",
                ratio >= TARGET_CEILING_RATIO,
            )
        )
    else:
        out.append(Verdict(f"≥ {TARGET_CEILING_RATIO}× the decode-only ceiling", "—", None))
    if half is not None and half.result.ack_latencies_s:
        # Over acknowledged requests only: a fast 503 must not pass a latency target.
        p99 = half.result.percentile(99, acked_only=True) * 1000
        refused = half.result.requests - half.result.acked
        note = f", {refused} not acknowledged" if refused else ""
        out.append(
            Verdict(
                f"p99 ≤ {TARGET_HALF_RATE_P99_MS:.0f} ms at half the maximum rate",
                f"{p99:.1f} ms at {half.result.target_rate:.0f} req/s{note}",
                p99 <= TARGET_HALF_RATE_P99_MS and not refused,
            )
        )
    else:
        out.append(Verdict(f"p99 ≤ {TARGET_HALF_RATE_P99_MS:.0f} ms at half rate", "—", None))
    if grpc is not None and http is not None and http.result.records_per_s > 0:
        ratio = grpc.result.records_per_s / http.result.records_per_s
        out.append(
            Verdict(
                f"gRPC ≥ {TARGET_GRPC_RATIO}× HTTP records/s",
                f"{ratio:.2f}× ({grpc.result.records_per_s:,.0f} records/s)",
                ratio >= TARGET_GRPC_RATIO,
            )
        )
    else:
        out.append(Verdict(f"gRPC ≥ {TARGET_GRPC_RATIO}× HTTP records/s", "—", None))
    return out


# ── the run ─────────────────────────────────────────────────────────────────────────


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    # Re-raised as SIGINT so it takes Ctrl-C's path: inside a load phase asyncio's
    # Runner cancels the run cleanly and then raises KeyboardInterrupt, elsewhere
    # Python's default handler raises it; either way the finally blocks stop the
    # servers. Raising here directly could land inside an event-loop callback.
    signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def started(stack: contextlib.ExitStack, server: ServerProcess) -> Iterator[ServerProcess]:
    """`server` started, and stopped when the block ends (and, failing that, when the
    outer `stack` unwinds)."""
    stack.callback(server.stop)
    try:
        server.start()
        yield server
    finally:
        code = server.stop()
        print(f"  {server.name} stopped (exit code {code})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="End-to-end OTLP ingest benchmark")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--records-per-request", type=int, default=100)
    parser.add_argument("--tenants", default="bench-a,bench-b,bench-c,bench-d")
    parser.add_argument("--token", default=None, help="Authorization: Bearer TOKEN")
    parser.add_argument("--pool", type=int, default=200, help="distinct pre-built requests")
    parser.add_argument("--grpc-channels", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep-data", action="store_true", help="keep ourios's data dir")
    args = parser.parse_args(argv)
    tenants = [t for t in args.tenants.split(",") if t]
    if not tenants:
        parser.error("--tenants: give at least one tenant")

    # A background job of a non-interactive shell starts with SIGINT ignored, which
    # would also make SIGTERM (re-raised as SIGINT) a no-op; this run must stay
    # stoppable, and it stops its own children on the way out.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _as_interrupt)
    print(
        f"ingest benchmark: {args.seconds:g}s per phase after {args.warmup:g}s warm-up, "
        f"{args.connections} connections, {args.records_per_request} records/request, "
        f"tenants {','.join(tenants)}, {os.cpu_count()} CPUs",
        flush=True,
    )
    t = time.perf_counter()
    pool = build_pool(args.pool, args.records_per_request, tenants, seed=args.seed)
    print(
        f"  request pool: {len(pool)} requests, mean {pool.mean_body_bytes / 1024:.1f} KiB, "
        f"built in {time.perf_counter() - t:.1f}s",
        flush=True,
    )
    base = LoadConfig(
        connections=args.connections,
        duration_s=args.seconds,
        warmup_s=args.warmup,
        token=args.token,
        grpc_channels=args.grpc_channels,
    )
    phases: list[Phase] = []
    ceiling: Phase | None = None
    http: Phase | None = None
    half: Phase | None = None
    grpc_phase: Phase | None = None
    data_dir = Path(tempfile.mkdtemp(prefix="ourios-bench-"))
    error: str | None = None
    with contextlib.ExitStack() as stack:
        if not args.keep_data:
            stack.callback(shutil.rmtree, data_dir, True)
        try:
            for work, label in (("decode", "(a) ceiling: decode, HTTP closed"),
                                ("flatten", "(a') ceiling: +flatten (info), HTTP")):  # fmt: skip
                server = ServerProcess(
                    f"ceiling-{work}",
                    [sys.executable, "-m", "soak.bench.ceiling_server", "--port", "0",
                     "--work", work],
                    {**os.environ, "PYTHONUNBUFFERED": "1"},
                    lambda doc: doc.get("event") == "ceiling.listening",
                )  # fmt: skip
                with started(stack, server):
                    port = int(server.announcement["port"])
                    wait_ready(f"http://127.0.0.1:{port}/readyz")
                    phase = measure(label, server, replace(base, port=port), pool)
                phases.append(phase)
                if work == "decode":
                    ceiling = phase

            ourios = ServerProcess(
                "ourios",
                [sys.executable, "-m", "app.cli", "serve"],
                ourios_env(data_dir),
                lambda doc: doc.get("event") == "server.listening",
                announce_on="stderr",
            )
            with started(stack, ourios):
                http_port = int(ourios.announcement["http_port"])
                grpc_port = int(ourios.announcement["grpc_port"])
                wait_ready(f"http://127.0.0.1:{http_port}/readyz")
                http_cfg = replace(base, port=http_port)
                http = measure("(b) ourios: HTTP closed", ourios, http_cfg, pool)
                phases.append(http)
                acked_rps = http.result.acked / http.result.elapsed_s / 2
                if acked_rps > 0:
                    half = measure(
                        f"(c) ourios: HTTP open @ {acked_rps:.0f} req/s",
                        ourios,
                        replace(http_cfg, rate=acked_rps),
                        pool,
                    )
                    phases.append(half)
                else:
                    print("  (c) skipped: (b) acknowledged nothing", flush=True)
                grpc_cfg = replace(base, transport="grpc", port=grpc_port)
                grpc_phase = measure("(d) ourios: gRPC closed", ourios, grpc_cfg, pool)
                phases.append(grpc_phase)
                problems = ourios.problems
            if problems:
                print(f"  ourios warnings/errors: {dict(problems)}")
            print(f"  ourios data dir: {_dir_bytes(data_dir) / 2**20:,.0f} MiB written")
        except KeyboardInterrupt:
            error = "interrupted"
            print("\ninterrupted: stopping the servers", flush=True)
        except RuntimeError as exc:
            error = str(exc)
            print(f"\nfailed: {exc}", flush=True)

    print()
    if phases:
        print_table(phases)
        print()
    results = verdicts(ceiling, http, half, grpc_phase)
    width = max(len(v.target) for v in results)
    for v in results:
        print(f"{v.target:<{width}}  {v.measured:<40}  {v.word}")
    print_generator_notes(phases)
    print(
        "cores: CPU used per wall second by the server (srv), this generator (gen) and "
        f"every other process (other), of the machine's {os.cpu_count()}; a busy 'other' "
        "means the figures are low"
    )
    if args.json is not None:
        doc = {
            "phases": [p.row() for p in phases],
            "verdicts": [{"target": v.target, "measured": v.measured, "met": v.met}
                         for v in results],
            "error": error,
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 130 if error == "interrupted" else (1 if error else 0)


def print_generator_notes(phases: Sequence[Phase]) -> None:
    """What the generator cost, so the figures can be read against the 2 cores."""
    costs = [
        p.result.cpu_s / _sent(p.result)
        for p in phases
        if p.result.transport == "http" and _sent(p.result)
    ]
    grpc_costs = [
        p.result.cpu_s / _sent(p.result)
        for p in phases
        if p.result.transport == "grpc" and _sent(p.result)
    ]
    print()
    if costs:
        us = min(costs) * 1e6
        print(
            f"load generator: {us:.0f} µs CPU per HTTP request at best here → at most "
            f"~{1e6 / us:,.0f} requests/s on one core of its own"
        )
    if grpc_costs:
        us = min(grpc_costs) * 1e6
        print(f"load generator: {us:.0f} µs CPU per gRPC call → at most ~{1e6 / us:,.0f} calls/s")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


if __name__ == "__main__":
    sys.exit(main())

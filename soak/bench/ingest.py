"""End-to-end OTLP ingest (issue 14's benchmark): records/s with durable acks, the
server's CPU per record per process, ack latency at half the maximum rate, and a
reference measured in the same run.

Load (the issue's shape, fixed): 100-record requests, 32 tenants, the load generator's
service-log templates with variable tokens (ids, addresses, durations, paths, users),
four attributes a record, 16 connections (keep-alive HTTP/1.1, or 16 gRPC calls in
flight), driven by ``soak.bench.loadgen`` from this process, which shares the machine.

For each ``server.workers`` setting (``--workers``: the default, derived from the CPUs,
then 0), a fresh ``ourios serve`` (a temp data dir, the embedded ``file://`` store) and,
each ``--seconds`` long after ``--warmup``:

1. HTTP closed loop → the maximum records/s acknowledged;
2. HTTP open loop at half of (1)'s acknowledged rate → p50/p99, timed from the
   *scheduled* send time (no coordinated omission);
3. gRPC closed loop → records/s and the ratio to (1).

CPU is read from ``/proc/<pid>/stat`` (user + system, every thread) of the core (the
``ourios serve`` process) and of each worker (its children; their pids are the
``server.listening`` event's ``workers``) at the start and the end of the measured
window, and divided by the records acknowledged in it: CPU per record for the whole
server, the core and the workers, which a noisy shared machine moves far less than
wall-clock rates.

With ``--decoders native,upb`` each ``server.workers`` setting runs once per decoder
(``server.decoder``, issue 23), so the two are compared in one run.

The reference, in this process on the same requests, one thread, CPU time
(``thread_time``): parse (``decode_request``) + ``flatten`` to Arrow + drain3 mining
(``Drain.add_log_message``, one ``Drain`` per tenant as configured by default, warmed
by a first pass over the pool so it mines at steady state as the server does). The
project's own miner (``TenantMiner.mine``) is timed beside it for information, and so
is the native decoder's parse + flatten (``otlp.decode_flat``, issue 23), against the
upb walk's parse + flatten in the same passes.

Targets (issue 14), each reported "met" / "NOT met" — a benchmark prints, it never
fails on speed — for the default workers:

- ≥ 60,000 records/s acknowledged over HTTP; gRPC ≥ 0.8× HTTP;
- server CPU per record ≤ 1.5× the reference;
- the core process ≤ 6 µs of CPU per record (a pod's ceiling, given cores, is
  1 / core CPU per record);
- p99 ≤ 25 ms at half the maximum rate;
- (issue 23) decode + flatten by the native decoder ≤ 1.5 µs a record, ≥ 4× faster than
  the upb walk, both isolated in the reference's passes.

Every process started here is stopped on the way out — normal end, exception, Ctrl-C
or SIGTERM — with SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``.

Run: ``.venv/bin/python soak/bench/ingest.py [--seconds 10] [--workers default,0]
[--decoders native,upb] [--json FILE]`` (``--workers ''``: the reference alone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from soak.bench.loadgen import LoadConfig, LoadResult, RequestPool, build_pool, run  # noqa: E402

TARGET_RECORDS_PER_S: Final = 60_000
TARGET_GRPC_RATIO: Final = 0.8
TARGET_CPU_RATIO: Final = 1.5
TARGET_CORE_US: Final = 6.0
TARGET_HALF_RATE_P99_MS: Final = 25.0
TARGET_NATIVE_US: Final = 1.5
TARGET_NATIVE_SPEEDUP: Final = 4.0

#: The issue's load shape.
TENANTS: Final = 32
RECORDS_PER_REQUEST: Final = 100
ATTRIBUTES: Final = 4
CONNECTIONS: Final = 16

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
        self.events: Counter[str] = Counter()
        #: ``receive.decoder``: the decoder each process (core, workers) chose
        self.decoders: list[dict[str, Any]] = []
        #: the first line of each event name
        self.first: dict[str, dict[str, Any]] = {}
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
            self.events[str(doc.get("event"))] += 1
            if doc.get("event") == "receive.decoder":
                self.decoders.append(doc)
            self.first.setdefault(str(doc.get("event")), doc)
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
        return proc_cpu_seconds(self.pid)

    def output_tail(self) -> str:
        return "\n".join(line for w in self._watchers.values() for line in w.tail)

    @property
    def events(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for w in self._watchers.values():
            total.update(w.events)
        return total

    def first_event(self, name: str) -> dict[str, Any] | None:
        """The first line of event `name` either stream carried, or None yet."""
        for w in self._watchers.values():
            if name in w.first:
                return w.first[name]
        return None

    @property
    def decoder_events(self) -> list[dict[str, Any]]:
        return [doc for w in self._watchers.values() for doc in w.decoders]

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


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` (every thread, living or ended) so far."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU of each living thread of process `pid`, by its kernel id."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


def thread_names(pid: int) -> dict[int, str]:
    """The Python name of each thread of `pid` by its kernel id (``py-spy dump``; empty
    without py-spy): the kernel only knows them all as ``python``."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return {}
    try:
        done = subprocess.run(
            [spy, "dump", "--json", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        threads = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    return {
        int(t["os_thread_id"]): str(t.get("thread_name") or "?")
        for t in threads
        if t.get("os_thread_id") is not None
    }


def thread_groups(
    start: Mapping[int, float], end: Mapping[int, float], names: Mapping[int, str], total: float
) -> dict[str, float]:
    """CPU seconds of the core's threads in a window, grouped by name without its number
    (``ourios-link-0`` and ``ourios-link-1`` are ``ourios-link``); threads that ended
    inside the window (a cut's flush lanes) are the process's total less the rest."""
    groups: dict[str, float] = {}
    for tid, cpu in end.items():
        name = names.get(tid, "unnamed").rstrip("0123456789").rstrip("-_") or "unnamed"
        groups[name] = groups.get(name, 0.0) + cpu - start.get(tid, 0.0)
    groups["(threads that ended)"] = max(0.0, total - sum(groups.values()))
    return {k: v for k, v in groups.items() if v > 0}


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


# ── the reference ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Reference:
    """CPU µs per record of each step, in one thread on the pool's requests."""

    parse_us: float
    flatten_us: float
    drain3_us: float
    #: the project's ``TenantMiner.mine`` on the same bodies (information only)
    miner_us: float
    #: parse + flatten by the native decoder (``otlp.decode_flat``; NaN without it)
    native_us: float = math.nan

    @property
    def total_us(self) -> float:
        return self.parse_us + self.flatten_us + self.drain3_us

    def row(self) -> dict[str, float]:
        return {
            "parse_us": round(self.parse_us, 3),
            "flatten_us": round(self.flatten_us, 3),
            "drain3_us": round(self.drain3_us, 3),
            "reference_us": round(self.total_us, 3),
            "project_miner_us": round(self.miner_us, 3),
            "native_decode_flatten_us": round(self.native_us, 3),
            "native_speedup": round((self.parse_us + self.flatten_us) / self.native_us, 2),
        }


def measure_reference(pool: RequestPool, passes: int) -> Reference:
    """Parse + flatten + drain3 of every request in `pool`, `passes` times after a
    warm-up pass (the miners learn the templates, as the server's have by the time it
    is measured); the median pass of each step, per record."""
    from drain3.drain import Drain

    from app.ingest.mining.miner_config import MinerConfig
    from app.ingest.mining.template_ids import CountingAllocator
    from app.ingest.mining.tenant_miner import TenantMiner
    from app.ingest.mining.tokens import PARAM
    from app.receive import native
    from app.receive.otlp import PROTOBUF_CONTENT_TYPE, decode_flat, decode_request, flatten

    config = MinerConfig()

    def drain() -> Any:
        return Drain(
            depth=config.depth,
            sim_th=config.sim_th,
            max_children=config.max_children,
            max_clusters=config.max_clusters,
            extra_delimiters=config.extra_delimiters,
            profiler=None,  # as the server configures it (the default profiler costs a third)
            param_str=PARAM,
            parametrize_numeric_tokens=config.parametrize_numeric_tokens,
        )

    drains = {t: drain() for t in set(pool.tenants)}
    allocator = CountingAllocator()
    miners = {t: TenantMiner(allocator, config) for t in set(pool.tenants)}
    records = sum(pool.records)
    laps: dict[str, list[float]] = {
        "parse": [], "flatten": [], "drain3": [], "miner": [], "native": []
    }  # fmt: skip
    has_native = native.select("native")[0] == "native"
    clock = time.thread_time
    for lap in range(passes + 1):
        t0 = clock()
        requests = [decode_request(b, PROTOBUF_CONTENT_TYPE) for b in pool.bodies]
        t1 = clock()
        flats = [flatten(r, t) for r, t in zip(requests, pool.tenants, strict=True)]
        t2 = clock()
        for flat in flats:
            add = drains[flat.tenant].add_log_message
            for body in flat.bodies:
                add(body)
        t3 = clock()
        for flat in flats:
            miners[flat.tenant].mine(flat.bodies)
        t4 = clock()
        natives = (
            [decode_flat(b, t) for b, t in zip(pool.bodies, pool.tenants, strict=True)]
            if has_native
            else flats
        )
        t5 = clock()
        assert natives == flats, "the native decoder's batches differ from the reference's"
        if lap:  # the first pass warms the miners
            for key, spent in (("parse", t1 - t0), ("flatten", t2 - t1),
                               ("drain3", t3 - t2), ("miner", t4 - t3),
                               ("native", t5 - t4)):  # fmt: skip
                laps[key].append(spent / records * 1e6)
    median = {key: statistics.median(values) for key, values in laps.items()}
    return Reference(
        median["parse"],
        median["flatten"],
        median["drain3"],
        median["miner"],
        median["native"] if has_native else math.nan,
    )


# ── phases ──────────────────────────────────────────────────────────────────────────


class CpuWindow:
    """The generator's window marks (``loadgen.WindowMark``): CPU seconds of each
    server process and of the whole machine at the window's start and end."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.samples: dict[str, tuple[float, dict[str, float], float]] = {}
        #: the core's threads' CPU at each mark (named after the window: a dump then
        #: would stall the generator's loop at the mark)
        self.core_threads: dict[str, dict[int, float]] = {}

    def __call__(self, what: str) -> None:
        cpu = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        if "core" in self.pids:
            self.core_threads[what] = thread_cpu_seconds(self.pids["core"])
        self.samples[what] = (time.perf_counter(), cpu, system_busy_seconds())

    def core_thread_groups(self) -> dict[str, float]:
        """CPU seconds of the core's threads in the window, by ``thread_groups``."""
        if "start" not in self.core_threads or "end" not in self.core_threads:
            return {}
        total = self.used().get("core", math.nan)
        names = thread_names(self.pids["core"])
        return thread_groups(self.core_threads["start"], self.core_threads["end"], names, total)

    @property
    def wall_s(self) -> float:
        if "start" not in self.samples or "end" not in self.samples:
            return math.nan
        return self.samples["end"][0] - self.samples["start"][0]

    def used(self) -> dict[str, float]:
        """CPU seconds each process used in the window."""
        if "start" not in self.samples or "end" not in self.samples:
            return {name: math.nan for name in self.pids}
        start, end = self.samples["start"][1], self.samples["end"][1]
        return {name: end[name] - start[name] for name in self.pids}

    def machine_busy_s(self) -> float:
        if "start" not in self.samples or "end" not in self.samples:
            return math.nan
        return self.samples["end"][2] - self.samples["start"][2]


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured run against one server. `cpu_s`: CPU seconds each server process
    used in the measured window (``core``, ``worker0``, …); `other_cores`: what every
    process other than the server and this generator used meanwhile, per wall second
    (the machine is shared)."""

    name: str
    workers: int
    result: LoadResult
    cpu_s: Mapping[str, float]
    window_s: float
    other_cores: float
    generator_cores: float
    #: CPU seconds of the core's threads in the window, by name (``CpuWindow``)
    core_threads: Mapping[str, float] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return self.result.records_acked

    def us_per_record(self, names: Sequence[str] | None = None) -> float:
        """CPU µs per acknowledged record of the named processes (all by default)."""
        if not self.records:
            return math.nan
        picked = self.cpu_s if names is None else {n: self.cpu_s[n] for n in names}
        return sum(picked.values()) / self.records * 1e6

    @property
    def server_us(self) -> float:
        return self.us_per_record()

    @property
    def core_us(self) -> float:
        return self.us_per_record(["core"])

    @property
    def workers_us(self) -> float:
        names = [n for n in self.cpu_s if n != "core"]
        return self.us_per_record(names) if names else 0.0

    def cores(self, names: Sequence[str] | None = None) -> float:
        picked = self.cpu_s if names is None else {n: self.cpu_s[n] for n in names}
        return sum(picked.values()) / self.window_s if self.window_s > 0 else math.nan

    def row(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "workers": self.workers,
            **self.result.summary(),
            "server_us_per_record": _round(self.server_us),
            "core_us_per_record": _round(self.core_us),
            "workers_us_per_record": _round(self.workers_us),
            "cpu_s": {k: round(v, 3) for k, v in self.cpu_s.items()},
            "window_s": round(self.window_s, 3),
            "server_cores": _round(self.cores()),
            "core_cores": _round(self.cores(["core"])),
            "generator_cores_in_window": _round(self.generator_cores),
            "other_cores": _round(self.other_cores),
            "core_threads_us_per_record": self.core_threads_us(),
        }

    def core_threads_us(self) -> dict[str, float | None]:
        """The core's CPU µs per record by thread name, largest first."""
        if not self.records:
            return {}
        ranked = sorted(self.core_threads.items(), key=lambda kv: -kv[1])
        return {k: _round(v / self.records * 1e6, 2) for k, v in ranked}


def _round(value: float, digits: int = 3) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def measure(
    name: str, workers: int, pids: Mapping[str, int], config: LoadConfig, pool: RequestPool
) -> Phase:
    print(f"  {name} …", flush=True)
    window = CpuWindow(pids)
    gen_cpu: dict[str, float] = {}

    def mark(what: str) -> None:
        window(what)
        gen_cpu[what] = time.process_time()

    result = run(config, pool, mark)
    wall = window.wall_s
    used = window.used()
    gen = gen_cpu.get("end", math.nan) - gen_cpu.get("start", math.nan)
    other = max(0.0, window.machine_busy_s() - sum(used.values()) - gen)
    return Phase(
        name, workers, result, used, wall, other / wall, gen / wall, window.core_thread_groups()
    )


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


def print_table(phases: Sequence[Phase], ref: Reference | None) -> None:
    header = (
        f"{'phase':<44} {'records/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'srv µs/rec':>10} "
        f"{'core µs':>7} {'wkrs µs':>7} {'× ref':>6} {'srv cores':>9} {'core':>5} "
        f"{'gen':>5} {'other':>5}  statuses"
    )
    print(header)
    print("─" * len(header))
    for p in phases:
        r = p.result
        statuses = " ".join(f"{k}×{v}" for k, v in sorted(r.statuses.items()))
        if r.late:
            statuses += f" (late {r.late})"
        ratio = p.server_us / ref.total_us if ref is not None else math.nan
        p50 = r.percentile(50, acked_only=True) * 1000
        p99 = r.percentile(99, acked_only=True) * 1000
        print(
            f"{p.name:<44} {r.records_per_s:>9,.0f} {_ms(p50):>7} {_ms(p99):>7} "
            f"{p.server_us:>10.2f} {p.core_us:>7.2f} {p.workers_us:>7.2f} {ratio:>6.2f} "
            f"{p.cores():>9.2f} {p.cores(['core']):>5.2f} {p.generator_cores:>5.2f} "
            f"{p.other_cores:>5.2f}  {statuses}"
        )
    for p in phases:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p.core_threads_us().items() if v)
        if parts:
            print(f"  core µs/rec by thread, {p.name}: {parts}")


@dataclass(frozen=True, slots=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: not measured

    @property
    def word(self) -> str:
        return "not measured" if self.met is None else "met" if self.met else "NOT met"


def verdicts(
    http: Phase | None, half: Phase | None, grpc: Phase | None, ref: Reference | None
) -> list[Verdict]:
    out = []
    target = f"≥ {TARGET_RECORDS_PER_S:,} records/s acknowledged (HTTP)"
    if http is not None:
        rps = http.result.records_per_s
        out.append(Verdict(target, f"{rps:,.0f} records/s", rps >= TARGET_RECORDS_PER_S))
    else:
        out.append(Verdict(target, "—", None))
    target = f"gRPC ≥ {TARGET_GRPC_RATIO}× HTTP records/s"
    if grpc is not None and http is not None and http.result.records_per_s > 0:
        ratio = grpc.result.records_per_s / http.result.records_per_s
        out.append(
            Verdict(
                target,
                f"{ratio:.2f}× ({grpc.result.records_per_s:,.0f} records/s)",
                ratio >= TARGET_GRPC_RATIO,
            )
        )
    else:
        out.append(Verdict(target, "—", None))
    target = f"server CPU per record ≤ {TARGET_CPU_RATIO}× the reference"
    if http is not None and ref is not None and http.records:
        ratio = http.server_us / ref.total_us
        out.append(
            Verdict(
                target,
                f"{ratio:.2f}× ({http.server_us:.2f} µs vs {ref.total_us:.2f} µs)",
                ratio <= TARGET_CPU_RATIO,
            )
        )
    else:
        out.append(Verdict(target, "—", None))
    target = f"core process ≤ {TARGET_CORE_US:g} µs CPU per record"
    if http is not None and http.records:
        ceiling = 1e6 / http.core_us if http.core_us > 0 else math.inf
        out.append(
            Verdict(
                target,
                f"{http.core_us:.2f} µs (a pod's ceiling ≈ {ceiling:,.0f} records/s)",
                http.core_us <= TARGET_CORE_US,
            )
        )
    else:
        out.append(Verdict(target, "—", None))
    target = f"p99 ≤ {TARGET_HALF_RATE_P99_MS:.0f} ms at half the maximum rate"
    if half is not None and half.result.ack_latencies_s:
        # Over acknowledged requests only: a fast 503 must not pass a latency target.
        p99 = half.result.percentile(99, acked_only=True) * 1000
        refused = half.result.requests - half.result.acked
        note = f", {refused} not acknowledged" if refused else ""
        out.append(
            Verdict(
                target,
                f"{p99:.1f} ms at {half.result.target_rate:.0f} req/s{note}",
                p99 <= TARGET_HALF_RATE_P99_MS and not refused,
            )
        )
    else:
        out.append(Verdict(target, "—", None))
    return out


def native_verdicts(ref: Reference) -> list[Verdict]:
    upb = ref.parse_us + ref.flatten_us
    if math.isnan(ref.native_us):
        return [Verdict("native decode + flatten", "the extension is not importable", None)]
    speedup = upb / ref.native_us
    return [
        Verdict(
            f"native decode + flatten ≤ {TARGET_NATIVE_US} µs/record",
            f"{ref.native_us:.2f} µs",
            ref.native_us <= TARGET_NATIVE_US,
        ),
        Verdict(
            f"≥ {TARGET_NATIVE_SPEEDUP:g}× faster than the upb walk",
            f"{speedup:.1f}× ({upb:.2f} µs vs {ref.native_us:.2f} µs)",
            speedup >= TARGET_NATIVE_SPEEDUP,
        ),
    ]


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


@dataclass
class ServerRun:
    """The three phases against one ``server.workers`` setting."""

    workers: int
    label: str
    http: Phase | None = None
    half: Phase | None = None
    grpc: Phase | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def phases(self) -> list[Phase]:
        return [p for p in (self.http, self.half, self.grpc) if p is not None]


def serve_and_measure(
    stack: contextlib.ExitStack,
    workers_setting: str,
    base: LoadConfig,
    pool: RequestPool,
    root: Path,
    decoder: str = "native",
) -> ServerRun:
    data_dir = Path(tempfile.mkdtemp(prefix=f"w{workers_setting}-", dir=root))
    env = ourios_env(data_dir)
    env["OURIOS_SERVER_DECODER"] = decoder
    if workers_setting != "default":
        env["OURIOS_SERVER_WORKERS"] = workers_setting
    else:
        env.pop("OURIOS_SERVER_WORKERS", None)
    ourios = ServerProcess(
        f"ourios-workers-{workers_setting}",
        [sys.executable, "-m", "app.cli", "serve"],
        env,
        lambda doc: doc.get("event") == "server.listening",
        announce_on="stderr",
    )
    with started(stack, ourios):
        announced = ourios.announcement
        worker_pids = [int(p) for p in announced.get("workers", [])]
        count = len(worker_pids)
        label = f"workers={count}" + (" (default)" if workers_setting == "default" else "")
        label += f", {decoder}"
        out = ServerRun(count, label)
        pids = {"core": ourios.pid, **{f"worker{i}": pid for i, pid in enumerate(worker_pids)}}
        http_port = int(announced["http_port"])
        grpc_port = int(announced["grpc_port"])
        wait_ready(f"http://127.0.0.1:{http_port}/readyz")
        http_cfg = replace(base, port=http_port)
        out.http = measure(f"{label}: HTTP closed", count, pids, http_cfg, pool)
        acked_rps = out.http.result.acked / out.http.result.elapsed_s / 2
        if acked_rps > 0:
            out.half = measure(
                f"{label}: HTTP open @ {acked_rps:.0f} req/s",
                count,
                pids,
                replace(http_cfg, rate=acked_rps),
                pool,
            )
        else:
            out.notes.append("open loop skipped: the closed loop acknowledged nothing")
        grpc_cfg = replace(base, transport="grpc", port=grpc_port)
        out.grpc = measure(f"{label}: gRPC closed", count, pids, grpc_cfg, pool)
        used = [e.get("decoder") for e in ourios.decoder_events]
        if len(used) != 1 + count or any(d != decoder for d in used):
            raise RuntimeError(f"{label}: the core and workers chose the decoders {used}")
        restarts = ourios.events.get("worker.exited", 0)
        if restarts:
            out.notes.append(f"{restarts} worker(s) exited during the run: CPU figures undercount")
        problems = ourios.problems
        if problems:
            out.notes.append(f"warnings/errors: {dict(problems)}")
    out.notes.append(f"data dir: {_dir_bytes(data_dir) / 2**20:,.0f} MiB written")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="End-to-end OTLP ingest benchmark (issue 14)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument(
        "--workers",
        default="default,0",
        help="server.workers settings to run, comma-separated ('default': derived from the CPUs)",
    )
    parser.add_argument(
        "--decoders",
        default="native",
        help="server.decoder settings to run each workers setting with (native, upb)",
    )
    parser.add_argument("--pool", type=int, default=320, help="distinct pre-built requests")
    parser.add_argument("--reference-passes", type=int, default=3)
    parser.add_argument("--token", default=None, help="Authorization: Bearer TOKEN")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep-data", action="store_true", help="keep ourios's data dirs")
    args = parser.parse_args(argv)
    settings = [w.strip() for w in args.workers.split(",") if w.strip()]
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    for d in decoders:
        if d not in ("native", "upb"):
            parser.error(f"--decoders: {d!r} is neither 'native' nor 'upb'")
    for w in settings:
        if w != "default" and not w.isdigit():
            parser.error(f"--workers: {w!r} is neither 'default' nor a number")

    # A background job of a non-interactive shell starts with SIGINT ignored, which
    # would also make SIGTERM (re-raised as SIGINT) a no-op; this run must stay
    # stoppable, and it stops its own children on the way out.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _as_interrupt)
    tenants = [f"bench-{i:02d}" for i in range(TENANTS)]
    print(
        f"ingest benchmark: {args.seconds:g}s per phase after {args.warmup:g}s warm-up, "
        f"{CONNECTIONS} connections, {RECORDS_PER_REQUEST} records/request, "
        f"{ATTRIBUTES} attributes/record, {TENANTS} tenants, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    t = time.perf_counter()
    pool = build_pool(
        args.pool, RECORDS_PER_REQUEST, tenants, seed=args.seed, attributes=ATTRIBUTES
    )
    print(
        f"  request pool: {len(pool)} requests, mean {pool.mean_body_bytes / 1024:.1f} KiB, "
        f"built in {time.perf_counter() - t:.1f}s",
        flush=True,
    )
    ref = measure_reference(pool, args.reference_passes)
    print(
        f"  reference (one thread, CPU µs/record): parse {ref.parse_us:.2f} + flatten "
        f"{ref.flatten_us:.2f} + drain3 {ref.drain3_us:.2f} = {ref.total_us:.2f} "
        f"(the project's miner: {ref.miner_us:.2f})",
        flush=True,
    )
    print(
        f"  decode + flatten (one thread, CPU µs/record): upb {ref.parse_us + ref.flatten_us:.2f}, "
        f"native {ref.native_us:.2f}",
        flush=True,
    )
    base = LoadConfig(
        connections=CONNECTIONS,
        duration_s=args.seconds,
        warmup_s=args.warmup,
        token=args.token,
    )
    runs: list[ServerRun] = []
    root = Path(tempfile.mkdtemp(prefix="ourios-bench-"))
    error: str | None = None
    with contextlib.ExitStack() as stack:
        if not args.keep_data:
            stack.callback(shutil.rmtree, root, True)
        try:
            for setting in settings:
                for decoder in decoders:
                    runs.append(serve_and_measure(stack, setting, base, pool, root, decoder))
        except KeyboardInterrupt:
            error = "interrupted"
            print("\ninterrupted: stopping the servers", flush=True)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            error = str(exc)
            print(f"\nfailed: {exc}", flush=True)

    print()
    phases = [p for r in runs for p in r.phases]
    if phases:
        print_table(phases, ref)
        print()
    print(
        f"reference: parse {ref.parse_us:.2f} + flatten {ref.flatten_us:.2f} + drain3 "
        f"{ref.drain3_us:.2f} = {ref.total_us:.2f} µs CPU per record "
        f"(the project's miner instead of drain3's add_log_message: {ref.miner_us:.2f})"
    )
    for r in runs:
        for note in r.notes:
            print(f"  {r.label}: {note}")
    print()
    results: list[Verdict] = native_verdicts(ref)
    print("targets, decode + flatten (issue 23, the reference's passes):")
    for v in results:
        print(f"  {v.target:<48}  {v.measured:<48}  {v.word}")
    for r in runs:
        print(f"targets, {r.label}:")
        found = verdicts(r.http, r.half, r.grpc, ref)
        width = max(len(v.target) for v in found)
        for v in found:
            print(f"  {v.target:<{width}}  {v.measured:<48}  {v.word}")
        if r is runs[0]:
            results = found + results
    print(
        "\nµs/rec: CPU (user+system, /proc) per acknowledged record in the measured window: "
        "srv = core + workers; × ref = srv / reference. cores: CPU per wall second of the "
        "server, its core process, this generator (gen) and every other process (other), "
        f"of the machine's {os.cpu_count()}; a busy 'other' means the rates are low"
    )
    if args.json is not None:
        doc = {
            "load": {
                "tenants": TENANTS,
                "records_per_request": RECORDS_PER_REQUEST,
                "attributes": ATTRIBUTES,
                "connections": CONNECTIONS,
                "pool": len(pool),
            },
            "reference": ref.row(),
            "runs": [
                {"label": r.label, "workers": r.workers, "phases": [p.row() for p in r.phases],
                 "notes": r.notes}
                for r in runs
            ],
            "verdicts": [{"target": v.target, "measured": v.measured, "met": v.met}
                         for v in results],
            "error": error,
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 130 if error == "interrupted" else (1 if error else 0)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


if __name__ == "__main__":
    sys.exit(main())

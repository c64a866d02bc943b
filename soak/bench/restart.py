"""Restart cost against total history, reclamation on and off (the segment-set seed
§9.1, "the measurement that matters"; DESIGN.md §11).

The claim: with reclamation on, what a restart reads is the *retained* WAL, not the
history ever written, so restart time stays flat as history grows 100×. The control
(reclamation off, everything else the same) must show the growth, or the benchmark
could not tell a regression from a pass.

The churn fixture, built in-process on the real assembly (``app.node.server.build_node``:
OsFs journal, pipeline, miners, local ``file://`` store, snapshot store) with the
timers not started, so this process drives them:

* 4 tenants, seeded OTLP/protobuf requests of ``--records-per-request`` records
  (≈ 32 KiB frames), posted through ``Pipeline.ingest`` from ``--threads`` threads
  (group commit, as concurrent receivers would), with ``OURIOS_WAL_SEGMENT_MAX_BYTES``
  fixed (1 MiB). The same few templates recur, so the miners' state stays small while
  the log grows: the O(history) term is isolated from the O(state) term.
* After every ``--retained-mib`` of appends: one housekeeping pass (reclamation on
  only), then a cut (the pending rotation cut, then a fresh timer cut): snapshots are
  installed and the checkpoint advances. The pass reclaims below the *previous* cut,
  so with reclamation on the WAL holds about one retained window — the working set
  ``--retained-mib`` — at every size of history.
* The last window ends with a cut (snapshots current in every row), then
  ``--apply-records`` records are written above it and the node is abandoned
  (publisher and journal closed, no final cut): every row replays the same tail.
* Reclamation off: the same history and the same cuts, and housekeeping never runs.

Then ``ourios serve`` starts on a copy of that data directory (``--repeats`` times,
median), timers effectively off (barrier and housekeeping every 86,400 s):

* restart seconds: from just before the process is spawned to ``/readyz`` 200;
* recovery seconds and frames walked / skipped / applied: ``recovery.done`` on stderr;
* WAL bytes at start: the sum of the ``*.wal`` segment sizes;
* bytes read: ``rchar`` of ``/proc/<pid>/io`` at readiness (every ``read`` the
  process made, page cache included — the files were just written, so
  ``read_bytes``, the storage reads, is near zero and printed only for completeness).
  The reference: the same server started on an empty data directory, in the same run
  (imports, configuration, listeners — everything that is not recovery), after one
  unmeasured warm-up start.

Check (printed, never asserted): with reclamation on, the restart at the largest
history must be within 1.25× of the restart at 1×; the control must grow by more than
that. The recovery-seconds ratio, which excludes the fixed start-up cost, is printed
beside it.

Run: ``.venv/bin/python soak/bench/restart.py [--history-mib 8] [--multiples 1,10,100]
[--retained-mib 8] [--repeats 5] [--quick]``. The full run writes 2 × 888 MiB of
history through the pipeline and takes minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
)

from app.base.config import load_settings  # noqa: E402
from app.base.events import EventLog  # noqa: E402
from app.node.recovery import recover  # noqa: E402
from app.node.server import Node, build_node  # noqa: E402
from app.receive.otlp import decode_request, flatten  # noqa: E402
from soak.bench.ingest import (  # noqa: E402
    ServerProcess,
    _as_interrupt,
    ourios_env,
    proc_cpu_seconds,
    started,
    wait_ready,
)

MiB: Final = 1 << 20
SEGMENT_BYTES: Final = 1 * MiB
TENANTS: Final = ("churn-a", "churn-b", "churn-c", "churn-d")
#: the timers of the served process: longer than any measurement, so nothing but
#: recovery touches the directory before /readyz
TIMER_OFF_SECS: Final = 86_400
FLAT_BOUND: Final = 1.25
PROTOBUF: Final = "application/x-protobuf"


# ── the fixture ─────────────────────────────────────────────────────────────────────


def bench_env(data_dir: Path) -> dict[str, str]:
    """What both the in-process build and the served process run with."""
    env = ourios_env(data_dir)
    env.update(
        OURIOS_SERVER_NODE_ID="restart-bench-0",
        OURIOS_WAL_SEGMENT_MAX_BYTES=str(SEGMENT_BYTES),
        OURIOS_WAL_BARRIER_SECS=str(TIMER_OFF_SECS),
        OURIOS_WAL_HOUSEKEEPING_SECS=str(TIMER_OFF_SECS),
        OURIOS_WAL_SEGMENT_AGE_SECS=str(TIMER_OFF_SECS),
    )
    return env


def request_pool(seed: int, count: int, records: int, body_bytes: int) -> list[bytes]:
    """`count` distinct serialised requests: the same handful of templates with seeded
    parameters (ids, paths, durations) and a padding field, so mining stays cheap and
    the template set stays fixed however much is written."""
    rng = random.Random(seed)
    verbs = ("GET", "PUT", "POST", "DELETE")
    out: list[bytes] = []
    for k in range(count):
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", "churn"
        sl = rl.scope_logs.add()
        sl.scope.name = "restart-bench"
        for i in range(records):
            rec = sl.log_records.add()
            rec.time_unix_nano = 1_764_000_000_000_000_000 + k * 1_000_000 + i
            rec.severity_number = 9
            head = (
                f"{rng.choice(verbs)} /api/v1/items/{rng.randrange(10_000)} from "
                f"user{rng.randrange(500)} status 200 took {rng.randrange(1, 900)} ms pad "
            )
            rec.body.string_value = head + "x" * max(0, body_bytes - len(head))
            a = rec.attributes.add()
            a.key, a.value.string_value = "request.id", f"{k:06d}-{i:03d}"
        out.append(req.SerializeToString())
    return out


@dataclass(frozen=True, slots=True)
class Fixture:
    reclaim: bool
    history_bytes: int  # the journal's end LSN: every byte ever appended
    wal_bytes: int  # *.wal bytes on disk when the server starts
    segments: int
    requests: int
    cuts: int
    removed_segments: int
    build_s: float


class Churn:
    """Writes the fixture through one node; closes it without a final cut."""

    def __init__(
        self,
        env: dict[str, str],
        pool: Sequence[bytes],
        threads: int,
        tenants: Sequence[str] = TENANTS,
    ) -> None:
        self._pool = pool
        self._tenants = tenants
        self._threads = threads
        self._events = open(os.devnull, "w")  # the build's events: closed in close()
        # No cut runs and no spiller (the served node has one): the rows written stay in
        # the buffers, so their bound is lifted for the build, or the turn would wait for
        # room once sink.ceiling_bytes of them are held (DESIGN.md §5.12) and never get it.
        env = {**env, "OURIOS_SINK_CEILING_BYTES": str(64 << 30)}
        self.node: Node = build_node(load_settings(env), EventLog(self._events))
        self.node.pipeline.publisher.start()
        recover(self.node.journal, self.node.pipeline, self.node.snapshots, self.node.ledger)
        self.node.pipeline.set_ready(True)
        self.requests = 0
        self.cuts = 0
        self.removed = 0

    def _one(self, k: int) -> None:
        payload = self._pool[k % len(self._pool)]
        tenant = self._tenants[k % len(self._tenants)]
        batch = flatten(decode_request(payload, PROTOBUF), tenant)
        self.node.pipeline.ingest(tenant, payload, batch, "bench")

    def write(self, ex: ThreadPoolExecutor, requests: int) -> None:
        list(ex.map(self._one, range(self.requests, self.requests + requests)))
        self.requests += requests

    def cut(self) -> None:
        """Run the pending rotation cut, if any, then a fresh one: the checkpoint and
        every tenant's snapshot end at the last acknowledged turn."""
        barrier = self.node.barrier
        barrier.step(timer=False)
        outcome = barrier.step(timer=True)
        if outcome is None or not outcome.ok or not outcome.checkpointed:
            raise RuntimeError(f"fixture cut did not checkpoint: {outcome}")
        self.cuts += 1

    def reclaim(self) -> None:
        progress = self.node.housekeeper.step()
        if progress is None:
            raise RuntimeError(f"housekeeping pass failed: {dict(self.node.housekeeper.runs)}")
        self.removed += progress.removed_segments

    def close(self) -> None:
        self.node.pipeline.publisher.close()
        self.node.journal.close()
        if self.node.lock is not None:
            self.node.lock.release()
        self._events.close()


def build_fixture(
    data_dir: Path,
    env: dict[str, str],
    pool: Sequence[bytes],
    *,
    history: int,
    retained: int,
    tail_requests: int,
    reclaim: bool,
    threads: int,
) -> Fixture:
    t0 = time.perf_counter()
    churn = Churn(env, pool, threads)
    journal = churn.node.journal
    frame = statistics.mean(len(p) for p in pool)
    window = max(1, math.ceil(retained / frame))
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="churn") as ex:
            while journal.end_lsn < history:
                churn.write(ex, min(window, max(1, math.ceil((history - journal.end_lsn) / frame))))
                if reclaim:
                    churn.reclaim()  # below the previous cut: one window stays
                churn.cut()
            churn.write(ex, tail_requests)  # above the last cut: replayed in every row
        end = journal.end_lsn
    finally:
        churn.close()
    segs = sorted((data_dir / "wal").glob("*.wal"))
    return Fixture(
        reclaim,
        end,
        sum(s.stat().st_size for s in segs),
        len(segs),
        churn.requests,
        churn.cuts,
        churn.removed,
        time.perf_counter() - t0,
    )


# ── the restart ─────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Restart:
    restart_s: float
    recovery_s: float
    frames: int
    frames_skipped: int
    records_replayed: int
    rchar: int
    read_bytes: int
    #: CPU seconds (user + system) from the spawn to ``recovery.done``, start-up included:
    #: the core process and its workers
    core_cpu_s: float = math.nan
    workers_cpu_s: float = math.nan


def proc_io(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}


#: How long a replay may take after readiness (the node is ready before it ends).
REPLAY_TIMEOUT_S: Final = 900.0


def restart_once(
    stack: contextlib.ExitStack, data_dir: Path, name: str, decoder: str | None = None
) -> Restart:
    env = bench_env(data_dir)
    if decoder is not None:
        env["OURIOS_SERVER_DECODER"] = decoder
    server = ServerProcess(
        name,
        [sys.executable, "-m", "app.cli", "serve"],
        env,
        lambda doc: doc.get("event") == "server.listening",
        announce_on="stderr",
    )
    t0 = time.perf_counter()
    with started(stack, server):
        wait_ready(f"http://127.0.0.1:{int(server.announcement['http_port'])}/readyz")
        elapsed = time.perf_counter() - t0
        counters = proc_io(server.pid)
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        while (done := server.first_event("recovery.done")) is None:
            if time.monotonic() > deadline or server.first_event("recovery.failed"):
                break
            time.sleep(0.01)  # polling the child's event stream: an external condition
        workers = [int(p) for p in server.announcement.get("workers", [])]
        core_cpu = proc_cpu_seconds(server.pid)
        workers_cpu = sum(proc_cpu_seconds(p) for p in workers)
        used = {e.get("decoder") for e in server.decoder_events}
        if decoder is not None and used != {decoder}:
            raise RuntimeError(f"{name}: asked for the {decoder} decoder, got {used}")
    if done is None:
        raise RuntimeError(f"{name}: no recovery.done line in\n{server.output_tail()}")
    return Restart(
        elapsed,
        float(done["seconds"]),
        int(done["frames"]),
        int(done["frames_skipped"]),
        int(done["records_replayed"]),
        counters.get("rchar", -1),
        counters.get("read_bytes", -1),
        core_cpu,
        workers_cpu,
    )


def restart_median(
    stack: contextlib.ExitStack,
    built: Path,
    scratch: Path,
    name: str,
    repeats: int,
    decoder: str | None = None,
) -> Restart:
    """`repeats` restarts, each on a fresh copy (a restart writes post-recovery
    snapshots, so a second one on the same directory would skip the tail)."""
    runs = []
    for r in range(repeats):
        copy = scratch / f"{name}-{r}"
        if built.exists():
            shutil.copytree(built, copy, symlinks=True)
        else:
            copy.mkdir()
        try:
            runs.append(restart_once(stack, copy, name, decoder))
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    runs.sort(key=lambda x: x.restart_s)
    return runs[len(runs) // 2]


# ── replay ──────────────────────────────────────────────────────────────────────────

#: issue 14: records replayed ÷ recovery seconds
TARGET_REPLAY_RECORDS_PER_S: Final = 100_000


def replay_row(
    stack: contextlib.ExitStack,
    base: Path,
    records: int,
    repeats: int,
    threads: int,
    decoders: Sequence[str] = ("native",),
) -> tuple[int, dict[str, Restart]]:
    """The replay figure: ``records`` records of the ingest benchmark's shape (100-record
    requests, 32 tenants, four attributes a record) written with no cut at all, so a
    restart replays every one of them (decoded on the workers, mined in the core), once
    per decoder (``server.decoder``) on copies of the same data directory; returns
    (records written, the median restart by decoder)."""
    from soak.bench.loadgen import build_pool

    tenants = [f"bench-{i:02d}" for i in range(32)]
    pool = build_pool(64, 100, tenants, seed=1, attributes=4)
    built = base / "replay"
    churn = Churn(bench_env(built), pool.bodies, threads, pool.tenants)
    requests = math.ceil(records / 100)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="churn") as ex:
            churn.write(ex, requests)
    finally:
        churn.close()
    results = {d: restart_median(stack, built, base, f"replay-{d}", repeats, d) for d in decoders}
    shutil.rmtree(built, ignore_errors=True)
    return requests * 100, results


def print_replay(written: int, results: Mapping[str, Restart], start: Restart | None) -> None:
    for decoder, r in results.items():
        rate = r.records_replayed / r.recovery_s if r.recovery_s > 0 else math.nan
        met = rate >= TARGET_REPLAY_RECORDS_PER_S
        print(
            f"replay ({decoder}): {r.records_replayed:,} of {written:,} records replayed in "
            f"{r.recovery_s:.3f} s of recovery ({r.frames:,} frames) → {rate:,.0f} records/s "
            f"(target ≥ {TARGET_REPLAY_RECORDS_PER_S:,}) {'met' if met else 'NOT met'}"
        )
        if r.records_replayed and not math.isnan(r.core_cpu_s):
            base_core = start.core_cpu_s if start is not None else 0.0
            base_workers = start.workers_cpu_s if start is not None else 0.0
            per = 1e6 / r.records_replayed
            print(
                f"  CPU to recovery.done: core {r.core_cpu_s:.2f} s, workers "
                f"{r.workers_cpu_s:.2f} s; less an empty start's ({base_core:.2f} s, "
                f"{base_workers:.2f} s): core {(r.core_cpu_s - base_core) * per:.2f} µs and "
                f"workers {(r.workers_cpu_s - base_workers) * per:.2f} µs per record"
            )


# ── report ──────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Row:
    multiple: int
    fixture: Fixture
    restart: Restart

    @property
    def mode(self) -> str:
        return "on" if self.fixture.reclaim else "off"


def print_table(rows: Sequence[Row], baseline: Restart) -> None:
    header = (
        f"{'reclaim':>7} {'history':>9} {'×':>4} {'WAL MiB':>8} {'segs':>5} {'frames':>7} "
        f"{'applied':>7} {'restart s':>9} {'recov s':>8} {'MB/s':>7} {'rchar MiB':>9} "
        f"{'vs empty':>8}"
    )
    print(header)
    print("─" * len(header))
    for r in rows:
        f, s = r.fixture, r.restart
        rate = f.wal_bytes / s.recovery_s / 1e6 if s.recovery_s > 0 else math.nan
        print(
            f"{r.mode:>7} {f.history_bytes / MiB:>8.0f}M {r.multiple:>4} "
            f"{f.wal_bytes / MiB:>8.1f} {f.segments:>5} {s.frames:>7} "
            f"{s.frames - s.frames_skipped:>7} {s.restart_s:>9.3f} {s.recovery_s:>8.3f} "
            f"{rate:>7.0f} {s.rchar / MiB:>9.1f} {s.restart_s / baseline.restart_s:>7.2f}x"
        )
    print(
        f"{'empty':>7} {'—':>9} {'':>4} {0.0:>8.1f} {0:>5} {baseline.frames:>7} {0:>7} "
        f"{baseline.restart_s:>9.3f} {baseline.recovery_s:>8.3f} {'—':>7} "
        f"{baseline.rchar / MiB:>9.1f} {1.0:>7.2f}x"
    )


def verdicts(rows: Sequence[Row]) -> None:
    for mode in ("on", "off"):
        mine = sorted((r for r in rows if r.mode == mode), key=lambda r: r.multiple)
        if len(mine) < 2:
            print(f"reclamation {mode}: fewer than two sizes, no ratio")
            continue
        lo, hi = mine[0], mine[-1]
        restart = hi.restart.restart_s / lo.restart.restart_s
        recovery = (
            hi.restart.recovery_s / lo.restart.recovery_s if lo.restart.recovery_s else math.nan
        )
        wal = hi.fixture.wal_bytes / lo.fixture.wal_bytes
        span = f"{hi.multiple}× vs {lo.multiple}× history"
        if mode == "on":
            met = restart <= FLAT_BOUND
            word = "met" if met else "NOT met"
            print(
                f"reclamation on, {span}: restart {restart:.2f}x (target ≤ {FLAT_BOUND}x) "
                f"{word}; recovery {recovery:.2f}x; WAL at start {wal:.2f}x"
            )
        else:
            grew = recovery > FLAT_BOUND
            word = "shows the growth" if grew else "does NOT show the growth"
            print(
                f"control (off), {span}: restart {restart:.2f}x, recovery {recovery:.2f}x "
                f"(> {FLAT_BOUND}x expected) {word}; WAL at start {wal:.2f}x"
            )
    if rows and max(r.multiple for r in rows) < 100:
        print("note: the target is stated at 100× history; this run stopped below it")


# ── the run ─────────────────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history-mib", type=float, default=8.0, help="history at 1×")
    ap.add_argument("--multiples", default="1,10,100")
    ap.add_argument("--retained-mib", type=float, default=8.0, help="the working set")
    ap.add_argument("--apply-records", type=int, default=1000, help="the tail above the cut")
    ap.add_argument("--records-per-request", type=int, default=32)
    ap.add_argument("--body-bytes", type=int, default=960)
    ap.add_argument("--threads", type=int, default=8, help="ingest threads building")
    ap.add_argument("--repeats", type=int, default=5, help="restarts per row (median)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="where to build (a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--quick", action="store_true", help="2 MiB × 1,10; one restart each")
    ap.add_argument(
        "--replay-records", type=int, default=200_000, help="the replay figure's records"
    )
    ap.add_argument("--replay-only", action="store_true", help="only the replay figure")
    ap.add_argument(
        "--replay-decoders",
        default="native",
        help="server.decoder settings the replay runs with, on the same WAL (native,upb)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.history_mib, args.retained_mib, args.multiples, args.repeats = 2.0, 2.0, "1,10", 1
    multiples = sorted({int(x) for x in args.multiples.split(",") if x})
    if not multiples or multiples[0] < 1:
        ap.error("--multiples: positive integers, e.g. 1,10,100")

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _as_interrupt)

    pool = request_pool(args.seed, 256, args.records_per_request, args.body_bytes)
    frame = statistics.mean(len(p) for p in pool)
    tail_requests = max(1, math.ceil(args.apply_records / args.records_per_request))
    print(
        f"restart benchmark: history {args.history_mib:g} MiB × {','.join(map(str, multiples))}, "
        f"retained window {args.retained_mib:g} MiB, {SEGMENT_BYTES // MiB} MiB segments, "
        f"{frame / 1024:.1f} KiB frames, tail {tail_requests * args.records_per_request} records,"
        f" {args.repeats} restart(s) per row; {os.cpu_count()} CPUs, load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    base = Path(tempfile.mkdtemp(prefix="restart-bench-", dir=args.dir))
    rows: list[Row] = []
    baseline: Restart | None = None
    replay: tuple[int, dict[str, Restart]] | None = None
    warm: Restart | None = None
    error: str | None = None
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        try:
            # unmeasured: the first start pays for cold module and page caches
            warm = restart_median(stack, base / "none", base, "warm-up", 1)
            if args.replay_records > 0:
                decoders = [d for d in args.replay_decoders.split(",") if d]
                replay = replay_row(
                    stack, base, args.replay_records, args.repeats, args.threads, decoders
                )
                print_replay(*replay, warm)
            if args.replay_only:
                multiples = []
            baseline = restart_median(stack, base / "none", base, "empty", args.repeats)
            print(f"  empty data dir: ready in {baseline.restart_s:.3f}s", flush=True)
            for m in multiples:
                for reclaim in (True, False):
                    built = base / f"{'on' if reclaim else 'off'}-{m}"
                    env = bench_env(built)
                    fixture = build_fixture(
                        built,
                        env,
                        pool,
                        history=int(args.history_mib * m * MiB),
                        retained=int(args.retained_mib * MiB),
                        tail_requests=tail_requests,
                        reclaim=reclaim,
                        threads=args.threads,
                    )
                    print(
                        f"  built {'on ' if reclaim else 'off'} {m:>3}×: "
                        f"{fixture.history_bytes / MiB:,.0f} MiB history, "
                        f"{fixture.wal_bytes / MiB:.1f} MiB in {fixture.segments} segments, "
                        f"{fixture.cuts} cuts, {fixture.removed_segments} reclaimed, "
                        f"{fixture.build_s:.1f}s",
                        flush=True,
                    )
                    result = restart_median(stack, built, base, built.name, args.repeats)
                    shutil.rmtree(built, ignore_errors=True)
                    rows.append(Row(m, fixture, result))
                    print(
                        f"  restarted: ready in {result.restart_s:.3f}s, recovery "
                        f"{result.recovery_s:.3f}s over {result.frames} frames",
                        flush=True,
                    )
        except KeyboardInterrupt:
            error = "interrupted"
            print("\ninterrupted: stopping", flush=True)
        except RuntimeError as exc:
            error = str(exc)
            print(f"\nfailed: {exc}", flush=True)
    if replay is not None:
        print()
        print_replay(*replay, warm)
    if baseline is None or not rows:
        if args.replay_only and replay is not None and error is None:
            return 0
        return 130 if error == "interrupted" else 1
    print()
    print_table(rows, baseline)
    print()
    verdicts(rows)
    print(
        "frames: TENANT_BATCH frames recovery walked (CRC-checked); applied: those above "
        "the tenant's snapshot (mined); MB/s: WAL bytes at start / recovery seconds; "
        f"rchar: bytes the server read() by /readyz (read_bytes from storage: "
        f"{max((r.restart.read_bytes for r in rows), default=0) / MiB:.1f} MiB at most); "
        f"load now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.json is not None:
        doc = {
            "rows": [
                {
                    "reclaim": r.mode,
                    "multiple": r.multiple,
                    "history_bytes": r.fixture.history_bytes,
                    "wal_bytes": r.fixture.wal_bytes,
                    "segments": r.fixture.segments,
                    "frames": r.restart.frames,
                    "frames_skipped": r.restart.frames_skipped,
                    "restart_s": r.restart.restart_s,
                    "recovery_s": r.restart.recovery_s,
                    "rchar": r.restart.rchar,
                    "read_bytes": r.restart.read_bytes,
                }
                for r in rows
            ],
            "empty_restart_s": baseline.restart_s,
            "replay": None
            if replay is None
            else {
                decoder: {
                    "records_written": replay[0],
                    "records_replayed": r.records_replayed,
                    "recovery_s": r.recovery_s,
                    "frames": r.frames,
                    "core_cpu_s": r.core_cpu_s,
                    "workers_cpu_s": r.workers_cpu_s,
                }
                for decoder, r in replay[1].items()
            },
            "load": os.getloadavg(),
            "error": error,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 130 if error == "interrupted" else (1 if error else 0)


if __name__ == "__main__":
    sys.exit(main())

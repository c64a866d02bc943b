"""The ingest stall a cut causes: how long ingest turns wait on the barrier exclusion
while a cut is captured, at 10, 1,000 and 10,000 buffered partitions (DESIGN.md §11).

A capture takes the barrier exclusion exclusively (``Barrier.capture``): it drains
every buffered partition into the cut (each detached and registered in flight), reads
the mark, freezes every tenant whose horizon moved, and takes an epoch. Every ingest
turn needs the exclusion shared, so a turn that arrives during the capture — or while
the capture waits for the turns already inside to leave (the lock prefers the writer)
— waits. That wait is the stall.

In-process on ``tests/support/noderig.NodeRig`` (a real journal on plain ``OsFs`` —
the fault seam's op log would grow a heap production never has; the real pipeline,
buffers, miners, barrier and snapshot store; an in-memory object store), with the heap
built by the warm-up frozen out of the cyclic collector as ``ourios serve`` does after
recovery (``app.base.gc_policy.freeze_long_lived_heap``): a full collection holds the GIL, so
one landing in a capture lengthens the hold, and its cost is the tracked heap's size.
Partitions are tenant × UTC day: ``T`` tenants (``--tenants``, at most P) each post
requests whose records are spread over ``D = P / T`` distinct days, so one request per
tenant recreates all P partitions. For each P:

1. warm-up: one pass over the tenants and one cut (the templates exist from then on);
2. reference window (``--seconds``): ``--threads`` ingest threads post continuously
   (decode, flatten, ``Pipeline.ingest``: append, group commit, the turn), no cut;
3. cut window (``--seconds``, and on until ``--min-captures`` captures or
   ``--max-seconds``): the same load, and this thread, which waits until P
   partitions are buffered, captures a cut (``Barrier.capture``), and runs it
   (``Barrier.run_cut``: frozen tenants serialised, snapshots installed, checkpoint).
   By default the cut's batches are settled as published without encoding them: at
   10,000 partitions the Parquet encoding alone takes tens of seconds a cut on a small
   machine, which would leave a handful of captures to measure; it runs outside the
   exclusion and is not the stall. ``--publish`` encodes and writes them for real.

The exclusion is replaced by a timing subclass of the pipeline's own ``ReadWriteLock``
before any traffic, which records, for every turn, the time from asking for the shared
side to getting it, and for every capture, the time to get the exclusive side and the
time it was held. ``CutOwner.cut_stall_seconds`` (what the metrics export: getting plus
holding) is reported beside them.

Printed per P: capture hold, capture acquire, the pipeline's cut stall, the wait of
the turns that met a cut (their wait overlapped a capture's exclusive request or hold),
the wait of every turn in each window, and ingest-call p99 with cuts against the
reference window. Target: the stall at 1,000 partitions p99 ≤ 10 ms — checked on the
turns that met a cut and on the capture hold; printed "met" / "NOT met", never asserted.
``--profile`` adds the top functions of one extra capture per P (what dominates it).

Run: ``.venv/bin/python soak/bench/barrier.py [--partitions 10,1000,10000]
[--seconds 10] [--min-captures 100] [--max-seconds 180] [--threads 4] [--tenants 100]
[--publish] [--profile] [--quick]``. At 10,000 partitions a capture cycle (refill plus
the cut's snapshots) takes about a second here, so the full run takes several minutes.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import gc
import io
import itertools
import math
import os
import pstats
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
)

from app.base.gc_policy import freeze_long_lived_heap  # noqa: E402
from app.ingest.cuts import Cut  # noqa: E402
from app.ingest.pipeline import ReadWriteLock  # noqa: E402
from app.receive.otlp import decode_request, flatten  # noqa: E402
from sink.buffers import NANOS_PER_DAY, PublishOutcome  # noqa: E402
from tests.support.noderig import NodeRig  # noqa: E402
from wal import WalConfig  # noqa: E402

TARGET_PARTITIONS: Final = 1_000
TARGET_P99_MS: Final = 10.0
FIRST_DAY: Final = 20_000  # 2024-10-04: any fixed day; partitions are its successors
PROTOBUF: Final = "application/x-protobuf"
#: large enough that no rotation (and so no rotation-fired cut) happens in a run
SEGMENT_BYTES: Final = 4 << 30


# ── instruments ─────────────────────────────────────────────────────────────────────


class TimedExclusion(ReadWriteLock):
    """The pipeline's reader–writer lock, unchanged, recording when each side was asked
    for, got and (exclusive only) let go. ``list.append`` is atomic under the GIL, so
    the turns record without a lock of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.shared_log: list[tuple[float, float]] = []  # (asked, got)
        self.exclusive_log: list[tuple[float, float, float]] = []  # (asked, got, released)

    @contextmanager
    def shared(self) -> Iterator[None]:
        asked = time.perf_counter()
        with super().shared():
            self.shared_log.append((asked, time.perf_counter()))
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        asked = time.perf_counter()
        with super().exclusive():
            got = time.perf_counter()
            try:
                yield
            finally:
                self.exclusive_log.append((asked, got, time.perf_counter()))


class GcLog:
    """Every cyclic-GC run (start, stop, generation) while installed: a collection
    holds the GIL, so one that lands inside a capture lengthens the hold."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float, int]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.runs.append((self._started, now, info["generation"]))

    def __enter__(self) -> GcLog:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def inside(self, start: float, end: float) -> tuple[float, int]:
        """GC seconds within [start, end], and the oldest generation collected there."""
        seconds, oldest = 0.0, -1
        for a, b, generation in self.runs:
            overlap = min(b, end) - max(a, start)
            if overlap > 0:
                seconds += overlap
                oldest = max(oldest, generation)
        return seconds, oldest


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (exact for the small samples a window of cuts gives)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass(frozen=True, slots=True)
class Dist:
    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Dist:
        if not seconds:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(seconds), pct(seconds, 50) * 1e3, pct(seconds, 99) * 1e3, max(seconds) * 1e3)

    def text(self) -> str:
        return f"{self.p50_ms:8.3f} {self.p99_ms:8.3f} {self.max_ms:8.3f} {self.n:>7}"


# ── load ────────────────────────────────────────────────────────────────────────────


def shape(partitions: int, tenants: int) -> tuple[int, int]:
    """(tenants, days) with tenants × days == partitions."""
    t = max(1, min(tenants, partitions))
    while partitions % t:
        t -= 1
    return t, partitions // t


def payloads(seed: int, tenants: int, days: int, min_records: int) -> list[bytes]:
    """One serialised request per tenant: ``days`` × k records (k ≥ 1, at least
    ``min_records`` in all), record i on day ``FIRST_DAY + i % days``."""
    rng = random.Random(seed)
    n = days * max(1, math.ceil(min_records / days))
    out = []
    for _ in range(tenants):
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", "barrier-bench"
        sl = rl.scope_logs.add()
        for i in range(n):
            rec = sl.log_records.add()
            rec.time_unix_nano = (FIRST_DAY + i % days) * NANOS_PER_DAY + rng.randrange(10**12)
            rec.severity_number = 9
            rec.body.string_value = (
                f"user {rng.randrange(1000)} logged in from 10.0.{rng.randrange(256)}."
                f"{rng.randrange(256)} in {rng.randrange(1, 500)} ms"
            )
        out.append(req.SerializeToString())
    return out


class Load:
    """``threads`` threads posting round-robin over the tenants until stopped; each
    ingest call's latency is kept with its start time."""

    def __init__(self, rig: NodeRig, requests: Sequence[bytes], threads: int) -> None:
        self._rig = rig
        self._requests = requests
        self._tenants = [f"tenant-{i:04d}" for i in range(len(requests))]
        self._next = itertools.count()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"ingest-{i}") for i in range(threads)
        ]
        self.calls: list[tuple[float, float]] = []  # (started, seconds)
        self.errors: list[BaseException] = []

    def sweep(self) -> None:
        """One request per tenant, on this thread (the warm-up)."""
        for k in range(len(self._requests)):
            self._post(k)

    def _post(self, k: int) -> None:
        i = k % len(self._requests)
        payload = self._requests[i]
        tenant = self._tenants[i]
        batch = flatten(decode_request(payload, PROTOBUF), tenant)
        self._rig.pipeline.ingest(tenant, payload, batch, "bench")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                self._post(next(self._next))
                self.calls.append((t0, time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)
            self._stop.set()

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        if self.errors:
            raise RuntimeError(f"an ingest thread failed: {self.errors[0]!r}") from self.errors[0]

    @property
    def failed(self) -> bool:
        return bool(self.errors)


# ── one partition count ─────────────────────────────────────────────────────────────


@dataclass
class Result:
    partitions: int
    tenants: int
    days: int
    captured: list[int] = field(default_factory=list)  # partitions drained per capture
    hold: Dist = Dist.of([])
    hold_gc: Dist = Dist.of([])  # cyclic-GC time inside each hold
    gen2_holds: int = 0  # holds a full (generation 2) collection landed in
    acquire: Dist = Dist.of([])
    cut_stall: Dist = Dist.of([])
    met_cut: Dist = Dist.of([])  # waits of the turns that met a capture
    turns_ref: Dist = Dist.of([])
    turns_cut: Dist = Dist.of([])
    ingest_ref: Dist = Dist.of([])
    ingest_cut: Dist = Dist.of([])
    profile: str = ""


def settle_unpublished(rig: NodeRig, cut: Cut) -> None:
    """The default stand-in for the flush: settle each batch as published, unencoded,
    so the rest of ``run_cut`` (snapshots, checkpoint) runs for real."""
    for d in cut.batches:
        rig.buffers.in_flight.settle(PublishOutcome(d.id, True))
    cut.batches = []


def run_cut(rig: NodeRig, cut: Cut, publish: bool) -> None:
    if not publish:
        settle_unpublished(rig, cut)
    outcome = rig.barrier.run_cut(cut)
    if not outcome.ok:
        raise RuntimeError(f"cut {outcome.epoch} failed: {outcome}")
    if publish:
        for prefix in ("records/", "audit/"):  # keep the in-memory store from growing
            for key in rig.memory.list(prefix):
                rig.memory.delete(key)


def measure(base: Path, partitions: int, args: argparse.Namespace) -> Result:
    tenants, days = shape(partitions, args.tenants)
    result = Result(partitions, tenants, days)
    requests = payloads(args.seed + partitions, tenants, days, args.min_records)
    root = base / f"p{partitions}"
    rig = NodeRig(
        root,
        config=WalConfig(segment_max_bytes=SEGMENT_BYTES),
        flush_bytes=1 << 40,
        faulty=False,
    )
    lock = TimedExclusion()
    # before any traffic: nothing holds the old one
    rig.pipeline.exclusion = rig.pipeline.cuts.exclusion = lock
    try:
        warm = Load(rig, requests, 1)
        warm.sweep()
        run_cut(rig, rig.barrier.capture(rotate_idle=False), args.publish)
        freeze_long_lived_heap()  # as ``ourios serve`` does once recovery is done

        # reference: the same load, no cut
        lock.shared_log.clear()
        load = Load(rig, requests, args.threads)
        load.start()
        try:
            time.sleep(args.seconds)  # a measurement window, not synchronisation
        finally:
            load.stop()
        result.turns_ref = Dist.of([got - asked for asked, got in lock.shared_log])
        result.ingest_ref = Dist.of([s for _, s in load.calls])

        # the cut window: drain what the reference left, then measure
        run_cut(rig, rig.barrier.capture(rotate_idle=False), args.publish)
        lock.shared_log.clear()
        lock.exclusive_log.clear()
        rig.pipeline.cuts.cut_stall_seconds.clear()
        load = Load(rig, requests, args.threads)
        with GcLog() as gc_log:
            load.start()
            try:
                cut_window(rig, load, partitions, result, args)
            finally:
                load.stop()
        result.ingest_cut = Dist.of([s for _, s in load.calls])
        shared = list(lock.shared_log)
        excl = list(lock.exclusive_log)
        result.turns_cut = Dist.of([got - asked for asked, got in shared])
        result.hold = Dist.of([rel - got for _, got, rel in excl])
        in_gc = [gc_log.inside(got, rel) for _, got, rel in excl]
        result.hold_gc = Dist.of([seconds for seconds, _ in in_gc])
        result.gen2_holds = sum(1 for _, oldest in in_gc if oldest == 2)
        result.acquire = Dist.of([got - asked for asked, got, _ in excl])
        result.cut_stall = Dist.of(list(rig.pipeline.cuts.cut_stall_seconds))
        result.met_cut = Dist.of(met_a_cut(shared, excl))

        if args.profile:
            result.profile = profile_capture(rig, partitions, requests, args)
    finally:
        gc.unfreeze()  # the next P starts from the same heap policy
        rig.close()
        shutil.rmtree(root, ignore_errors=True)
    return result


def cut_window(
    rig: NodeRig, load: Load, partitions: int, result: Result, args: argparse.Namespace
) -> None:
    """Capture and run a cut each time P partitions are buffered, until the window ends."""
    started = time.perf_counter()
    while not load.failed:
        elapsed = time.perf_counter() - started
        if elapsed >= args.max_seconds or (
            elapsed >= args.seconds and len(result.captured) >= args.min_captures
        ):
            return
        if rig.buffers.partitions < partitions:
            time.sleep(0.001)  # the ingest threads are refilling the partitions
            continue
        cut = rig.barrier.capture(rotate_idle=False)
        result.captured.append(len(cut.batches))
        run_cut(rig, cut, args.publish)


def met_a_cut(
    shared: Sequence[tuple[float, float]], excl: Sequence[tuple[float, float, float]]
) -> list[float]:
    """Waits of the turns whose wait overlapped a capture (asked .. released)."""
    windows = sorted((asked, rel) for asked, _, rel in excl)
    starts = [w[0] for w in windows]
    out = []
    for asked, got in shared:
        i = bisect.bisect_left(starts, got)  # windows asked before the turn got in
        if i and windows[i - 1][1] > asked:
            out.append(got - asked)
    return out


def profile_capture(
    rig: NodeRig, partitions: int, requests: Sequence[bytes], args: argparse.Namespace
) -> str:
    """One more capture with P partitions buffered, under cProfile (this thread only)."""
    Load(rig, requests, 1).sweep()
    profiler = cProfile.Profile()
    profiler.enable()
    cut = rig.barrier.capture(rotate_idle=False)
    profiler.disable()
    n = len(cut.batches)
    run_cut(rig, cut, args.publish)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(8)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    keep = [line for line in lines if "ncalls" in line or line.lstrip()[:1].isdigit()]
    return f"  profile of one capture at {partitions:,} ({n:,} drained), by own time:\n" + (
        "\n".join("    " + line for line in keep)
    )


# ── report ──────────────────────────────────────────────────────────────────────────


def report(results: Sequence[Result], args: argparse.Namespace) -> None:
    print()
    print(f"{'':48} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>7}")
    for r in results:
        drained = sum(r.captured) / len(r.captured) if r.captured else 0
        print(
            f"{r.partitions:,} partitions ({r.tenants} tenants × {r.days} days), "
            f"{len(r.captured)} captures draining {drained:,.0f} on average"
        )
        for label, d in (
            ("capture: exclusion held", r.hold),
            (f"  of which cyclic GC ({r.gen2_holds} with a full collection)", r.hold_gc),
            ("capture: waiting for it (turns inside)", r.acquire),
            ("cuts.cut_stall_seconds (wait + hold)", r.cut_stall),
            ("turns that met a capture: wait", r.met_cut),
            ("every turn, cut window: wait", r.turns_cut),
            ("every turn, reference window: wait", r.turns_ref),
            ("ingest call, cut window", r.ingest_cut),
            ("ingest call, reference window", r.ingest_ref),
        ):
            print(f"  {label:<46} {d.text()}")
        ratio = r.ingest_cut.p99_ms / r.ingest_ref.p99_ms
        print(f"  ingest p99 with cuts / without: {ratio:.2f}x")
        if r.profile:
            print(r.profile)
    by_p = {r.partitions: r for r in results}
    lo, hi = min(by_p), max(by_p)
    if lo != hi and by_p[lo].hold.p50_ms > 0:
        growth = by_p[hi].hold.p50_ms / by_p[lo].hold.p50_ms
        print(
            f"capture hold p50 at {hi:,} / at {lo:,} partitions: {growth:.0f}x "
            f"({by_p[hi].hold.p50_ms / hi * 1e3:.1f} µs per partition at {hi:,})"
        )
    target = by_p.get(TARGET_PARTITIONS)
    if target is None:
        print(f"target (p99 ≤ {TARGET_P99_MS:g} ms at {TARGET_PARTITIONS:,}): not measured")
    else:
        for label, d in (("turns that met a cut", target.met_cut), ("capture hold", target.hold)):
            met = d.n > 0 and d.p99_ms <= TARGET_P99_MS
            note = f" (only {d.n} samples: p99 ≈ max)" if 0 < d.n < 100 else ""
            print(
                f"target p99 ≤ {TARGET_P99_MS:g} ms at {TARGET_PARTITIONS:,} partitions, "
                f"{label}: {d.p99_ms:.2f} ms{note}: "
                f"{'met' if met else 'NOT met' if d.n else 'not measured'}"
            )
    flush = (
        "encoded and written to the in-memory store"
        if args.publish
        else "settled unencoded (--publish to encode)"
    )
    print(
        f"flush: {flush}; {args.threads} ingest threads; {os.cpu_count()} CPUs; load now "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="10,1000,10000")
    ap.add_argument("--seconds", type=float, default=10.0, help="per window, at least")
    ap.add_argument(
        "--min-captures", type=int, default=100, help="the cut window runs until this many"
    )
    ap.add_argument("--max-seconds", type=float, default=180.0, help="…or this long")
    ap.add_argument("--threads", type=int, default=4, help="ingest threads")
    ap.add_argument("--tenants", type=int, default=100, help="tenants (at most P)")
    ap.add_argument("--min-records", type=int, default=10, help="records per request, at least")
    ap.add_argument("--publish", action="store_true", help="encode the cut's batches too")
    ap.add_argument("--profile", action="store_true", help="profile one capture per P")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="2 s windows, 5 captures, 20 s cap")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.min_captures, args.max_seconds = 2.0, 5, 20.0
    counts = sorted({int(x) for x in args.partitions.split(",") if x})
    print(
        f"barrier stall benchmark: partitions {','.join(f'{p:,}' for p in counts)}, "
        f"{args.seconds:g}s windows, {args.threads} ingest threads; {os.cpu_count()} CPUs, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    base = Path(tempfile.mkdtemp(prefix="barrierbench-", dir=args.dir))
    results = []
    try:
        for p in counts:
            print(f"  {p:,} partitions …", flush=True)
            results.append(measure(base, p, args))
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if results:
        report(results, args)
    return 0 if len(results) == len(counts) else 130


if __name__ == "__main__":
    raise SystemExit(main())

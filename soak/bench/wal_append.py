"""WAL append throughput and ack latency against a raw group-commit loop.

For 4 KiB frames at 1, 8 and 64 concurrent appenders, measure frames/s and p50/p99
acknowledgement latency of ``Journal.commit`` and, in the same process, of a raw
write+fsync group-commit loop (one lock, one condition, whoever finds no sync running
fsyncs and wakes everyone). Prints both and the ratio.

Target (issue 2): at 64 appenders ≥ 0.9× the raw loop's frames/s and p99 ≤ 1.5× its
p99. Run: ``.venv/bin/python soak/bench/wal_append.py [--seconds 3] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wal import Journal, WalConfig  # noqa: E402

FRAME = 4096


class RawLoop:
    """The naive baseline: write under a lock, then wait on one condition for a sync
    that covers the write; a waiter that finds no sync running runs one itself."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.written = 0
        self.synced = 0
        self.syncing = False

    def commit(self, data: bytes) -> None:
        with self.lock:
            os.write(self.fd, data)
            self.written += 1
            mine = self.written
        with self.cond:
            while self.synced < mine:
                if self.syncing:
                    self.cond.wait()
                    continue
                self.syncing = True
                target = self.written
                self.cond.release()
                try:
                    os.fsync(self.fd)
                finally:
                    self.cond.acquire()
                self.syncing = False
                self.synced = max(self.synced, target)
                self.cond.notify_all()

    def close(self) -> None:
        os.close(self.fd)


def drive(
    commit: Callable[[int, bytes], None], threads: int, seconds: float
) -> tuple[float, list[float]]:
    stop = time.perf_counter() + seconds
    latencies: list[list[float]] = [[] for _ in range(threads)]
    counts = [0] * threads
    start_gate = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        data = (b"%04d" % t) * (FRAME // 4)
        lat = latencies[t]
        start_gate.wait()
        n = 0
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                break
            commit(t, data)
            lat.append(time.perf_counter() - t0)
            n += 1
        counts[t] = n

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    t_start = time.perf_counter()
    start_gate.wait()
    for p in pool:
        p.join()
    elapsed = time.perf_counter() - t_start
    flat = [x for lat in latencies for x in lat]
    return sum(counts) / elapsed, flat


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--threads", default="1,8,64")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="walbench-", dir=args.dir))
    rows = []
    try:
        for threads in [int(x) for x in args.threads.split(",")]:
            raw_path = base / f"raw-{threads}.log"
            raw = RawLoop(raw_path)

            def raw_commit(t: int, d: bytes, r: RawLoop = raw) -> None:
                r.commit(d)

            raw_rate, raw_lat = drive(raw_commit, threads, args.seconds)
            raw.close()
            raw_path.unlink()
            root = base / f"wal-{threads}"
            journal = Journal.open(root, WalConfig())
            tenants = [f"tenant-{t % 16}" for t in range(threads)]

            def wal_commit(t: int, d: bytes, j: Journal = journal, ts: list[str] = tenants) -> None:
                j.commit(ts[t], d)

            wal_rate, wal_lat = drive(wal_commit, threads, args.seconds)
            journal.close()
            shutil.rmtree(root)
            rows.append((threads, raw_rate, raw_lat, wal_rate, wal_lat))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"4 KiB frames, {args.seconds:.0f} s per run, fsync per covering round")
    print(
        f"{'appenders':>9} | {'raw frames/s':>12} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'wal frames/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'rate x':>6} {'p99 x':>6}"
    )
    for threads, raw_rate, raw_lat, wal_rate, wal_lat in rows:
        r50, r99 = pct(raw_lat, 50) * 1e3, pct(raw_lat, 99) * 1e3
        w50, w99 = pct(wal_lat, 50) * 1e3, pct(wal_lat, 99) * 1e3
        print(
            f"{threads:>9} | {raw_rate:>12,.0f} {r50:>7.2f} {r99:>7.2f} | "
            f"{wal_rate:>12,.0f} {w50:>7.2f} {w99:>7.2f} | "
            f"{wal_rate / raw_rate:>6.2f} {w99 / r99:>6.2f}"
        )
    last = rows[-1]
    rate_ratio = last[3] / last[1]
    p99_ratio = pct(last[4], 99) / pct(last[2], 99)
    ok = rate_ratio >= 0.9 and p99_ratio <= 1.5
    print(
        f"target at {last[0]} appenders: rate >= 0.9x raw ({rate_ratio:.2f}x), "
        f"p99 <= 1.5x raw ({p99_ratio:.2f}x): {'met' if ok else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

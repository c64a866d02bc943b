"""Housekeeping under load: append latency during capped passes over a large backlog,
and the time a pass holds the journal mutex as the backlog grows.

1. Build a 1,113-segment backlog (the incident's shape: one frame per 64 KiB segment),
   checkpoint it, and give every tenant a horizon past it.
2. Run 16 appender threads (1 KiB frames) for a baseline window with no pass, then
   for a window in which capped passes (cap 128) run back to back until the backlog is
   drained; six rounds, each on a fresh backlog, the two windows interleaved. Report
   append p50/p99 in both and the ratio (target p99 ≤ 2×).
3. For backlogs of 100, 300, 1,113 and 10,000 segments, report the time a pass holds the
   journal mutex (its two ledger halves, prepare + commit): the first pass (which also
   applies the horizons, capped) and the median full-cap pass. It must be flat in the
   backlog size, because a pass does O(cap) ledger work and no directory walk. (At 100
   segments — also reported — a backlog is below the cap, so its one pass does less
   than a cap's work; 300 is the smallest that shows a full-cap pass, and the flatness
   ratio compares full-cap passes only.)

Run: ``.venv/bin/python soak/bench/housekeeping.py [--big 10000]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wal import Journal, KnownHorizons, WalConfig  # noqa: E402
from wal.reclamation import APPLY_STEPS_PER_UNLINK  # noqa: E402

CAP = 128
CFG = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=64 * 1024, max_unlinks_per_pass=CAP)
BIG_FRAME = b"b" * 60_000  # one frame per segment
SMALL_FRAME = b"s" * 1024


def build(root: Path, segments: int, tenants: int = 4) -> tuple[Journal, KnownHorizons]:
    j = Journal.open(root, CFG)
    last: dict[str, object] = {}
    batch = []
    for i in range(segments):
        tenant = f"tenant-{i % tenants}"
        batch.append((tenant, j.append_batch(tenant, BIG_FRAME)))
        if len(batch) == 256:
            for t, p in batch:
                last[t] = p.wait().offset
            batch = []
    for t, p in batch:
        last[t] = p.wait().offset
    tail = j.commit("tenant-0", SMALL_FRAME).offset  # the current segment
    last["tenant-0"] = tail
    j.checkpoint(tail)
    return j, KnownHorizons(dict(last))  # type: ignore[arg-type]


def appenders(
    j: Journal, stop: threading.Event, out: list[float], threads: int = 16
) -> list[threading.Thread]:
    lock = threading.Lock()

    def work(t: int) -> None:
        mine: list[float] = []
        while not stop.is_set():
            t0 = time.perf_counter()
            j.commit(f"live-{t % 4}", SMALL_FRAME)
            mine.append(time.perf_counter() - t0)
        with lock:
            out.extend(mine)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    return pool


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def measure(
    j: Journal, window: float | None, horizons: KnownHorizons | None
) -> tuple[list[float], int, int, float]:
    """16 appenders on ``j`` while either nothing else runs for ``window`` seconds, or
    capped passes run back to back until the backlog is drained. Returns the append
    latencies, the passes, the segments removed and the elapsed seconds."""
    out: list[float] = []
    stop = threading.Event()
    pool = appenders(j, stop, out)
    passes = removed = 0
    t0 = time.perf_counter()
    if horizons is None:
        assert window is not None
        time.sleep(window)  # a measurement window, not synchronisation
    else:
        while True:
            progress = j.maintain(horizons, CAP)
            passes += 1
            removed += progress.removed_segments
            if progress.removed_segments == 0 and not progress.capped:
                break
    elapsed = time.perf_counter() - t0
    stop.set()
    for p in pool:
        p.join()
    return out, passes, removed, elapsed


def latency_under_passes(base: Path, seconds: float, rounds: int) -> None:
    """``rounds`` times: build a 1,113-segment backlog, measure the appenders alone for
    ``seconds``, then while capped passes drain the backlog. Interleaving the two
    windows exposes both to the same machine conditions; the rounds give the passes'
    window enough appends for a p99."""
    baseline: list[float] = []
    during: list[float] = []
    for r in range(rounds):
        j, horizons = build(base / f"backlog-{r}", 1113)
        alone, _, _, _ = measure(j, seconds, None)
        busy, passes, removed, elapsed = measure(j, None, horizons)
        j.close()
        shutil.rmtree(base / f"backlog-{r}")
        baseline.extend(alone)
        during.extend(busy)
        print(
            f"round {r + 1}: 1,113-segment backlog, cap {CAP}: {passes} passes removed "
            f"{removed} segments in {elapsed:.2f} s; append p99 alone "
            f"{pct(alone, 99) * 1e3:.2f} ms, during passes {pct(busy, 99) * 1e3:.2f} ms"
        )
    b50, b99 = pct(baseline, 50) * 1e3, pct(baseline, 99) * 1e3
    d50, d99 = pct(during, 50) * 1e3, pct(during, 99) * 1e3
    print(f"all {rounds} rounds, 16 appenders, 1 KiB frames:")
    print(
        f"  append latency, no pass : p50 {b50:.2f} ms  p99 {b99:.2f} ms  ({len(baseline)} appends)"
    )
    print(
        f"  append latency, passes  : p50 {d50:.2f} ms  p99 {d99:.2f} ms  ({len(during)} appends)"
    )
    ratio = d99 / b99
    print(f"  p99 ratio {ratio:.2f}x (target <= 2x): {'met' if ratio <= 2 else 'NOT met'}")


def lock_hold(base: Path, sizes: list[int]) -> None:
    """The journal-mutex hold of each pass, grouped by the work the pass did: a pass
    with a full cap of unlinks that also applied a full budget of horizon steps
    (``APPLY_STEPS_PER_UNLINK`` × cap), and one with a full cap of unlinks and no
    horizon step left. Flat means: the same work costs the same at any backlog size."""
    budget = APPLY_STEPS_PER_UNLINK * CAP
    print(f"time a pass holds the journal mutex (prepare + commit), cap {CAP}:")
    by_class: dict[str, list[float]] = {"unlinks+steps": [], "unlinks only": []}
    for n in sizes:
        j, horizons = build(base / f"hold-{n}", n)
        holds: list[tuple[float, int, int]] = []  # (seconds, removed, horizon steps)
        while len(holds) < 24:
            t0 = time.perf_counter()
            plan = j.plan_reclamation(horizons, CAP)
            t1 = time.perf_counter()
            outcome = j.execute_reclamation(plan)
            t2 = time.perf_counter()
            progress = j.commit_reclamation(plan, outcome)
            t3 = time.perf_counter()
            holds.append(
                ((t1 - t0) + (t3 - t2), progress.removed_segments, progress.horizon_applied)
            )
            if progress.removed_segments == 0 and not progress.capped:
                break
        j.close()
        shutil.rmtree(base / f"hold-{n}")
        both = [h for h, removed, steps in holds if removed == CAP and steps == budget]
        only = [h for h, removed, steps in holds if removed == CAP and steps == 0]
        worst = max(h for h, _, _ in holds)
        parts = []
        for name, values in (("unlinks+steps", both), ("unlinks only", only)):
            if values:
                median = statistics.median(values)
                by_class[name].append(median)
                parts.append(f"{name} median {median * 1e3:.2f} ms ({len(values)})")
        if not parts:
            first = holds[0]
            parts.append(f"one pass {first[0] * 1e3:.2f} ms ({first[1]} unlinks): below the cap")
        print(f"  {n:>6} segments: {'; '.join(parts)}; worst pass {worst * 1e3:.2f} ms")
    for name, medians in by_class.items():
        if len(medians) > 1:
            print(
                f"  {name} ({CAP} unlinks{f', {budget} horizon steps' if 'steps' in name else ''})"
                f": largest / smallest median over backlogs {max(medians) / min(medians):.2f}x"
                " (flat means ~1x)"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="baseline window per round")
    ap.add_argument("--rounds", type=int, default=6, help="backlogs drained under load")
    ap.add_argument("--big", type=int, default=10_000, help="the largest backlog")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hkbench-", dir=args.dir))
    try:
        latency_under_passes(base, args.seconds, args.rounds)
        lock_hold(base, [100, 300, 1113, args.big])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The start-up cost of exactly-once (issue 16): what a restart spends finding out which
objects published above the frontiers already landed.

For N objects published since the frontier (N = 1 and 1,000), the fixture is N real
records objects in a store and their N publish intents in a real ``PUBLISHING`` file
(``wal.IntentLog``, appended and fsynced one by one, as the publisher does). Then, timed:

* **open**: ``IntentLog.open`` reading the N intents (what ``ourios serve`` does before
  it is ready);
* **check**: ``app.ingest.landed.LandedCheck`` asking the store about every intended
  object (16 requests in flight) and building the suppression (what the replay waits
  for before its first frame; the node is ready meanwhile).

Against the embedded store (``LocalStore``: a stat and a directory fsync per object)
and SeaweedFS (``S3Store``: a HEAD per object), each the median of ``--repeats`` runs.
The ratio printed is the 1,000-object check over the 1-object check: the cost follows
what was published since the frontier. The store's total size does not enter: the
fixture adds ``--ballast`` objects the intents do not name, and the figures with and
without them are printed side by side.

    .venv/bin/python soak/bench/landed.py [--repeats 5] [--ballast 2000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.ingest.landed import LandedCheck  # noqa: E402
from sink.store import LocalStore, ObjectStore, S3Store  # noqa: E402
from tests.support.seaweed import S3Bucket, SeaweedS3  # noqa: E402
from wal import IntentLog, IntentRecord, ObjectKind, OsFs  # noqa: E402

DAY = 20_425


def _key(i: int) -> str:
    return f"records/tenant=t{i % 32}/date=2025-12-03/bench-0-{i:08d}.parquet"


def fixture(store: ObjectStore, wal: Path, n: int, ballast: int) -> None:
    data = b"PAR1" + bytes(4096) + b"PAR1"  # the size of a small object; never parsed
    log = IntentLog.open(OsFs(), wal)
    try:
        for i in range(n):
            log.append(
                IntentRecord(
                    ObjectKind.RECORDS,
                    f"t{i % 32}",
                    _key(i),
                    DAY,
                    frames=tuple(range(1_000 + i * 100, 1_000 + i * 100 + 40)),
                )
            )
            store.put(_key(i), data)
    finally:
        log.close()
    for j in range(ballast):
        store.put(_key(10_000_000 + j), data)


def measure(store: ObjectStore, wal: Path) -> tuple[float, float, int]:
    began = time.perf_counter()
    log = IntentLog.open(OsFs(), wal)
    intents = log.records()
    log.close()
    opened = time.perf_counter() - began
    began = time.perf_counter()
    landed = LandedCheck(store, intents).run()
    checked = time.perf_counter() - began
    assert landed is not None and landed.present == len(intents)
    return opened, checked, len(intents)


def run(kind: str, make: object, n: int, ballast: int, repeats: int) -> tuple[float, float]:
    opens: list[float] = []
    checks: list[float] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-landed-") as tmp:
            store = make(Path(tmp))  # type: ignore[operator]
            wal = Path(tmp) / "wal"
            wal.mkdir()
            fixture(store, wal, n, ballast)
            o, c, _ = measure(store, wal)
            opens.append(o)
            checks.append(c)
    o, c = statistics.median(opens), statistics.median(checks)
    print(
        f"{kind:<10} {n:>6,} objects since the frontier, {ballast:>5,} others: "
        f"open {o * 1e3:8.2f} ms, check {c * 1e3:8.2f} ms",
        flush=True,
    )
    return o, c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ballast", type=int, default=2000)
    args = ap.parse_args()
    weed = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    results: dict[tuple[str, int, int], tuple[float, float]] = {}

    def local(tmp: Path) -> ObjectStore:
        return LocalStore(tmp / "objects")

    stores: list[tuple[str, object]] = [("local", local)]
    server: SeaweedS3 | None = None
    if weed is not None:
        server = SeaweedS3(weed, Path(tempfile.mkdtemp(prefix="bench-weed-"))).start()

        def seaweed(tmp: Path) -> ObjectStore:
            assert server is not None
            bucket = S3Bucket.create(server, "bench")
            return S3Store(
                bucket.name,
                endpoint_url=server.endpoint_url,
                region=server.region,
                client=server.client(),
            )

        stores.append(("seaweedfs", seaweed))
    else:
        print("weed not found: SeaweedFS skipped", file=sys.stderr)
    try:
        for kind, make in stores:
            for n in (1, 1000):
                for ballast in (0, args.ballast):
                    results[(kind, n, ballast)] = run(kind, make, n, ballast, args.repeats)
    finally:
        if server is not None:
            server.close()
    for kind, _ in stores:
        one = results[(kind, 1, 0)][1]
        many = results[(kind, 1000, 0)][1]
        grown = results[(kind, 1000, args.ballast)][1]
        print(
            f"{kind}: check at 1,000 objects / at 1 = {many / one:,.0f}x; "
            f"with {args.ballast:,} other objects in the store / without = {grown / many:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

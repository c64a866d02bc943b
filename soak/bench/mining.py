"""Mining alone (issue 23 item 5): ``TenantMiner.mine`` on the ingest benchmark's bodies
(``soak.bench.loadgen.build_pool``: 320 requests of 100 records, 32 tenants), the Python
path against the native fast path (``app/ingest/mining/_minefast.c``) in the same run.

Each path gets its own miners (the bench's default ``miner`` bounds), warmed by a first
pass over the pool as the server's are; then ``--passes`` passes each, interleaved, one
thread, ``thread_time``; the median pass per record is printed. The two paths' results
are checked equal on every pass (a benchmark never fails on speed, only on a wrong
answer). ``--path python`` or ``--path native`` mines with one path only, for a
profiler (``py-spy record -- .venv/bin/python soak/bench/mining.py --path python``).

``--bodies noisy`` mines what the noisy tenant of tests/integration/test_noisy_tenant_serve.py
sends instead: batches of 200 lines no two alike, all in one leaf of Drain's tree, so
every line is a creation after a search of a full leaf (``miner.max_leaf_templates``)
and an eviction — the most a record can cost the turn.

Run: ``.venv/bin/python soak/bench/mining.py [--passes 5] [--bodies service|noisy]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.base.config import load_settings  # noqa: E402
from app.ingest.mining import native_miner  # noqa: E402
from app.ingest.mining.miner_config import MinerConfig  # noqa: E402
from app.ingest.mining.template_ids import CountingAllocator  # noqa: E402
from app.ingest.mining.tenant_miner import MineResult, TenantMiner  # noqa: E402
from app.node.server import miner_bounds  # noqa: E402
from app.receive.otlp import PROTOBUF_CONTENT_TYPE, decode_request, flatten  # noqa: E402
from soak.bench.loadgen import build_pool  # noqa: E402

RECORDS_PER_REQUEST = 100
TENANTS = 32
ATTRIBUTES = 4
NOISY_RECORDS = 200


def node_config() -> MinerConfig:
    """The miner configuration ``ourios serve`` gives a tenant by default (its bounds)."""
    return miner_bounds(load_settings(env={}))


def batches(pool_size: int, seed: int) -> list[tuple[str, list[str]]]:
    tenants = [f"bench-{i:02d}" for i in range(TENANTS)]
    pool = build_pool(pool_size, RECORDS_PER_REQUEST, tenants, seed=seed, attributes=ATTRIBUTES)
    out = []
    for body, tenant in zip(pool.bodies, pool.tenants, strict=True):
        flat = flatten(decode_request(body, PROTOBUF_CONTENT_TYPE), tenant)
        out.append((tenant, list(flat.bodies)))
    return out


def noisy_batches(count: int, seed: int) -> list[tuple[str, list[str]]]:
    """``count`` batches of ``NOISY_RECORDS`` unique lines of one tenant, in one leaf
    (the same first two tokens and token count, then ten random lowercase words)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        bodies = [
            "noisy line "
            + " ".join("".join(rng.choices(string.ascii_lowercase, k=8)) for _ in range(10))
            for _ in range(NOISY_RECORDS)
        ]
        out.append(("noisy", bodies))
    return out


def one_pass(
    miners: dict[str, TenantMiner], work: list[tuple[str, list[str]]]
) -> tuple[float, list[MineResult]]:
    clock = time.thread_time
    results = []
    started = clock()
    for tenant, bodies in work:
        results.append(miners[tenant].mine(bodies))
    return clock() - started, results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--pool", type=int, default=320)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--path", choices=("both", "python", "native"), default="both")
    ap.add_argument("--bodies", choices=("service", "noisy"), default="service")
    args = ap.parse_args(argv)
    if args.bodies == "noisy":
        # a pass of 16 batches: the first pass fills the leaf, the next ones evict
        work = noisy_batches(16, args.seed)
    else:
        work = batches(args.pool, args.seed)
    records = sum(len(b) for _, b in work)
    config = node_config()
    paths = ("python", "native") if args.path == "both" else (args.path,)
    if "native" in paths and native_miner.active() != "native":
        print(f"the native miner is unavailable: {native_miner.unavailable()}", file=sys.stderr)
        return 1
    miners = {}
    for path in paths:
        allocator = CountingAllocator()
        per = {t: TenantMiner(allocator, config) for t, _ in work}
        for miner in per.values():
            miner.native = path == "native"
        miners[path] = per
    laps: dict[str, list[float]] = {path: [] for path in paths}
    for lap in range(args.passes + 1):
        answers = {}
        for path in paths:
            spent, answers[path] = one_pass(miners[path], work)
            if lap:  # the first pass warms the miners
                laps[path].append(spent / records * 1e6)
        if len(paths) == 2:
            assert answers["python"] == answers["native"], "the two paths' results differ"
    tenants = len({t for t, _ in work})
    print(
        f"mining {records} {args.bodies} records ({len(work)} batches, {tenants} tenants), {config}"
    )
    for path in paths:
        values = laps[path]
        print(
            f"  {path:6s}: median {statistics.median(values):.3f} µs/record "
            f"(passes: {', '.join(f'{v:.3f}' for v in values)})"
        )
    if len(paths) == 2:
        ratio = statistics.median(laps["native"]) / statistics.median(laps["python"])
        print(f"  native / python: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

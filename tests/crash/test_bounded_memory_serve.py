"""Issue 21 item 1, on a real ``ourios serve`` and a real SeaweedFS: memory is bounded
whatever the store outage's length (DESIGN.md §5.12).

``test_bounded_1_...``: a small ``sink.ceiling_bytes``, load from several senders and
tenants, then SeaweedFS is SIGKILLed and the load goes on until the WAL holds many
times the ceiling. Throughout, the resident memory (``VmRSS`` from ``/proc``) of the
core and of each worker is sampled; neither may pass its documented bound (the
ceiling plus the fixed allowance of DESIGN.md §5.12). What did not fit in memory went
to the spool (``sink.spool.started``, ``ourios_sink_spooled_objects_total``), and
PUBLISHING held one record per object that may exist — not one per attempt: its claims
never outnumber the frames written. Then the store returns: the spool drains, the
barrier completes cuts, SIGTERM exits 0, and every acknowledged record is in the store
exactly once (read back with pyarrow).

On the code before the bound, the core grew with the WAL (every failed publish merged
back into memory) and PUBLISHING gained a record with the whole claim list per attempt.

Everything waits on real conditions with deadlines (``/metrics``, the WAL's size on
disk, acknowledgement counts); the memory is sampled, never waited for. The seed is
printed (``BOUNDED_SEED`` reruns one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import seed_from
from tests.support.parquet_read import download_prefix
from tests.support.poll import poll_until
from tests.support.procmem import MemorySampler
from tests.support.scrape import try_scrape
from tests.support.seaweed import S3Bucket, SeaweedS3
from tests.support.serve import ServeProcess
from wal.intents import scan

pytestmark = pytest.mark.slow

MiB = 1 << 20
TENANTS = ("acme", "globex", "initech")
PREFIX = "bounded"
CEILING = 2 * MiB
TURN_BACKLOG = 2 * MiB
#: The fixed allowance of DESIGN.md §5.12 for this configuration: the interpreter and
#: its libraries, the encoded copies of what is being published (at most the ceiling),
#: the turn backlog's frames (their payload and decoded columns, twice the backlog
#: bound) and the allocator's slack.
CORE_BOUND = 256 * MiB + 2 * CEILING + 2 * TURN_BACKLOG
WORKER_BOUND = 256 * MiB + 2 * CEILING
#: what the outage may add to the core's memory: the ceiling's rows and their encoded
#: copies, the backlog's frames, and the allocator's slack (never the WAL's growth)
OUTAGE_GROWTH = 2 * CEILING + 2 * TURN_BACKLOG + 24 * MiB
#: the outage lasts until the WAL on disk holds this many times the ceiling
WAL_TIMES_CEILING = 10
#: a bound on a failure, not a pace: each condition holds in seconds on an idle machine
DEADLINE_S = 120.0

ENV = {
    "OURIOS_SERVER_WORKERS": "1",
    "OURIOS_WAL_BARRIER_SECS": "1",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": str(4 * MiB),
    "OURIOS_WAL_TURN_BACKLOG_BYTES": str(TURN_BACKLOG),
    "OURIOS_SINK_CEILING_BYTES": str(CEILING),
    "OURIOS_SINK_FLUSH_BYTES": str(512 << 10),
    "OURIOS_SINK_MAX_OBJECT_BYTES": str(MiB),
    "OURIOS_SINK_FLUSH_AGE_SECS": "2",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "10",
}


def wait_for(condition: Callable[[], bool], what: str, detail: Callable[[], str]) -> None:
    """Poll a real external condition until it holds (bounded by ``DEADLINE_S``)."""
    poll_until(what, condition, deadline_s=DEADLINE_S, detail=detail, every_s=0.1)


def metric(serve: ServeProcess, name: str) -> float:
    """The sum of one metric's samples (0 when the node does not answer)."""
    s = try_scrape(serve)
    return s.total(name) if s is not None else 0.0


def barrier_ok(serve: ServeProcess) -> float:
    s = try_scrape(serve)
    return s.total("ourios_cadence_runs_total", cadence="barrier", outcome="ok") if s else 0.0


def wal_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "wal").glob("*.wal"))


def published_rids(bucket: S3Bucket, dest: Path) -> Counter[str]:
    """How many times each ``rid`` is in the published records (read with pyarrow, the
    one column, as columns: the outage published hundreds of thousands of rows)."""
    download_prefix(bucket.server.client(), bucket.name, PREFIX, dest)
    found: Counter[str] = Counter()
    for path in sorted((dest / "records").rglob("*.parquet")):
        attributes = pq.read_table(path, columns=["attributes"]).column("attributes")
        found.update(pc.map_lookup(attributes, "rid", "first").to_pylist())
    return found


def test_bounded_1_a_long_store_outage_keeps_memory_under_the_bound_and_loses_nothing(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    seed = seed_from("BOUNDED_SEED")
    bucket = S3Bucket.create(seaweed, "bounded")
    ledger = AckLedger()
    data = tmp_path / "node"
    serve = ServeProcess(data, {**ENV, **seaweed.env(), "OURIOS_STORE_URL": bucket.url(PREFIX)})
    with serve:
        (listening,) = serve.event("server.listening")
        core = serve.proc.pid if serve.proc is not None else 0
        workers = list(listening["workers"])
        for pid in workers:  # the allocator's arenas are part of the bound (DESIGN.md §5.12)
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"MALLOC_ARENA_MAX=2" in environ, pid
        with (
            MemorySampler(lambda: [core, *workers]) as memory,
            AckLoad(
                ledger,
                serve.http_port,
                senders=6,
                tenants=TENANTS,
                seed=seed,
                records_per_request=(20, 40),
            ) as load,
        ):
            load.wait_acked(200)
            wait_for(
                lambda: barrier_ok(serve) >= 2,
                "healthy cuts before the outage",
                serve.tail,
            )

            memory.sample()
            before = dict(memory.peak)  # the healthy node's peak: the outage adds to it
            seaweed.kill()  # every publish fails from now on
            wal_before = wal_bytes(data)
            wait_for(
                lambda: wal_bytes(data) >= wal_before + WAL_TIMES_CEILING * CEILING,
                f"the WAL growing by {WAL_TIMES_CEILING}x the ceiling during the outage",
                lambda: f"wal {wal_bytes(data)} bytes, acked {load.acked}\n{serve.tail()}",
            )
            spooled = metric(serve, "ourios_sink_spooled_objects_total")
            intents = scan((data / "wal" / "PUBLISHING").read_bytes(), data / "PUBLISHING")
            frames = load.acked  # one frame per acknowledged request
            memory.sample()

            seaweed.restart()
            wait_for(
                lambda: (
                    metric(serve, "ourios_sink_spool_objects") == 0
                    and metric(serve, "ourios_sink_store_down") == 0
                ),
                "the spool drained after the store returned",
                lambda: f"spool {metric(serve, 'ourios_sink_spool_objects')}\n{serve.tail()}",
            )
            ok_back = barrier_ok(serve)
            wait_for(
                lambda: barrier_ok(serve) >= ok_back + 2,
                "the barrier completing cuts after the store returned",
                serve.tail,
            )
            load.stop()
            serve.wait_turned()  # a stop leaves the unturned to the WAL (exit 75)
        code = serve.terminate()

    peaks = {pid: max(memory.peak.get(pid, 0), memory.hwm.get(pid, 0)) for pid in memory.peak}
    print(f"seed {seed}; resident bytes before {before}, peak {peaks}; spooled {spooled}")
    assert memory.samples > 50, memory.samples
    assert peaks.get(core, 0) <= CORE_BOUND, (peaks, CORE_BOUND)
    grown = memory.peak.get(core, 0) - before.get(core, 0)
    assert grown <= OUTAGE_GROWTH, f"the outage grew the core by {grown} bytes"
    for pid in workers:
        assert peaks.get(pid, 0) <= WORKER_BOUND, (pid, peaks, WORKER_BOUND)
    assert spooled > 0 and serve.event("sink.spool.started"), "nothing was spooled"
    claims = sum(len(r.frames) + len(r.events) for r in intents.records)
    assert claims <= frames + 16 * len(intents.records), (claims, frames, len(intents.records))
    assert len(intents.records) <= spooled + 64, (len(intents.records), spooled)

    (stopped,) = serve.event("server.stopped")
    assert code == 0, f"exit {code}: {stopped}\n{serve.tail()}"
    assert stopped["rows_left_in_wal"] == 0, stopped
    published = published_rids(bucket, tmp_path / "published")
    acked = ledger.rids(Outcome.ACKED)
    missing = sorted(acked - published.keys())
    assert not missing, f"{len(missing)} acknowledged records not in the store: {missing[:5]}"
    copies = {rid: n for rid, n in published.items() if n > 1}
    assert not copies, f"{len(copies)} records published more than once: {list(copies)[:5]}"


def test_bounded_1_a_sigkill_during_the_outage_discards_the_spool_and_loses_nothing(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    """The node is SIGKILLed while its spool holds what the store would not take. The
    next start empties the spool (``sink.spool.discarded``) and its replay re-derives the
    rows from the WAL under the same bound — the restarted core stays under its bound
    too, so a long outage does not end in a crash loop — and every acknowledged record
    is in the store once."""
    seed = seed_from("BOUNDED_SEED")
    bucket = S3Bucket.create(seaweed, "bounded")
    ledger = AckLedger()
    data = tmp_path / "node"
    env = {**ENV, **seaweed.env(), "OURIOS_STORE_URL": bucket.url(PREFIX)}
    serve = ServeProcess(data, env)
    with serve:
        with AckLoad(
            ledger,
            serve.http_port,
            senders=6,
            tenants=TENANTS,
            seed=seed,
            records_per_request=(20, 40),
        ) as load:
            load.wait_acked(100)
            seaweed.kill()
            wal_before = wal_bytes(data)
            wait_for(
                lambda: (
                    wal_bytes(data) >= wal_before + 4 * CEILING
                    and metric(serve, "ourios_sink_spool_objects") > 0
                ),
                "a spool and a WAL of four ceilings during the outage",
                serve.tail,
            )
            load.stop()
        serve.kill()
    assert list((data / "spool").glob("*.parquet")), "the killed node left its spool"

    seaweed.restart()
    again = ServeProcess(data, env)
    with again:
        core = again.proc.pid if again.proc is not None else 0
        with MemorySampler(lambda: [core]) as memory:
            wait_for(
                lambda: metric(again, "ourios_sink_spool_objects") == 0 and barrier_ok(again) >= 2,
                "the replayed rows published and cuts completing",
                again.tail,
            )
        code = again.terminate()

    (discarded,) = again.event("sink.spool.discarded")
    assert discarded["files"] > 0, discarded
    peak = max(memory.peak.get(core, 0), memory.hwm.get(core, 0))
    assert peak <= CORE_BOUND, (peak, CORE_BOUND)
    assert code == 0, f"exit {code}\n{again.tail()}"
    published = published_rids(bucket, tmp_path / "published")
    acked = ledger.rids(Outcome.ACKED)
    missing = sorted(acked - published.keys())
    assert not missing, f"{len(missing)} acknowledged records not in the store: {missing[:5]}"
    copies = {rid: n for rid, n in published.items() if n > 1}
    assert not copies, f"{len(copies)} records published more than once: {list(copies)[:5]}"

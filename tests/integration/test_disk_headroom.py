"""The data volume's headroom under a real store outage, and a volume filled to zero
(issue 18 items 1 and 2; DESIGN.md §7, §12; segment-set seed §6).

Each runs a real ``ourios serve`` whose whole data directory (WAL, snapshots,
template-ids, and the embedded store where it is used) is one size-limited tmpfs, as in
the chart. The store goes away mid-load: a real SeaweedFS SIGKILLed by pid (and started
again on the same ports and data), or the embedded ``file://`` store made unwritable.

1. An outage under load: four senders of ~30 KB batches keep writing while the store is
   gone; an outside sampler reads ``os.statvfs`` every 20 ms. Admission refuses at stop
   water by the free space as of the last append (the last sample minus what the node
   wrote since), so the volume never drops below half the stop water, and every
   refusal is a 503 naming the bound.
2. Full from zero: the node's WAL holds data the store lacks, the store is gone, and an
   outside file takes every free byte of the volume and is never removed. Once the
   store is back the node publishes (with the embedded store, into the space of the
   emergency reserve it released), snapshots, checkpoints, reclaims and accepts again
   within a minute, without a restart.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from app.node.server import EXIT_ROWS_LEFT
from tests.support import S3Bucket, SeaweedS3
from tests.support.noderig import bodies_request
from tests.support.poll import poll_until
from tests.support.scrape import scrape
from tests.support.serve import ServeProcess
from tests.support.tmpfs import TmpfsMounts, fill_volume, free_bytes
from tests.support.tools import require_tool

MiB = 1 << 20
VOLUME = 40 * MiB
SEGMENT = 1 * MiB
LOW_WATER = 12 * MiB
STOP_WATER = 6 * MiB
RESERVE = 2 * MiB
BATCH_RECORDS = 10
RECORD_BODY = 3000  # ~30 KB a batch
SENDERS = 4
SAMPLE_EVERY = 0.02


def _batch(rng: random.Random, tag: str) -> bytes:
    """~30 KB: a few records with long bodies (three tokens each: mining stays cheap)."""
    # compressible, as logs are: one cut's Parquet fits in the reserve
    bodies = [f"blob {rng.randrange(1 << 30)} {'x' * RECORD_BODY}" for _ in range(BATCH_RECORDS)]
    body: bytes = bodies_request(tag, bodies, service="disk", severity=9).SerializeToString()
    return body


def _env(bucket: S3Bucket | None, **extra: str) -> dict[str, str]:
    return {
        **(bucket.env() if bucket is not None else {}),
        "OURIOS_WAL_SEGMENT_MAX_BYTES": str(SEGMENT),
        "OURIOS_WAL_BARRIER_SECS": "1",
        "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
        "OURIOS_WAL_MAX_TENANTS": "16",
        "OURIOS_DISK_LOW_WATER_BYTES": str(LOW_WATER),
        "OURIOS_DISK_STOP_WATER_BYTES": str(STOP_WATER),
        "OURIOS_DISK_RESERVE_BYTES": str(RESERVE),
        **extra,
    }


def _metric(server: ServeProcess, prefix: str) -> float | None:
    return scrape(server).series(prefix)


def _wait(condition: Callable[[], bool], what: str, server: ServeProcess, timeout: float) -> None:
    poll_until(what, condition, deadline_s=timeout, detail=lambda: _story(server))


def _story(server: ServeProcess) -> str:
    """The node's events (not its ordinary log lines) and its last log lines."""
    events = [line for line in server.lines if '"event":"log"' not in line]
    return "\n".join(events[-40:]) + "\n--- last lines:\n" + server.tail(15)


class Sampler(threading.Thread):
    """Reads the volume's free space from outside every 20 ms; keeps the minimum."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="statvfs-sampler", daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.lowest = free_bytes(path)
        self.samples = 0

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY):
            self.lowest = min(self.lowest, free_bytes(self.path))
            self.samples += 1


class Senders:
    """Four threads posting ~30 KB batches until told to stop; every answer is kept."""

    def __init__(self, server: ServeProcess, seed: int) -> None:
        self.server = server
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.refusals: list[tuple[int, bytes, dict[str, str]]] = []
        self.acked = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._send, args=(seed + k, k), name=f"sender-{k}")
            for k in range(SENDERS)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)

    def _send(self, seed: int, k: int) -> None:
        rng = random.Random(seed)
        n = 0
        while not self.stop.is_set():
            body = _batch(rng, f"s{k}-{n}")
            n += 1
            status, answer, headers = self.server.post_logs(body)
            with self._lock:
                self.statuses[status] += 1
                if status == 200:
                    self.acked += 1
                elif len(self.refusals) < 10_000:
                    self.refusals.append((status, answer, headers))

    def refused_for(self, seconds: float) -> Callable[[], bool]:
        """True once every answer for ``seconds`` has been a refusal."""
        seen = 0
        since: float | None = None

        def check() -> bool:
            nonlocal seen, since
            with self._lock:
                total = sum(self.statuses.values())
                oks = self.statuses[200]
            if seen != oks or total == oks:  # an acknowledgement: start again
                seen, since = oks, None
                return False
            if since is None:
                since = time.monotonic()
            return time.monotonic() - since >= seconds

        return check


def _seaweed(tmp_path: Path) -> SeaweedS3:
    return SeaweedS3(require_tool("weed"), tmp_path / "seaweed")


def test_nowedge_1_a_store_outage_under_load_never_eats_the_headroom(
    tmp_path: Path, small_tmpfs: TmpfsMounts
) -> None:
    data = small_tmpfs(VOLUME)
    with _seaweed(tmp_path) as weed:
        bucket = S3Bucket.create(weed)
        with ServeProcess(data, _env(bucket)) as server:
            sampler = Sampler(data)
            sampler.start()
            senders = Senders(server, seed=18_1)
            try:
                senders.start()
                _wait(lambda: senders.acked >= 20, "the first acknowledgements", server, 60)
                weed.kill()  # SIGKILL by pid: the store is gone mid-load
                # the WAL grows into stop water, then every answer is a refusal for a while
                _wait(senders.refused_for(3.0), "steady refusals", server, 120)
            finally:
                senders.close()
                sampler.stop.set()
                sampler.join(10)
            low = sampler.lowest
            refusals = list(senders.refusals)
            assert sampler.samples > 100
            assert low >= STOP_WATER // 2, (
                f"the volume fell to {low} bytes free (stop water {STOP_WATER}); answers "
                f"{dict(senders.statuses)}:\n{server.tail(30)}"
            )
            assert low < LOW_WATER, f"the load never reached low water ({low} bytes free)"
            assert refusals and all(status == 503 for status, _, _ in refusals), Counter(
                s for s, _, _ in refusals
            )
            for _status, body, headers in refusals:
                assert headers.get("retry-after") == "1", headers
                assert b"disk below stop water" in body, body
                assert f"disk.stop_water_bytes={STOP_WATER}".encode() in body, body
            refused = _metric(
                server,
                'ourios_ingest_requests_total{error_type="disk_stop_water",outcome="refused",'
                'transport="http"}',
            )
            assert refused is not None and refused >= len(refusals)
            # the WAL never met ENOSPC: admission refused before the volume was full
            assert not server.event("wal.segment.sealed"), server.event("wal.segment.sealed")
            # The store is still gone: a shutdown leaves acknowledged rows in the WAL only,
            # says how many and exits EX_TEMPFAIL (the next start publishes them).
            assert server.terminate() == EXIT_ROWS_LEFT, server.tail(10)
            (stopped,) = server.event("server.stopped")
            assert stopped["rows_left_in_wal"] > 0 and stopped["exit_code"] == EXIT_ROWS_LEFT


def _checkpoint_lsn(server: ServeProcess) -> float:
    return _metric(server, "ourios_wal_checkpoint_lsn_bytes") or 0.0


class LocalOutage:
    """The embedded ``file://`` store inside the data directory, on the same volume: its
    path goes through a symlink that an outage points at a regular file (every write then
    fails with ENOTDIR — root ignores permissions) and the store's return points back."""

    def __init__(self, data: Path) -> None:
        self.real = data / "objects"
        self.real.mkdir()
        self.blocker = data / "store-gone"
        self.blocker.write_text("the store is away")
        self.link = data / "store"
        self._point(self.real)
        self.url = (self.link / "objects").as_uri()

    def _point(self, target: Path) -> None:
        tmp = self.link.with_name("store.new")
        tmp.symlink_to(target)
        os.replace(tmp, self.link)  # atomic: the store is either there or not

    def kill(self) -> None:
        self._point(self.blocker)

    def restart(self) -> None:
        self._point(self.real)


def _objects(root: Path) -> int:
    return sum(1 for p in root.rglob("*.parquet"))


@pytest.mark.parametrize("store", ["s3", "file"])
def test_nowedge_2_a_volume_filled_to_zero_recovers_without_a_restart(
    tmp_path: Path, small_tmpfs: TmpfsMounts, store: str
) -> None:
    data = small_tmpfs(VOLUME)
    with contextlib.ExitStack() as stack:
        if store == "s3":
            weed = stack.enter_context(_seaweed(tmp_path))
            env = _env(S3Bucket.create(weed))
            outage: SeaweedS3 | LocalOutage = weed
        else:
            local = LocalOutage(data)
            env = {**_env(None), "OURIOS_STORE_URL": local.url}
            outage = local
        server = stack.enter_context(ServeProcess(data, env))
        # the first write to find the volume full: the cut's snapshot install (S3), or
        # the cut's publish before it (the embedded store's objects on this volume)
        first = "the snapshot of tenant" if store == "s3" else "the store's write of"
        _filled_to_zero(server, data, outage, random.Random(18_2), first)
        if store == "file":
            assert _objects(local.real) > 0


def _filled_to_zero(
    server: ServeProcess,
    data: Path,
    outage: SeaweedS3 | LocalOutage,
    rng: random.Random,
    first: str,
) -> None:
    filler = data / "outside-filler"
    pid = server.proc.pid if server.proc else None
    for i in range(5):
        assert server.post_logs(_batch(rng, f"before{i}"))[0] == 200
    _wait(lambda: _checkpoint_lsn(server) > 0, "a first checkpoint", server, 30)
    outage.kill()  # the store is gone: what follows stays in the WAL
    # the WAL grows until admission stops it at stop water (~30 MiB of frames)
    for i in range(5000):
        status, body, _ = server.post_logs(_batch(rng, f"outage{i}"))
        if status != 200:
            break
    assert status == 503 and b"disk below stop water" in body, (status, body)
    segments = _metric(server, "ourios_wal_segments") or 0
    assert segments >= 20, segments
    mark = _checkpoint_lsn(server)
    assert (data / "disk-reserve").stat().st_size == RESERVE
    size = fill_volume(filler)  # every free byte, never removed
    assert free_bytes(data) == 0 and size > 0
    status, body, _ = server.post_logs(_batch(rng, "full"))
    assert status == 503, (status, body)
    back = time.monotonic()
    outage.restart()  # the store is back (SeaweedFS: the same ports, the same data)
    # publish, snapshot (into the released reserve), checkpoint, reclaim
    _wait(lambda: _checkpoint_lsn(server) > mark, "a later checkpoint", server, 60)
    _wait(
        lambda: (_metric(server, "ourios_wal_segments") or segments) < segments / 2,
        "reclamation",
        server,
        60,
    )

    def accepted() -> bool:
        return server.post_logs(_batch(rng, "after"))[0] == 200

    _wait(accepted, "admission again", server, 60)
    assert time.monotonic() - back < 60
    assert filler.exists() and filler.stat().st_size == size  # never removed
    assert server.proc is not None and server.proc.pid == pid  # no restart
    released = server.event("disk.reserve.released")
    assert len(released) == 1 and first in str(released[0]["cause"]), released
    assert "No space left on device" in str(released[0]["cause"])
    restored = server.event("disk.reserve.restored")
    assert len(restored) == 1 and (data / "disk-reserve").stat().st_size == RESERVE
    assert not server.event("snapshot.install.failed")  # the reserve made room in time
    recovered = server.event("disk.recovered")
    assert recovered and recovered[-1]["from"] == "stop_water", _story(server)
    assert server.terminate() == 0

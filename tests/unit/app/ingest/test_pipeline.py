"""The ingest pipeline on a real journal and an in-memory store: commit-ordered turns,
own-frame marks, the error mapping, the size trigger, parking and requeueing, and the
start-up replay's checkpoint gate."""

from __future__ import annotations

import errno
import io
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from app.base.batch import FlatBatch
from app.base.rejections import PayloadTooLarge, Unavailable
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import MineResult
from app.ingest.pipeline import Pipeline, ReadWriteLock, TurnGate
from app.node.recovery import recover
from app.receive.otlp import decode_request, flatten
from sink.buffers import Buffers
from sink.publisher import Publisher
from sink.testing import FailingStore, MemoryStore
from tests.support.walkit import faulty
from wal import Journal, WalConfig
from wal.testing import FaultyFs

CFG = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=32 * 1024)


def request(n: int, tag: str = "r", tenant_attr: str = "x") -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    kv = rl.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    sl = rl.scope_logs.add()
    for i in range(n):
        rec = sl.log_records.add()
        rec.time_unix_nano = 1_764_000_000_000_000_000 + i
        rec.severity_number = 9
        rec.body.string_value = f"{tag} request {i} took {i * 3} ms for user u{i % 7}"
        a = rec.attributes.add()
        a.key, a.value.string_value = "rid", f"{tag}-{i}"
    return req


def body(req: ExportLogsServiceRequest) -> tuple[bytes, FlatBatch]:
    data = req.SerializeToString()
    return data, flatten(decode_request(data, "application/x-protobuf"), "t")


class Rig:
    def __init__(
        self,
        tmp: Path,
        *,
        store: MemoryStore | FailingStore | None = None,
        flush_bytes: int = 1 << 30,
        queue_depth: int = 64,
        fs: FaultyFs | None = None,
    ) -> None:
        self.root = tmp / "wal"
        self.journal = Journal.open(self.root, CFG, fs=fs)
        self.store = store if store is not None else MemoryStore()
        holder: dict[str, Pipeline] = {}
        self.buffers = Buffers(
            flush_bytes=flush_bytes,
            clock=time.monotonic,
            epoch=lambda: holder["p"].epoch if "p" in holder else 1,
        )
        self.publisher = Publisher(self.store, self.buffers, node="test-0", queue_depth=queue_depth)
        self.miners = MinerCluster(CountingAllocator())
        self.pipeline = Pipeline(self.journal, self.miners, self.buffers, self.publisher)
        holder["p"] = self.pipeline

    def ingest(self, req: ExportLogsServiceRequest, tenant: str = "t") -> int:
        data, batch = body(req)
        return self.pipeline.ingest(tenant, data, batch, "test").records

    def close(self) -> None:
        self.publisher.close()
        self.journal.close()


def test_turn_gate_runs_turns_in_sequence_whatever_the_arrival_order() -> None:
    gate = TurnGate()
    order: list[int] = []
    entered = threading.Barrier(6)

    def turn(seq: int) -> None:
        entered.wait()
        gate.enter(seq)
        order.append(seq)
        gate.leave(seq)

    threads = [threading.Thread(target=turn, args=(s,)) for s in (5, 3, 1, 4, 2)]
    for t in threads:
        t.start()
    entered.wait()
    for t in threads:
        t.join()
    assert order == [1, 2, 3, 4, 5]
    assert gate.next_seq == 6


def test_read_write_lock_excludes_and_prefers_the_writer() -> None:
    lock = ReadWriteLock()
    holding = threading.Event()
    release = threading.Event()
    log: list[str] = []

    def reader() -> None:
        with lock.shared():
            holding.set()
            release.wait(10)
            log.append("reader-done")

    r = threading.Thread(target=reader)
    r.start()
    assert holding.wait(10)
    writer_in = threading.Event()

    def writer() -> None:
        with lock.exclusive():
            writer_in.set()
            log.append("writer")

    w = threading.Thread(target=writer)
    w.start()
    # a new reader arriving while the writer waits queues behind it
    late: list[str] = []

    def late_read() -> None:
        lock.shared().__enter__()
        late.append("late")

    late_reader = threading.Thread(target=late_read)
    assert not writer_in.wait(0.05)
    release.set()
    r.join()
    w.join()
    late_reader.start()
    late_reader.join()
    assert log == ["reader-done", "writer"] and late == ["late"]


def test_rows_carry_the_frames_own_end_and_the_mark_follows_each_turn(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.ingest(request(3, "a"))
        first = rig.pipeline.last_durable
        rig.ingest(request(2, "b"))
        second = rig.pipeline.last_durable
        assert first is not None and second is not None and first < second
        assert rig.pipeline.folded["t"] == second
        detached = rig.buffers.drain_all("test")
        rows = [d for d in detached if d.partition.records is not None][0].partition.records
        assert rows is not None
        assert rows.wal_lsn == [first.lsn] * 3 + [second.lsn] * 2
        assert [r.split()[0] for r in rows.body] == ["a"] * 3 + ["b"] * 2
        for d in detached:
            rig.publisher.publish(d)
    finally:
        rig.close()


def test_concurrent_ingest_mines_in_commit_order(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    seen: list[int] = []
    real = rig.miners.mine

    def recording(tenant: str, bodies: Sequence[str]) -> MineResult:
        seen.append(int(bodies[0].split()[0][1:]))
        return real(tenant, bodies)

    rig.miners.mine = recording  # type: ignore[method-assign]
    offsets: dict[int, int] = {}
    lock = threading.Lock()

    def send(k: int) -> None:
        for j in range(10):
            n = k * 100 + j
            rig.ingest(request(1, f"n{n}"))
            with lock:
                assert rig.pipeline.last_durable is not None
                offsets[n] = rig.pipeline.last_durable.lsn

    try:
        threads = [threading.Thread(target=send, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # the miner saw the frames in their WAL order, which is replay's order
        rows = rig.buffers.drain_all("test")
        lsns = [lsn for d in rows if d.partition.records for lsn in d.partition.records.wal_lsn]
        assert lsns == sorted(lsns) and len(lsns) == 80
        assert len(seen) == 80
    finally:
        rig.close()


def test_an_oversize_frame_is_payload_too_large_and_writes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        big = request(200, "x" * 300)
        with pytest.raises(PayloadTooLarge) as info:
            rig.ingest(big)
        assert info.value.http_status == 413
        assert rig.journal.end_lsn == 0
    finally:
        rig.close()


def test_a_failed_sync_is_unavailable_and_the_next_turn_still_runs(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    rig = Rig(tmp_path, fs=fs)
    try:
        rig.ingest(request(1, "ok"))
        fs.fail("fsync", "*.wal", errno=errno.EIO)
        with pytest.raises(Unavailable) as info:
            rig.ingest(request(1, "lost"))
        assert info.value.http_status == 503 and "transient" in info.value.message
        assert rig.ingest(request(2, "after")) == 2  # the failed turn passed the gate
        bodies = [
            b
            for d in rig.buffers.drain_all("t")
            if d.partition.records
            for b in d.partition.records.body
        ]
        assert not [b for b in bodies if b.startswith("lost")]
    finally:
        rig.close()


def test_the_size_trigger_publishes_and_a_full_queue_parks_without_losing_rows(
    tmp_path: Path,
) -> None:
    store = FailingStore(MemoryStore())
    hold = store.hold(ops=("put",))
    rig = Rig(tmp_path, store=store, flush_bytes=2000, queue_depth=1)
    rig.publisher.start()
    try:
        for k in range(6):  # each batch crosses flush_bytes: one detach per batch
            rig.ingest(request(20, f"b{k}"))
        assert hold.reached.wait(10)  # the publisher thread is stuck on its first put
        # one partition is being written, one queued; the rest were parked back
        assert rig.buffers.partitions >= 1
        hold.release()
    finally:
        rig.publisher.close()
    for d in rig.buffers.drain_all("flush"):
        assert rig.publisher.publish(d).ok
    total = sum(len(pq.read_table(io.BytesIO(store.get(k)))) for k in store.list("records/"))
    assert total == 6 * 20


def test_a_failed_publish_requeues_its_rows_and_counts_the_error(tmp_path: Path) -> None:
    store = FailingStore(MemoryStore())
    store.fail(ops=("put",), nth=1, error_type="s3_5xx")
    rig = Rig(tmp_path, store=store)
    try:
        rig.ingest(request(5, "z"))
        detached = rig.buffers.drain_all("barrier")
        outcomes = [rig.publisher.publish(d) for d in detached]
        assert not all(o.ok for o in outcomes)
        assert any(o.error_type == "s3_5xx" and o.requeue_epoch is not None for o in outcomes)
        # the audit put failed and refused the records that reference its events
        assert rig.publisher.stats.failures == {
            ("audit", "s3_5xx"): 1,
            ("records", "audit_not_durable"): 1,
        }
        again = rig.buffers.drain_all("barrier")
        assert sum(d.partition.rows for d in again) == sum(
            d.partition.rows for d, o in zip(detached, outcomes, strict=True) if not o.ok
        )
        assert all(rig.publisher.publish(d).ok for d in again)
        assert len(rig.buffers.in_flight) == 0
    finally:
        rig.close()


def test_recovery_replays_every_frame_and_gates_the_sink_on_the_checkpoint(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    for k in range(4):
        rig.ingest(request(3, f"k{k}"))
    mark = rig.pipeline.last_durable
    assert mark is not None
    rig.journal.checkpoint(mark)  # as if everything so far were published
    rig.ingest(request(2, "after"))
    rig.close()  # the buffers are dropped: a crash

    again = Rig(tmp_path)
    try:
        report = recover(again.journal, again.pipeline)
        assert report.frames == 5
        assert report.records_suppressed == 12 and report.records_replayed == 2
        rows = [
            b
            for d in again.buffers.drain_all("t")
            if d.partition.records
            for b in d.partition.records.body
        ]
        assert sorted(r.split()[0] for r in rows) == ["after", "after"]
        # the miner was fed every frame, so the tenant's templates are rebuilt
        assert again.miners.get("t") is not None
        assert again.miners.get("t").template_count >= 1  # type: ignore[union-attr]
    finally:
        again.close()

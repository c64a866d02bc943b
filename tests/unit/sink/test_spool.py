"""The memory bound (issue 21 item 1, DESIGN.md §5.12): ``sink/spool.py`` and the
pieces of ``sink/buffers.py`` and ``sink/publisher.py`` it rests on.

- rows past the spill mark go to the spool when the store does not take them, and the
  rows in memory come down to the spill target (``..._spill_to_the_spool...``);
- a spooled unit is published from its file under the name it was spooled with, once,
  with the conditional create, and its file leaves the disk (``..._published_from...``);
- its intent is recorded once however many attempts it takes, and a clean failure of a
  publish in memory takes its intent back (``..._one_intent_per_object...``);
- the turn waits for room at the ceiling while the spiller works, and gives up after its
  timeout when nothing is done (``..._the_turn_waits...``);
- the spool left by a previous run is discarded, and disk admission counts what the
  spool writes and frees (``..._disk_admission_counts_the_spool``);
- no partition grows past ``max_object_bytes`` (size trigger, requeue, encoded split);
- the store gate lets one probe a second through while the store is down.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.base.diskspace import DiskSpace
from app.ingest.landed import intent_hook, retract_hook
from sink.buffers import Buffers, Detached
from sink.publisher import STORE_UNAVAILABLE, Publisher, StoreGate, Ticket
from sink.spool import OBJECT_TOO_LARGE, Spiller, Spool
from sink.store import StoreError
from sink.testing import FailingStore, MemoryStore
from tests.support.sinkrows import frame_rows
from wal import IntentLog, OsFs

DAY = 20_000
CEILING = 64 << 10
TENANTS = ("acme", "globex")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """Buffers under a small ceiling, a publisher over a store that can fail, a spool
    in ``tmp_path`` and the intents in ``tmp_path/wal``."""

    def __init__(self, tmp_path: Path, *, max_object_bytes: int = 1 << 30) -> None:
        self.memory = MemoryStore()
        self.store = FailingStore(self.memory)
        self.clock = Clock()
        self.buffers = Buffers(
            flush_bytes=1 << 30,
            clock=self.clock,
            epoch=lambda: 1,
            ceiling_bytes=CEILING,
            max_object_bytes=max_object_bytes,
        )
        (tmp_path / "wal").mkdir()
        self.intents = IntentLog.open(OsFs(), tmp_path / "wal")
        self.spool = Spool(tmp_path / "spool", read_budget=CEILING // 4)
        self.spool.clear()
        self.gate = StoreGate(clock=self.clock)
        self.publisher = Publisher(
            self.store,
            self.buffers,
            node="n0",
            intents=intent_hook(self.intents),
            retract=retract_hook(self.intents),
            spool=self.spool,
            gate=self.gate,
            max_object_bytes=max_object_bytes,
        )
        self.spiller = Spiller(self.buffers, self.publisher.spill)
        self.lsn = 0

    def fill(self, nbytes: int, rows: int = 20) -> None:
        """Append frames round-robin over the tenants until ``nbytes`` more are held."""
        target = self.buffers.held_bytes + nbytes
        while self.buffers.held_bytes < target:
            self.lsn += 100
            tenant = TENANTS[(self.lsn // 100) % len(TENANTS)]
            self.buffers.add_records(
                tenant, DAY, frame_rows(tenant, DAY, self.lsn, rows), wal_lsn=self.lsn, nbytes=400
            )

    def store_down(self) -> None:
        self.store.fail(always=True, error_type="s3_connection")

    def store_up(self) -> None:
        self.store.clear()
        self.clock.now += 10  # past the gate's next probe

    def publish_everything(self) -> list[bool]:
        return [self.publisher.publish(d).ok for d in self.buffers.drain_all("barrier")]

    def stored_lsns(self) -> Counter[int]:
        found: Counter[int] = Counter()
        for key, data in self.memory.snapshot().items():
            if key.startswith("records/"):
                table = pq.read_table(pa.BufferReader(data))
                found.update(table.column("wal_lsn").to_pylist())
        return found


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_bounded_1_rows_past_the_spill_mark_spill_to_the_spool_and_memory_comes_down(
    rig: Rig,
) -> None:
    rig.store_down()
    rig.fill(2 * CEILING)  # twice the ceiling: no turn waits here, the spiller catches up
    assert rig.buffers.held_bytes > CEILING and rig.buffers.pressure.is_set()
    spilled = rig.spiller.spill_once()
    assert spilled > 0
    assert rig.buffers.held_bytes <= rig.buffers.spill_target
    units, size = rig.buffers.spooled
    assert units == rig.spool.files > 0 and size == rig.spool.bytes > 0
    # the rows left memory but are still counted where a shutdown counts them
    assert rig.buffers.unpublished_rows()[0] == 20 * (rig.lsn // 100)
    assert not rig.memory.snapshot(), "nothing reached the store"


def test_bounded_1_a_spooled_unit_is_published_from_its_file_once_under_its_name(
    rig: Rig,
) -> None:
    rig.store_down()
    rig.fill(2 * CEILING)
    rig.spiller.spill_once()
    names = {f.name for f in rig.spool.root.iterdir()}
    assert names
    for _ in range(3):  # cuts retrying while the store is down change nothing
        rig.clock.now += 10
        assert not all(rig.publish_everything())
    rig.store_up()
    assert all(rig.publish_everything())
    assert rig.buffers.empty() and rig.spool.files == 0
    assert not list(rig.spool.root.iterdir()), "published spool files leave the disk"
    stored = rig.stored_lsns()
    assert set(stored) == set(range(100, rig.lsn + 1, 100))
    assert set(stored.values()) == {20}, "every frame's rows are in the store once"
    keys = {k.rsplit("/", 1)[1] for k in rig.memory.snapshot()}
    assert {n.split("-", 1)[1] for n in names} <= keys, "spooled under the names they keep"
    assert "put_if_absent" in {op for op, _ in rig.store.calls}


def test_bounded_1_one_intent_per_object_that_may_exist_not_one_per_attempt(
    rig: Rig,
) -> None:
    rig.fill(CEILING // 4)
    rig.store_down()
    for _ in range(5):  # clean failures: each takes its intent back
        rig.clock.now += 10
        assert not any(rig.publish_everything())
    assert len(rig.intents) == 0
    rig.fill(2 * CEILING)
    rig.spiller.spill_once()
    spooled = rig.spool.files
    assert len(rig.intents) == spooled > 0  # one per spooled object
    for _ in range(5):
        rig.clock.now += 10
        rig.publish_everything()
    assert len(rig.intents) == spooled, "a retried spooled unit records nothing new"
    claims = sum(len(r.frames) for r in rig.intents.records())
    assert claims <= rig.lsn // 100, "every frame is claimed at most once"


def test_bounded_1_the_turn_waits_for_room_while_the_spiller_works(rig: Rig) -> None:
    rig.store_down()
    rig.fill(CEILING)
    assert rig.buffers.held_bytes >= CEILING
    assert rig.buffers.wait_for_room(timeout=0) == pytest.approx(0, abs=1)
    assert rig.buffers.room_timeouts == 1, "nothing freed memory: the wait gave up"
    rig.spiller.start()
    try:
        rig.buffers.wait_for_room(timeout=60)
    finally:
        assert rig.spiller.close()
    assert rig.buffers.held_bytes < CEILING and rig.buffers.room_timeouts == 1


def test_bounded_1_the_spool_of_a_previous_run_is_discarded_and_disk_admission_counts_the_spool(
    tmp_path: Path,
) -> None:
    root = tmp_path / "spool"
    root.mkdir()
    (root / "records-old.parquet").write_bytes(b"x" * 5000)
    (root / ".records-old.parquet.ab.tmp").write_bytes(b"y" * 10)
    space = DiskSpace(tmp_path, measure=lambda path: 10 << 20, block=4096)
    space.sample()
    spool = Spool(root, on_write=space.wrote, on_free=space.freed)
    assert spool.clear() == (2, 5010) and not list(root.iterdir())
    f = spool.write("records", "n0-a", b"z" * 10_000)
    assert space.written_since_sample() == 12_288  # three blocks
    assert space.free_bytes == (10 << 20) - 12_288
    f.discard()
    f.discard()  # twice: nothing more
    assert space.written_since_sample() == 0 and spool.files == 0


def test_bounded_1_no_partition_grows_past_max_object_bytes(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_object_bytes=16 << 10)
    detached: list[Detached] = []
    for lsn in range(100, 10_000, 100):
        d = rig.buffers.add_records(
            "acme", DAY, frame_rows("acme", DAY, lsn, 20), wal_lsn=lsn, nbytes=400
        )
        if d is not None:
            detached.append(d)
    assert detached, "the size trigger fired on the rows' size"
    assert all(d.partition.mem_bytes < (16 << 10) + 8192 for d in detached)
    rig.store_down()
    for d in detached:  # failed and put back: never merged past the bound
        rig.publisher.publish(d)
    for d in rig.buffers.drain_all("barrier"):
        assert d.partition.mem_bytes < 2 * ((16 << 10) + 8192)


def test_bounded_1_an_encoded_object_over_max_object_bytes_is_split(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_object_bytes=1 << 30)
    for lsn in (100, 200, 300, 400):
        rig.buffers.add_records(
            "acme", DAY, frame_rows("acme", DAY, lsn, 50), wal_lsn=lsn, nbytes=10
        )
    rig.publisher.max_object_bytes = 2000  # below the encoded size of four frames
    (d,) = rig.buffers.drain_all("barrier")
    outcome = rig.publisher.publish(d)
    assert not outcome.ok and outcome.error_type == OBJECT_TOO_LARGE
    halves = rig.buffers.drain_all("barrier")
    assert [h.partition.rows for h in halves] == [100, 100]
    rig.publisher.max_object_bytes = 1 << 30
    assert all(rig.publisher.publish(h).ok for h in halves)
    assert rig.stored_lsns() == Counter({100: 50, 200: 50, 300: 50, 400: 50})


def test_bounded_1_while_the_store_is_down_one_publish_a_second_probes_it() -> None:
    clock = Clock()
    events: list[str] = []
    gate = StoreGate(clock=clock, events=lambda name, fields: events.append(name))
    assert gate.admit() is Ticket.OPEN
    gate.done(Ticket.OPEN, StoreError("put", "k", "s3_connection", "refused"))
    assert gate.down and events == ["sink.store.unavailable"]
    assert gate.admit() is Ticket.REFUSED  # before the next probe is due
    clock.now += 1.0
    assert gate.admit() is Ticket.PROBE
    assert gate.admit() is Ticket.REFUSED  # one probe at a time
    gate.done(Ticket.PROBE, StoreError("put", "k", "s3_5xx", "busy"))
    clock.now += 1.0
    ticket = gate.admit()
    assert ticket is Ticket.PROBE
    gate.done(ticket, True)
    assert (gate.down, events) == (False, ["sink.store.unavailable", "sink.store.available"])
    # an object's own error (not the store being down) leaves the gate open
    gate.done(Ticket.OPEN, StoreError("put", "k", "s3_access_denied", "no"))
    assert gate.admit() is Ticket.OPEN


def test_a_publish_the_gate_refuses_requeues_without_touching_the_store(rig: Rig) -> None:
    rig.fill(CEILING // 4)
    rig.store_down()
    first, *rest = rig.buffers.drain_all("barrier")
    assert not rig.publisher.publish(first).ok
    calls = len(rig.store.calls)
    outcomes = [rig.publisher.publish(d) for d in rest]
    assert all(o.error_type == STORE_UNAVAILABLE for o in outcomes)
    assert len(rig.store.calls) == calls and len(rig.intents) == 0


def test_the_spiller_stops_a_round_when_a_spool_write_fails(rig: Rig) -> None:
    rig.store_down()
    rig.fill(2 * CEILING)
    held = rig.buffers.held_bytes
    rig.spool.root.rmdir()  # every write fails now
    assert rig.spiller.spill_once() == 1
    assert rig.buffers.held_bytes == held, "the rows went back into memory"
    assert rig.spool.write_failures == 1

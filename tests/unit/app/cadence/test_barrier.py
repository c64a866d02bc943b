"""The publication barrier (``app/cadence/barrier.py``) against RFC 0052's RFC0052.1 and
RFC0052.14, on a ``NodeRig``: a real journal on a ``FaultyFs``, the real pipeline,
buffers, publisher, snapshot store and housekeeper, a store double and a stepped clock.
Interleavings are made with threads plus named sync points (``app.points``), store
holds and fs faults. Nothing sleeps; every wait is bounded and fails the test.

Legs → tests (seed ``000_21bfad6f2285f3e3.txt``). Scenario RFC0052.1:

- healthy store, both sinks drained → the checkpoint is the barrier's mark; a failed
  flush → no checkpoint, rows requeued, published and stamped by the next cut:
  ``test_rfc0052_1_healthy_store_stamps_the_last_turns_own_end``,
  ``test_rfc0052_1_failed_flush_requeues_and_the_next_cut_stamps``.
- either sink retaining anything → no checkpoint attempted:
  ``test_rfc0052_1_either_sink_retaining_anything_stamps_nothing``.
- high-water mark None (fresh node, restarted node) → no checkpoint attempted:
  ``test_rfc0052_1_no_mark_attempts_no_checkpoint``.
- the latch: every later cut neither checkpoints nor snapshots, however many passes,
  until a restart: ``test_rfc0052_1_mining_failure_latches_every_later_cut_until_restart``.
- a publish registered before the barrier that fails (seed: panics) while the barrier
  waits → no stamp, no snapshots, its records not lost:
  ``test_rfc0052_1_prior_publish_failing_while_the_barrier_waits``.
- an encode worker panicking mid-batch, alone and concurrently with a barrier → a turn
  whose mining raises: ``test_rfc0052_1_mining_failure_latches_every_later_cut_until_restart``,
  ``test_rfc0052_1_turn_failing_concurrently_with_a_barrier_latches_its_cut``.
- a panic in the barrier tick latches its epoch, invalidates the pending slot, and the
  next tick runs; a housekeeping tick that raises counts ``cadence_panic`` and the next
  pass re-plans:
  ``test_rfc0052_1_raising_barrier_tick_latches_and_the_next_tick_runs``,
  ``test_rfc0052_1_barrier_thread_logs_counts_a_raising_tick_and_takes_the_next``,
  ``test_housekeeping.py::test_rfc0052_1_raising_housekeeping_pass_counts_and_the_next_pass_replans``.
- a batch queued before cut E's capture carries epoch E; a partition detached before
  the capture and enqueued after it is covered (the cut waits for it); a failed send
  parks → the full-queue park:
  ``test_rfc0052_1_partition_detached_before_the_capture_and_queued_after_is_covered``.
- several partitions detached by one batch are all waited for:
  ``test_rfc0052_1_every_partition_one_turn_detached_is_waited_for``.
- a publisher panic with batches queued behind it:
  ``test_rfc0052_1_publisher_exception_requeues_its_batch_and_the_queue_drains``.
- records are not published ahead of their template events when those fail:
  ``test_rfc0052_1_records_never_land_ahead_of_their_template_events``.
- a failed checkpoint write → the barrier reports success, the mark is unchanged, and
  housekeeping reclaims only what the previous mark allowed:
  ``test_rfc0052_1_failed_checkpoint_write_keeps_the_previous_mark``.
- requeue epochs: a failed publish refuses only cuts captured before its requeue:
  ``test_rfc0052_1_a_requeue_refuses_only_cuts_captured_before_it``.

Scenario RFC0052.14:

- the mark is read after the quiesce, under the same exclusion:
  ``test_rfc0052_14_mark_is_read_after_the_quiesce_under_the_exclusion``.
- a turn's own frame end, never the sync's EOF (one fsync covering two turns, a cut
  between them); nothing replayed is ever a mark:
  ``test_rfc0052_14_own_frame_mark_across_a_two_turn_flush``,
  ``test_rfc0052_14_nothing_replayed_is_ever_a_mark``.
- a capture past the pending cut's ceiling parks all it drained and advances nothing
  (and, under the ceiling, coalesces):
  ``test_rfc0052_14_coalescing_capture_under_and_over_the_ceiling``.
- the idle rotation rotates before the capture:
  ``test_rfc0052_14_idle_rotation_rotates_before_the_capture``.
- a pre-cut batch that detached a partition mid-batch has the rest in the cut:
  ``test_rfc0052_14_rest_of_a_turn_that_detached_mid_batch_is_in_the_cut``.
- several partitions from one pre-cut batch:
  ``test_rfc0052_1_every_partition_one_turn_detached_is_waited_for``.
- a rotation-fired cut does no store I/O inside the turn:
  ``test_rfc0052_14_rotation_fired_cut_does_no_store_io_in_the_turn``.
- cuts strictly ordered; a pending cut inherits the running cut's outcome:
  ``test_rfc0052_14_pending_cut_inherits_the_running_cuts_outcome``.
- a failed publish refuses only the cuts captured before its requeue:
  ``test_rfc0052_14_one_failed_publish_never_refuses_the_later_cuts``.
- a publish registered after the cut that fails is neither stamped over nor lost:
  ``test_rfc0052_14_publish_registered_after_the_cut_that_fails_is_not_lost``.

What does not apply here, and why. There is no encode pool (DESIGN.md §5, §12): an
ingest turn mines and appends its rows into the buffers itself, under the shared
exclusion, so the pool's pending count, the BatchGuard and a batch's shared completion
do not exist. Their legs become turn legs (a mining exception is the worker's panic;
the capture waits for a turn through the exclusion) and publisher legs (each
partition a turn detaches is registered in flight on its own, under the sink lock,
inside the turn, and enqueued after the turn releases the exclusion). Publisher and
sweep exceptions requeue instead of dropping (DESIGN.md §5), so their "panics" are
asserted as requeues that refuse the cuts captured before them and latch nothing. The
one publisher thread survives an exception in a publish, so the respawn and the
closed-channel claim do not exist; a full queue's park is what a failed send becomes.
The publisher is sequential, so "completing in any order" is the queue's order. A
JoinError at shutdown belongs to ``app/node/server.py``'s shutdown, not to this module.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from app import points
from app.base.rejections import Unavailable
from app.cadence.barrier import Barrier, CutOutcome
from app.cadence.sweep import AgeSweep
from app.ingest.cuts import Cut
from app.ingest.pipeline import LATCH_CLEAR, ReadWriteLock
from app.ingest.snapshot_store import decode_snapshot
from app.receive.otlp import decode_request, flatten
from sink.buffers import NANOS_PER_DAY, Detached
from sink.store import StoreError
from tests.support.noderig import NodeRig, checkpoint, request, rids, rig_factory, step
from tests.support.threads import Worker
from wal import FrameSpan, WalConfig, WalOffset
from wal.types import CommitOutcome

T = TypeVar("T")

#: every bounded wait in this file (a broken interleaving fails instead of hanging)
WAIT_S = 10.0
#: how long a step that should return at once may take before it is called a hang
HANG_S = 3.0
#: records per frame when filling a 64 KiB segment (≈11 KiB a frame, five a segment)
BIG = 200
SEGMENT_AGE = WalConfig().segment_age_secs


# -- helpers -------------------------------------------------------------------------


class GatedPut:
    """Stands in for ``store.put``. Calls whose key starts with ``prefix`` are counted:
    number ``hold`` blocks until ``release()`` (``reached`` is set when it blocks), a
    number in ``errors`` raises that error instead of writing. While ``failing`` is set
    every call raises it."""

    def __init__(
        self,
        inner: Callable[[str, bytes], None],
        *,
        hold: int | None = None,
        errors: dict[int, BaseException] | None = None,
        prefix: str = "",
    ) -> None:
        self._inner = inner
        self._hold = hold
        self._errors = errors or {}
        self._prefix = prefix
        self._lock = threading.Lock()
        self._go = threading.Event()
        self.reached = threading.Event()
        self.failing: BaseException | None = None
        self.calls = 0
        self.threads: list[str] = []

    def release(self) -> None:
        self._go.set()

    def __call__(self, key: str, data: bytes) -> None:
        with self._lock:
            self.threads.append(threading.current_thread().name)
            n = 0
            if key.startswith(self._prefix):
                self.calls += 1
                n = self.calls
        if n == self._hold:
            self.reached.set()
            if not self._go.wait(WAIT_S):
                raise StoreError("put", key, "hold_timeout", "the test never released it")
        error = self._errors.get(n) or self.failing
        if error is not None:
            raise error
        self._inner(key, data)


class WatchedLock(ReadWriteLock):
    """The barrier exclusion, with an event set when a capture starts asking for it."""

    def __init__(self) -> None:
        super().__init__()
        self.writer_arrived = threading.Event()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        self.writer_arrived.set()
        with super().exclusive():
            yield


@dataclass
class Settled:
    """A ``Pending`` whose covering fsync already returned (its outcome kept)."""

    seq: int
    outcome: CommitOutcome
    span: FrameSpan

    def wait(self) -> CommitOutcome:
        return self.outcome


@dataclass
class Fill:
    """Frames ingested until one landed in a new segment."""

    closed: list[str] = field(default_factory=list)  # tags of frames in the old segment
    rotating: str = ""  # the tag of the turn that observed the segment change
    prev: WalOffset | None = None  # the last acknowledged frame end in the old segment
    rotated: WalOffset | None = None  # the rotating turn's own frame end

    @property
    def prev_mark(self) -> WalOffset:
        assert self.prev is not None
        return self.prev

    @property
    def rotated_mark(self) -> WalOffset:
        assert self.rotated is not None
        return self.rotated


def fill_to_rotation(rig: NodeRig, tenant: str, prefix: str) -> Fill:
    fill = Fill()
    for i in range(64):
        tag = f"{prefix}{i}"
        segment = rig.journal.current_segment
        before = last_durable(rig)
        mark = rig.ingest(tenant, tag, BIG)
        if mark.segment != segment:
            fill.rotating, fill.prev, fill.rotated = tag, before, mark
            return fill
        fill.closed.append(tag)
    raise AssertionError("the segment never rotated")


def all_rids(*groups: tuple[Sequence[str], int]) -> list[str]:
    out: list[str] = []
    for tags, n in groups:
        for tag in tags:
            out.extend(rids(tag, n))
    return sorted(out)


def published(rig: NodeRig) -> list[str]:
    return sorted(rig.published_rids())


def horizon(rig: NodeRig, tenant: str) -> WalOffset | None:
    """The installed snapshot's horizon for ``tenant`` (None when no file)."""
    path = rig.snapshots.path_of(tenant)
    if not path.exists():
        return None
    return decode_snapshot(path.read_bytes(), path).horizon


def last_durable(rig: NodeRig) -> WalOffset | None:
    """The pipeline's mark (a call, so that mypy does not narrow it)."""
    return rig.pipeline.last_durable


def checkpoint_writes(rig: NodeRig) -> int:
    """How many times a CHECKPOINT write was attempted (its temp opened)."""
    return sum(
        1 for op, p in rig.fs.log if op == "open" and p is not None and p.name == "CHECKPOINT.tmp"
    )


def wait_settled(rig: NodeRig) -> None:
    """Wait for every publish registered so far to settle (durable or requeued)."""
    for item in rig.buffers.in_flight.pending_upto(sys.maxsize):
        assert item.wait(WAIT_S), f"publish {item.detached.id} never settled"


def audit_unique(rig: NodeRig) -> int:
    """The audit rows in the store, asserting none is there twice."""
    rows = rig.audit_rows()
    keys = Counter((r["tenant"], r["template_id"], r["template_version"]) for r in rows)
    assert all(n == 1 for n in keys.values()), f"audit rows published twice: {keys}"
    return len(rows)


def ingest_request(rig: NodeRig, tenant: str, req: ExportLogsServiceRequest) -> WalOffset:
    data = req.SerializeToString()
    batch = flatten(decode_request(data, "application/x-protobuf"), tenant)
    rig.pipeline.ingest(tenant, data, batch, "test")
    mark = rig.pipeline.last_durable
    assert mark is not None
    return mark


def two_day_request(tag: str, n: int) -> ExportLogsServiceRequest:
    """``n`` records; the first one a day earlier than the rest."""
    req = request(tag, n)
    req.resource_logs[0].scope_logs[0].log_records[0].time_unix_nano -= NANOS_PER_DAY
    return req


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    yield from rig_factory(tmp_path)


@pytest.fixture
def gate_put(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., GatedPut]]:
    """``gate_put(rig, hold=…, errors=…, prefix=…)`` installs a ``GatedPut`` as the rig's
    ``store.put``; every gate is released before the rigs close."""
    gates: list[GatedPut] = []

    def install(rig: NodeRig, **kwargs: object) -> GatedPut:
        gate = GatedPut(rig.store.put, **kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(rig.store, "put", gate)
        gates.append(gate)
        return gate

    yield install
    for gate in gates:
        gate.release()


def failure(kind: str) -> BaseException:
    if kind == "store_error":
        return StoreError("put", "held", "injected", "held, then failed")
    return RuntimeError("injected publisher exception")


# -- RFC0052.1 -----------------------------------------------------------------------


def test_rfc0052_1_healthy_store_stamps_the_last_turns_own_end(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    rig.ingest("t1", "a")
    b = rig.ingest("t2", "b")
    c = rig.ingest("t1", "c")

    out = step(rig)

    assert out.ok and out.checkpointed and out.flush_failures == 0
    assert out.flushed == 4  # audit then records, per tenant
    assert out.mark == c == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b", "c"], 3))
    # each tenant's snapshot carries its own folded horizon, never the global mark
    assert horizon(rig, "t1") == c and horizon(rig, "t2") == b
    assert rig.buffers.empty() and len(rig.buffers.in_flight) == 0


def test_rfc0052_1_failed_flush_requeues_and_the_next_cut_stamps(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    a = rig.ingest("t", "a")
    assert step(rig).checkpointed and checkpoint(rig) == a
    writes = checkpoint_writes(rig)
    b = rig.ingest("t", "b")
    fault = rig.store.fail(ops=("put",), always=True)

    out = step(rig)

    assert fault.reached.is_set()
    assert not out.ok and out.flushed == 0 and out.flush_failures >= 1
    assert not out.checkpointed and out.mark == b
    assert checkpoint(rig) == a and checkpoint_writes(rig) == writes
    assert horizon(rig, "t") == a  # no snapshot installed either
    assert published(rig) == all_rids((["a"], 3))
    assert not rig.buffers.empty() and len(rig.buffers.in_flight) == 0  # requeued

    rig.store.clear()
    again = step(rig)

    assert again.ok and again.checkpointed and again.mark == b == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b"], 3))
    assert horizon(rig, "t") == b
    assert rig.buffers.empty()


@pytest.mark.parametrize(("kind", "nth"), [("audit", 1), ("records", 2)])
def test_rfc0052_1_either_sink_retaining_anything_stamps_nothing(
    make_rig: Callable[..., NodeRig], kind: str, nth: int
) -> None:
    rig = make_rig()
    a = rig.ingest("t", "a")
    rig.store.fail(ops=("put",), nth=nth)  # the cut flushes audit first, then records

    out = step(rig)

    # a failed audit half refuses the records that reference its events (write order)
    expected = (0, 2) if kind == "audit" else (1, 1)
    assert (out.flushed, out.flush_failures) == expected and not out.ok
    assert not out.checkpointed and checkpoint_writes(rig) == 0
    assert checkpoint(rig) is None
    assert horizon(rig, "t") is None
    assert not rig.buffers.empty()

    rig.store.clear()
    again = step(rig)

    assert again.checkpointed and checkpoint(rig) == a
    assert published(rig) == all_rids((["a"], 3))
    assert audit_unique(rig) >= 1
    assert horizon(rig, "t") == a


def test_rfc0052_1_no_mark_attempts_no_checkpoint(make_rig: Callable[..., NodeRig]) -> None:
    rig = make_rig()
    assert last_durable(rig) is None

    fresh = step(rig)

    assert fresh.mark is None and not fresh.checkpointed and fresh.snapshots_installed == 0
    assert checkpoint_writes(rig) == 0 and checkpoint(rig) is None
    assert not rig.snapshots.path_of("t").exists()

    a = rig.ingest("t", "a")
    assert step(rig).checkpointed
    writes = checkpoint_writes(rig)
    rig.restart()
    assert last_durable(rig) is None

    restarted = step(rig)

    assert restarted.mark is None and not restarted.checkpointed
    assert checkpoint_writes(rig) == writes
    assert checkpoint(rig) == a


@pytest.mark.parametrize("when", ["before_recheck", "while_waiting"])
@pytest.mark.parametrize("error", ["store_error", "exception"])
def test_rfc0052_1_prior_publish_failing_while_the_barrier_waits(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
    when: str,
    error: str,
) -> None:
    rig = make_rig(flush_bytes=1)  # every turn's partitions take the size trigger
    gate = gate_put(rig, hold=1, errors={1: failure(error)})
    rig.publisher.start()
    a = rig.ingest("t", "a")  # audit and records queued for the publisher; audit held
    assert gate.reached.wait(WAIT_S)
    assert rig.buffers.empty() and len(rig.buffers.in_flight) >= 2

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)
        if when == "before_recheck":
            gate.release()
            wait_settled(rig)
            flushed.release()
        else:
            flushed.release()  # the barrier goes on to wait for the held publish
            gate.release()
        out = barrier.join()

    assert out is not None and out.mark == a
    assert not out.prior_ok and not out.latched and not out.ok
    assert not out.checkpointed and out.snapshots_installed == 0
    assert checkpoint(rig) is None and checkpoint_writes(rig) == 0
    assert horizon(rig, "t") is None
    assert rig.pipeline.failed_epoch == LATCH_CLEAR  # a requeue, not a latch
    wait_settled(rig)
    assert not rig.buffers.empty()  # the failed publish's rows are back, not lost

    again = step(rig)

    assert again.ok and again.checkpointed and checkpoint(rig) == a
    assert published(rig) == all_rids((["a"], 3))
    assert audit_unique(rig) >= 1
    assert horizon(rig, "t") == a


def test_rfc0052_1_mining_failure_clamps_the_mark_until_settlement_rebuilds_the_tenant(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mining failure is no longer a latch (DESIGN.md §5: RFC 0055's settlement rebuilds
    the tenant): the mark is clamped below the frame, no cut stamps past it, and the next
    tick rebuilds the tenant, after which the mark is the latest acknowledged offset."""
    rig = make_rig()
    real = rig.miners.mine

    def mine(tenant: str, bodies: Sequence[str]) -> object:
        if tenant == "bad":
            raise RuntimeError("injected miner failure")
        return real(tenant, bodies)

    monkeypatch.setattr(rig.miners, "mine", mine)
    a = rig.ingest("good", "a")
    assert step(rig).checkpointed

    # The frame is durable and acknowledged; its turn failed to mine: an unmined entry.
    assert rig.ingest("bad", "x") == a  # a failed turn does not advance the mark
    assert rig.pipeline.failed_epoch == LATCH_CLEAR
    assert not [n for n, _ in rig.events if n == "barrier.latch.set"]
    assert rig.pipeline.unmined.tenants() == {"bad"}
    g = rig.ingest("good", "g")
    assert last_durable(rig) == a  # clamped below the unmined frame

    out = step(rig)  # settles first, then captures

    assert rig.pipeline.settler.rebuilds == 1 and not rig.pipeline.unmined.tenants()
    assert out.ok and out.mark == g and checkpoint(rig) == g
    assert horizon(rig, "bad") == rig.pipeline.folded["bad"]
    assert Counter(rig.published_rids("bad")) == Counter(rids("x"))
    assert set(rig.published_rids("good")) == set(all_rids((["a", "g"], 3)))

    rig.restart()  # nothing above the frontiers is left to replay
    assert rig.report.records_replayed == 0
    assert Counter(rig.published_rids("bad")) == Counter(rids("x"))


def test_rfc0052_1_turn_failing_concurrently_with_a_barrier_stamps_no_mark_past_it(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig()
    exclusion = WatchedLock()
    rig.pipeline.exclusion = rig.pipeline.cuts.exclusion = exclusion
    a = rig.ingest("good", "a")
    assert step(rig).checkpointed
    real = rig.miners.mine

    def mine(tenant: str, bodies: Sequence[str]) -> object:
        if tenant == "bad":
            raise RuntimeError("injected miner failure")
        return real(tenant, bodies)

    monkeypatch.setattr(rig.miners, "mine", mine)

    with points.hold("turn.before_mine") as turn:
        ingest = Worker("ingest", lambda: rig.ingest("bad", "x"))
        assert turn.reached.wait(WAIT_S)
        barrier = Worker("barrier", lambda: rig.barrier.run_cut(rig.barrier.capture()))
        assert exclusion.writer_arrived.wait(WAIT_S)
        turn.release()  # the turn fails to mine while the barrier waits to capture
        ingest.join()
        out = barrier.join()

    assert out is not None and out.ok and out.mark == a and not out.latched
    assert out.snapshots_installed == 0 and horizon(rig, "bad") is None
    assert checkpoint(rig) == a and rig.pipeline.unmined.tenants() == {"bad"}


@pytest.mark.parametrize(
    ("op", "name"),
    [
        ("open", "CHECKPOINT.tmp"),
        ("write", "CHECKPOINT.tmp"),
        ("fsync", "CHECKPOINT.tmp"),
        ("rename", "CHECKPOINT"),
    ],
)
def test_rfc0052_1_failed_checkpoint_write_keeps_the_previous_mark(
    make_rig: Callable[..., NodeRig], op: str, name: str
) -> None:
    rig = make_rig()
    a = rig.ingest("t", "a")
    rig.clock.advance(SEGMENT_AGE + 1)
    assert step(rig).checkpointed  # rotates the idle segment, then stamps a
    first, second = rig.journal.segment_names()
    b = rig.ingest("t", "b")
    assert step(rig).mark == a  # the rotation-fired cut b's turn captured: a re-assert
    rig.clock.advance(SEGMENT_AGE + 1)
    rig.fs.fail(op, name)

    out = step(rig)

    assert out.ok and out.flushed >= 1 and out.flush_failures == 0  # the flush succeeded
    assert not out.checkpointed and "stays in force" in out.checkpoint_error
    assert out.mark == b and checkpoint(rig) == a
    assert horizon(rig, "t") == b  # a snapshot is not the checkpoint
    third = rig.journal.segment_names()[-1]
    assert rig.journal.segment_names() == [first, second, third]

    rig.housekeeper.step()

    # The first segment was eligible under a; the second holds b, above it.
    assert rig.journal.segment_names() == [second, third]

    assert step(rig).checkpointed and checkpoint(rig) == b
    rig.housekeeper.step()
    assert rig.journal.segment_names() == [third]
    assert published(rig) == all_rids((["a", "b"], 3))


def tick(rig: NodeRig) -> CutOutcome | None:
    """One tick of the barrier thread (``Barrier._run``): a step, and on an exception the
    thread's handler."""
    try:
        return rig.barrier.step()
    except Exception as exc:  # noqa: BLE001 - what the barrier thread does with it
        rig.barrier.tick_failed(exc)
        return None


class RaiseOnce:
    """Wraps a callable: the first call waits for ``go`` (``reached`` set), then raises."""

    def __init__(self, real: Callable[..., object]) -> None:
        self._real = real
        self.calls = 0
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        if self.calls == 1:
            self.reached.set()
            assert self.go.wait(WAIT_S)
            raise RuntimeError("injected barrier tick failure")
        return self._real(*args, **kwargs)


@pytest.mark.parametrize("where", ["capture", "serialize", "install"])
def test_rfc0052_1_raising_barrier_tick_latches_and_the_next_tick_runs(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    rig = make_rig()
    runs: list[tuple[str, str]] = []
    rig.barrier.runner.on_run = lambda outcome, error_type: runs.append((outcome, error_type))
    target: object
    if where == "capture":
        target, name = rig.pipeline.cuts, "capture_cut_locked"  # before anything is drained
    elif where == "serialize":
        target, name = rig.pipeline.cuts, "serialize_frozen"  # drained, before the flush
    else:
        target, name = rig.snapshots, "install_all"  # flushed, before the stamp
    raising = RaiseOnce(getattr(target, name))
    monkeypatch.setattr(target, name, raising)
    rig.ingest("t", "a", BIG)
    rig.ingest("t", "a2", BIG)
    epoch = rig.pipeline.epoch

    failing = Worker("barrier", lambda: tick(rig))
    assert raising.reached.wait(WAIT_S)
    pending: Cut | None = None
    fill = Fill()
    if where != "capture":
        # a rotation-fired cut lands in the pending slot while the tick is running
        fill = fill_to_rotation(rig, "t", "b")
        pending = rig.barrier.pending
        assert pending is not None and pending.mark == fill.prev and pending.batches
    raising.go.set()
    assert failing.join() is None

    # every later cut is latched; the pending slot is invalidated (its rows requeued)
    assert epoch <= rig.pipeline.failed_epoch <= rig.pipeline.epoch
    assert any(n == "barrier.latch.set" for n, _ in rig.events)
    assert runs == [("error", "cadence_panic")]
    assert rig.barrier.pending is None
    if pending is not None:
        assert pending.batches == [] and pending.snaps == {}
    assert checkpoint(rig) is None and horizon(rig, "t") is None

    following = Worker("barrier", lambda: tick(rig))
    if not following.finished(timeout=HANG_S):
        stranded = rig.buffers.in_flight.pending_upto(sys.maxsize)
        for item in stranded:  # unblock the thread so the test can end
            rig.buffers.requeue(item.detached, "test_unstrand")
        following.finished()
        pytest.fail(
            f"the tick after one that raised in {name} blocked forever: the raising cut's "
            f"{len(stranded)} drained batches stayed registered in flight, in neither "
            f"the buffers nor the store, and the next cut waits for them"
        )
    out = following.join()

    assert out is not None and out.latched and not out.checkpointed
    assert runs[-1] == ("refused", "latched")
    assert checkpoint(rig) is None and horizon(rig, "t") is None

    rig.restart()  # only a restart clears the latch; replay re-publishes every frame

    assert rig.pipeline.failed_epoch == LATCH_CLEAR
    tags = ["a", "a2"] if pending is None else ["a", "a2", *fill.closed, fill.rotating]
    assert set(rig.published_rids()) == set(all_rids((tags, BIG)))
    d = rig.ingest("t", "d")
    again = step(rig)
    assert again.ok and again.checkpointed and checkpoint(rig) == d


def test_rfc0052_1_barrier_thread_logs_counts_a_raising_tick_and_takes_the_next(
    make_rig: Callable[..., NodeRig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = make_rig(barrier_secs=0)  # every loop of the thread is a timer tick
    runs: list[tuple[str, str]] = []
    refused = threading.Event()

    def on_run(outcome: str, error_type: str) -> None:
        runs.append((outcome, error_type))
        if outcome == "refused":
            refused.set()

    rig.barrier.runner.on_run = on_run
    rig.ingest("t", "a")
    raising = RaiseOnce(rig.pipeline.cuts.capture_cut_locked)
    raising.go.set()
    monkeypatch.setattr(rig.pipeline.cuts, "capture_cut_locked", raising)

    with caplog.at_level(logging.ERROR, logger="ourios.barrier"):
        rig.barrier.start()
        try:
            assert refused.wait(WAIT_S)  # the thread survived and took another tick
        finally:
            assert rig.barrier.close(timeout=WAIT_S)

    failed = [r for r in caplog.records if r.getMessage().startswith("barrier tick failed")]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert isinstance(failed[0].exc_info[1], RuntimeError)
    assert runs[0] == ("error", "cadence_panic") and runs[1] == ("refused", "latched")
    assert checkpoint(rig) is None


def test_failed_cuts_back_off_instead_of_recapturing_at_once(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A cut that fails asks for a fresh capture; while cuts keep failing (a store
    outage, a latch) the barrier thread waits a doubling delay, capped at the barrier
    period, instead of capturing again at once — which spun the thread and wrote
    thousands of log lines a second. The first good cut resets the delay."""
    rig = make_rig()
    rig.store.fail(ops=("put",), always=True)
    rig.ingest("t", "a")
    delays = []
    for _ in range(6):
        out = rig.barrier.step(timer=True)
        assert out is not None and not out.ok
        delays.append(rig.barrier.retry_not_before - rig.clock())
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # barrier_secs is 300 here
    rig.barrier.runner.barrier_secs = 3
    assert rig.barrier.step(timer=True) is not None
    assert rig.barrier.retry_not_before - rig.clock() == 3  # capped at the period
    rig.store.clear()
    out = rig.barrier.step(timer=True)
    assert out is not None and out.ok
    assert rig.barrier.retry_not_before == 0.0  # reset

    # The thread: a failing store for ~2 s of real time is a handful of cuts, not a spin.
    rig.store.fail(ops=("put",), always=True)
    rig.ingest("t", "b")
    outcomes: list[CutOutcome] = []
    first = threading.Event()

    def on_cut(o: CutOutcome) -> None:
        outcomes.append(o)
        first.set()

    barrier = Barrier(
        rig.pipeline.cuts,
        rig.snapshots,
        rig.ledger,
        journal=rig.journal,
        settler=rig.pipeline.settler,
        barrier_secs=1,
        segment_age_secs=SEGMENT_AGE,
        on_cut=on_cut,
    )
    barrier.start()
    try:
        assert first.wait(WAIT_S)
        window = threading.Event()
        window.wait(2.0)  # a measured window: the count in it is the assertion
    finally:
        assert barrier.close(WAIT_S)
    assert 2 <= len(outcomes) <= 6, [o.reason for o in outcomes]
    assert not any(o.ok for o in outcomes)


@pytest.mark.parametrize("order", ["requeued_before_capture", "requeued_after_capture"])
def test_rfc0052_1_a_requeue_refuses_only_cuts_captured_before_it(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
    order: str,
) -> None:
    rig = make_rig(flush_bytes=1)
    gate = gate_put(rig, hold=1, errors={1: failure("store_error")})
    rig.publisher.start()
    a = rig.ingest("t", "a")
    assert gate.reached.wait(WAIT_S)

    if order == "requeued_before_capture":
        gate.release()
        wait_settled(rig)
        failed, *refused_with_it = rig.buffers.in_flight.failures_upto(sys.maxsize)
        out = step(rig)
        assert failed.requeue_epoch == out.epoch  # not above the cut: the cut drained it
        assert out.ok and out.checkpointed and checkpoint(rig) == a
    else:
        with points.hold("barrier.before_flush") as captured:
            barrier = Worker("barrier", rig.barrier.step)
            assert captured.reached.wait(WAIT_S)
            gate.release()
            wait_settled(rig)
            failed, *refused_with_it = rig.buffers.in_flight.failures_upto(sys.maxsize)
            captured.release()
            refused = barrier.join()
        assert refused is not None and failed.requeue_epoch is not None
        assert failed.requeue_epoch > refused.epoch
        assert not refused.prior_ok and not refused.checkpointed
        assert checkpoint(rig) is None
        after = step(rig)  # the first cut captured after the requeue stamps
        assert after.epoch >= failed.requeue_epoch
        assert after.ok and after.checkpointed and checkpoint(rig) == a

    assert published(rig) == all_rids((["a"], 3))
    assert audit_unique(rig) >= 1


@pytest.mark.parametrize("enqueue", ["published_and_fails", "queue_full_parks"])
def test_rfc0052_1_partition_detached_before_the_capture_and_queued_after_is_covered(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch, enqueue: str
) -> None:
    rig = make_rig(flush_bytes=1)
    if enqueue == "published_and_fails":
        rig.publisher.start()
        rig.store.fail(ops=("put",), nth=1)
    real_offer = rig.publisher.offer
    offered: list[Detached] = []
    at_offer = threading.Event()
    go = threading.Event()

    def offer(d: Detached) -> bool:
        offered.append(d)
        if len(offered) == 1:
            at_offer.set()
            assert go.wait(WAIT_S)
        return real_offer(d) if enqueue == "published_and_fails" else False

    monkeypatch.setattr(rig.publisher, "offer", offer)
    ingest = Worker("ingest", lambda: rig.ingest("t", "a"))
    assert at_offer.wait(WAIT_S)
    # The turn released the exclusion: its partitions are detached and registered in
    # flight, and not yet queued (or parked).
    registered = len(rig.buffers.in_flight)
    assert rig.buffers.empty() and registered >= 2

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)  # captured between the detach and the enqueue
        go.set()
        a = ingest.join()
        flushed.release()
        out = barrier.join()

    assert out is not None and out.mark == a and out.flushed == 0
    assert [d.epoch for d in offered] == [out.epoch] * registered  # registered before it
    assert not out.prior_ok and not out.checkpointed
    assert checkpoint(rig) is None and horizon(rig, "t") is None

    rig.store.clear()
    again = step(rig)

    assert again.ok and again.checkpointed and checkpoint(rig) == a
    assert published(rig) == all_rids((["a"], 3))
    assert audit_unique(rig) >= 1


def test_rfc0052_1_every_partition_one_turn_detached_is_waited_for(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = make_rig(flush_bytes=1)
    # audit first, then the records of day 1 (held) and of day 2 (fails, last)
    gate = gate_put(rig, prefix="records/", hold=1, errors={2: failure("store_error")})
    rig.publisher.start()
    a = ingest_request(rig, "t", two_day_request("a", 4))
    assert gate.reached.wait(WAIT_S)
    assert len(rig.buffers.in_flight) == 2  # the audit partitions have completed

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)
        flushed.release()
        gate.release()  # the second completes, then the last fails
        out = barrier.join()

    assert out is not None and out.mark == a
    assert not out.prior_ok and not out.checkpointed
    assert checkpoint(rig) is None
    assert published(rig) == ["a/0"]  # day 1 went through; day 2 requeued

    again = step(rig)

    assert again.checkpointed and checkpoint(rig) == a
    assert published(rig) == sorted(rids("a", 4))


def test_rfc0052_1_publisher_exception_requeues_its_batch_and_the_queue_drains(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = make_rig(flush_bytes=1)
    gate = gate_put(rig, hold=1, errors={1: failure("exception")})
    rig.publisher.start()
    rig.ingest("t", "a")
    assert gate.reached.wait(WAIT_S)
    rig.ingest("t", "b")  # queued behind the failing publish
    queued = len(rig.buffers.in_flight)
    assert queued >= 3

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)
        flushed.release()
        gate.release()
        out = barrier.join()  # returns: every queued publish settled

    assert out is not None and not out.prior_ok and not out.checkpointed
    assert rig.pipeline.failed_epoch == LATCH_CLEAR
    assert rig.publisher.stats.failures[("audit", "unexpected")] == 1
    assert rig.publisher.queue_depth == 0 and len(rig.buffers.in_flight) == 0
    # the records behind it reference the refused events, so they went back with them
    # (write order) instead of landing ahead of them
    assert published(rig) == []
    assert rig.publisher.stats.failures[("records", "audit_not_durable")] >= 1

    b = last_durable(rig)
    again = step(rig)  # the next cut writes the events first, then the records
    assert again.ok and again.checkpointed and checkpoint(rig) == b
    assert published(rig) == all_rids((["a", "b"], 3))

    rig.ingest("t", "c")  # the same publisher thread still publishes
    wait_settled(rig)
    assert published(rig) == all_rids((["a", "b", "c"], 3))
    assert audit_unique(rig) >= 1


@pytest.mark.parametrize("path", ["publisher", "barrier_flush"])
def test_rfc0052_1_records_never_land_ahead_of_their_template_events(
    make_rig: Callable[..., NodeRig], path: str
) -> None:
    """Seed: when the write of a partition's template events fails, the dependent
    records requeue rather than landing in Parquet ahead of their template events."""
    rig = make_rig(flush_bytes=1 if path == "publisher" else 1 << 30)
    rig.store.fail(ops=("put",), nth=1)  # the audit partition's write (it goes first)
    if path == "publisher":
        rig.publisher.start()
        a = rig.ingest("t", "a")
        wait_settled(rig)
    else:
        a = rig.ingest("t", "a")
        out = step(rig)
        assert not out.ok and not out.checkpointed

    assert rig.publisher.stats.failures[("audit", "injected")] == 1
    assert published(rig) == [], "records were published although their template events failed"

    rig.store.clear()
    assert step(rig).checkpointed and checkpoint(rig) == a
    assert published(rig) == all_rids((["a"], 3))


# -- RFC0052.14 ----------------------------------------------------------------------


def test_rfc0052_14_mark_is_read_after_the_quiesce_under_the_exclusion(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    exclusion = WatchedLock()
    rig.pipeline.exclusion = rig.pipeline.cuts.exclusion = exclusion
    a = rig.ingest("t", "a")

    with (
        points.hold("turn.before_mine") as turn,
        points.hold("barrier.after_quiesce") as quiesced,
    ):
        ingest = Worker("ingest", lambda: rig.ingest("t", "b"))
        assert turn.reached.wait(WAIT_S)  # a turn is in flight, holding the exclusion
        barrier = Worker("barrier", rig.barrier.step)
        assert exclusion.writer_arrived.wait(WAIT_S)
        assert not quiesced.reached.is_set()  # it cannot capture while the turn runs
        assert last_durable(rig) == a
        turn.release()
        assert quiesced.reached.wait(WAIT_S)
        b = ingest.join()
        assert last_durable(rig) == b  # what the capture now reads
        quiesced.release()
        out = barrier.join()

    assert out is not None and out.mark == b == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b"], 3))
    assert horizon(rig, "t") == b


def test_rfc0052_14_own_frame_mark_across_a_two_turn_flush(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig()
    payloads = {tag: request(tag).SerializeToString() for tag in ("a", "b")}
    # Two frames appended before either waits: the first waiter's fsync covers both.
    pa = rig.journal.append_batch("t", payloads["a"])
    pb = rig.journal.append_batch("t", payloads["b"])
    oa = pa.wait()
    ob = pb.wait()
    assert oa.durable_eof.lsn == ob.offset.lsn > oa.offset.lsn  # one sync, two turns
    settled = [Settled(pa.seq, oa, pa.span), Settled(pb.seq, ob, pb.span)]
    monkeypatch.setattr(rig.journal, "append_batch", lambda tenant, payload: settled.pop(0))

    def turn(tag: str) -> None:
        data = payloads[tag]
        batch = flatten(decode_request(data, "application/x-protobuf"), "t")
        rig.pipeline.ingest("t", data, batch, "test")

    turn("a")
    assert last_durable(rig) == oa.offset

    between = step(rig)  # b is durable, not yet mined nor acknowledged

    assert between.mark == oa.offset == checkpoint(rig)
    assert checkpoint(rig) != oa.durable_eof
    assert horizon(rig, "t") == oa.offset
    assert published(rig) == all_rids((["a"], 3))

    turn("b")
    after = step(rig)

    assert after.mark == ob.offset == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b"], 3))


def test_rfc0052_14_nothing_replayed_is_ever_a_mark(make_rig: Callable[..., NodeRig]) -> None:
    rig = make_rig()
    rig.ingest("t", "a")
    b = rig.ingest("t", "b")
    rig.fs.fail("fsync", "*.wal")
    with pytest.raises(Unavailable):
        rig.ingest("t", "c")  # written, its group sync failed: never acknowledged
    c_end = rig.journal.end_lsn
    assert last_durable(rig) == b and c_end > b.lsn

    before_crash = step(rig)

    assert before_crash.mark == b == checkpoint(rig)

    report = rig.restart(crash=True)
    writes = checkpoint_writes(rig)

    assert report.frames == 3  # c survived in the file and was replayed
    assert last_durable(rig) is None
    replayed = step(rig)
    assert replayed.mark is None and not replayed.checkpointed
    assert checkpoint_writes(rig) == writes and checkpoint(rig) == b

    d = rig.ingest("t", "d")
    assert d.lsn > c_end
    out = step(rig)
    assert out.mark == d == checkpoint(rig)


def test_rfc0052_14_idle_rotation_rotates_before_the_capture(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig()
    rig.ingest("t", "a")
    b = rig.ingest("t", "b")
    closed = rig.journal.current_segment
    # A frame written whose turn has not run: never acknowledged, never mined.
    pc = rig.journal.append_batch("t", request("c").SerializeToString())
    rig.clock.advance(SEGMENT_AGE + 1)

    with points.hold("barrier.before_flush") as flushing:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushing.reached.wait(WAIT_S)  # rotated and captured; exclusion released
        assert rig.journal.current_segment != closed
        oc = pc.wait()
        rig.pipeline.gate.enter(pc.seq)  # its turn passes with nothing to ingest,
        rig.pipeline.gate.leave(pc.seq)  # as a turn whose sync failed does
        e = rig.ingest("t", "e")  # admitted after the release
        flushing.release()
        out = barrier.join()

    assert out is not None and out.mark == b and b.segment == closed
    # the rotation boundary is c's end (the new segment's base), above the mark
    assert rig.journal.segment_names()[-1] == f"{oc.offset.lsn:020d}.wal"
    assert out.mark.lsn < oc.offset.lsn
    assert e.segment == rig.journal.current_segment != closed and e.lsn > out.mark.lsn
    assert checkpoint(rig) == b and horizon(rig, "t") == b
    assert published(rig) == all_rids((["a", "b"], 3))

    # e's turn observed the segment change: its rotation-fired cut re-asserts b
    fired = step(rig)
    assert fired.reason == "rotation" and fired.mark == b
    assert step(rig).mark == e == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b", "e"], 3))


def test_rfc0052_14_rest_of_a_turn_that_detached_mid_batch_is_in_the_cut(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = make_rig()
    req = two_day_request("a", 10)  # day 1 holds one record, day 2 nine
    rig.buffers.flush_bytes = len(req.SerializeToString()) // 2  # only day 2 detaches
    gate = gate_put(rig, prefix="records/", hold=1)
    rig.publisher.start()
    a = ingest_request(rig, "t", req)
    assert gate.reached.wait(WAIT_S)  # day 2 detached mid-turn, its PUT held
    # the publisher wrote the turn's template events ahead of day 2's records (write
    # order); day 1 stays buffered
    assert rig.buffers.partitions == 1 and audit_unique(rig) >= 1

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)
        # the cut flushed the rest of the turn itself, without waiting for the held PUT
        assert published(rig) == ["a/0"] and audit_unique(rig) >= 1
        flushed.release()
        gate.release()
        out = barrier.join()

    assert out is not None and out.ok and out.checkpointed and out.mark == a
    assert out.flushed >= 1  # the turn's day-1 records
    assert published(rig) == sorted(rids("a", 10))
    assert checkpoint(rig) == a


def test_rfc0052_14_rotation_fired_cut_does_no_store_io_in_the_turn(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = make_rig()
    gate = gate_put(rig)  # records the thread of every put

    fs_ops = len(rig.fs.log)

    fill = fill_to_rotation(rig, "t", "f")

    assert gate.threads == []  # the rotating turn returned without any store I/O
    # ...and without writing a snapshot or a checkpoint
    touched = {p.name for _, p in rig.fs.log[fs_ops:] if p is not None}
    assert not [n for n in touched if ".snap" in n or n.startswith("CHECKPOINT")], touched
    cut = rig.barrier.pending
    assert cut is not None and cut.reason == "rotation" and cut.mark == fill.prev
    assert cut.batches and all(d.partition.max_lsn <= fill.prev_mark.lsn for d in cut.batches)
    rig.ingest("t", "s")  # admitted after the turn
    assert gate.threads == []

    out = Worker("barrier", rig.barrier.step).join()

    assert out is not None and out.reason == "rotation" and out.checkpointed
    # the PUTs ran on the barrier's side: its thread or the cut's flush lanes
    assert gate.threads
    assert all(t == "barrier" or t.startswith("ourios-flush-") for t in gate.threads)
    assert out.mark == fill.prev == checkpoint(rig)
    assert horizon(rig, "t") == fill.prev
    assert published(rig) == all_rids((fill.closed, BIG))  # neither R's nor s's rows

    report = rig.restart(crash=True)

    # the snapshot excluded both: replay mines exactly those two frames
    assert report.frames_skipped == len(fill.closed) and report.frames == len(fill.closed) + 2
    assert published(rig) == all_rids(([*fill.closed, fill.rotating], BIG), (["s"], 3))


@pytest.mark.parametrize("ceiling", ["over", "under"])
def test_rfc0052_14_coalescing_capture_under_and_over_the_ceiling(
    make_rig: Callable[..., NodeRig], ceiling: str
) -> None:
    rig = make_rig(ceiling_bytes=1 if ceiling == "over" else 256 << 20)
    u = rig.ingest("u", "u0")
    first = fill_to_rotation(rig, "t", "p")
    pending = rig.barrier.pending
    assert pending is not None and pending.mark == first.prev
    epoch, ids = pending.epoch, [d.id for d in pending.batches]

    second = fill_to_rotation(rig, "t", "q")  # a second rotation capture, A still pending

    assert rig.barrier.pending is pending
    if ceiling == "over":
        # all or nothing: its batches parked, the pending cut untouched
        assert pending.mark == first.prev and pending.epoch == epoch
        assert [d.id for d in pending.batches] == ids
        assert {k: s.horizon for k, s in pending.snaps.items()} == {"t": first.prev, "u": u}
        assert not rig.buffers.empty() and len(rig.buffers.in_flight) == len(ids)
        mark, covered = first.prev_mark, all_rids((["u0"], 3), (first.closed, BIG))
    else:
        assert pending.mark == second.prev and pending.epoch > epoch
        assert [d.id for d in pending.batches][: len(ids)] == ids
        assert len(pending.batches) > len(ids)
        mark = second.prev_mark
        covered = all_rids((["u0"], 3), ([*first.closed, first.rotating, *second.closed], BIG))

    out = step(rig)

    assert out.reason.startswith("rotation") and out.checkpointed and out.mark == mark
    assert checkpoint(rig) == mark
    assert horizon(rig, "t") == mark and horizon(rig, "u") == u
    assert published(rig) == covered

    final = step(rig)  # the next cut covers the parked partitions

    assert final.checkpointed and checkpoint(rig) == second.rotated
    assert published(rig) == all_rids(
        (["u0"], 3), ([*first.closed, first.rotating, *second.closed, second.rotating], BIG)
    )


@pytest.mark.parametrize("a_outcome", ["a_fails", "a_succeeds"])
def test_rfc0052_14_pending_cut_inherits_the_running_cuts_outcome(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
    a_outcome: str,
) -> None:
    rig = make_rig()
    errors: dict[int, BaseException] = {}
    if a_outcome == "a_fails":
        # A's audit half fails, which refuses A's records with it (write order)
        errors = {1: failure("store_error")}
    gate = gate_put(rig, hold=1, errors=errors)
    rig.ingest("t", "a1", BIG)
    a2 = rig.ingest("t", "a2", BIG)

    running = Worker("barrier", rig.barrier.step)
    assert gate.reached.wait(WAIT_S)  # cut A captured at a2, its flush held
    fill = fill_to_rotation(rig, "t", "b")  # cut B captured behind it, inside the turn
    b = rig.barrier.pending
    assert b is not None and b.reason == "rotation" and b.mark == fill.prev
    b_epoch, b_ids = b.epoch, [d.id for d in b.batches]
    assert b_ids
    # B neither installs nor stamps before A's outcome
    assert checkpoint(rig) is None and horizon(rig, "t") is None
    gate.release()
    a = running.join()

    assert a is not None and a.mark == a2 and a.epoch < b_epoch
    everything = all_rids((["a1", "a2", *fill.closed, fill.rotating], BIG))
    if a_outcome == "a_fails":
        assert not a.ok and a.flush_failures == 2
        assert rig.barrier.pending is None  # B invalidated
        assert b.batches == [] and b.snaps == {}
        assert checkpoint(rig) is None and horizon(rig, "t") is None
        assert published(rig) == []
        assert len(rig.buffers.in_flight) == 0 and not rig.buffers.empty()

        again = step(rig)  # the re-capture covers A's and B's records

        assert again.reason == "timer" and again.ok and again.checkpointed
        assert again.mark == fill.rotated == checkpoint(rig)
        assert horizon(rig, "t") == fill.rotated
        assert published(rig) == everything
    else:
        assert a.ok and a.checkpointed and checkpoint(rig) == a2
        assert horizon(rig, "t") == a2
        assert rig.barrier.pending is b  # unchanged
        assert b.mark == fill.prev and b.epoch == b_epoch and [d.id for d in b.batches] == b_ids

        out = step(rig)

        assert out.reason == "rotation" and out.epoch == b_epoch and out.checkpointed
        assert out.mark == fill.prev == checkpoint(rig)
        assert horizon(rig, "t") == fill.prev
        assert published(rig) == all_rids((["a1", "a2", *fill.closed], BIG))
        assert step(rig).mark == fill.rotated == checkpoint(rig)
        assert published(rig) == everything


def test_rfc0052_14_one_failed_publish_never_refuses_the_later_cuts(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = make_rig(flush_bytes=1)
    gate = gate_put(rig, hold=1, errors={1: failure("store_error")})
    rig.publisher.start()
    rig.ingest("t", "a")
    assert gate.reached.wait(WAIT_S)

    with points.hold("barrier.after_flush") as flushed:
        barrier = Worker("barrier", rig.barrier.step)
        assert flushed.reached.wait(WAIT_S)
        flushed.release()
        gate.release()
        refused = barrier.join()

    assert refused is not None and not refused.prior_ok and not refused.checkpointed
    for tag in ("b", "c", "d"):
        mark = rig.ingest("t", tag)
        out = step(rig)
        assert out.ok and out.checkpointed and out.mark == mark == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b", "c", "d"], 3))
    assert audit_unique(rig) >= 1


@pytest.mark.parametrize("error", ["store_error", "exception"])
def test_rfc0052_14_publish_registered_after_the_cut_that_fails_is_not_lost(
    make_rig: Callable[..., NodeRig],
    gate_put: Callable[..., GatedPut],
    monkeypatch: pytest.MonkeyPatch,
    error: str,
) -> None:
    rig = make_rig()
    gate = gate_put(rig)
    sweep = AgeSweep(rig.pipeline, 5, 1)
    a = rig.ingest("t", "a")

    with points.hold("barrier.before_stamp") as stamping:
        barrier = Worker("barrier", rig.barrier.step)
        assert stamping.reached.wait(WAIT_S)  # flushed and checked; not yet stamped
        b = rig.ingest("t", "b")  # the barrier holds no exclusion around its I/O
        rig.clock.advance(10)
        gate.failing = failure(error)
        assert sweep.sweep_once() >= 1  # registered after the cut, and it fails
        gate.failing = None
        assert not rig.buffers.empty() and len(rig.buffers.in_flight) == 0
        stamping.release()
        out = barrier.join()

    assert out is not None and out.ok and out.checkpointed
    assert out.mark == a == checkpoint(rig) and b.lsn > a.lsn
    assert horizon(rig, "t") == a
    assert published(rig) == all_rids((["a"], 3))
    assert rig.pipeline.failed_epoch == LATCH_CLEAR

    later = step(rig)

    assert later.ok and later.mark == b == checkpoint(rig)
    assert published(rig) == all_rids((["a", "b"], 3))
    assert audit_unique(rig) >= 1


def test_a_cuts_partitions_are_published_side_by_side_a_held_put_holds_no_other(
    make_rig: Callable[..., NodeRig], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One after the other, a busy node's flush outlasted the cadence and the checkpoint
    # fell behind without bound (the 2026-12-03 soak): the cut publishes its partitions
    # on lanes of its own, so every other tenant's object lands while one PUT is held.
    rig = make_rig()
    tenants = ["t0", "t1", "t2", "t3"]
    for t in tenants:
        rig.ingest(t, t)
    inner = rig.store.put
    held, release = threading.Event(), threading.Event()
    landed = threading.Condition()
    others: list[str] = []

    def put(key: str, data: bytes) -> None:
        if key.startswith("records/tenant=t0/"):
            held.set()
            assert release.wait(WAIT_S), "never released"
        inner(key, data)
        if key.startswith("records/") and not key.startswith("records/tenant=t0/"):
            with landed:
                others.append(key)
                landed.notify_all()

    monkeypatch.setattr(rig.store, "put", put)
    barrier = Worker("barrier", rig.barrier.step)
    try:
        assert held.wait(WAIT_S)
        with landed:
            # every other tenant's records land while t0's PUT is held
            assert landed.wait_for(lambda: len(others) == 3, WAIT_S), others
    finally:
        release.set()
    out = barrier.join()
    assert out is not None and out.ok and out.checkpointed and out.flushed == 8
    assert published(rig) == all_rids((tenants, 3))

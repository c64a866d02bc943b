"""app.node.worker_pool: the core's side of the worker processes, driven by in-process fake
workers (a thread on the worker's end of the channel, through the ``launch`` seam), so
each interleaving is placed with events, not timing. The real processes are
tests/integration/test_workers.py's."""

from __future__ import annotations

import itertools
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection
from app.ingest.stages import Stages
from app.node.encode_dispatch import EncodeSlots
from app.node.recovery import DecodeStopped, Undecodable
from app.node.worker_pool import NodeState, Workers
from app.receive import channel
from app.receive.channel import ChannelClosed, Connection, MessageKind
from app.receive.otlp import decode_request, flatten
from sink.parquet import FLAT_SCHEMA, RecordColumns, assemble_records, encode_records
from tests.support.noderig import NodeRig, request

_PIDS = itertools.count(900_000)


class FakeWorker:
    """A worker's end of the channel on a thread: says HELLO, answers FLUSH and STOP,
    hands every answer to the call waiting for it. ``exit()`` ends it as a crash would."""

    def __init__(self, index: int, sock: socket.socket, decode: DecodePolicy | None = None) -> None:
        self.index = index
        self._decode = decode
        self.pid = next(_PIDS)
        self.conn = Connection(sock)
        self.returncode: int | None = None
        #: the ENCODE calls it answered: (compression, rows)
        self.encoded: list[tuple[str, pa.Table]] = []
        #: when set, an ENCODE is answered only once it is set (``encoding``: one came)
        self.hold_encodes: threading.Event | None = None
        self.encoding = threading.Event()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.conn.send(MessageKind.HELLO, 0, [self.pid.to_bytes(4, "little")])
            while True:
                kind, ident, body = self.conn.receive()
                if kind is MessageKind.FLUSH:
                    self.conn.send(MessageKind.FLUSHED, ident, [])
                elif kind is MessageKind.ENCODE:
                    compression, table = channel.decode_encode_request(body)
                    self.encoding.set()
                    if self.hold_encodes is not None:
                        assert self.hold_encodes.wait(30)
                    self.encoded.append((compression, table))
                    self.conn.send(MessageKind.ENCODED, ident, [f"encoded by {self.pid}".encode()])
                elif kind is MessageKind.DECODE and self._decode is not None:
                    tenant, payload = channel.decode_decode_request(body)
                    what = self._decode(bytes(payload))
                    if what == "ok":
                        batch = flatten(decode_request(bytes(payload), PROTOBUF), tenant)
                        self.conn.send(MessageKind.DECODED, ident, [batch.columns.serialize()])
                    elif what == "raise":  # what the worker answers for any exception
                        failed = IngestRejection("decode failed: MemoryError: ")
                        self.conn.send(
                            MessageKind.REFUSAL, ident, list(channel.encode_refusal(failed))
                        )
                    elif what == "die":
                        self.exit()
                    # "hold": never answered
                elif kind is MessageKind.STOP:
                    self.conn.send(MessageKind.STOPPING, ident, [])
                    self.returncode = 0
                    break
                else:
                    self.conn.deliver(kind, ident, body)
        except ChannelClosed:
            if self.returncode is None:
                self.returncode = -9
        finally:
            self.conn.close()
            self._ended.set()

    def exit(self) -> None:
        self.returncode = -9
        self.conn.close()

    # -- what the supervisor needs of a process ---------------------------------------

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("fake worker", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.exit()


#: What a fake worker does with a DECODE of a payload: "ok", "raise", "die" or "hold".
DecodePolicy = Callable[[bytes], str]
PROTOBUF = "application/x-protobuf"


class Fleet:
    """The fake workers launched so far, by index (the latest one of each)."""

    def __init__(self, decode: DecodePolicy | None = None) -> None:
        self.decode = decode
        self.launched: list[FakeWorker] = []
        self._cond = threading.Condition()
        #: when set, a launch returns only once this is set (the supervisor stays inside it)
        self.hold: threading.Event | None = None

    def launch(self, index: int, worker_end: socket.socket) -> FakeWorker:
        worker = FakeWorker(index, worker_end.dup(), self.decode)
        with self._cond:
            self.launched.append(worker)
            self._cond.notify_all()
        if self.hold is not None:
            assert self.hold.wait(30)
        return worker

    def wait_launched(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.launched) >= n, 30), self.launched


class Observed:
    """The core's counter callback; ``block`` holds it (a busy core reading late)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, int, float]] = []
        self.block = threading.Event()
        self.block.set()
        self.entered = threading.Event()

    def __call__(self, *report: object) -> None:
        self.entered.set()
        assert self.block.wait(30)
        self.seen.append(report)  # type: ignore[arg-type]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[NodeRig]:
    rig = NodeRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


Events = list[tuple[str, dict[str, object]]]


def make(
    rig: NodeRig, fleet: Fleet, observed: Observed, *, encode_concurrency: int = 1
) -> tuple[Workers, Events]:
    events: Events = []
    workers = Workers(
        2,
        Stages(rig.pipeline, backlog_bytes=64 << 20),
        NodeState(lambda: True, lambda: True),
        observe=observed,
        exposition=lambda: (f"observed {len(observed.seen)}\n".encode(), "text/plain"),
        events=lambda name, fields: events.append((name, fields)),
        launch=fleet.launch,
        backoff=0.0,
        encode_slots=EncodeSlots(encode_concurrency),
    )
    return workers, events


def test_a_scrape_counts_every_report_sent_before_it_through_any_worker(rig: NodeRig) -> None:
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed)
    workers.start()
    try:
        reporter, scraper = fleet.launched
        observed.block.clear()  # the core reads worker 0's reports late
        report = channel.encode_observed("http", "ok", "", 2, 0.01)
        reporter.conn.send(MessageKind.OBSERVED, 0, report)
        assert observed.entered.wait(10)
        reporter.conn.send(MessageKind.OBSERVED, 0, report)
        scrape = scraper.conn.start(MessageKind.METRICS, [])
        # The scrape is answered only after worker 0's reports were counted.
        with pytest.raises(TimeoutError):
            scrape.wait(0.3)
        observed.block.set()
        _, text = channel.decode_text(scrape.wait(10).body)
        assert text == b"observed 2\n"
    finally:
        observed.block.set()
        assert workers.stop(5)


def test_a_worker_that_exits_is_replaced_and_the_exit_is_reported(rig: NodeRig) -> None:
    fleet, observed = Fleet(), Observed()
    workers, events = make(rig, fleet, observed)
    workers.start()
    try:
        first = fleet.launched[0]
        first.exit()
        fleet.wait_launched(3)
        replacement = fleet.launched[2]
        assert replacement.index == 0 and replacement.pid != first.pid
        names = [name for name, _ in events]
        exited = [f for name, f in events if name == "worker.exited"]
        assert exited == [
            {
                "index": 0,
                "pid": first.pid,
                "returncode": -9,
                "lived_seconds": exited[0]["lived_seconds"],
                "restarting": True,
            }
        ]
        assert workers.restarts == 1 and "worker.ready" in names
    finally:
        assert workers.stop(5)


def test_a_worker_launched_while_stopping_is_ended_not_left_running(rig: NodeRig) -> None:
    # A replacement whose launch is under way when ``stop`` takes its list of links:
    # it must not be left running outside that list (its reader and process leaked).
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed)
    workers.start()
    release = threading.Event()
    fleet.hold = release  # the supervisor is inside the next launch meanwhile
    stopper: threading.Thread | None = None
    try:
        fleet.launched[0].exit()
        fleet.wait_launched(3)  # the replacement exists; its launch has not returned
        stopper = threading.Thread(target=workers.stop, args=(5,), daemon=True)
        stopper.start()
        # Worker 1 answering STOP shows that stop has taken its list of links.
        assert fleet.launched[1].wait(10) == 0
        release.set()
        stopper.join(30)
        assert not stopper.is_alive()
        assert fleet.launched[2].wait(5) == -9  # ended by the core, not left running
    finally:
        release.set()
        if stopper is None:
            workers.stop(5)


def _partition() -> RecordColumns:
    flat = pa.RecordBatch.from_pylist(
        [
            {
                "time_unix_nano": 1_700_000_000_000_000_000 + i,
                "observed_time_unix_nano": 1_700_000_000_000_000_000 + i,
                "severity_number": 9,
                "severity_text": "INFO",
                "body": f"user {i} logged in",
                "attributes": [("k", str(i))],
                "resource_attributes": [("service.name", "svc")],
                "scope_name": "scope",
                "trace_id": None,
                "span_id": None,
                "record_index": i,
            }
            for i in range(5)
        ],
        schema=FLAT_SCHEMA,
    )
    cols = RecordColumns()
    cols.append_batch(assemble_records("t", flat, [7] * 5, [(str(i),) for i in range(5)], 99))
    return cols


def test_records_partitions_are_encoded_by_the_workers_in_turn(rig: NodeRig) -> None:
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed)
    workers.start()
    try:
        cols = _partition()
        first = workers.encode_records(cols, "zstd")
        second = workers.encode_records(cols, "snappy")
        by = {w.pid: w for w in fleet.launched}
        assert {first, second} == {f"encoded by {pid}".encode() for pid in by}
        for data, compression in ((first, "zstd"), (second, "snappy")):
            worker = by[int(data.split()[-1])]
            assert [c for c, _ in worker.encoded] == [compression]
            assert worker.encoded[0][1].equals(cols.table())  # the rows, as they are
    finally:
        assert workers.stop(5)


def test_tail_6_an_encode_waits_for_a_slot_before_it_is_sent(rig: NodeRig) -> None:
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed, encode_concurrency=1)
    workers.start()
    slots = workers.encoder.slots
    held = threading.Event()
    for worker in fleet.launched:
        worker.hold_encodes = held
    try:
        cols = _partition()
        answers: list[bytes] = []
        callers = [
            threading.Thread(target=lambda: answers.append(workers.encode_records(cols, "zstd")))
            for _ in range(3)
        ]
        for t in callers:
            t.start()
        # the two workers are idle, yet one encode is sent and the others wait for its
        # slot (parked in a Condition: polled, the deadline bounds a failure only)
        deadline = time.monotonic() + 30
        while not (slots.waiting == 2 and any(w.encoding.is_set() for w in fleet.launched)):
            assert time.monotonic() < deadline, (slots.waiting, slots.in_flight)
            time.sleep(0.001)
        assert slots.in_flight == 1
        assert sum(w.encoding.is_set() for w in fleet.launched) == 1
        held.set()
        for t in callers:
            t.join(30)
        assert len(answers) == 3
        assert (slots.max_in_flight, slots.waited, slots.in_flight) == (1, 2, 0)
    finally:
        held.set()
        assert workers.stop(5)


def test_the_core_encodes_a_partition_itself_when_no_worker_answers(rig: NodeRig) -> None:
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed)
    workers.start()
    assert workers.stop(5)  # every channel closed
    cols = _partition()
    assert workers.encode_records(cols, "zstd") == encode_records(cols, "zstd")


def test_a_partition_over_the_channels_frame_bound_is_encoded_by_the_core(
    rig: NodeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, observed = Fleet(), Observed()
    workers, _ = make(rig, fleet, observed)
    workers.start()
    try:
        cols = _partition()
        monkeypatch.setattr(channel, "MAX_FRAME", 64)  # every ENCODE is too large to send
        assert workers.encode_records(cols, "zstd") == encode_records(cols, "zstd")
        assert all(not w.encoded for w in fleet.launched)
    finally:
        monkeypatch.undo()
        assert workers.stop(5)


# -- the replay's decoding ----------------------------------------------------------------


def _payloads(*tags: str) -> list[tuple[str, bytes]]:
    return [("t", request(tag).SerializeToString()) for tag in tags]


class Counted:
    """A decode policy: ``bad`` payloads get ``what`` for their first ``clears_after``
    calls (a fault retries without bound would outlast), every other one is decoded;
    counts the DECODE calls each payload got."""

    def __init__(self, what: str, clears_after: int = 10) -> None:
        self.what = what
        self.clears_after = clears_after
        self.calls: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def __call__(self, payload: bytes) -> str:
        with self._lock:
            self.calls[payload] += 1
            calls = self.calls[payload]
        return self.what if b"bad" in payload and calls <= self.clears_after else "ok"


@pytest.mark.parametrize("what", ["raise", "die"])
def test_every_state_4_a_payload_failing_on_every_worker_is_undecodable_at_the_bound(
    rig: NodeRig, what: str
) -> None:
    policy = Counted(what)
    fleet = Fleet(policy)
    workers, _ = make(rig, fleet, Observed())
    workers.start()
    try:
        frames = _payloads("a", "bad", "b", "c")
        out = list(workers.decode_in_order(frames, stop=threading.Event(), attempts=3))
        assert [type(o) for o in out] == [FlatBatch, Undecodable, FlatBatch, FlatBatch]
        failed = out[1]
        assert isinstance(failed, Undecodable) and failed.attempts == 3
        bad = frames[1][1]
        if what == "raise":
            assert "MemoryError" in failed.error and policy.calls[bad] == 3
        else:
            # the first, windowed send's death is not counted against it (the payload
            # may only have shared the dying worker's queue); three retries are
            assert "died" in failed.error and policy.calls[bad] == 4
    finally:
        assert workers.stop(5)


def test_every_state_1_a_stop_abandons_the_decode_window(rig: NodeRig) -> None:
    fleet = Fleet(lambda payload: "hold")  # nothing is ever answered
    workers, _ = make(rig, fleet, Observed())
    workers.start()
    stop = threading.Event()
    raised: list[BaseException] = []

    def decode() -> None:
        try:
            list(workers.decode_in_order(_payloads("a", "b"), stop=stop, attempts=3))
        except DecodeStopped as exc:
            raised.append(exc)

    t = threading.Thread(target=decode, daemon=True)
    t.start()
    try:
        stop.set()
        t.join(30)
        assert not t.is_alive() and len(raised) == 1
    finally:
        stop.set()
        assert workers.stop(5)


def test_every_state_1_stopping_workers_end_a_decode_that_waits_for_them(rig: NodeRig) -> None:
    # Without a stop of its own, a replay waiting for a worker that is gone waited for
    # ever: the workers stopping ends it (DecodeStopped), never a "finished" replay.
    fleet = Fleet(lambda payload: "hold")
    workers, _ = make(rig, fleet, Observed())
    workers.start()
    raised: list[BaseException] = []

    def decode() -> None:
        try:
            list(workers.decode_in_order(_payloads("a"), stop=threading.Event(), attempts=3))
        except DecodeStopped as exc:
            raised.append(exc)

    t = threading.Thread(target=decode, daemon=True)
    t.start()
    workers.stop(5)
    t.join(30)
    assert not t.is_alive() and len(raised) == 1

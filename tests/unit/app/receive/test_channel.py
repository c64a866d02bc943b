"""app.receive.channel and the worker's side of it (app.receive.worker.RemotePort): framing, the
bodies, and that a worker answers a client with exactly what the core answered — never
before it."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Iterator

import grpc
import pytest

from app.receive import channel
from app.receive.api import IngestOutcome
from app.receive.channel import ChannelClosed, Connection, Kind
from app.receive.otlp import BadRequest, FlatBatch, Unavailable, decode_request, flatten
from app.receive.worker import RemotePort
from tests.support.noderig import request


def batch_of(tag: str, n: int = 3) -> tuple[bytes, FlatBatch]:
    data = request(tag, n).SerializeToString()
    return data, flatten(decode_request(data, "application/x-protobuf"), "acme")


class FakeCore:
    """The core's end of a channel: a reader thread that hands each INGEST to
    ``on_ingest`` (which answers when it likes) and answers STATE."""

    def __init__(self, sock: socket.socket) -> None:
        self.conn = Connection(sock)
        self.ingests: list[tuple[int, str, str, bytes, FlatBatch]] = []
        self.received = threading.Event()
        self.flags = 3
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                kind, ident, body = self.conn.receive()
                if kind is Kind.INGEST:
                    self.ingests.append((ident, *channel.decode_ingest(body)))
                    self.received.set()
                elif kind is Kind.STATE:
                    self.conn.send(Kind.STATE_IS, ident, [bytes([self.flags])])
        except ChannelClosed:
            return

    def close(self) -> None:
        self.conn.close()
        self._thread.join(10)


@pytest.fixture
def pair() -> Iterator[tuple[FakeCore, Connection]]:
    core_end, worker_end = socket.socketpair()
    core = FakeCore(core_end)
    worker = Connection(worker_end)
    reader = threading.Thread(target=_deliver, args=(worker,), daemon=True)
    reader.start()
    try:
        yield core, worker
    finally:
        worker.close()
        core.close()
        reader.join(10)


def _deliver(conn: Connection) -> None:
    try:
        while True:
            conn.deliver(*conn.receive())
    except ChannelClosed:
        return


def test_an_ingest_crosses_the_channel_intact(pair: tuple[FakeCore, Connection]) -> None:
    core, worker = pair
    data, batch = batch_of("a", 5)
    done: list[IngestOutcome] = []
    t = threading.Thread(
        target=lambda: done.append(RemotePort(worker).ingest("acme", data, batch, "grpc"))
    )
    t.start()
    assert core.received.wait(10)
    ((ident, transport, tenant, payload, got),) = core.ingests
    assert (transport, tenant, payload) == ("grpc", "acme", data)
    assert got == batch  # the Arrow columns, value for value
    core.conn.send(Kind.ACK, ident, channel.encode_ack(5, 0, ""))
    t.join(10)
    assert done == [IngestOutcome(5)]


def test_the_worker_answers_only_once_the_core_has(pair: tuple[FakeCore, Connection]) -> None:
    core, worker = pair
    data, batch = batch_of("b")
    returned = threading.Event()

    def ingest() -> None:
        RemotePort(worker).ingest("acme", data, batch, "http")
        returned.set()

    t = threading.Thread(target=ingest)
    t.start()
    assert core.received.wait(10)
    # The core has the request and has not answered: the worker must still be waiting.
    assert not returned.is_set()
    t.join(0.2)
    assert t.is_alive() and not returned.is_set()
    (ident, *_) = core.ingests[0]
    core.conn.send(Kind.ACK, ident, channel.encode_ack(3, 0, ""))
    assert returned.wait(10)
    t.join(10)


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(
            Unavailable("tenant 'x' is settling", retry_after=7, error_type="settling"),
            id="unavailable_with_retry",
        ),
        pytest.param(BadRequest("tenant header is not ASCII"), id="bad_request"),
    ],
)
def test_the_worker_relays_the_cores_refusal_as_is(
    pair: tuple[FakeCore, Connection], refusal: Unavailable | BadRequest
) -> None:
    core, worker = pair
    refusal.records = 3
    data, batch = batch_of("c")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            RemotePort(worker).ingest("acme", data, batch, "http")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert core.received.wait(10)
    (ident, *_) = core.ingests[0]
    core.conn.send(Kind.REFUSAL, ident, channel.encode_refusal(refusal))
    t.join(10)
    (exc,) = raised
    assert isinstance(exc, channel.RemoteRejection)
    assert (exc.http_status, exc.grpc_code) == (refusal.http_status, refusal.grpc_code)
    assert (exc.message, exc.retry_after) == (refusal.message, refusal.retry_after)
    assert (exc.error_type, exc.records) == (refusal.error_type, 3)


def test_a_core_gone_mid_request_is_a_retryable_unavailable(
    pair: tuple[FakeCore, Connection],
) -> None:
    core, worker = pair
    data, batch = batch_of("d")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            RemotePort(worker).ingest("acme", data, batch, "http")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert core.received.wait(10)
    core.close()
    t.join(10)
    (exc,) = raised
    assert isinstance(exc, Unavailable) and exc.retry_after == 1
    assert exc.grpc_code is grpc.StatusCode.UNAVAILABLE


def test_state_reads_the_cores_flags(pair: tuple[FakeCore, Connection]) -> None:
    core, worker = pair
    remote = RemotePort(worker)
    assert remote.ready and remote.alive
    core.flags = 2
    ready: bool = remote.ready  # declared: not the True the assert above narrowed it to
    assert not ready and remote.alive


def test_a_broken_frame_closes_the_channel() -> None:
    a, b = socket.socketpair()
    conn = Connection(b)
    try:
        a.sendall((1 << 31).to_bytes(4, "little") + b"\x01" + bytes(8))
        with pytest.raises(ChannelClosed, match="breaks the protocol"):
            conn.receive()
    finally:
        a.close()
        conn.close()


def test_an_unknown_kind_closes_the_channel() -> None:
    a, b = socket.socketpair()
    conn = Connection(b)
    try:
        a.sendall((9).to_bytes(4, "little") + b"\xff" + bytes(8))
        with pytest.raises(ChannelClosed, match="unknown frame kind 255"):
            conn.receive()
    finally:
        a.close()
        conn.close()


def test_frames_of_every_size_arrive_whole_and_in_order_however_the_bytes_are_cut() -> None:
    # The reader's buffer holds several small frames at once and receives a large body
    # into a buffer of its own; frames cut anywhere, or run together, read the same.
    rng = random.Random(14)
    sizes = [0, 1, 12, 13, 200, 4_000, 16_384, 16_385, 40_000, 65_536, 70_000, 200_000]
    frames = [(i, rng.randbytes(rng.choice(sizes))) for i in range(1, 120)]
    raw = b"".join(
        struct.pack("<IBQ", len(body) + 9, Kind.TEXT, ident) + body for ident, body in frames
    )
    a, b = socket.socketpair()
    a.settimeout(10)  # a reader that lost the framing fails instead of waiting for good
    conn = Connection(a)

    def write() -> None:
        at = 0
        try:
            while at < len(raw):
                step = rng.choice([1, 7, 13, 500, 9_000, 70_000, 300_000])
                b.sendall(raw[at : at + step])
                at += step
        except OSError:
            pass  # the reader failed and closed its end
        finally:
            b.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for ident, body in frames:
            assert conn.receive() == (Kind.TEXT, ident, memoryview(body))
        with pytest.raises(ChannelClosed):
            conn.receive()
    finally:
        conn.close()
        writer.join()


def test_an_ingest_awaited_on_an_event_loop_gets_the_cores_answer(
    pair: tuple[FakeCore, Connection],
) -> None:
    # The worker's HTTP receiver awaits the core's answer on its event loop (no thread
    # per request): the reader thread wakes the loop when the answer arrives.
    core, worker = pair
    data, batch = batch_of("e", 4)

    async def go() -> tuple[IngestOutcome, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:  # the loop stays free while the call is out
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.ensure_future(ticker())
        ingest = asyncio.ensure_future(RemotePort(worker).ingest_async("acme", data, batch, "http"))
        while not core.ingests:
            await asyncio.sleep(0.001)
        ((ident, *_),) = core.ingests
        seen = ticks
        core.conn.send(Kind.ACK, ident, channel.encode_ack(4, 1, "one refused"))
        outcome = await asyncio.wait_for(ingest, 10)
        beat.cancel()
        return outcome, seen

    outcome, ticks = asyncio.run(go())
    assert outcome == IngestOutcome(4, 1, "one refused")
    assert ticks > 0


def test_an_ingest_awaited_on_an_event_loop_is_unavailable_when_the_core_goes(
    pair: tuple[FakeCore, Connection],
) -> None:
    core, worker = pair
    data, batch = batch_of("f")

    async def go() -> None:
        ingest = asyncio.ensure_future(RemotePort(worker).ingest_async("acme", data, batch, "grpc"))
        while not core.ingests:
            await asyncio.sleep(0.001)
        core.close()
        await asyncio.wait_for(ingest, 10)

    with pytest.raises(Unavailable) as raised:
        asyncio.run(go())
    assert raised.value.retry_after == 1 and raised.value.records == 3

"""The worker's side of the channel (``app.receive.worker_process.RemotePort``): a worker answers
a client with exactly what the core answered — never before it — relays a refusal as is,
turns a core gone mid-request into a retryable refusal, and reads the core's state. The
channel's framing is tested in ``test_channel.py``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

from app.base.batch import FlatBatch
from app.base.rejections import BadRequest, Unavailable
from app.receive import channel
from app.receive.api import IngestOutcome
from app.receive.channel import Connection, MessageKind
from app.receive.worker_process import RemotePort, _Jobs
from tests.support.decode_slots import spy_native
from tests.support.fakecore import FakeCore, batch_of, channel_pair


@pytest.fixture
def pair() -> Iterator[tuple[FakeCore, Connection]]:
    yield from channel_pair()


def ingest_on_a_thread(
    worker: Connection, data: bytes, batch: FlatBatch
) -> tuple[threading.Thread, list[BaseException]]:
    """A started thread ingesting ``batch`` (tenant ``acme``, over HTTP) through the
    worker's ``RemotePort``, and the list that will hold what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            RemotePort(worker).ingest("acme", data, batch, "http")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, raised


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
    core.conn.send(MessageKind.ACK, ident, channel.encode_ack(3, 0, ""))
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
    t, raised = ingest_on_a_thread(worker, data, batch)
    assert core.received.wait(10)
    (ident, *_) = core.ingests[0]
    core.conn.send(MessageKind.REFUSAL, ident, channel.encode_refusal(refusal))
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
    t, raised = ingest_on_a_thread(worker, data, batch)
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


def test_every_state_3_a_worker_says_why_the_core_is_not_alive(
    pair: tuple[FakeCore, Connection],
) -> None:
    """A worker's /healthz names the core's failed thread: STATE carries the reason."""
    core, worker = pair
    remote = RemotePort(worker)
    assert remote.health_detail == ""
    core.flags, core.detail = 1, b"thread committer stopped: KeyError: 7"
    alive: bool = remote.alive  # declared: not narrowed by the assert above
    assert not alive and remote.health_detail == "thread committer stopped: KeyError: 7"


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
        core.conn.send(MessageKind.ACK, ident, channel.encode_ack(4, 1, "one refused"))
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


def test_native_4_a_replayed_payload_is_decoded_natively_on_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The core's replay sends each WAL payload as a DECODE job (app.node.recovery with
    # workers): the worker's job thread answers it with the native decoder's columns.
    answered = spy_native(monkeypatch)
    data, expected = batch_of("replayed", 3)
    core_end, worker_end = socket.socketpair()
    core, worker = Connection(core_end), Connection(worker_end)
    jobs = _Jobs(worker)
    try:
        body = b"".join(channel.encode_decode_request("acme", data))
        jobs.put(MessageKind.DECODE, 7, memoryview(body))
        kind, ident, answer = core.receive()
    finally:
        jobs.close()
        core.close()
        worker.close()
    assert (kind, ident) == (MessageKind.DECODED, 7)
    assert FlatBatch("acme", channel.decode_batch(answer)) == expected
    assert answered == [3]

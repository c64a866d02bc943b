"""app.receive.channel: framing and the bodies, an ingest crossing it intact. The worker's
side of it (``app.receive.worker_process.RemotePort``: answering only once the core has) is tested
in ``test_worker.py``."""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from app.receive import channel
from app.receive.api import IngestOutcome
from app.receive.channel import ChannelClosed, Connection, MessageKind
from app.receive.worker_process import RemotePort
from tests.support.fakecore import FakeCore, batch_of, channel_pair


@pytest.fixture
def pair() -> Iterator[tuple[FakeCore, Connection]]:
    yield from channel_pair()


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
    core.conn.send(MessageKind.ACK, ident, channel.encode_ack(5, 0, ""))
    t.join(10)
    assert done == [IngestOutcome(5)]


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
        struct.pack("<IBQ", len(body) + 9, MessageKind.TEXT, ident) + body for ident, body in frames
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
            assert conn.receive() == (MessageKind.TEXT, ident, memoryview(body))
        with pytest.raises(ChannelClosed):
            conn.receive()
    finally:
        conn.close()
        writer.join()

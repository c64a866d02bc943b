"""The core's end of a worker channel for tests of ``app.receive.channel`` and of the
worker's ``RemotePort``: a ``FakeCore`` that records each INGEST and answers when the test
says, and ``channel_pair()``, the body of a ``pair`` fixture (a core and the worker's
connection, with a thread delivering the worker's answers)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

from app.base.batch import FlatBatch
from app.receive import channel
from app.receive.channel import ChannelClosed, Connection, MessageKind
from app.receive.otlp import decode_request, flatten
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
        #: why the core is not alive, sent after the flags (the core's thread verdict)
        self.detail = b""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                kind, ident, body = self.conn.receive()
                if kind is MessageKind.INGEST:
                    self.ingests.append((ident, *channel.decode_ingest(body)))
                    self.received.set()
                elif kind is MessageKind.STATE:
                    self.conn.send(MessageKind.STATE_IS, ident, [bytes([self.flags]), self.detail])
        except ChannelClosed:
            return

    def close(self) -> None:
        self.conn.close()
        self._thread.join(10)


def channel_pair() -> Iterator[tuple[FakeCore, Connection]]:
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

"""The local channel between a worker process and the core: framed messages over one
Unix stream socket per worker (a ``socketpair`` the core makes before it starts the
worker).

Frame layout (little-endian)::

    u32 length | u8 kind | u64 id | body            length counts kind, id and body

``id`` pairs an answer with its call: the side that calls picks it, the other side
answers with the same id. Both sides call: a worker calls the core to ingest a batch,
to read the core's state and its metrics, and tells it how each request ended (the
core keeps every counter, so a worker that dies takes none with it); the core calls a
worker to flush those reports before a scrape, to decode a WAL payload for replay and
to stop. A side answers every call it
receives, in any order. The record data never goes through pickle: a decoded batch
travels as one Arrow IPC record-batch message (``FLAT_SCHEMA``, which both sides know,
so no schema is sent).

Bodies (``str8``/``str16``/``str32``: UTF-8 prefixed by a u8/u16/u32 length)::

    INGEST      u8 transport | str8 tenant | u32 payload_len | payload | Arrow message
    ACK         u32 records | u32 rejected | str32 message
    REFUSAL     u16 http status | u8 gRPC code | i32 retry_after (-1: none)
                | u32 records | str16 error_type | str32 message
    STATE       (empty)  →  STATE_IS  u8 flags (1: ready, 2: alive) | why not alive (UTF-8)
    METRICS     (empty)  →  TEXT      str16 content type | the exposition
    OBSERVED    u8 transport | u8 outcome | u32 records | f64 seconds | str8 error_type
                (no answer: a finished request, for the core's counters)
    FLUSH       (empty)  →  FLUSHED   (every OBSERVED sent before it has been read)
    DECODE      str8 tenant | the WAL payload  →  DECODED  Arrow message | REFUSAL
    ENCODE      str8 compression | Arrow IPC stream (``RECORDS_SCHEMA``)
                →  ENCODED  the Parquet object | REFUSAL
    STOP        (empty)  →  STOPPING  (the worker stops listening, finishes, exits)
    HELLO       u32 pid (no answer: the worker's listeners are up)

Framing errors (a short read, an unknown kind, a length over ``MAX_FRAME``) close the
connection: both ends are our own code, so one is a bug or a dying peer, never data to
parse around.
"""

from __future__ import annotations

import enum
import itertools
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
import pyarrow as pa

from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection
from sink.parquet import FLAT_SCHEMA, RECORDS_SCHEMA

__all__ = [
    "MAX_FRAME",
    "Answer",
    "Call",
    "ChannelClosed",
    "Connection",
    "MessageKind",
    "RemoteRejection",
    "Transport",
    "decode_ack",
    "decode_batch",
    "decode_decode_request",
    "decode_ingest",
    "decode_observed",
    "decode_refusal",
    "decode_text",
    "decode_encode_request",
    "encode_ack",
    "encode_decode_request",
    "encode_encode_request",
    "encode_ingest",
    "encode_observed",
    "encode_refusal",
    "encode_text",
]

_HEAD: Final = struct.Struct("<IBQ")
_U8: Final = struct.Struct("<B")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_ACK: Final = struct.Struct("<II")
_REFUSAL: Final = struct.Struct("<HBiI")
_OBSERVED: Final = struct.Struct("<BBId")
_OUTCOMES: Final = ("ok", "refused", "error")
#: A frame's bound: a WAL frame's payload (``wal.max_frame_bytes`` tops out well below)
#: plus its decoded batch, with room to spare. A longer length is a broken peer.
MAX_FRAME: Final = 1 << 30
#: The reader's receive buffer, and the size above which a frame body is received into
#: a buffer of its own instead (at most a quarter of it, so a small frame always fits).
_RECV_BYTES: Final = 1 << 16
_DIRECT_BYTES: Final = 1 << 14
#: How long ``close`` waits for the reader thread to leave the socket.
_CLOSE_WAIT_S: Final = 5.0


class MessageKind(enum.IntEnum):
    INGEST = 1
    ACK = 2
    REFUSAL = 3
    STATE = 4
    STATE_IS = 5
    METRICS = 6
    TEXT = 7
    OBSERVED = 8
    FLUSH = 9
    FLUSHED = 10
    DECODE = 11
    DECODED = 12
    STOP = 13
    STOPPING = 14
    HELLO = 15
    ENCODE = 16
    ENCODED = 17


class Transport(enum.IntEnum):
    HTTP = 1
    GRPC = 2


_TRANSPORTS: Final = {"http": Transport.HTTP, "grpc": Transport.GRPC}


class ChannelClosed(ConnectionError):
    """The peer closed the channel, or a frame broke the protocol (says which)."""


@dataclass(frozen=True, slots=True)
class Answer:
    kind: MessageKind
    body: memoryview


class Connection:
    """One end of a channel: framed sends (thread-safe) and blocking receives (one
    reader thread). ``call`` sends a request and blocks until its answer arrives, which
    the reader thread hands over (``deliver``)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        # What the reader thread received and has not returned yet: ``_buf[_start:_end]``.
        self._buf = bytearray(_RECV_BYTES)
        self._start = 0
        self._end = 0
        # Held while the reader thread reads: ``close`` takes it after its shutdown has
        # woken the reader and before it closes the descriptor, so a reader can never
        # call ``recv`` on a number the kernel has already handed to a new socket.
        self._receiving = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._calls: dict[int, _Slot] = {}
        self._calls_lock = threading.Lock()
        self._closed: ChannelClosed | None = None

    def fileno(self) -> int:
        return self._sock.fileno()

    # -- sending ----------------------------------------------------------------------

    def send(
        self, kind: MessageKind, ident: int, parts: Sequence[bytes | memoryview | pa.Buffer]
    ) -> None:
        """One frame from ``parts`` (written in order, not concatenated)."""
        views = [memoryview(p).cast("B") for p in parts]
        length = _HEAD.size - 4 + sum(len(v) for v in views)
        if length > MAX_FRAME:
            raise ValueError(f"a channel frame of {length} bytes exceeds {MAX_FRAME}")
        views.insert(0, memoryview(_HEAD.pack(length, kind, ident)))
        with self._send_lock:
            try:
                _send_all(self._sock, views)
            except OSError as exc:
                raise ChannelClosed(f"sending on the channel failed: {exc}") from exc

    def start(
        self,
        kind: MessageKind,
        parts: Sequence[bytes | memoryview | pa.Buffer],
        on_done: Callable[[], None] | None = None,
    ) -> Call:
        """Send a request; its answer is ``Call.wait``'s (``ChannelClosed`` when the
        channel is closed). ``on_done`` is called, on the reader's thread, once the answer
        is there or the channel has closed (an event loop's wake-up)."""
        ident = next(self._ids)
        slot = _Slot()
        slot.on_done = on_done
        with self._calls_lock:
            if self._closed is not None:
                raise ChannelClosed(str(self._closed))
            self._calls[ident] = slot
        try:
            self.send(kind, ident, parts)
        except BaseException:
            with self._calls_lock:
                self._calls.pop(ident, None)
            raise
        return Call(self, kind, ident, slot)

    def call(
        self,
        kind: MessageKind,
        parts: Sequence[bytes | memoryview | pa.Buffer],
        timeout: float | None = None,
    ) -> Answer:
        """Send a request and wait for its answer (``ChannelClosed`` when the channel
        closes first, ``TimeoutError`` after ``timeout`` seconds)."""
        call = self.start(kind, parts)
        try:
            return call.wait(timeout)
        finally:
            call.forget()

    # -- receiving (the reader thread) ------------------------------------------------

    def receive(self) -> tuple[MessageKind, int, memoryview]:
        """The next frame; ``ChannelClosed`` at the end of the stream or on a broken
        frame — which also fails every call still waiting for an answer."""
        try:
            return self._receive()
        except ChannelClosed as exc:
            self._fail_calls(str(exc))
            raise
        except (OSError, ValueError) as exc:  # read on a closed file or socket
            self._fail_calls(f"the channel closed: {exc}")
            raise ChannelClosed(f"the channel closed: {exc}") from exc

    def _receive(self) -> tuple[MessageKind, int, memoryview]:
        with self._receiving:
            head = self._take(_HEAD.size, "the peer closed the channel")
            length, kind, ident = _HEAD.unpack(head)
            if length > MAX_FRAME or length < _HEAD.size - 4:
                raise ChannelClosed(f"a frame of {length} bytes breaks the protocol")
            body = self._take(
                length - (_HEAD.size - 4), "the peer closed the channel inside a frame"
            )
        try:
            return MessageKind(kind), ident, body
        except ValueError:
            raise ChannelClosed(f"unknown frame kind {kind}") from None

    def _take(self, n: int, eof: str) -> memoryview:
        """The next ``n`` bytes of the stream. Reads go into a fixed buffer (``recv_into``,
        no allocation): a frame the peer wrote with one ``sendmsg`` usually arrives whole
        with its head, and several small frames arrive with one call. A larger body is
        received into its own buffer: what already arrived is copied once and the rest
        is read straight into it with ``MSG_WAITALL`` — one system call, one release of
        the interpreter lock, where a stream buffer spent the link reader's time in
        copies and reallocations (docs/BENCHMARKS.md, issue 14)."""
        buf, start, end = self._buf, self._start, self._end
        if end - start >= n:
            self._start = start + n
            return memoryview(buf[start : start + n])  # a copy: the buffer is reused
        if n > _DIRECT_BYTES:
            # From Arrow's memory pool: reused memory, not zero-filled (a fresh bytearray
            # of this size was, under load, a page-faulting allocation on every batch).
            out = memoryview(pa.allocate_buffer(n)).cast("B")
            have = end - start
            out[:have] = memoryview(buf)[start:end]
            self._start = self._end = 0
            rest = out[have:]
            while rest:
                got = self._sock.recv_into(rest, len(rest), socket.MSG_WAITALL)
                if not got:
                    raise ChannelClosed(eof)
                rest = rest[got:]
            return out
        if start:  # move the partial frame to the front, so it has room to complete
            buf[: end - start] = buf[start:end]
            end -= start
            self._start = start = 0
        view = memoryview(buf)
        while end < n:
            got = self._sock.recv_into(view[end:], len(buf) - end)
            if not got:
                self._end = end
                raise ChannelClosed(eof)
            end += got
        self._end = end
        self._start = n
        return memoryview(buf[:n])

    def deliver(self, kind: MessageKind, ident: int, body: memoryview) -> bool:
        """Hand an answer to the ``call`` waiting for it; False when none waits (it
        timed out, or the id is not one of ours)."""
        with self._calls_lock:
            slot = self._calls.pop(ident, None)
        if slot is None:
            return False
        slot.answer = Answer(kind, body)
        slot.finish()
        return True

    def close(self, why: str = "the channel closed") -> None:
        """Close the channel and fail every waiting call. The shutdown wakes a reader
        blocked on the socket first, so closing its buffered file does not wait long."""
        self._fail_calls(why)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        # The shutdown ends a read in progress; wait for it to leave the socket (bounded:
        # a close must not hang on a reader that somehow stays).
        receiving = self._receiving.acquire(timeout=_CLOSE_WAIT_S)
        try:
            self._sock.close()
        finally:
            if receiving:
                self._receiving.release()

    def _fail_calls(self, why: str) -> None:
        with self._calls_lock:
            if self._closed is None:
                self._closed = ChannelClosed(why)
            waiting = list(self._calls.values())
            self._calls.clear()
        for slot in waiting:
            slot.finish()

    @property
    def closed(self) -> bool:
        return self._closed is not None


class Call:
    """A request sent on a ``Connection``, waiting for its answer."""

    __slots__ = ("_conn", "_kind", "_ident", "_slot")

    def __init__(self, conn: Connection, kind: MessageKind, ident: int, slot: _Slot) -> None:
        self._conn = conn
        self._kind = kind
        self._ident = ident
        self._slot = slot

    def wait(self, timeout: float | None = None) -> Answer:
        """The answer; ``ChannelClosed`` when the channel closed first, ``TimeoutError``
        after ``timeout`` seconds (the call stays pending: wait again, or ``forget``)."""
        if not self._slot.done.wait(timeout):
            raise TimeoutError(f"no answer to {self._kind.name} within {timeout} s")
        self.forget()
        if self._slot.answer is None:
            raise ChannelClosed(str(self._conn._closed or "the channel closed"))
        return self._slot.answer

    def forget(self) -> None:
        """Stop waiting: an answer that still comes is dropped."""
        conn = self._conn
        with conn._calls_lock:
            conn._calls.pop(self._ident, None)


class _Slot:
    __slots__ = ("done", "answer", "on_done")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Answer | None = None
        self.on_done: Callable[[], None] | None = None

    def finish(self) -> None:
        self.done.set()
        if self.on_done is not None:
            self.on_done()


def _send_all(sock: socket.socket, views: list[memoryview]) -> None:
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


# -- bodies -----------------------------------------------------------------------------


def _str8(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFF:
        raise ValueError(f"{text[:32]!r}… is longer than 255 bytes")
    return _U8.pack(len(raw)) + raw


def _str16(text: str) -> bytes:
    raw = text.encode("utf-8")[:0xFFFF]
    return _U16.pack(len(raw)) + raw


def _str32(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _U32.pack(len(raw)) + raw


class _Cursor:
    __slots__ = ("view", "at")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.at = 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.view):
            raise ChannelClosed(f"a body ends at byte {len(self.view)}, {n} more were expected")
        out = self.view[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return st.unpack(self.take(st.size))

    def str8(self) -> str:
        return bytes(self.take(self.unpack(_U8)[0])).decode("utf-8")

    def str16(self) -> str:
        return bytes(self.take(self.unpack(_U16)[0])).decode("utf-8")

    def str32(self) -> str:
        return bytes(self.take(self.unpack(_U32)[0])).decode("utf-8")

    def rest(self) -> memoryview:
        return self.take(len(self.view) - self.at)


def encode_ingest(
    transport: str, tenant: str, payload: bytes, batch: FlatBatch
) -> list[bytes | pa.Buffer]:
    return [
        _U8.pack(_TRANSPORTS[transport]) + _str8(tenant) + _U32.pack(len(payload)),
        payload,
        batch.columns.serialize(),
    ]


def decode_ingest(body: memoryview) -> tuple[str, str, bytes, FlatBatch]:
    """(transport, tenant, WAL payload, batch) of an INGEST body."""
    c = _Cursor(body)
    transport = Transport(c.unpack(_U8)[0]).name.lower()
    tenant = c.str8()
    payload = bytes(c.take(c.unpack(_U32)[0]))
    return transport, tenant, payload, FlatBatch(tenant, decode_batch(c.rest()))


def decode_batch(view: memoryview) -> pa.RecordBatch:
    """An Arrow IPC record-batch message in ``FLAT_SCHEMA`` (zero-copy over ``view``)."""
    try:
        return pa.ipc.read_record_batch(pa.py_buffer(view), FLAT_SCHEMA)
    except (pa.ArrowException, ValueError) as exc:
        raise ChannelClosed(f"an Arrow batch on the channel does not read: {exc}") from exc


def encode_ack(records: int, rejected: int, message: str) -> list[bytes]:
    return [_ACK.pack(records, rejected) + _str32(message)]


def decode_ack(body: memoryview) -> tuple[int, int, str]:
    c = _Cursor(body)
    records, rejected = c.unpack(_ACK)
    return records, rejected, c.str32()


class RemoteRejection(IngestRejection):
    """A refusal the core sent back: the worker answers the client with exactly the
    status, retry hint, error type and message the core chose."""

    def __init__(
        self,
        message: str,
        *,
        http_status: int,
        grpc_code: grpc.StatusCode,
        retry_after: int | None,
        error_type: str,
    ) -> None:
        super().__init__(message, retry_after=retry_after, error_type=error_type)
        self.http_status = http_status  # type: ignore[misc]
        self.grpc_code = grpc_code  # type: ignore[misc]


_GRPC_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}


def encode_refusal(rejection: IngestRejection) -> list[bytes]:
    retry = -1 if rejection.retry_after is None else rejection.retry_after
    return [
        _REFUSAL.pack(rejection.http_status, rejection.grpc_code.value[0], retry, rejection.records)
        + _str16(rejection.error_type)
        + _str32(rejection.message)
    ]


def decode_refusal(body: memoryview) -> RemoteRejection:
    c = _Cursor(body)
    http_status, grpc_code, retry, records = c.unpack(_REFUSAL)
    error_type = c.str16()
    message = c.str32()
    refusal = RemoteRejection(
        message,
        http_status=http_status,
        grpc_code=_GRPC_CODES.get(grpc_code, grpc.StatusCode.UNKNOWN),
        retry_after=None if retry < 0 else retry,
        error_type=error_type,
    )
    refusal.records = records
    return refusal


def encode_observed(
    transport: str, outcome: str, error_type: str, records: int, seconds: float
) -> list[bytes]:
    return [
        _OBSERVED.pack(_TRANSPORTS[transport], _OUTCOMES.index(outcome), records, seconds)
        + _str8(error_type)
    ]


def decode_observed(body: memoryview) -> tuple[str, str, str, int, float]:
    """(transport, outcome, error_type, records, seconds) of an OBSERVED body."""
    c = _Cursor(body)
    transport, outcome, records, seconds = c.unpack(_OBSERVED)
    error_type = c.str8()
    return Transport(transport).name.lower(), _OUTCOMES[outcome], error_type, records, seconds


def encode_text(content_type: str, text: bytes) -> list[bytes]:
    return [_str16(content_type), text]


def decode_text(body: memoryview) -> tuple[str, bytes]:
    c = _Cursor(body)
    content_type = c.str16()
    return content_type, bytes(c.rest())


def encode_decode_request(tenant: str, payload: bytes) -> list[bytes]:
    return [_str8(tenant), payload]


def decode_decode_request(body: memoryview) -> tuple[str, bytes]:
    c = _Cursor(body)
    tenant = c.str8()
    return tenant, bytes(c.rest())


def encode_encode_request(compression: str, table: pa.Table) -> list[bytes | pa.Buffer]:
    """An ENCODE body: the compression and the partition's rows as an Arrow IPC stream
    (written without the interpreter lock; the record batches are copied once)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RECORDS_SCHEMA) as writer:
        writer.write_table(table)
    return [_str8(compression), sink.getvalue()]


def decode_encode_request(body: memoryview) -> tuple[str, pa.Table]:
    """(compression, rows) of an ENCODE body (the table reads zero-copy over ``body``)."""
    c = _Cursor(body)
    compression = c.str8()
    try:
        table = pa.ipc.open_stream(pa.py_buffer(c.rest())).read_all()
    except (pa.ArrowException, ValueError) as exc:
        raise ChannelClosed(f"an Arrow stream on the channel does not read: {exc}") from exc
    if not table.schema.equals(RECORDS_SCHEMA):
        raise ChannelClosed(f"an ENCODE stream has schema {table.schema}, not RECORDS_SCHEMA")
    return compression, table

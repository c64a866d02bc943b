"""A worker process: the per-request work of ``ourios serve`` (DESIGN.md §5).

The core starts ``python -m app.receive.worker_process`` with, as inherited descriptors,
its end of the channel (``app.receive.channel``) and the HTTP listening socket (bound
and listening in the core, so every worker accepts from one queue and a worker that dies
loses no queued connection); the gRPC port is bound here with ``SO_REUSEPORT`` beside
the core's reservation of it. A worker serves the same receivers as the in-process node
(``app.receive.otlp_http``, ``app.receive.otlp_grpc``) over a ``RemotePort``: auth,
decompression, decoding and flattening to Arrow run here, and ``ingest`` hands the core
(tenant, WAL payload, batch) and blocks until the core's answer, which it relays as is.
It keeps no state of its own: the core counts every request (``OBSERVED`` reports), and
a worker that dies loses only the requests it had not answered.

The worker never outlives the core: the kernel sends it SIGKILL when the core's
supervising thread ends (``PR_SET_PDEATHSIG``), and it exits at once if the core died
before that was armed. It ignores SIGTERM and SIGINT — the core orchestrates shutdown
with ``STOP``: stop accepting, finish the requests in flight (the core still answers
them), then exit 0. Its main thread reads the channel; uvicorn runs in a thread of its
own, so it installs no signal handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import queue
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from app.base.batch import FlatBatch
from app.base.config import ConfigError, load_settings
from app.base.events import open_logs
from app.base.gc_policy import freeze_long_lived_heap
from app.base.rejections import IngestRejection, Unavailable
from app.receive import channel, native
from app.receive.api import IngestOutcome
from app.receive.auth import Authenticator
from app.receive.channel import ChannelClosed, Connection, MessageKind
from app.receive.inflight import receiver_bounds
from app.receive.otlp import decode_flat
from app.receive.otlp_grpc import create_grpc_server
from app.receive.otlp_http import create_http_app, http_server
from app.receive.tls import TlsError, server_tls
from sink.parquet import encode_table

if TYPE_CHECKING:
    import grpc
    import uvicorn

    from app.base.config import Settings
    from app.base.events import EventLog

__all__ = ["RemotePort", "main"]

log = logging.getLogger("ourios.worker")

_PR_SET_PDEATHSIG: Final = 1
#: How long a request waits for the core's answer before the client is told to retry.
#: The core answers every request it accepted; this only bounds a wedged core.
ANSWER_TIMEOUT_S: Final = 300.0


class RemotePort:
    """The receivers' ``IngestPort`` in a worker: every call goes to the core."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        try:
            answer = self._conn.call(
                MessageKind.INGEST,
                channel.encode_ingest(transport, tenant, payload, batch),
                ANSWER_TIMEOUT_S,
            )
        except (ChannelClosed, TimeoutError) as exc:
            raise _no_answer(exc, len(batch)) from exc
        return _outcome(answer)

    async def ingest_async(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        """``ingest`` for a receiver on an event loop: the call is sent from the loop's
        thread and the loop is woken when the answer is there, so a request needs no
        thread of its own: a hop to a thread and back per request, and the threads
        contending for the interpreter, were a large share of a worker's time
        (docs/BENCHMARKS.md, issue 14)."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # on the channel reader's thread
            try:
                loop.call_soon_threadsafe(_resolve, answered)
            except RuntimeError:
                pass  # the loop has closed: nobody waits any more

        try:
            call = self._conn.start(
                MessageKind.INGEST, channel.encode_ingest(transport, tenant, payload, batch), wake
            )
        except ChannelClosed as exc:
            raise _no_answer(exc, len(batch)) from exc
        try:
            await asyncio.wait_for(answered, ANSWER_TIMEOUT_S)
            answer = call.wait(0)
        except (ChannelClosed, TimeoutError) as exc:
            call.forget()
            raise _no_answer(exc, len(batch)) from exc
        return _outcome(answer)

    def _state(self) -> tuple[int, str]:
        try:
            answer = self._conn.call(MessageKind.STATE, [], 10.0)
        except (ChannelClosed, TimeoutError) as exc:
            return 0, f"the core did not answer: {exc}"
        if answer.kind is not MessageKind.STATE_IS or not len(answer.body):
            return 0, "the core did not answer"
        return answer.body[0], bytes(answer.body[1:]).decode("utf-8", "replace")

    @property
    def ready(self) -> bool:
        return bool(self._state()[0] & 1)

    @property
    def alive(self) -> bool:
        return bool(self._state()[0] & 2)

    @property
    def health_detail(self) -> str:
        flags, detail = self._state()
        return "" if flags & 2 else detail

    def metrics_text(self) -> tuple[bytes, str]:
        answer = self._conn.call(MessageKind.METRICS, [], 30.0)
        content_type, text = channel.decode_text(answer.body)
        return text, content_type


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _no_answer(exc: BaseException, records: int) -> Unavailable:
    refusal = Unavailable(f"the core did not answer (retry): {exc}", retry_after=1)
    refusal.records = records
    return refusal


def _outcome(answer: channel.Answer) -> IngestOutcome:
    """The core's answer to an INGEST: the outcome, or its refusal raised."""
    if answer.kind is MessageKind.ACK:
        records, rejected, message = channel.decode_ack(answer.body)
        return IngestOutcome(records, rejected, message)
    if answer.kind is MessageKind.REFUSAL:
        raise channel.decode_refusal(answer.body)
    raise ChannelClosed(f"the core answered INGEST with {answer.kind.name}")


class ReportingObserver:
    """The receivers' observer in a worker: each finished request is reported to the
    core, which keeps the counters (``OBSERVED``, no answer)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def observe(
        self, transport: str, outcome: str, error_type: str, records: int, seconds: float
    ) -> None:
        try:
            self._conn.send(
                MessageKind.OBSERVED,
                0,
                channel.encode_observed(transport, outcome, error_type, records, seconds),
            )
        except ChannelClosed:
            pass  # the core is gone; so is this worker, momentarily


def _arm_parent_death(parent: int) -> None:
    """SIGKILL when the core's supervising thread ends; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(0)  # the core died before the signal was armed: no orphan


class _Jobs:
    """The core's calls that take CPU — decoding WAL payloads for its replay, encoding
    its records partitions as Parquet — on a thread of their own, so the channel reader
    stays free to deliver answers."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._jobs: queue.SimpleQueue[tuple[MessageKind, int, memoryview] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="ourios-jobs", daemon=True)
        self._thread.start()

    def put(self, kind: MessageKind, ident: int, body: memoryview) -> None:
        self._jobs.put((kind, ident, body))

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            kind, ident, body = job
            parts: list[bytes | pa.Buffer]
            try:
                if kind is MessageKind.DECODE:
                    tenant, payload = channel.decode_decode_request(body)
                    batch = decode_flat(payload, tenant)
                    parts, answer = [batch.columns.serialize()], MessageKind.DECODED
                else:
                    compression, table = channel.decode_encode_request(body)
                    parts, answer = [encode_table(table, compression)], MessageKind.ENCODED
            except IngestRejection as exc:
                parts, answer = list(channel.encode_refusal(exc)), MessageKind.REFUSAL
            except Exception as exc:  # noqa: BLE001 - reported to the core, which retries
                # named by its type too: a MemoryError's message is empty
                failed = IngestRejection(f"{kind.name.lower()} failed: {type(exc).__name__}: {exc}")
                parts, answer = list(channel.encode_refusal(failed)), MessageKind.REFUSAL
            try:
                self._conn.send(answer, ident, parts)
            except ChannelClosed:
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.receive.worker_process")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--http-fd", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--config", type=Path, default=None)
    args = parser.parse_args(argv)
    _arm_parent_death(args.parent)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the core orchestrates shutdown (STOP)
    try:
        settings = load_settings(os.environ, args.config)
    except ConfigError as exc:
        print(f"worker {args.index}: {exc}", file=sys.stderr)
        return 2
    events = open_logs(settings.server.log_level, settings.server.log_format)
    native.start(settings.server.decoder, events.emit, worker=args.index)
    conn = Connection(socket.socket(fileno=args.channel_fd))
    remote = RemotePort(conn)
    observer = ReportingObserver(conn)
    grace = max(1, settings.server.shutdown_grace_secs // 2)
    started = _start_receivers(settings, events, args, remote, observer, grace)
    if isinstance(started, int):
        return started
    grpc_server, http = started
    # Start-up's objects (modules, the ASGI and gRPC stacks) live as long as the process:
    # out of the collector's generations, a full collection no longer stops the event
    # loop for a walk over all of them (58 ms measured under the half-load benchmark,
    # docs/BENCHMARKS.md).
    freeze_long_lived_heap()
    sock = socket.socket(fileno=args.http_fd)
    http_thread = threading.Thread(
        target=http.run, kwargs={"sockets": [sock]}, name="ourios-http", daemon=True
    )
    http_thread.start()
    jobs = _Jobs(conn)
    conn.send(MessageKind.HELLO, 0, [os.getpid().to_bytes(4, "little")])
    stop_ident: int | None = None
    try:
        while True:
            kind, ident, body = conn.receive()
            if kind in (
                MessageKind.ACK,
                MessageKind.REFUSAL,
                MessageKind.STATE_IS,
                MessageKind.TEXT,
            ):
                conn.deliver(kind, ident, body)
            elif kind is MessageKind.FLUSH:
                conn.send(MessageKind.FLUSHED, ident, [])
            elif kind in (MessageKind.DECODE, MessageKind.ENCODE):
                jobs.put(kind, ident, body)
            elif kind is MessageKind.STOP:
                stop_ident = ident
                break
            else:
                raise ChannelClosed(f"a worker does not take {kind.name}")
    except ChannelClosed as exc:
        # The core closed the channel: it is exiting or replacing this worker.
        log.info("worker %d: channel closed (%s); exiting", args.index, exc)
        return 0
    # STOP: stop accepting, let the requests in flight finish (their answers still
    # arrive: a reader keeps delivering them), then say so and exit.
    reader = threading.Thread(target=_deliver_forever, args=(conn,), daemon=True)
    reader.start()
    http.should_exit = True
    stopped = grpc_server.stop(grace)
    http_thread.join(grace + 5)
    stopped.wait(grace + 5)
    jobs.close()
    try:
        conn.send(MessageKind.STOPPING, stop_ident, [])
    except ChannelClosed:
        pass
    events.emit("worker.stopped", {"index": args.index, "pid": os.getpid()})
    conn.close("the worker stopped")
    return 0


def _start_receivers(
    settings: Settings,
    events: EventLog,
    args: argparse.Namespace,
    remote: RemotePort,
    observer: ReportingObserver,
    grace: int,
) -> tuple[grpc.Server, uvicorn.Server] | int:
    """This worker's gRPC receiver started and its HTTP server made (``main`` runs it on
    the core's listening socket), both over the core; 2 when TLS cannot be set up."""
    auth = Authenticator(settings.auth.tokens or None)
    # One budget for both transports: the bound is per process (DESIGN.md §7).
    bounds = receiver_bounds(
        settings,
        lambda name, fields: events.emit(name, {"worker": args.index, **fields}, "warning"),
    )
    try:
        tls = server_tls(
            settings,
            lambda name, fields, level: events.emit(name, {"worker": args.index, **fields}, level),
        )
    except TlsError as exc:
        print(f"worker {args.index}: {exc}", file=sys.stderr)
        return 2
    grpc_server, _ = create_grpc_server(
        remote,
        max_frame_bytes=settings.wal.max_frame_bytes,
        authenticator=auth,
        host=settings.server.host,
        port=args.grpc_port,
        observer=observer,
        reuse_port=True,
        bounds=bounds,
        credentials=tls.grpc_credentials() if tls is not None else None,
    )
    grpc_server.start()
    app = create_http_app(
        remote,
        max_frame_bytes=settings.wal.max_frame_bytes,
        authenticator=auth,
        metrics_text=remote.metrics_text,
        observer=observer,
        bounds=bounds,
    )
    http = http_server(app, grace=grace, tls=tls.http_context() if tls is not None else None)
    return grpc_server, http


def _deliver_forever(conn: Connection) -> None:
    try:
        while True:
            kind, ident, body = conn.receive()
            conn.deliver(kind, ident, body)
    except (ChannelClosed, OSError, ValueError):
        return


if __name__ == "__main__":
    sys.exit(main())

"""OTLP/gRPC receiver: `opentelemetry.proto.collector.logs.v1.LogsService/Export`.

The method is served by a generic handler with no request deserializer, registered as
stream-unary (on the wire a unary call is a stream of one message), so the handler runs
*before* grpcio receives the message and then gets its bytes exactly as grpcio received
them (already gunzipped when the client sent `grpc-encoding: gzip`). Those bytes are the
WAL payload, so what recovery re-parses is byte-for-byte what was parsed here. Per
request, in this order::

    metadata     `authorization`, `x-ourios-tenant` (repeated keys ", "-joined,
                 which auth refuses, as on HTTP)
    auth         Authenticator.authorize: UNAUTHENTICATED / PERMISSION_DENIED /
                 INVALID_ARGUMENT (tenant) — nothing has been received yet
    in flight    a ticket of the process's budget (`app.receive.inflight`) for the
                 largest message grpcio may hand over: RESOURCE_EXHAUSTED with
                 RetryInfo beyond it
    receive      the message, within the body read timeout (else the call is
                 cancelled); then the ticket holds its size
    decode       in a decode slot: decode_batch — the native decoder, or
                 decode_request with the request limits (INVALID_ARGUMENT naming one)
                 and flatten
    flatten      zero records: acknowledged without a WAL frame (app.receive.api)
    ingest       IngestPort.ingest(..., "grpc") in the handler thread
    reply        serialized ExportLogsServiceResponse (partial_success only when the
                 pipeline rejected records)

Refusals are `context.abort(code, message)` with DESIGN.md §7's codes. When the
rejection carries `retry_after`, the trailing metadata also holds
`grpc-status-details-bin`: a `google.rpc.Status` (same code and message) with a
`google.rpc.RetryInfo` detail, which is where OTLP gRPC exporters read the retry delay.
An unexpected exception is logged and answered INTERNAL; the server keeps serving.

Size limit: the handler refuses a (decompressed) message over `max_frame_bytes` with
RESOURCE_EXHAUSTED naming the limit (no RetryInfo). `grpc.max_receive_message_length`
is max_frame_bytes + 64 KiB, the hard bound: grpcio answers RESOURCE_EXHAUSTED itself
for a message beyond it, on the wire or after decompression, and stops inflating there,
so a gzip bomb costs at most that much memory — the share of the in-flight budget a
receive holds. `maximum_concurrent_rpcs` (`server.grpc_max_concurrent_rpcs`) bounds the
calls grpcio accepts at once; beyond it grpcio answers RESOURCE_EXHAUSTED itself.

`grpc.so_reuseport` is off so a second server on a taken port fails to bind instead of
silently sharing it — except in worker processes (`reuse_port`), which share the port
the core reserved with the option set, so only they and the core can share it.

`create_grpc_server` returns the server unstarted; call `start()`. The handler pool is
owned by the returned server: the event `stop(grace)` returns is set only after grpcio
finished the last RPC and the pool's threads have exited.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any, Final

import grpc

from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge
from app.receive.api import NO_OBSERVER, IngestObserver, IngestPort, ListenerBindError
from app.receive.auth import Authenticator
from app.receive.inflight import ReceiverBounds, default_bounds
from app.receive.otlp import PROTOBUF_CONTENT_TYPE, decode_batch, status_body, success_body

__all__ = ["EXPORT_METHOD", "LOGS_SERVICE", "create_grpc_server"]

LOGS_SERVICE: Final = "opentelemetry.proto.collector.logs.v1.LogsService"
EXPORT_METHOD: Final = f"/{LOGS_SERVICE}/Export"
#: grpcio's own receive bound is max_frame_bytes + 64 KiB: a message just over the limit
#: reaches the handler, whose refusal names the limit; grpcio refuses (and stops
#: inflating) beyond the bound, which is what a receive reserves of the in-flight budget.
_GRPC_SLACK: Final = 64 * 1024
#: How often the receive deadlines are checked (the body read timeout's resolution).
_DEADLINE_TICK_S: Final = 0.5
_STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"

_log = logging.getLogger("ourios.grpc")


def _metadata_value(seen: str | None, value: str | bytes) -> str:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return text if seen is None else f"{seen}, {text}"


class _Cancelled(Exception):
    """The call was cancelled while its message was being received (by the client, or
    by the receive deadline); nobody reads an answer."""

    def __init__(self, error_type: str) -> None:
        super().__init__(error_type)
        self.error_type = error_type


class _Deadlines:
    """Cancels a call whose message is not received within the body read timeout. One
    thread for the server, polling only while some receive is armed, so a call costs a
    dict insert and delete instead of a timer thread."""

    def __init__(self, timeout: float, tick: float = _DEADLINE_TICK_S) -> None:
        self.timeout = timeout
        self._tick = min(tick, timeout)
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ourios-grpc-deadlines", daemon=True)
        self._thread.start()

    def arm(self, key: int, context: Any) -> None:
        with self._cond:
            self._armed[key] = (time.monotonic() + self.timeout, context)
            self._cond.notify()

    def disarm(self, key: int) -> bool:
        """True when the deadline already fired (the call was cancelled)."""
        with self._cond:
            self._armed.pop(key, None)
            if key in self._fired:
                self._fired.discard(key)
                return True
            return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5.0)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._armed:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                due = [key for key, (deadline, _) in self._armed.items() if deadline <= now]
                for key in due:
                    _, context = self._armed.pop(key)
                    self._fired.add(key)
                    context.cancel()  # the receive in the handler thread raises
                self._cond.wait(self._tick)


class _ExportHandler:
    """`LogsService/Export` over raw bytes; one instance shared by the handler threads.

    Registered as stream-unary (on the wire a unary call is a stream of one message),
    so the handler runs before grpcio receives the message: it authenticates from the
    metadata and takes its in-flight ticket first, then asks for the message."""

    def __init__(
        self,
        pipeline: IngestPort,
        authenticator: Authenticator,
        logger: logging.Logger,
        observer: IngestObserver = NO_OBSERVER,
        max_frame_bytes: int = 1 << 62,
        bounds: ReceiverBounds | None = None,
        deadlines: _Deadlines | None = None,
    ) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._receive_bound = max_frame_bytes + _GRPC_SLACK
        self._bounds = bounds or default_bounds(max_frame_bytes)
        self._deadlines = deadlines
        self._observer = observer
        self._pipeline = pipeline
        self._authenticator = authenticator
        self._log = logger
        self._empty_ok: bytes = success_body(0, "", False)[0]
        self._internal = IngestRejection("internal error; the server log has the details")

    def __call__(self, requests: Iterator[bytes], context: Any) -> bytes:
        started = time.perf_counter()
        try:
            reply, records = self._export(requests, context)
        except _Cancelled as exc:
            # The call is over (RST_STREAM): nothing to answer; count it.
            self._observer.observe(
                "grpc", "refused", exc.error_type, 0, time.perf_counter() - started
            )
            return b""
        except IngestRejection as exc:
            rejection = exc
            outcome = "refused"
        except Exception:
            self._log.exception("%s failed unexpectedly", EXPORT_METHOD)
            rejection = self._internal
            outcome = "error"
        else:
            self._observer.observe("grpc", "ok", "", records, time.perf_counter() - started)
            return reply
        error_type = rejection.error_type if outcome == "refused" else "internal"
        self._observer.observe(
            "grpc", outcome, error_type, rejection.records, time.perf_counter() - started
        )
        # Outside the handlers above: abort raises, and that must reach grpcio.
        if rejection.retry_after is not None:
            details, _ = status_body(rejection, False)
            context.set_trailing_metadata(((_STATUS_DETAILS_KEY, details),))
        context.abort(rejection.grpc_code, rejection.message)
        raise AssertionError("grpc context.abort returned")  # pragma: no cover

    def _receive(self, requests: Iterator[bytes], context: Any) -> bytes:
        """The call's one message, received now (grpcio inflates it here, bounded by
        its receive limit), within the body read timeout."""
        key = id(context)
        if self._deadlines is not None:
            self._deadlines.arm(key, context)
        try:
            message = next(requests)
        except StopIteration:
            raise BadRequest("the call carried no request message") from None
        except grpc.RpcError:
            fired = self._deadlines is not None and self._deadlines.disarm(key)
            raise _Cancelled("body_read_timeout" if fired else "client_disconnect") from None
        finally:
            if self._deadlines is not None and self._deadlines.disarm(key):
                raise _Cancelled("body_read_timeout")
        return message

    def _export(self, requests: Iterator[bytes], context: Any) -> tuple[bytes, int]:
        authorization: str | None = None
        tenant_value: str | None = None
        metadata: Sequence[tuple[str, str | bytes]] = context.invocation_metadata() or ()
        for key, value in metadata:
            if key == "authorization":
                authorization = _metadata_value(authorization, value)
            elif key == "x-ourios-tenant":
                tenant_value = _metadata_value(tenant_value, value)
        tenant = self._authenticator.authorize(authorization, tenant_value)
        bounds = self._bounds
        # The size is unknown until received: hold the most grpcio may hand over.
        ticket = bounds.budget.take(self._receive_bound)
        try:
            request = self._receive(requests, context)
            if len(request) > self._max_frame_bytes:
                raise PayloadTooLarge(self._max_frame_bytes)
            ticket.resize(len(request))
            with bounds.budget.decoding():
                decoded = decode_batch(request, PROTOBUF_CONTENT_TYPE, tenant, bounds.limits)
            if decoded is None:
                return self._empty_ok, 0
            outcome = self._pipeline.ingest(tenant, request, decoded[1], "grpc")
        finally:
            ticket.release()
        if not outcome.rejected:
            return self._empty_ok, outcome.records
        return success_body(outcome.rejected, outcome.message, False)[0], outcome.records


class _ReceiverServer(grpc.Server):  # type: ignore[misc]
    """A `grpc.Server` that also shuts down the handler pool it was built with."""

    def __init__(
        self,
        server: grpc.Server,
        pool: futures.ThreadPoolExecutor,
        deadlines: _Deadlines | None = None,
    ) -> None:
        self._server = server
        self._pool = pool
        self._deadlines = deadlines
        self._stop_lock = threading.Lock()
        self._stopped: threading.Event | None = None

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[Any]) -> None:
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        port: int = self._server.add_insecure_port(address)
        return port

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        port: int = self._server.add_secure_port(address, server_credentials)
        return port

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        """grpcio's stop, plus the pool: the returned event is set once both are done.

        The pool is shut down only after grpcio's own event, because grpcio submits each
        arriving RPC to it until the server has fully stopped."""
        with self._stop_lock:
            if self._stopped is None:
                self._stopped = threading.Event()
                server_stopped: threading.Event = self._server.stop(grace)
                threading.Thread(
                    target=self._finish,
                    args=(server_stopped, self._stopped),
                    name="ourios-grpc-stop",
                ).start()
            else:
                # A second stop (e.g. a shorter grace) still reaches grpcio.
                self._server.stop(grace)
            return self._stopped

    def _finish(self, server_stopped: threading.Event, done: threading.Event) -> None:
        server_stopped.wait()
        self._pool.shutdown(wait=True)
        if self._deadlines is not None:
            self._deadlines.close()
        done.set()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        terminated: bool = self._server.wait_for_termination(timeout)
        return terminated


def create_grpc_server(
    pipeline: IngestPort,
    *,
    max_frame_bytes: int,
    authenticator: Authenticator,
    host: str,
    port: int,
    max_workers: int = 64,
    logger: logging.Logger = _log,
    observer: IngestObserver = NO_OBSERVER,
    reuse_port: bool = False,
    bounds: ReceiverBounds | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, int]:
    """The LogsService server bound to `host:port` (0 picks a free port) and the bound
    port; not started. `max_workers` handler threads may wait in `IngestPort.ingest` at
    once (further RPCs queue, up to `bounds.grpc_max_concurrent_rpcs` in all, beyond
    which grpcio answers RESOURCE_EXHAUSTED itself). `bounds` are the process's request
    limits, in-flight budget and body read timeout (the settings' defaults when None).
    `reuse_port` binds with ``SO_REUSEPORT`` (a worker process beside its siblings and
    the core's reservation of the port). `credentials`: TLS
    (`app.receive.tls.ServerTls.grpc_credentials`); plaintext when None. Raises
    `ListenerBindError` when the address is taken."""
    if max_frame_bytes < 1:
        raise ValueError(f"max_frame_bytes must be >= 1, got {max_frame_bytes}")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    bounds = bounds or default_bounds(max_frame_bytes)
    deadlines = _Deadlines(bounds.body_read_timeout)
    export = grpc.stream_unary_rpc_method_handler(
        _ExportHandler(
            pipeline, authenticator, logger, observer, max_frame_bytes, bounds, deadlines
        ),
        request_deserializer=None,
        response_serializer=None,
    )
    handler = grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": export})
    pool = futures.ThreadPoolExecutor(max_workers, thread_name_prefix="ourios-grpc")
    server = grpc.server(
        pool,
        handlers=(handler,),
        options=(
            # grpcio refuses and stops inflating past this bound; the handler applies
            # the exact limit itself so the refusal names it (DESIGN.md §7).
            ("grpc.max_receive_message_length", max_frame_bytes + _GRPC_SLACK),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ),
        maximum_concurrent_rpcs=bounds.grpc_max_concurrent_rpcs,
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound: int = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        bound, reason = 0, str(exc)
    else:
        reason = "grpcio could not bind the address"
    if not bound:
        server.stop(None)
        pool.shutdown(wait=False)
        deadlines.close()
        raise ListenerBindError("gRPC", host, port, reason)
    return _ReceiverServer(server, pool, deadlines), bound

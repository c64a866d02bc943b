"""OTLP/HTTP receiver: `POST /v1/logs`, `GET /healthz`, `GET /readyz`, `GET /metrics`.

`POST /v1/logs` takes each request through, in this order, and stops at the first
refusal (DESIGN.md §7 gives the codes)::

    headers      one pass over the raw ASGI header list
    auth         Authenticator.authorize: 401 / 403 / 400 (tenant)
    media type   415 unless protobuf or JSON; decides the reply's encoding
    raw body     413 past the raw cap: at once when Content-Length says so and the
                 client waits for `100 Continue`; otherwise after reading and
                 discarding the body (up to DISCARD_BYTES more), so a client that
                 writes its whole body before reading gets the 413, not a reset
                 (which OTLP clients retry)
    in flight    a ticket of the process's budget (`app.receive.inflight`) for the
                 declared length (the raw cap without one), before any byte is read:
                 503 + Retry-After beyond it (the body is read and dropped first unless
                 the client waits for `100 Continue`)
    read         the body within `body_read_timeout` (408 past it)
    worker       decompress (limit max_frame_bytes; each step grows the ticket) →
                 a decode slot → decode_batch (protobuf: the native decoder's parse +
                 flatten in one call; else, and for what it leaves, decode_request
                 with the request limits (400 naming one) → flatten) → WAL payload →
                 IngestPort.ingest
    reply        ExportLogsServiceResponse 200, or a google.rpc.Status; the ticket
                 is returned

Authentication comes before anything reads the body, so a client without a valid
token cannot make the server buffer or inflate anything.

The raw cap (`raw_body_cap`) bounds what is buffered before decompression: exactly
`max_frame_bytes` for an identity body (larger cannot decode to a frame), and
`max_frame_bytes + max_frame_bytes // 1024 + 64 KiB` for a coded one. Deflate's worst
case is stored blocks, 5 bytes per block of up to 64 KiB (under 0.01 %); the rest is
room for gzip header fields and concatenated members. A larger compressed body cannot
be a frame a legitimate client meant to send. A gzip bomb under the cap is stopped by
`app.receive.otlp.decompress` at `max_frame_bytes + 1` inflated bytes.

The CPU work (inflate, parse, flatten) runs in the same worker thread as the blocking
`IngestPort.ingest`, so a large request does not hold the event loop and `/healthz`
stays answerable while it is parsed. Workers come from a dedicated
`anyio.CapacityLimiter` (`ingest_concurrency`, default 256): a group commit
acknowledges many waiters with one fsync, so many requests must be able to wait at
once. A pipeline that can be awaited on the event loop (`ingest_async`: a worker
process's, which only waits for the core's answer) is awaited there instead, and an
uncompressed body up to `INLINE_BODY_BYTES` is decoded on the loop's thread: no thread
per request, whose hop to a thread and back cost a worker much of its interpreter time
(docs/BENCHMARKS.md, issue 14); a larger or compressed body is still decoded on a thread.

A request with zero log records is valid OTLP. It is decoded and acknowledged with 200
but never reaches the pipeline, so it writes no WAL frame (there is nothing to make
durable).

Replies: success is an `ExportLogsServiceResponse` (`partial_success` only when the
pipeline rejected records) in the request's encoding; a refusal is a `google.rpc.Status`
in the request's encoding (JSON when the content type was not understood) with the
rejection's status, `Retry-After` only when the rejection carries `retry_after`, and
`WWW-Authenticate` on 401. An unexpected exception is logged and answered 500 with an
INTERNAL Status; the server keeps serving.

The hot path has no pydantic models and no dependency injection: the routes are plain
Starlette routes taking a `Request` and returning a `Response`. `POST /v1/logs` is also
dispatched by the app itself before FastAPI's middleware stack and router (the route
stays registered, and is what a mounted copy of the app would use): on uvicorn with
httptools + uvloop that stack cost about as much per request as the worker-thread hop
(docs/BENCHMARKS.md).
FastAPI's native OpenTelemetry instrumentation is switched off: an ingester must not
trace every request it receives into whatever providers the process has.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, cast

import anyio
import anyio.to_thread
import uvicorn
from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.base.batch import FlatBatch
from app.base.rejections import BadRequest, IngestRejection, PayloadTooLarge, UnsupportedMediaType
from app.receive.api import (
    NO_OBSERVER,
    IngestObserver,
    IngestOutcome,
    IngestPort,
    ListenerBindError,
)
from app.receive.auth import Authenticator, BearerRejected
from app.receive.inflight import BodyTimeout, Overloaded, ReceiverBounds, Ticket, default_bounds
from app.receive.otlp import (
    JSON_CONTENT_TYPE,
    PROTOBUF_CONTENT_TYPE,
    _echo,
    decode_batch,
    decompress,
    status_body,
    success_body,
)

__all__ = [
    "DEFAULT_INGEST_CONCURRENCY",
    "DISCARD_BYTES",
    "LOGS_PATH",
    "Health",
    "create_http_app",
    "create_ops_app",
    "http_server",
    "raw_body_cap",
    "start_in_thread",
    "stop_in_thread",
]

LOGS_PATH: Final = "/v1/logs"
DEFAULT_INGEST_CONCURRENCY: Final = 256
#: A body over the cap is read and thrown away up to this many bytes more before the 413
#: is sent, so a client that writes its whole body before reading the answer gets it.
DISCARD_BYTES: Final = 64 * 1024 * 1024
#: With a pipeline that answers on the event loop, an uncompressed body up to this size
#: is decoded and flattened on the loop's thread (about a millisecond per 100 records).
INLINE_BODY_BYTES: Final = 1024 * 1024

_log = logging.getLogger("ourios.http")

#: The media types `app.receive.otlp.decode_request` reads as protobuf (a test pins this).
_PROTOBUF_MEDIA_TYPES: Final = frozenset({PROTOBUF_CONTENT_TYPE, "application/protobuf"})
_IDENTITY_CODINGS: Final = frozenset({"", "identity"})
_CODED_SLACK_BYTES: Final = 64 * 1024
_NOT_READY: Final = (
    "not ready: recovery is running, it failed, or the WAL is in its terminal state\n"
)


class AsyncIngest(Protocol):
    """``IngestPort.ingest`` awaited on the event loop (``app.receive.worker_process.RemotePort``
    has it): the receiver then needs no thread per request."""

    def __call__(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> Awaitable[IngestOutcome]: ...


def raw_body_cap(max_frame_bytes: int, content_encoding: str | None) -> int:
    """The most request-body bytes read before decompression (module docstring)."""
    if (content_encoding or "").strip().lower() in _IDENTITY_CODINGS:
        return max_frame_bytes
    return max_frame_bytes + max_frame_bytes // 1024 + _CODED_SLACK_BYTES


class _Headers:
    """The request headers the route reads, from one pass over the raw list. A field
    given more than once is combined as RFC 9110 §5.3 does (``", "``-joined)."""

    __slots__ = (
        "authorization",
        "content_encoding",
        "content_length",
        "content_type",
        "expect",
        "tenant",
    )

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.authorization: str | None = None
        self.content_encoding: str | None = None
        self.content_length: str | None = None
        self.content_type: str | None = None
        self.expect: str | None = None
        self.tenant: str | None = None
        for name, value in raw:
            # ASGI servers lower-case header names.
            if name == b"content-type":
                self.content_type = _combine(self.content_type, value)
            elif name == b"content-encoding":
                self.content_encoding = _combine(self.content_encoding, value)
            elif name == b"content-length":
                self.content_length = _combine(self.content_length, value)
            elif name == b"authorization":
                self.authorization = _combine(self.authorization, value)
            elif name == b"x-ourios-tenant":
                self.tenant = _combine(self.tenant, value)
            elif name == b"expect":
                self.expect = _combine(self.expect, value)


def _combine(seen: str | None, value: bytes) -> str:
    text = value.decode("latin-1")
    return text if seen is None else f"{seen}, {text}"


def _unsupported_type(content_type: str | None) -> UnsupportedMediaType:
    shown = _echo(content_type or "")  # quoted, and "..." when it was cut
    return UnsupportedMediaType(
        f"unsupported Content-Type {shown}; accepted: {PROTOBUF_CONTENT_TYPE}, "
        f"application/protobuf, {JSON_CONTENT_TYPE}"
    )


def _rejection_response(rejection: IngestRejection, as_json: bool) -> Response:
    body, content_type = status_body(rejection, as_json)
    headers: dict[str, str] = {}
    if rejection.retry_after is not None:
        headers["retry-after"] = str(rejection.retry_after)
    if isinstance(rejection, BearerRejected):
        headers["www-authenticate"] = rejection.challenge
    return Response(body, rejection.http_status, headers, content_type)


async def _read_body(request: Request, cap: int, max_frame_bytes: int) -> bytes:
    """The whole body; past `cap` bytes, `PayloadTooLarge` — after reading and
    discarding the rest of the body, up to `DISCARD_BYTES`, so the client that is still
    writing it reads the 413 instead of a connection reset (which it would retry)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            if size - cap > DISCARD_BYTES:
                break  # not worth reading on: answer and close
            chunks.clear()
            continue
        chunks.append(chunk)
    if size > cap:
        raise PayloadTooLarge(max_frame_bytes)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _discard(request: Request, most: int) -> None:
    """Read and drop up to `most` body bytes, so a client still writing its body reads
    the refusal instead of a reset; holds no memory."""
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > most:
            return


class _ReceiverApp(FastAPI):
    """FastAPI with `POST /v1/logs` served before the middleware stack (module docstring).
    The fast path needs none of it: `post_logs` answers every exception itself."""

    def __init__(self, post_logs: Callable[[Request], Awaitable[Response]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._post_logs = post_logs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == LOGS_PATH and scope["method"] == "POST":
            response = await self._post_logs(Request(scope, receive, send))
            await response(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_http_app(
    pipeline: IngestPort,
    *,
    max_frame_bytes: int,
    authenticator: Authenticator,
    metrics_text: Callable[[], tuple[bytes, str]],
    ingest_concurrency: int = DEFAULT_INGEST_CONCURRENCY,
    logger: logging.Logger = _log,
    observer: IngestObserver = NO_OBSERVER,
    bounds: ReceiverBounds | None = None,
) -> FastAPI:
    """The OTLP/HTTP application (module docstring). `metrics_text` returns the
    Prometheus exposition and its content type; `ingest_concurrency` bounds the
    worker threads waiting in `IngestPort.ingest`; `bounds` are the process's request
    limits, in-flight budget and body read timeout (shared with its gRPC receiver;
    the settings' defaults when None)."""
    if max_frame_bytes < 1:
        raise ValueError(f"max_frame_bytes must be >= 1, got {max_frame_bytes}")
    if ingest_concurrency < 1:
        raise ValueError(f"ingest_concurrency must be >= 1, got {ingest_concurrency}")
    post_logs = _post_logs_handler(
        pipeline,
        max_frame_bytes,
        authenticator,
        anyio.CapacityLimiter(ingest_concurrency),
        logger,
        observer,
        bounds or default_bounds(max_frame_bytes),
    )
    app = _ReceiverApp(
        post_logs,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    # Starlette routes, not FastAPI path operations: no dependency solving, no models.
    app.add_route(LOGS_PATH, post_logs, methods=["POST"], include_in_schema=False)
    _add_ops_routes(app, pipeline, metrics_text)
    return app


#: A request's ingest once its body is read: (tenant, body, headers, protobuf, ticket);
#: None means the request held no records.
_IngestCall = Callable[[str, bytes, _Headers, bool, Ticket], IngestOutcome | None]
_AsyncIngestCall = Callable[[str, bytes, _Headers, bool, Ticket], Awaitable[IngestOutcome | None]]


def _ingest_calls(
    pipeline: IngestPort,
    max_frame_bytes: int,
    bounds: ReceiverBounds,
    limiter: anyio.CapacityLimiter,
) -> tuple[_IngestCall, _AsyncIngestCall | None]:
    """How a read body is decoded and ingested: in a worker thread, and — for a pipeline
    that answers on the event loop (a worker process's) — awaited on the loop (None
    otherwise)."""
    limits, budget = bounds.limits, bounds.budget
    ingest_async = cast(AsyncIngest | None, getattr(pipeline, "ingest_async", None))

    def decode(
        tenant: str, body: bytes, headers: _Headers, ticket: Ticket
    ) -> tuple[bytes, FlatBatch] | None:
        # (WAL payload, rows); None means the request held no records. Inflating grows
        # the ticket step by step; the count limits are checked before flattening.
        data = decompress(body, headers.content_encoding, max_frame_bytes, ticket.grow)
        return decode_batch(data, headers.content_type or "", tenant, limits)

    def prepare(
        tenant: str, body: bytes, headers: _Headers, protobuf: bool, ticket: Ticket
    ) -> tuple[bytes, FlatBatch] | None:
        # In a thread: waits for one of the process's decode slots.
        with budget.decoding():
            return decode(tenant, body, headers, ticket)

    def ingest(
        tenant: str, body: bytes, headers: _Headers, protobuf: bool, ticket: Ticket
    ) -> IngestOutcome | None:
        # Runs in a worker thread; None means the request held no records.
        prepared = prepare(tenant, body, headers, protobuf, ticket)
        if prepared is None:
            return None
        return pipeline.ingest(tenant, *prepared, "http")

    async def ingest_on_loop(
        tenant: str, body: bytes, headers: _Headers, protobuf: bool, ticket: Ticket
    ) -> IngestOutcome | None:
        # A pipeline that answers on the event loop (a worker process's): an identity
        # body up to INLINE_BODY_BYTES is decoded here, anything larger on a thread, so
        # /healthz is never held up by one big request.
        assert ingest_async is not None
        identity = (headers.content_encoding or "").strip().lower() in _IDENTITY_CODINGS
        if identity and len(body) <= INLINE_BODY_BYTES:
            prepared = decode(tenant, body, headers, ticket)
        else:
            prepared = await anyio.to_thread.run_sync(
                prepare, tenant, body, headers, protobuf, ticket, limiter=limiter
            )
        if prepared is None:
            return None
        return await ingest_async(tenant, *prepared, "http")

    return ingest, ingest_on_loop if ingest_async is not None else None


def _admit(
    headers: _Headers,
    authenticator: Authenticator,
    media_type: str,
    protobuf: bool,
    max_frame_bytes: int,
) -> tuple[str, int, int | None, bool]:
    """What a request's headers decide before any byte of its body is read: its tenant,
    the body cap, the declared length and whether the client waits for 100 Continue;
    raises the rejection a header earns."""
    tenant = authenticator.authorize(headers.authorization, headers.tenant)
    if not protobuf and media_type != JSON_CONTENT_TYPE:
        raise _unsupported_type(headers.content_type)
    cap = raw_body_cap(max_frame_bytes, headers.content_encoding)
    declared: int | None = None
    waiting = (headers.expect or "").strip().lower() == "100-continue"
    if headers.content_length is not None:
        try:
            declared = int(headers.content_length)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if declared > cap and (waiting or declared > cap + DISCARD_BYTES):
            # A client waiting for 100 Continue sends no body: answer now. One
            # beyond the discard bound is not worth reading: answer and close.
            raise PayloadTooLarge(max_frame_bytes)
    return tenant, cap, declared, waiting


def _post_logs_handler(
    pipeline: IngestPort,
    max_frame_bytes: int,
    authenticator: Authenticator,
    limiter: anyio.CapacityLimiter,
    logger: logging.Logger,
    observer: IngestObserver,
    bounds: ReceiverBounds,
) -> Callable[[Request], Awaitable[Response]]:
    """POST /v1/logs: the headers admitted, the body read under the in-flight budget,
    then ingested; every outcome observed and answered."""
    budget, read_timeout = bounds.budget, bounds.body_read_timeout
    empty_ok = {as_json: success_body(0, "", as_json) for as_json in (False, True)}
    internal = IngestRejection("internal error; the server log has the details")
    ingest, ingest_on_loop = _ingest_calls(pipeline, max_frame_bytes, bounds, limiter)

    async def post_logs(request: Request) -> Response:
        started = time.perf_counter()
        headers = _Headers(request.scope["headers"])
        media_type = (headers.content_type or "").split(";", 1)[0].strip().lower()
        protobuf = media_type in _PROTOBUF_MEDIA_TYPES
        as_json = not protobuf
        ticket: Ticket | None = None
        try:
            tenant, cap, declared, waiting = _admit(
                headers, authenticator, media_type, protobuf, max_frame_bytes
            )
            try:
                # Before any byte of the body is read: a body is never held past cap.
                ticket = budget.take(cap if declared is None else min(declared, cap))
            except Overloaded:
                if not waiting:
                    # Let the client finish writing so it reads the 503, holding nothing.
                    with anyio.move_on_after(read_timeout):
                        await _discard(request, cap + DISCARD_BYTES)
                raise
            try:
                with anyio.fail_after(read_timeout):
                    body = await _read_body(request, cap, max_frame_bytes)
            except TimeoutError:
                raise BodyTimeout(read_timeout) from None
            ticket.resize(len(body))
            if ingest_on_loop is not None:
                outcome = await ingest_on_loop(tenant, body, headers, protobuf, ticket)
            else:
                outcome = await anyio.to_thread.run_sync(
                    ingest, tenant, body, headers, protobuf, ticket, limiter=limiter
                )
        except IngestRejection as exc:
            observer.observe(
                "http", "refused", exc.error_type, exc.records, time.perf_counter() - started
            )
            return _rejection_response(exc, as_json)
        except ClientDisconnect:
            # Nobody reads this reply; it only ends the request cleanly.
            observer.observe(
                "http", "refused", "client_disconnect", 0, time.perf_counter() - started
            )
            return Response(status_code=400)
        except Exception:
            logger.exception("POST %s failed unexpectedly", LOGS_PATH)
            observer.observe("http", "error", "internal", 0, time.perf_counter() - started)
            return _rejection_response(internal, as_json)
        finally:
            if ticket is not None:
                ticket.release()
        records = 0 if outcome is None else outcome.records
        observer.observe("http", "ok", "", records, time.perf_counter() - started)
        if outcome is None or not outcome.rejected:
            content, content_type = empty_ok[as_json]
        else:
            content, content_type = success_body(outcome.rejected, outcome.message, as_json)
        return Response(content, 200, None, content_type)

    return post_logs


class Health(Protocol):
    """What `/healthz` and `/readyz` read (an `IngestPort` has it)."""

    @property
    def ready(self) -> bool: ...

    @property
    def alive(self) -> bool: ...

    @property
    def health_detail(self) -> str: ...


def _add_ops_routes(
    app: FastAPI, pipeline: Health, metrics_text: Callable[[], tuple[bytes, str]]
) -> None:
    """`GET /healthz`, `/readyz` and `/metrics`: on the OTLP/HTTP app, and alone on the
    plaintext metrics port (`create_ops_app`). Each reads its answer on a worker thread,
    never on the event loop: in a worker process the answer is a call to the core over
    the channel (up to 10 s for the state, 30 s for a scrape), and the loop it would
    block serves every ingest request of that process."""

    def health() -> tuple[bool, str]:
        return (True, "") if pipeline.alive else (False, pipeline.health_detail)

    def ready() -> bool:
        return pipeline.ready

    async def healthz(request: Request) -> Response:
        alive, detail = await anyio.to_thread.run_sync(health)
        if alive:
            return PlainTextResponse("ok\n")
        return PlainTextResponse(f"not alive: {detail}\n", 503)

    async def readyz(request: Request) -> Response:
        if await anyio.to_thread.run_sync(ready):
            return PlainTextResponse("ready\n")
        return PlainTextResponse(_NOT_READY, 503)

    async def metrics(request: Request) -> Response:
        content, content_type = await anyio.to_thread.run_sync(metrics_text)
        return Response(content, 200, None, content_type)

    app.add_route("/healthz", healthz, methods=["GET"], include_in_schema=False)
    app.add_route("/readyz", readyz, methods=["GET"], include_in_schema=False)
    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)


def create_ops_app(health: Health, metrics_text: Callable[[], tuple[bytes, str]]) -> FastAPI:
    """`server.metrics_port`'s application: `/healthz`, `/readyz` and `/metrics` only,
    never the receivers, so a scraper or a probe reaches it without TLS."""
    app = FastAPI(
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    _add_ops_routes(app, health, metrics_text)
    return app


# ── serving ─────────────────────────────────────────────────────────────────────────


def http_server(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    grace: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> uvicorn.Server:
    """A uvicorn server for `app` on uvloop + httptools, without lifespan events,
    access log or logging configuration of its own (the process configures logging);
    ``grace``: seconds in-flight requests get at shutdown; ``tls``: the context it
    serves TLS with (`app.receive.tls.ServerTls.http_context`). The node's servers run
    on a socket it bound itself (``run(sockets=…)``), so their host and port go unused."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
        proxy_headers=False,  # the client address is not used; skips a middleware
        timeout_graceful_shutdown=grace,
    )
    if tls is not None:
        # uvicorn builds its context from file names only; its load() is what run()
        # would call, after which the context it listens with is ours.
        config.load()
        config.ssl = tls
    return uvicorn.Server(config)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ListenerBindError("HTTP", host, port, exc.strerror or str(exc)) from exc
    return sock


def start_in_thread(server: uvicorn.Server) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Run `server` in a new thread; returns it, the thread and the bound port (the
    real one when the configured port is 0).

    The socket is bound and listening before the thread starts, so a client may connect
    as soon as this returns (the connection waits in the backlog until the loop runs).
    Stop with `stop_in_thread`. Raises `ListenerBindError` when the address is taken.
    """
    sock = _listen(server.config.host, server.config.port)
    port: int = sock.getsockname()[1]

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"ourios-http-{port}")
    thread.start()
    return server, thread, port


def stop_in_thread(server: uvicorn.Server, thread: threading.Thread, timeout: float = 10.0) -> None:
    """Ask `server` to exit (requests in flight finish) and join its thread."""
    server.should_exit = True
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"HTTP server thread {thread.name!r} did not stop in {timeout:g} s")

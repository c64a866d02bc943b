"""An asyncio OTLP load generator: HTTP/1.1 keep-alive on raw streams, or gRPC.

Used by ``soak/bench/ingest.py`` and reusable by the soak harness. It exists because
an httpx client spends more CPU per request than the server under test, so on a
2-core machine it would measure itself. Here each request is one pre-built byte
string (request line, headers and a protobuf ``ExportLogsServiceRequest`` body) written
with one ``write``; the response is parsed just enough to know its status and where
it ends (status line, headers, then a ``Content-Length`` or chunked body, or the body
up to EOF). No pipelining: a connection has at most one request in flight. A broken
or refused connection is counted as ``error:<type>`` and reopened for the next request.

gRPC uses ``grpc.aio`` on ``grpc_channels`` channels (default one, as an OTel
Collector exporter does) with ``connections`` calls in flight, calling
``LogsService/Export`` (the stub's method path) with the pool's pre-serialised bytes;
the tenant goes in ``x-ourios-tenant`` metadata. It costs the generator about 5× the
CPU per request of the HTTP path (grpc.aio's per-call overhead), which the
benchmark's per-row generator figures show.

The request pool (``build_pool``) is built once from a seeded RNG before the clock
starts: ``count`` distinct requests of ``records_per_request`` records shaped like real
service logs (about twenty message templates with ids, IPs, durations, paths and user
names; 3–6 string attributes; ``service.name``/``host.name``/``k8s.pod.name``
resources; trace and span ids; severities), so generating load costs the generator
nothing per request. Pool entry ``i`` is sent as tenant ``tenants[i % len(tenants)]``;
connection ``c`` starts at a different offset of the pool and walks it in order.

Two ways to pace, for both transports:

- closed loop (``rate=None``): each of ``connections`` workers sends its next request
  as soon as the previous one is answered — the maximum the server acknowledges.
- open loop (``rate=R`` requests/s): worker ``c`` sends at ``t0 + c/R + k·N/R``. A
  request is timed from its *scheduled* send time, not from when the connection was
  free to send it, so a server that falls behind shows up as latency instead of
  silently lowering the offered rate (coordinated omission); ``late`` counts requests
  sent more than ``LATE_TOLERANCE_S`` after their schedule.

Latency is (scheduled, in open loop) send → full response read. Requests sent during the
first ``warmup_s`` are not recorded. Workers stop sending at the deadline and finish
the request in flight (bounded by ``request_timeout_s``), so a run stops by itself.
Only 2xx (HTTP) / OK (gRPC) responses count as acknowledged records.

Run alone::

    .venv/bin/python -m soak.bench.loadgen --url http://127.0.0.1:4318/v1/logs --seconds 10
    .venv/bin/python -m soak.bench.loadgen --grpc 127.0.0.1:4317 --connections 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2

__all__ = [
    "LATE_TOLERANCE_S",
    "HttpConnection",
    "HttpResponse",
    "LoadConfig",
    "LoadResult",
    "RequestPool",
    "WindowMark",
    "build_pool",
    "run",
    "run_load",
]

Transport = Literal["http", "grpc"]

#: An open-loop request sent later than this after its schedule counts as late.
LATE_TOLERANCE_S: Final = 0.001

PROTOBUF_CONTENT_TYPE: Final = "application/x-protobuf"
GRPC_METHOD: Final = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"

# ── the request pool ────────────────────────────────────────────────────────────────

_SEVERITY: Final = {
    "DEBUG": logs_pb2.SEVERITY_NUMBER_DEBUG,
    "INFO": logs_pb2.SEVERITY_NUMBER_INFO,
    "WARN": logs_pb2.SEVERITY_NUMBER_WARN,
    "ERROR": logs_pb2.SEVERITY_NUMBER_ERROR,
}

# (weight, severity, scope, template). Placeholders are filled by `_Fields`; each
# occurrence draws a fresh value. Rendered bodies are about 80–200 characters.
_TEMPLATES: Final[tuple[tuple[int, str, str, str], ...]] = (
    (
        12,
        "INFO",
        "http.access",
        "{method} {path} completed with status {status} in {ms}ms "
        "(client={ip}, user={user}, bytes={bytes})",
    ),
    (
        4,
        "INFO",
        "auth",
        "User {user} authenticated successfully from {ip} using method=password session_id={hex16}",
    ),
    (
        2,
        "WARN",
        "auth",
        "Failed login attempt for user {user} from {ip}: invalid credentials "
        "(attempt {small} of 5)",
    ),
    (
        3,
        "INFO",
        "db.pool",
        "Connection to postgres://db-{small}.prod.internal:5432/orders established in "
        "{ms}ms, pool usage {small}/{pool}",
    ),
    (
        3,
        "INFO",
        "payments",
        "Payment {uuid} for order {order} authorized: amount={amount} EUR, provider=stripe, "
        "latency={ms}ms",
    ),
    (
        4,
        "DEBUG",
        "cache",
        "Cache miss for key session:{hex16} in redis-{small}.cache.internal, fetched from "
        "origin in {ms}ms",
    ),
    (
        2,
        "ERROR",
        "http.client",
        "Upstream request to http://inventory-service:8080{path} timed out after {ms}ms "
        "(request_id={uuid})",
    ),
    (
        2,
        "WARN",
        "jobs",
        "Retrying job {job} (attempt {small}/5) after error: connection reset by peer {ip}:{port}",
    ),
    (
        1,
        "INFO",
        "jobs",
        "Scheduled task cleanup-expired-sessions finished: removed {count} sessions in "
        "{ms}ms on worker-{small}",
    ),
    (
        1,
        "INFO",
        "kafka",
        "Kafka consumer group orders-consumer rebalanced: partitions [{small}, {small}, "
        "{small}] assigned to member {hex8}",
    ),
    (
        3,
        "INFO",
        "orders",
        "Order {order} shipped to {city} via carrier {carrier}, tracking number {tracking}, "
        "weight {weight}kg",
    ),
    (
        1,
        "DEBUG",
        "runtime",
        "GC pause of {ms}ms detected (heap before={mb}MB, after={mb}MB, "
        "collector=G1 Young Generation)",
    ),
    (
        2,
        "WARN",
        "ratelimit",
        "Rate limit exceeded for API key {hex8}...{hex4} from {ip}: {count} requests in "
        "the last 60s (limit 1000)",
    ),
    (
        2,
        "INFO",
        "storage",
        "Uploaded object s3://assets-prod/uploads/{user}/{uuid}.jpg ({bytes} bytes) in {ms}ms",
    ),
    (
        5,
        "DEBUG",
        "health",
        "Health check /healthz returned 200 in {ms}ms for pod {pod} from kubelet {ip}, "
        "probe=readiness, consecutive_ok={count}",
    ),
    (
        2,
        "INFO",
        "notifications",
        "Sent email notification template=order_confirmation to {user}@example.com "
        "message_id=<{uuid}@mail.example.com>",
    ),
    (
        1,
        "ERROR",
        "http.server",
        "Unhandled exception in handler {path}: KeyError: 'customer_id' "
        "(request_id={uuid}, user={user})",
    ),
    (
        2,
        "INFO",
        "flags",
        "Feature flag checkout-v2 evaluated to {bool} for user {user} "
        "(segment={segment}, rule={small})",
    ),
    (
        1,
        "WARN",
        "db.query",
        "Slow query detected ({ms}ms): SELECT * FROM orders WHERE customer_id = $1 AND "
        "status = $2 LIMIT {small}",
    ),
    (
        1,
        "ERROR",
        "tls",
        "TLS handshake with {ip}:{port} failed: certificate verify failed "
        "(unable to get local issuer certificate)",
    ),
    (
        2,
        "INFO",
        "websocket",
        "WebSocket connection {hex8} closed by client {ip} after {sec}s, "
        "messages_in={count}, messages_out={count}",
    ),
)

_USERS: Final = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
    "mallory", "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter",
    "xena", "yusuf", "zoe", "m.schmidt", "j.doe", "k.tanaka", "l.rossi", "p.novak",
)  # fmt: skip
_ROUTES: Final = (
    "/api/v1/users/{id}", "/api/v1/users/{id}/orders", "/api/v1/orders/{id}",
    "/api/v1/orders/{id}/items", "/api/v2/search", "/api/v1/cart/{id}/checkout",
    "/api/v1/products/{id}", "/api/v1/payments/{id}/refund", "/static/js/app.{id}.js",
    "/internal/metrics", "/api/v1/sessions", "/api/v1/inventory/{id}/reserve",
)  # fmt: skip
_CITIES: Final = (
    "Berlin", "Lisbon", "Osaka", "Toronto", "Nairobi", "Lyon", "Porto", "Denver",
    "Krakow", "Melbourne", "Sao Paulo", "Dublin",
)  # fmt: skip
_CARRIERS: Final = ("DHL", "UPS", "FedEx", "DPD", "GLS", "PostNL")
_SEGMENTS: Final = ("beta", "internal", "eu-rollout", "control", "holdout")
_METHODS: Final = ("GET", "GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH")
_STATUSES: Final = (
    "200", "200", "200", "200", "200", "201", "204", "301", "304", "400", "401", "404",
    "409", "429", "500", "502", "503",
)  # fmt: skip
_SERVICES: Final = (
    "checkout", "orders", "payments", "inventory", "auth", "notifications", "gateway",
    "search", "shipping", "catalog",
)  # fmt: skip
_NAMESPACES: Final = ("shop-prod", "platform", "payments-prod")


class _Fields(dict[str, str]):
    """`str.format_map` source: every placeholder is drawn from the seeded RNG."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    def __missing__(self, key: str) -> str:
        rng = self.rng
        if key == "ip":
            return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        if key == "user":
            return rng.choice(_USERS)
        if key == "ms":
            return f"{rng.lognormvariate(2.5, 1.0):.1f}"
        if key == "sec":
            return str(rng.randrange(1, 7200))
        if key == "path":
            return rng.choice(_ROUTES).replace("{id}", str(rng.randrange(1, 10**7)))
        if key == "method":
            return rng.choice(_METHODS)
        if key == "status":
            return rng.choice(_STATUSES)
        if key == "bytes":
            return str(rng.randrange(64, 2_000_000))
        if key in ("hex4", "hex8", "hex16"):
            return rng.randbytes(int(key[3:]) // 2).hex()
        if key == "uuid":
            return str(uuid.UUID(bytes=rng.randbytes(16), version=4))
        if key == "small":
            return str(rng.randrange(1, 64))
        if key == "pool":
            return str(rng.choice((64, 128, 256)))
        if key == "order":
            return f"ORD-{rng.randrange(10**8):08d}"
        if key == "amount":
            return f"{rng.uniform(1, 2500):.2f}"
        if key == "job":
            return f"job-{rng.randrange(10**6)}"
        if key == "port":
            return str(rng.randrange(1024, 65535))
        if key == "count":
            return str(rng.randrange(1, 100_000))
        if key == "city":
            return rng.choice(_CITIES)
        if key == "carrier":
            return rng.choice(_CARRIERS)
        if key == "tracking":
            return f"1Z{rng.randrange(16**12):012X}"
        if key == "weight":
            return f"{rng.uniform(0.1, 40):.2f}"
        if key == "mb":
            return str(rng.randrange(128, 8192))
        if key == "pod":
            return (
                f"{rng.choice(_SERVICES)}-{rng.randbytes(3).hex()[:5]}-{rng.randbytes(3).hex()[:5]}"
            )
        if key == "bool":
            return rng.choice(("true", "false"))
        if key == "segment":
            return rng.choice(_SEGMENTS)
        raise KeyError(key)


_ATTRIBUTE_KEYS: Final = (
    "http.method", "http.route", "http.status_code", "user.id", "client.address",
    "thread.name", "code.function", "request.id", "session.id", "cloud.region", "log.logger",
)  # fmt: skip


def _attribute_values(rng: random.Random, fields: _Fields) -> dict[str, Callable[[], str]]:
    return {
        "http.method": lambda: rng.choice(_METHODS),
        "http.route": lambda: rng.choice(_ROUTES),
        "http.status_code": lambda: rng.choice(_STATUSES),
        "user.id": lambda: fields["user"],
        "client.address": lambda: fields["ip"],
        "thread.name": lambda: f"worker-{rng.randrange(32)}",
        "code.function": lambda: rng.choice(("handle", "process", "dispatch", "run", "flush")),
        "request.id": lambda: fields["uuid"],
        "session.id": lambda: fields["hex16"],
        "cloud.region": lambda: rng.choice(("eu-west-1", "us-east-1", "ap-northeast-1")),
        "log.logger": lambda: f"com.example.{rng.choice(_SERVICES)}.{rng.choice(('Api', 'Db'))}",
    }


@dataclass(frozen=True, slots=True)
class RequestPool:
    """Pre-built requests: `messages[i]` serialises to `bodies[i]`, which holds
    `records[i]` log records and is sent as tenant `tenants[i]`."""

    messages: tuple[ExportLogsServiceRequest, ...]
    bodies: tuple[bytes, ...]
    records: tuple[int, ...]
    tenants: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.bodies)

    @property
    def mean_body_bytes(self) -> float:
        return sum(map(len, self.bodies)) / len(self.bodies)


def build_pool(
    count: int = 200,
    records_per_request: int = 100,
    tenants: Sequence[str] = ("default",),
    seed: int = 1,
    now_ns: int | None = None,
    attributes: int | None = None,
) -> RequestPool:
    """`count` distinct requests from `random.Random(seed)`; same seed, same bytes
    (given the same `now_ns`, the base of the records' timestamps). `attributes`: the
    attributes of every record (the logger and `attributes - 1` drawn keys); None
    draws 3–6 a record."""
    if count < 1 or records_per_request < 1 or not tenants:
        raise ValueError("count, records_per_request and tenants must be positive")
    if attributes is not None and not 1 <= attributes <= len(_ATTRIBUTE_KEYS):
        raise ValueError(f"attributes {attributes}: must be 1..{len(_ATTRIBUTE_KEYS)}")
    rng = random.Random(seed)
    fields = _Fields(rng)
    attr_values = _attribute_values(rng, fields)
    attr_keys = tuple(attr_values)
    assert attr_keys == _ATTRIBUTE_KEYS
    weights = [t[0] for t in _TEMPLATES]
    base_ns = time.time_ns() if now_ns is None else now_ns
    hosts = [
        (svc, f"node-{rng.randrange(1, 40):02d}.cluster.local", f"{svc}-{rng.randbytes(4).hex()}")
        for svc in _SERVICES
    ]
    messages: list[ExportLogsServiceRequest] = []
    for n in range(count):
        req = ExportLogsServiceRequest()
        # 1–3 resources (pods) per request, as a collector batching several pods sends.
        groups = rng.randint(1, min(3, records_per_request))
        cuts = sorted(rng.sample(range(1, records_per_request), groups - 1))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, records_per_request], strict=True)]
        # Request n covers second n of the `count` seconds before `now_ns`.
        ts = max(0, base_ns - (count - n) * 1_000_000_000)
        for size in sizes:
            svc, host, pod = rng.choice(hosts)
            rl = req.resource_logs.add()
            for key, value in (
                ("service.name", svc),
                ("host.name", host),
                ("k8s.pod.name", pod),
                ("k8s.namespace.name", rng.choice(_NAMESPACES)),
            ):
                rl.resource.attributes.append(_kv(key, value))
            sl = rl.scope_logs.add()
            sl.scope.name = f"com.example.{svc}"
            for _ in range(size):
                _, severity, logger, template = rng.choices(_TEMPLATES, weights)[0]
                lr = sl.log_records.add()
                ts += rng.randrange(1_000, 5_000_000)
                lr.time_unix_nano = ts
                lr.observed_time_unix_nano = ts + rng.randrange(100_000, 50_000_000)
                lr.severity_number = _SEVERITY[severity]
                lr.severity_text = severity
                lr.body.string_value = template.format_map(fields)
                drawn = rng.randint(3, 6) if attributes is None else attributes
                keys = rng.sample(attr_keys, drawn)
                lr.attributes.append(_kv("logger", logger))
                lr.attributes.extend(_kv(k, attr_values[k]()) for k in keys[1:])
                if rng.random() < 0.9:
                    lr.trace_id = rng.randbytes(16)
                    lr.span_id = rng.randbytes(8)
        messages.append(req)
    return RequestPool(
        messages=tuple(messages),
        bodies=tuple(m.SerializeToString() for m in messages),
        records=tuple(sum(len(sl.log_records) for rl in m.resource_logs for sl in rl.scope_logs)
                      for m in messages),
        tenants=tuple(tenants[i % len(tenants)] for i in range(count)),
    )  # fmt: skip


def _kv(key: str, value: str) -> KeyValue:
    kv = KeyValue(key=key)
    kv.value.string_value = value
    return kv


# ── configuration and result ────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What to send where, and how fast. `rate=None` is closed loop."""

    transport: Transport = "http"
    host: str = "127.0.0.1"
    port: int = 4318
    path: str = "/v1/logs"
    connections: int = 16
    duration_s: float = 10.0
    warmup_s: float = 0.0
    rate: float | None = None
    token: str | None = None
    request_timeout_s: float = 30.0
    #: gRPC only: channels (TCP connections) the in-flight calls are spread over.
    grpc_channels: int = 1

    def validate(self) -> None:
        if self.transport not in ("http", "grpc"):
            raise ValueError(f"transport {self.transport!r}: expected 'http' or 'grpc'")
        if self.connections < 1:
            raise ValueError(f"connections {self.connections}: must be ≥ 1")
        if not (self.duration_s > 0 and self.warmup_s >= 0 and self.request_timeout_s > 0):
            raise ValueError("duration_s and request_timeout_s must be > 0, warmup_s ≥ 0")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate {self.rate}: must be a positive number of requests/s")
        if not 1 <= self.grpc_channels <= self.connections:
            raise ValueError(f"grpc_channels {self.grpc_channels}: must be 1..connections")

    @property
    def mode(self) -> str:
        return "closed" if self.rate is None else "open"


@dataclass(slots=True)
class LoadResult:
    """What one run measured, over the requests sent after the warm-up.

    `statuses` keys are HTTP status codes ("200", "503"), gRPC code names ("OK",
    "UNAVAILABLE"), "timeout", or "error:<ExceptionType>" for a broken connection.
    `latencies_s` holds every request's latency, `ack_latencies_s` only those of
    acknowledged (2xx / OK) requests: a quick 503 is not an acknowledgement, so ack
    latency targets read the latter.
    `cpu_s` is this process's CPU time (all threads) over the whole run, warm-up
    included, and `wall_s` the run's wall time, so `cpu_s / wall_s` is the cores the
    generator itself used.
    """

    transport: Transport
    mode: str
    target_rate: float | None
    elapsed_s: float = 0.0
    requests: int = 0
    records_acked: int = 0
    latencies_s: list[float] = field(default_factory=list)
    ack_latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    late: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records_acked / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def acked(self) -> int:
        return sum(n for status, n in self.statuses.items() if _is_ack(status))

    @property
    def generator_cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def percentile(self, q: float, acked_only: bool = False) -> float:
        """Nearest-rank percentile of the latencies in seconds (nan when empty)."""
        return _nearest_rank(sorted(self.ack_latencies_s if acked_only else self.latencies_s), q)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        acked = sorted(self.ack_latencies_s)

        def pct(q: float, values: Sequence[float] = ordered) -> float | None:
            return round(_nearest_rank(values, q) * 1000, 3) if values else None

        return {
            "transport": self.transport,
            "mode": self.mode,
            "target_rate": self.target_rate,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests": self.requests,
            "requests_per_s": round(self.requests_per_s, 1),
            "records_acked": self.records_acked,
            "records_per_s": round(self.records_per_s, 1),
            "p50_ms": pct(50),
            "p90_ms": pct(90),
            "p99_ms": pct(99),
            "max_ms": round(ordered[-1] * 1000, 3) if ordered else None,
            "ack_p50_ms": pct(50, acked),
            "ack_p99_ms": pct(99, acked),
            "statuses": dict(sorted(self.statuses.items())),
            "late": self.late,
            "generator_cpu_s": round(self.cpu_s, 3),
            "generator_cores": round(self.generator_cores, 3),
        }


def _nearest_rank(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return math.nan
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _is_ack(status: str) -> bool:
    return status == "OK" or (len(status) == 3 and status.startswith("2"))


class _Recorder:
    """Shared by the workers of one run: the schedule, the window and the tallies."""

    def __init__(self, config: LoadConfig, pool: RequestPool, result: LoadResult) -> None:
        self.config = config
        self.pool = pool
        self.result = result
        self.t0 = time.perf_counter()
        self.measure_from = self.t0 + config.warmup_s
        self.deadline = self.measure_from + config.duration_s
        self.last_done = self.measure_from
        # Open loop: each worker sends every `interval` seconds, phase-shifted.
        self.interval = config.connections / config.rate if config.rate else 0.0

    def start_index(self, worker: int) -> int:
        return worker * len(self.pool) // self.config.connections

    def record(self, index: int, sent: float, done: float, status: str) -> None:
        if sent < self.measure_from:
            return
        result = self.result
        result.requests += 1
        result.statuses[status] += 1
        result.latencies_s.append(done - sent)
        if _is_ack(status):
            result.records_acked += self.pool.records[index]
            result.ack_latencies_s.append(done - sent)
        if done > self.last_done:
            self.last_done = done

    async def pace(self, worker: int, k: int) -> float | None:
        """When request `k` of `worker` is due (perf_counter), after waiting for it;
        None once the deadline has passed. Closed loop: now."""
        now = time.perf_counter()
        if not self.interval:
            return now if now < self.deadline else None
        due = self.t0 + worker * self.interval / self.config.connections + k * self.interval
        if due >= self.deadline:
            return None
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > LATE_TOLERANCE_S and due >= self.measure_from:
            self.result.late += 1
        return due


# ── HTTP/1.1 ────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    keep_alive: bool
    #: the Retry-After header's value, for a client that honours it
    retry_after: str | None = None


class HttpConnection:
    """One HTTP/1.1 keep-alive connection; `exchange` sends one request and reads its
    response. Not safe for concurrent use (no pipelining)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        # 1 MiB line limit: a response head or chunk-size line longer than asyncio's
        # 64 KiB default is malformed for our purposes, but should not crash the run.
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def exchange(self, request: bytes) -> HttpResponse:
        self._writer.write(request)
        await self._writer.drain()
        return await self.read_response()

    async def read_response(self) -> HttpResponse:
        reader = self._reader
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            status, keep_alive, length, chunked = _parse_head(head)
            if not 100 <= status < 200:  # an interim 1xx response is followed by the real one
                break
        if chunked:
            body = await self._read_chunked()
        elif length is not None:
            body = await reader.readexactly(length)
        elif status in (204, 304):
            body = b""
        else:  # no framing: the body runs to EOF
            body = await reader.read()
            keep_alive = False
        return HttpResponse(status, body, keep_alive, _retry_after(head))

    async def _read_chunked(self) -> bytes:
        reader = self._reader
        parts: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            chunk = await reader.readexactly(size + 2)
            if chunk[-2:] != b"\r\n":
                raise ValueError("chunk not terminated by CRLF")
            parts.append(chunk[:-2])

    def close(self) -> None:
        self._writer.close()

    async def aclose(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass


def _retry_after(head: bytes) -> str | None:
    for line in head[:-4].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after":
            return value.strip().decode("ascii", "replace")
    return None


def _parse_head(head: bytes) -> tuple[int, bool, int | None, bool]:
    """(status, keep_alive, content_length, chunked) of a response head ending CRLFCRLF."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    status = int(rest[:3])
    keep_alive = version != b"HTTP/1.0"
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            tokens = value.lower()
            if b"close" in tokens:
                keep_alive = False
            elif b"keep-alive" in tokens:
                keep_alive = True
    return status, keep_alive, length, chunked


def http_requests(config: LoadConfig, pool: RequestPool) -> tuple[bytes, ...]:
    """The complete request bytes (head and body) of each pool entry."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    auth = f"Authorization: Bearer {config.token}\r\n" if config.token else ""
    out = []
    for body, tenant in zip(pool.bodies, pool.tenants, strict=True):
        head = (
            f"POST {config.path} HTTP/1.1\r\n"
            f"Host: {host}:{config.port}\r\n"
            f"Content-Type: {PROTOBUF_CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Ourios-Tenant: {tenant}\r\n"
            f"{auth}"
            "\r\n"
        )
        out.append(head.encode("ascii") + body)
    return tuple(out)


async def _http_worker(worker: int, rec: _Recorder, requests: Sequence[bytes]) -> None:
    config = rec.config
    size = len(requests)
    index = rec.start_index(worker)
    conn: HttpConnection | None = None
    k = 0
    try:
        while (due := await rec.pace(worker, k)) is not None:
            k += 1
            index = (index + 1) % size
            try:
                async with asyncio.timeout(config.request_timeout_s):
                    if conn is None:
                        conn = await HttpConnection.open(config.host, config.port)
                    response = await conn.exchange(requests[index])
            except TimeoutError:
                status, keep = "timeout", False
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError) as exc:  # fmt: skip
                status, keep = f"error:{type(exc).__name__}", False
            else:
                status, keep = str(response.status), response.keep_alive
            rec.record(index, due, time.perf_counter(), status)
            if not keep and conn is not None:
                conn.close()
                conn = None
            if status.startswith("error:") and rec.interval == 0.0:
                # A refused or reset connection answers instantly; without a pause a
                # closed loop would spin on it and drown the figures in errors.
                await asyncio.sleep(0.01)
    finally:
        if conn is not None:
            await conn.aclose()


# ── gRPC ────────────────────────────────────────────────────────────────────────────


async def _grpc_run(rec: _Recorder) -> None:
    import grpc
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

    config = rec.config
    host = f"[{config.host}]" if ":" in config.host else config.host
    # A local subchannel pool per channel, or grpcio would share one TCP connection.
    options = [("grpc.use_local_subchannel_pool", 1)] if config.grpc_channels > 1 else []
    channels = [
        grpc.aio.insecure_channel(f"{host}:{config.port}", options=options)
        for _ in range(config.grpc_channels)
    ]
    try:
        # LogsServiceStub's Export method, but sent as the pool's pre-serialised bytes
        # (no request serializer): serialising a 100-record request costs ~65 µs of
        # the CPU the generator shares with the server, and the HTTP path sends the
        # same bytes without that cost.
        exports = [
            ch.unary_unary(
                GRPC_METHOD,
                request_serializer=None,
                response_deserializer=ExportLogsServiceResponse.FromString,
            )
            for ch in channels
        ]
        auth = (("authorization", f"Bearer {config.token}"),) if config.token else ()
        metadata = [(("x-ourios-tenant", t), *auth) for t in rec.pool.tenants]
        workers = [
            _grpc_worker(w, rec, exports[w % len(exports)], metadata)
            for w in range(config.connections)
        ]
        await asyncio.gather(*workers)
    finally:
        for ch in channels:
            await ch.close()


async def _grpc_worker(
    worker: int, rec: _Recorder, export: Any, metadata: Sequence[tuple[tuple[str, str], ...]]
) -> None:
    import grpc

    bodies = rec.pool.bodies
    size = len(bodies)
    index = rec.start_index(worker)
    timeout = rec.config.request_timeout_s
    k = 0
    while (due := await rec.pace(worker, k)) is not None:
        k += 1
        index = (index + 1) % size
        try:
            await export(bodies[index], metadata=metadata[index], timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            status = "timeout" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
        else:
            status = "OK"
        rec.record(index, due, time.perf_counter(), status)


# ── running ─────────────────────────────────────────────────────────────────────────


#: Called with "start" when the measured window opens (after the warm-up) and "end"
#: at its deadline, on the generator's event loop: a caller samples the server's CPU
#: there, so CPU and records cover the same window.
WindowMark = Callable[[str], None]


async def _marks(rec: _Recorder, mark: WindowMark) -> None:
    await asyncio.sleep(max(0.0, rec.measure_from - time.perf_counter()))
    mark("start")
    await asyncio.sleep(max(0.0, rec.deadline - time.perf_counter()))
    mark("end")


async def run_load(
    config: LoadConfig, pool: RequestPool, mark: WindowMark | None = None
) -> LoadResult:
    """Send load as `config` says until its deadline; returns what was measured."""
    config.validate()
    result = LoadResult(config.transport, config.mode, config.rate)
    cpu0 = time.process_time()
    rec = _Recorder(config, pool, result)
    marks = asyncio.ensure_future(_marks(rec, mark)) if mark is not None else None
    if config.transport == "http":
        requests = http_requests(config, pool)
        await asyncio.gather(*(_http_worker(w, rec, requests) for w in range(config.connections)))
    else:
        await _grpc_run(rec)
    if marks is not None:
        await marks
    end = time.perf_counter()
    result.elapsed_s = max(rec.last_done, rec.deadline) - rec.measure_from
    result.wall_s = end - rec.t0
    result.cpu_s = time.process_time() - cpu0
    return result


def run(config: LoadConfig, pool: RequestPool, mark: WindowMark | None = None) -> LoadResult:
    """`run_load` on a fresh event loop: uvloop for HTTP (less CPU per request), the
    default loop for gRPC (grpc.aio runs its own poller and does not support uvloop)."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if config.transport == "http":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run_load(config, pool, mark))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", default="http://127.0.0.1:4318/v1/logs", help="OTLP/HTTP URL")
    where.add_argument("--grpc", metavar="HOST:PORT", help="send OTLP/gRPC here instead")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=float, default=None, help="requests/s (open loop)")
    parser.add_argument("--records-per-request", type=int, default=100)
    parser.add_argument("--pool", type=int, default=200, help="distinct requests to build")
    parser.add_argument("--tenants", default="default", help="comma-separated tenant list")
    parser.add_argument("--token", default=None, help="send Authorization: Bearer TOKEN")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--grpc-channels", type=int, default=1)
    args = parser.parse_args(argv)
    tenants = [t for t in args.tenants.split(",") if t]
    pool = build_pool(args.pool, args.records_per_request, tenants, seed=args.seed)
    config = LoadConfig(
        connections=args.connections,
        duration_s=args.seconds,
        warmup_s=args.warmup,
        rate=args.rate,
        token=args.token,
        grpc_channels=args.grpc_channels,
    )
    if args.grpc:
        host, _, port = args.grpc.rpartition(":")
        config = replace(config, transport="grpc", host=host.strip("[]"), port=int(port))
    else:
        url = urlsplit(args.url)
        if url.scheme != "http" or url.hostname is None:
            parser.error(f"--url {args.url}: only http://HOST[:PORT]/PATH is supported")
        config = replace(
            config, host=url.hostname, port=url.port or 80, path=url.path or "/v1/logs"
        )
    result = run(config, pool)
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Smoke tests for soak.bench.loadgen: the generator against tiny in-test servers.

Each run lasts about a second and must end by itself; the servers count what they
received, so the generator's tallies are checked against the other side, not against
themselves. No speed is asserted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field, replace

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from soak.bench.loadgen import LoadConfig, LoadResult, RequestPool, build_pool, run_load

RECORDS = 7
TENANTS = ("ok", "busy", "chunked")
#: The tiny server closes every connection after this many requests.
CLOSE_EVERY = 5


@pytest.fixture(scope="module")
def pool() -> RequestPool:
    return build_pool(count=12, records_per_request=RECORDS, tenants=TENANTS, seed=7, now_ns=10**18)


def count_records(req: ExportLogsServiceRequest) -> int:
    return sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)


@dataclass
class Tally:
    """What a tiny server received, per tenant."""

    requests: Counter[str] = field(default_factory=Counter)
    records: Counter[str] = field(default_factory=Counter)
    connections: int = 0


class TinyHttpServer:
    """HTTP/1.1 on asyncio streams: tenant "ok" → 200 with Content-Length, "busy" →
    503 with Content-Length, "chunked" → 200 with a chunked body; every
    `CLOSE_EVERY`-th request on a connection is answered `Connection: close`."""

    def __init__(self) -> None:
        self.tally = Tally()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.tally.connections += 1
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                headers = dict(
                    line.split(b": ", 1) for line in head[:-4].split(b"\r\n")[1:]
                )  # fmt: skip
                body = await reader.readexactly(int(headers[b"Content-Length"]))
                tenant = headers[b"X-Ourios-Tenant"].decode()
                self.tally.requests[tenant] += 1
                self.tally.records[tenant] += count_records(
                    ExportLogsServiceRequest.FromString(body)
                )
                served += 1
                close = served % CLOSE_EVERY == 0
                extra = b"Connection: close\r\n" if close else b""
                if tenant == "chunked":
                    reply = (
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + extra + b"\r\n"
                        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"
                    )
                else:
                    status = b"200 OK" if tenant == "ok" else b"503 Service Unavailable"
                    reply = (
                        b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n"
                        b"Content-Type: application/x-protobuf\r\n" + extra + b"\r\nok"
                    )
                writer.write(reply)
                await writer.drain()
                if close:
                    return
        finally:
            writer.close()


async def run_against_http(config: LoadConfig, pool: RequestPool) -> tuple[LoadResult, Tally]:
    tiny = TinyHttpServer()
    server = await asyncio.start_server(tiny.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        result = await run_load(replace(config, host="127.0.0.1", port=port), pool)
    return result, tiny.tally


def test_closed_loop_http_200_503_chunked_and_reconnects(pool: RequestPool) -> None:
    config = LoadConfig(connections=4, duration_s=1.0, request_timeout_s=5.0)
    result, tally = asyncio.run(run_against_http(config, pool))

    # Every request sent was answered and recorded (no warm-up): both sides agree.
    assert result.requests == sum(tally.requests.values()) > 0
    assert result.statuses == Counter(
        {"200": tally.requests["ok"] + tally.requests["chunked"], "503": tally.requests["busy"]}
    )
    # Only 2xx acknowledge records.
    assert result.records_acked == tally.records["ok"] + tally.records["chunked"]
    assert all(n % RECORDS == 0 for n in tally.records.values())
    assert len(result.latencies_s) == result.requests
    assert len(result.ack_latencies_s) == result.statuses["200"]
    assert all(lat >= 0 for lat in result.latencies_s)
    # `Connection: close` made the generator reconnect.
    assert tally.connections > config.connections
    assert set(tally.requests) == set(TENANTS)
    assert result.elapsed_s >= config.duration_s
    summary = result.summary()
    assert summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]


def test_open_loop_sends_the_scheduled_number_of_requests(pool: RequestPool) -> None:
    # 190 requests/s for 1 s over 4 connections: the schedule holds 190 sends (±1 per
    # connection at the deadline), however fast the server answers.
    config = LoadConfig(connections=4, duration_s=1.0, rate=190.0, request_timeout_s=5.0)
    result, tally = asyncio.run(run_against_http(config, pool))
    assert result.mode == "open"
    assert abs(result.requests - 190) <= config.connections
    assert result.requests == sum(tally.requests.values())


def test_connection_refused_is_counted_not_raised(pool: RequestPool) -> None:
    async def main() -> LoadResult:
        # A port that was just free: bind, note it, close, then aim there.
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        return await run_load(LoadConfig(port=port, connections=2, duration_s=0.3), pool)

    result = asyncio.run(main())
    assert result.records_acked == 0
    assert result.requests > 0
    assert set(result.statuses) == {"error:ConnectionRefusedError"}


class _Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self) -> None:
        self.tally = Tally()

    async def Export(  # noqa: N802 (the generated servicer's name)
        self, request: ExportLogsServiceRequest, context: grpc.aio.ServicerContext
    ) -> ExportLogsServiceResponse:
        tenant = dict(context.invocation_metadata() or ())["x-ourios-tenant"]
        self.tally.requests[tenant] += 1
        self.tally.records[tenant] += count_records(request)
        if tenant == "busy":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        return ExportLogsServiceResponse()


@pytest.mark.thread_leak_ok(
    "grpc.aio starts one process-wide completion-queue poller thread on first use and "
    "never stops it; it is grpcio's, not the generator's"
)
def test_grpc_closed_loop_counts_ok_and_unavailable(pool: RequestPool) -> None:
    async def main() -> tuple[LoadResult, Tally]:
        servicer = _Logs()
        server = grpc.aio.server()
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            config = LoadConfig(
                transport="grpc", port=port, connections=4, duration_s=1.0, request_timeout_s=5.0
            )
            result = await run_load(config, pool)
        finally:
            await server.stop(None)
        return result, servicer.tally

    result, tally = asyncio.run(main())
    assert result.requests == sum(tally.requests.values()) > 0
    assert result.statuses == Counter(
        {
            "OK": tally.requests["ok"] + tally.requests["chunked"],
            "UNAVAILABLE": tally.requests["busy"],
        }
    )
    assert result.records_acked == tally.records["ok"] + tally.records["chunked"]


def test_pool_is_seeded_and_realistic() -> None:
    a = build_pool(count=4, records_per_request=50, tenants=("t1", "t2"), seed=3, now_ns=10**18)
    b = build_pool(count=4, records_per_request=50, tenants=("t1", "t2"), seed=3, now_ns=10**18)
    c = build_pool(count=4, records_per_request=50, tenants=("t1", "t2"), seed=4, now_ns=10**18)
    assert a.bodies == b.bodies != c.bodies
    assert a.records == (50, 50, 50, 50)
    assert a.tenants == ("t1", "t2", "t1", "t2")
    assert len(set(a.bodies)) == 4
    for message in a.messages:
        for rl in message.resource_logs:
            keys = {kv.key for kv in rl.resource.attributes}
            assert {"service.name", "host.name", "k8s.pod.name"} <= keys
            for lr in (lr for sl in rl.scope_logs for lr in sl.log_records):
                assert 60 <= len(lr.body.string_value) <= 220
                assert 3 <= len(lr.attributes) <= 6
                assert lr.severity_number and lr.severity_text
                assert len(lr.trace_id) in (0, 16) and len(lr.span_id) in (0, 8)

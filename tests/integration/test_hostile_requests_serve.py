"""Issue 21 item 3 against a real ``ourios serve``: hostile requests cannot exhaust a worker.

One worker process, the shipped defaults (8 MiB frames, 64 MiB in flight, two decodes at
once), open mode (so the hostile client needs no token). Sixteen concurrent 8 MiB
requests, each one log record with 4.2 million empty attributes — 27 times its size once
parsed, and gigabytes once flattened before the limits — are sent over HTTP, then over
gRPC, while a normal client sends small batches and asks ``/healthz`` in a loop. Each
hostile request gets its documented answer: 400 / INVALID_ARGUMENT naming
``server.max_attributes_per_record``, or 503 / RESOURCE_EXHAUSTED with a one-second
Retry-After (RetryInfo on gRPC) from the in-flight bound. The normal client keeps getting
200s, the worker's peak resident memory (VmHWM) stays under the bound docs/RUNBOOK.md
documents, and nothing of the hostile tenant reaches the WAL.
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2

from app.receive.otlp_grpc import EXPORT_METHOD
from tests.support.noderig import bodies_request
from tests.support.otel import wal_frame_count
from tests.support.procmem import status_kib
from tests.support.serve import ServeProcess

MiB = 1 << 20
HOSTILE = 16
#: docs/RUNBOOK.md, "Receivers: request limits and the in-flight bound": a worker's peak
#: resident memory with the defaults, whatever its clients send.
WORKER_PEAK_BOUND_MIB = 1024
LIMIT_NAMED = "over server.max_attributes_per_record=4096"


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    size, length = len(payload), bytearray()
    while True:
        byte = size & 0x7F
        size >>= 7
        length.append(byte | (0x80 if size else 0))
        if not size:
            break
    return bytes([number << 3 | 2]) + bytes(length) + payload


def hostile_body() -> bytes:
    """One record whose attributes are all empty KeyValues (field 6, two bytes each),
    as many as fit an 8 MiB frame."""
    attributes = b"\x32\x00" * ((8 * MiB - 32) // 2)
    body = _field(1, _field(2, _field(2, attributes)))
    assert len(body) <= 8 * MiB
    return body


def normal_body() -> bytes:
    bodies = [f"user {i} logged in from 10.0.0.{i}" for i in range(20)]
    data: bytes = bodies_request(None, bodies).SerializeToString()
    return data


@dataclass
class NormalClient:
    """Small batches and /healthz, back to back, on a thread of its own for the length of
    a ``with`` block (or until ``stop`` is set)."""

    port: int
    statuses: Counter[int] = field(default_factory=Counter)
    health: Counter[int] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> NormalClient:
        self._thread = threading.Thread(target=self.run, name="normal-client")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(120)

    def run(self) -> None:
        body = normal_body()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            while not self.stop.is_set():
                conn.request(
                    "POST",
                    "/v1/logs",
                    body,
                    {"Content-Type": "application/x-protobuf", "X-Ourios-Tenant": "normal"},
                )
                response = conn.getresponse()
                response.read()
                self.statuses[response.status] += 1
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                self.health[response.status] += 1
        finally:
            conn.close()


def post_hostile(port: int, body: bytes) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(
            "POST",
            "/v1/logs",
            body,
            {"Content-Type": "application/x-protobuf", "X-Ourios-Tenant": "hostile"},
        )
        response = conn.getresponse()
        payload = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    return response.status, status_pb2.Status.FromString(payload).message, headers


def export_hostile(channel: grpc.Channel, body: bytes) -> grpc.RpcError:
    call = channel.unary_unary(EXPORT_METHOD)
    try:
        call(body, metadata=(("x-ourios-tenant", "hostile"),), timeout=120)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("a hostile request was acknowledged")


def retry_delay(error: grpc.RpcError) -> int | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            retry = error_details_pb2.RetryInfo()
            if status.details and status.details[0].Unpack(retry):
                return int(retry.retry_delay.seconds)
    return None


def test_bounded_3_hostile_requests_cannot_exhaust_a_worker(tmp_path: Path) -> None:
    body = hostile_body()
    env = {"OURIOS_SERVER_WORKERS": "1", "OURIOS_WAL_BARRIER_SECS": "5"}
    with ServeProcess(tmp_path / "data", env) as serve:
        (listening,) = serve.event("server.listening")
        (worker,) = listening["workers"]
        with NormalClient(serve.http_port) as normal:
            with ThreadPoolExecutor(HOSTILE) as pool:
                http_replies = list(
                    pool.map(lambda _: post_hostile(serve.http_port, body), range(HOSTILE))
                )
                with grpc.insecure_channel(
                    f"127.0.0.1:{serve.grpc_port}",
                    options=(("grpc.max_send_message_length", 16 * MiB),),
                ) as channel:
                    grpc_errors = list(
                        pool.map(lambda _: export_hostile(channel, body), range(HOSTILE))
                    )
        worker_peak_mib = status_kib(worker, "VmHWM") // 1024

        for status, message, headers in http_replies:
            if status == 400:
                assert LIMIT_NAMED in message, message
            else:
                assert status == 503, (status, message)
                assert headers["retry-after"] == "1"
                assert "server.max_inflight_bytes" in message, message
        assert Counter(s for s, _, _ in http_replies)[400] >= 1
        for error in grpc_errors:
            if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
                assert LIMIT_NAMED in error.details(), error.details()
            else:
                assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
                assert "server.max_inflight_bytes" in error.details(), error.details()
                assert retry_delay(error) == 1
        assert sum(e.code() is grpc.StatusCode.INVALID_ARGUMENT for e in grpc_errors) >= 1

        sent = sum(normal.statuses.values())
        assert sent >= 5, normal.statuses  # it ran meanwhile (however loaded the host)
        assert normal.statuses[200] >= 0.95 * sent, normal.statuses
        assert set(normal.health) == {200}, normal.health
        assert worker_peak_mib < WORKER_PEAK_BOUND_MIB, worker_peak_mib
        assert wal_frame_count(serve.data_dir / "wal", "hostile") == 0
        assert wal_frame_count(serve.data_dir / "wal", "normal") == normal.statuses[200]
        assert serve.terminate() == 0
    print(f"worker peak {worker_peak_mib} MiB; normal client {dict(normal.statuses)}")


#: server.max_expanded_bytes' default, as its refusal quotes it
EXPANDED_NAMED = "over server.max_expanded_bytes=67108864"
#: a worker's peak with the defaults after small bodies that would each have flattened to
#: 2.1 GB: its own memory (~200 MiB) and a few parsed 130 KB requests, never their rows
EXPANDING_PEAK_BOUND_MIB = 512


def expanding_body() -> bytes:
    """Issue 21 item 3's gap: 33,000 empty records under one 64 KiB resource value — a
    130 KB body within every count and length limit whose rows would hold 2.1 GB."""
    value = b"a" * (64 << 10)
    attribute = _field(1, _field(1, b"k8s.pod.annotations") + _field(2, _field(1, value)))
    records = b"\x12\x00" * 33_000  # ScopeLogs.log_records, each an empty LogRecord
    body = _field(1, _field(1, attribute) + _field(2, records))
    assert len(body) < 140_000
    return body


def test_bounded_3_a_small_body_expanding_past_max_expanded_bytes_is_refused_400(
    tmp_path: Path,
) -> None:
    body = expanding_body()
    env = {"OURIOS_SERVER_WORKERS": "1", "OURIOS_WAL_BARRIER_SECS": "5"}
    with ServeProcess(tmp_path / "data", env) as serve:
        (listening,) = serve.event("server.listening")
        (worker,) = listening["workers"]
        with NormalClient(serve.http_port) as normal:
            with ThreadPoolExecutor(4) as pool:
                http_replies = list(
                    pool.map(lambda _: post_hostile(serve.http_port, body), range(8))
                )
                with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
                    grpc_errors = list(pool.map(lambda _: export_hostile(channel, body), range(8)))
        worker_rss_mib = status_kib(worker, "VmRSS") // 1024
        worker_peak_mib = status_kib(worker, "VmHWM") // 1024  # the most VmRSS has been

        for status, message, headers in http_replies:
            assert status == 400, (status, message)
            assert EXPANDED_NAMED in message, message
            assert "retry-after" not in headers
        for error in grpc_errors:
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
            assert EXPANDED_NAMED in error.details(), error.details()
        sent = sum(normal.statuses.values())
        assert sent >= 5, normal.statuses
        assert normal.statuses[200] == sent, normal.statuses
        assert worker_peak_mib < EXPANDING_PEAK_BOUND_MIB, worker_peak_mib
        assert wal_frame_count(serve.data_dir / "wal", "hostile") == 0
        assert wal_frame_count(serve.data_dir / "wal", "normal") == normal.statuses[200]
        assert serve.terminate() == 0
    print(f"worker VmRSS {worker_rss_mib} MiB, peak {worker_peak_mib} MiB; {dict(normal.statuses)}")

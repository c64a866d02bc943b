"""RFC0052.15, the receiver's half: a real WAL refusal — an fsync failure, a rotation
still retrying, the terminal rotation state — reaches the client on both transports as
DESIGN.md §7 says (503 / UNAVAILABLE, no Retry-After, the message saying transient and
retrying or naming the terminal state and its first error), with the WAL error's class
on the counters; nothing is acknowledged and nothing is written for a refused batch.

The WAL, pipeline and receivers are the real ones (the in-process node rig on a
``FaultyFs``); only the fs seam is told to fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from fastapi import FastAPI
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

from app.receive.auth import Authenticator
from app.receive.otlp_grpc import create_grpc_server
from app.receive.otlp_http import create_http_app
from tests.support.noderig import NodeRig, request
from tests.unit.app.receive.test_otlp_http import call
from wal import RotationExhausted, RotationFailing, WalConfig
from wal.types import RotationHealthy

ATTEMPTS = 3
STATUS_DETAILS = "grpc-status-details-bin"


@dataclass
class Counted:
    """An ``IngestObserver`` that keeps what the receivers report."""

    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def observe(
        self, transport: str, outcome: str, error_type: str, records: int, seconds: float
    ) -> None:
        self.requests[(transport, outcome, error_type)] += 1


@dataclass
class Wire:
    rig: NodeRig
    app: FastAPI
    stub: logs_service_pb2_grpc.LogsServiceStub
    counted: Counted

    def http(self, tag: str, n: int = 3) -> tuple[int, dict[str, str], str]:
        reply = call(self.app, request(tag, n).SerializeToString())
        message = reply.status_message().message if reply.status != 200 else ""
        return reply.status, reply.headers, message

    def grpc(self, tag: str) -> tuple[grpc.StatusCode, str, bool]:
        try:
            self.stub.Export(request(tag), timeout=30)
        except grpc.RpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())
            retry_info = False
            if STATUS_DETAILS in trailers:  # only a refusal with a hint carries details
                status = status_pb2.Status.FromString(trailers[STATUS_DETAILS])
                retry_info = any(d.type_url.endswith("RetryInfo") for d in status.details)
            return exc.code(), exc.details() or "", retry_info
        return grpc.StatusCode.OK, "", False


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[Wire]:
    config = WalConfig(segment_max_bytes=64 * 1024, rotation_retry_attempts=ATTEMPTS)
    rig = NodeRig(tmp_path / "node", config=config)
    counted = Counted()
    app = create_http_app(
        rig.pipeline,
        max_frame_bytes=1 << 20,
        authenticator=Authenticator(None),
        metrics_text=lambda: (b"", "text/plain"),
        observer=counted,
    )
    server, port = create_grpc_server(
        rig.pipeline,
        max_frame_bytes=1 << 20,
        authenticator=Authenticator(None),
        host="127.0.0.1",
        port=0,
        observer=counted,
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]
    try:
        yield Wire(rig, app, stub, counted)
    finally:
        channel.close()
        server.stop(None).wait()
        rig.close()


def written(rig: NodeRig) -> int:
    """The WAL's logical end: the bytes of every frame ever appended."""
    return rig.journal.end_lsn


def test_rfc0052_15_an_fsync_failure_is_transient_on_both_transports(wire: Wire) -> None:
    assert wire.http("ok")[0] == 200
    before = written(wire.rig)

    wire.rig.fs.fail("fsync", "*.wal")
    status, headers, message = wire.http("h")
    wire.rig.fs.fail("fsync", "*.wal")
    code, details, retry_info = wire.grpc("g")

    assert status == 503 and "retry-after" not in headers
    assert "transient, retrying" in message and "fsync" in message
    assert code is grpc.StatusCode.UNAVAILABLE and not retry_info
    assert "transient, retrying" in details
    # the failed frames were never acknowledged; whatever reached the disk behind them
    # was sealed, and the node takes the next batch on a fresh segment
    assert wire.http("after")[0] == 200
    assert wire.grpc("after-g")[0] is grpc.StatusCode.OK
    assert isinstance(wire.rig.journal.rotation_state, RotationHealthy)
    assert written(wire.rig) > before
    refused = {k for k in wire.counted.requests if k[1] != "ok"}
    assert {(t, e) for t, _, e in refused} == {("http", "wal_io"), ("grpc", "wal_io")}


def test_rfc0052_15_rotation_retrying_then_terminal_on_both_transports(wire: Wire) -> None:
    rig = wire.rig
    assert wire.http("ok")[0] == 200
    rig.fs.fail("open", "*.wal.partial", count=None)  # every rotation attempt fails
    # fill the segment: the append that needs a rotation is the first to fail
    for i in range(200):
        status, headers, message = wire.http(f"fill{i}", 50)
        if status != 200:
            break
    state = rig.journal.rotation_state
    assert isinstance(state, RotationFailing) and state.attempts == 1

    code, details, retry_info = wire.grpc("r2")  # the second attempt, also failing

    assert status == 503 and "retry-after" not in headers
    assert "transient, retrying" in message and "rotat" in message
    assert code is grpc.StatusCode.UNAVAILABLE and not retry_info
    assert "transient, retrying" in details
    while isinstance(rig.journal.rotation_state, RotationFailing):
        assert wire.http("r3")[0] == 503
    state = rig.journal.rotation_state
    assert isinstance(state, RotationExhausted) and state.attempts == ATTEMPTS
    end = written(rig)

    status, headers, message = wire.http("t1")
    code, details, retry_info = wire.grpc("t2")

    assert status == 503 and "retry-after" not in headers
    assert "server-terminal" in message and "terminal" in message.lower()
    assert code is grpc.StatusCode.UNAVAILABLE and not retry_info
    assert "server-terminal" in details
    assert written(rig) == end  # a terminal refusal writes nothing
    types = Counter(e for (_, outcome, e), n in wire.counted.requests.items() if outcome != "ok")
    assert set(types) == {"wal_rotation_retrying", "wal_rotation_terminal"}

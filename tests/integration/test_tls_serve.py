"""TLS on both receivers of a real ``ourios serve`` (DESIGN.md §7, issue 24 item 5).

Certificates are made here (``tests/support/tlscerts.py``) and mounted as the kubelet
mounts a Secret, so a rotation is the symlink flip cert-manager's renewal causes. Each
node runs in the core (workers 0) and in a worker process (workers 1), which build their
TLS separately. What is checked: the OpenTelemetry SDK's OTLP/HTTP and OTLP/gRPC
exporters deliver over TLS; plaintext clients are refused on both ports; a rotated
certificate is served to new connections without a restart; ``server.metrics_port``
serves ``/metrics``, ``/healthz`` and ``/readyz`` in plaintext and no receiver; with a
client CA a client without a certificate is refused on both ports.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.resources import Resource

from tests.support.otel import ClientTls, grpc_client, grpc_export, http_client, sample_request
from tests.support.scrape import Scrape
from tests.support.serve import ServeProcess
from tests.support.tlscerts import Authority, Pair, SecretVolume

RECORDS = 5
_BODY = sample_request("tls", 1, time_base_ns=1_700_000_000_000_000_000).SerializeToString()


@dataclass
class TlsNode:
    node: ServeProcess
    volume: SecretVolume
    trust: ClientTls  # both CAs, and the client certificate when one is asked for
    second: Authority  # what a rotation issues from
    tmp: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _client_context(trust: ClientTls) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(trust.ca_file))
    if trust.cert_file is not None and trust.key_file is not None:
        ctx.load_cert_chain(trust.cert_file, trust.key_file)
    return ctx


def _start(tmp: Path, workers: int, *, client_ca: Authority | None = None) -> TlsNode:
    first, second = Authority("ourios-test-ca-1"), Authority("ourios-test-ca-2")
    served = first.issue("ourios")
    volume = SecretVolume(tmp / "tls", {"tls.crt": served.cert, "tls.key": served.key})
    (tmp / "trust.pem").write_bytes(first.pem + second.pem)
    trust = ClientTls(tmp / "trust.pem")
    env = {
        "OURIOS_SERVER_WORKERS": str(workers),
        "OURIOS_SERVER_METRICS_PORT": str(_free_port()),
        "OURIOS_SERVER_TLS_CERT_FILE": str(volume.path("tls.crt")),
        "OURIOS_SERVER_TLS_KEY_FILE": str(volume.path("tls.key")),
    }
    if client_ca is not None:
        (tmp / "client-ca.pem").write_bytes(client_ca.pem)
        env["OURIOS_SERVER_TLS_CLIENT_CA_FILE"] = str(tmp / "client-ca.pem")
        mine = client_ca.issue("collector", client=True)
        (tmp / "client.crt").write_bytes(mine.cert)
        (tmp / "client.key").write_bytes(mine.key)
        trust = ClientTls(tmp / "trust.pem", tmp / "client.crt", tmp / "client.key")
    node = ServeProcess(tmp / "data", env, tls=_client_context(trust))
    node.start()
    return TlsNode(node, volume, trust, second, tmp)


@pytest.fixture(scope="module", params=[0, 1], ids=["core", "worker"])
def tls_node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsNode]:
    started = _start(tmp_path_factory.mktemp("tls"), request.param)
    try:
        yield started
    finally:
        started.node.close()


def _send(trust: ClientTls, node: ServeProcess) -> None:
    resource = Resource.create({"service.name": "tls-test"})
    with pytest.MonkeyPatch.context() as env:
        # requests lets these replace the CA file the exporter gives its session.
        env.delenv("REQUESTS_CA_BUNDLE", raising=False)
        env.delenv("CURL_CA_BUNDLE", raising=False)
        for make, port in ((http_client, node.http_port), (grpc_client, node.grpc_port)):
            with make(port, headers={}, resource=resource, tls=trust) as client:
                logger = client.provider.get_logger("tls")
                for i in range(RECORDS):
                    logger.emit(body=f"over tls {i}")
                report = client.flush()
                assert report.ok and report.records_acknowledged == RECORDS, report


def _plain_get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_clone_5_otlp_exporters_send_logs_over_tls(tls_node: TlsNode) -> None:
    _send(tls_node.trust, tls_node.node)
    assert tls_node.node.event("server.listening")[0]["tls"] is True


def test_clone_5_plaintext_clients_are_refused_when_tls_is_on(tls_node: TlsNode) -> None:
    node = tls_node.node
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        _plain_get(node.http_port, "/v1/logs", "POST")
    reply = grpc_export(node.grpc_port, _BODY, timeout_s=10)
    assert reply.code is grpc.StatusCode.UNAVAILABLE, reply


def test_clone_5_metrics_port_serves_metrics_and_health_in_plaintext(tls_node: TlsNode) -> None:
    node = tls_node.node
    _send(tls_node.trust, node)  # counted by /metrics, whichever process served them
    status, body = _plain_get(node.metrics_port, "/metrics")
    assert status == 200
    scraped = Scrape.parse(body.decode())
    for transport in ("http", "grpc"):
        ok = scraped.value("ourios_ingest_records_total", outcome="ok", transport=transport)
        assert ok is not None, scraped.text
    assert _plain_get(node.metrics_port, "/healthz") == (200, b"ok\n")
    assert _plain_get(node.metrics_port, "/readyz") == (200, b"ready\n")
    assert _plain_get(node.metrics_port, "/v1/logs", "POST")[0] == 404  # no receiver here


def _served_certificate(port: int, trust: ClientTls) -> bytes:
    ctx = _client_context(trust)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_clone_5_a_rotated_certificate_is_served_to_new_connections(tls_node: TlsNode) -> None:
    node, trust = tls_node.node, tls_node.trust
    held = _served_certificate(node.http_port, trust)  # before the renewal
    renewed: Pair = tls_node.second.issue("ourios-renewed")
    before = len(node.event("tls.reloaded"))
    tls_node.volume.update({"tls.crt": renewed.cert, "tls.key": renewed.key})
    assert _served_certificate(node.http_port, trust) == renewed.der != held
    # gRPC: a client trusting only the second CA completes its handshake.
    (tls_node.tmp / "second.pem").write_bytes(tls_node.second.pem)
    only_second = ClientTls(tls_node.tmp / "second.pem", trust.cert_file, trust.key_file)
    reply = grpc_export(node.grpc_port, _BODY, timeout_s=10, tls=only_second)
    assert reply.code is grpc.StatusCode.OK, reply
    node.wait_event("tls.reloaded", before + 1)
    assert node.proc is not None and node.proc.poll() is None  # no restart


def test_clone_5_a_client_without_a_certificate_is_refused_when_a_client_ca_is_set(
    tmp_path: Path,
) -> None:
    started = _start(tmp_path, 1, client_ca=Authority("ourios-test-clients"))
    try:
        node = started.node
        _send(started.trust, node)  # with its certificate: delivered
        anonymous = ClientTls(started.trust.ca_file)
        conn = http.client.HTTPSConnection(
            "127.0.0.1", node.http_port, timeout=10, context=_client_context(anonymous)
        )
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            conn.request(
                "POST", "/v1/logs", body=b"", headers={"Content-Type": "application/x-protobuf"}
            )
            conn.getresponse()
        conn.close()
        reply = grpc_export(node.grpc_port, _BODY, timeout_s=10, tls=anonymous)
        assert reply.code is grpc.StatusCode.UNAVAILABLE, reply
    finally:
        started.node.close()

"""The store's configuration is checked at start-up (issue 22 item 8; DESIGN.md §6).

A real ``ourios serve`` against a real SeaweedFS (started with an identities file, so
every request is signed and checked):

1. A bucket that does not exist, or credentials the server does not know: a permanent
   error. The start is refused before the WAL opens, with one ``server.start_failed``
   naming the bucket, the endpoint and the store's error code, exit status 1.
2. The store down at start (its endpoint refusing connections): a transient error. The
   node starts and is ready (the WAL absorbs an outage) with ``ourios_store_up`` 0 and
   a ``store.unavailable`` event; once the endpoint answers the probe finds it and the
   gauge is 1, without a publish. The endpoint is a ``_Gate`` in front of the session's
   SeaweedFS — a bound socket that refuses connections until it listens, then relays
   bytes — so the outage and its end cost no SeaweedFS restart (18 s of its start-up).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import S3Bucket, SeaweedS3
from tests.support.poll import poll_until
from tests.support.scrape import scrape
from tests.support.serve import ServeProcess

ENV = {
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_WORKERS": "0",
    "OURIOS_STORE_PROBE_SECS": "1",
}


class _Gate:
    """A TCP endpoint that refuses connections (bound, not listening: the kernel answers
    RST) until ``open``, then relays each connection to ``target`` byte for byte."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def open(self) -> None:
        self._sock.listen(16)
        self._start(self._accept)

    def close(self) -> None:
        """Stop accepting (a shutdown wakes the blocked accept), end every relay, join."""
        for sock in (self._sock, *self._conns):
            _shut(sock)
        for thread in self._threads:
            thread.join(10)
        for sock in (self._sock, *self._conns):
            sock.close()

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return  # shut down
            upstream = socket.create_connection(self.target)
            self._conns += [client, upstream]
            self._start(_pump, client, upstream)
            self._start(_pump, upstream, client)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        _shut(src)
        _shut(dst)


def _metric(server: ServeProcess, name: str) -> float | None:
    return scrape(server).series(name)


def _refused(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    node = ServeProcess(tmp_path / "data", {**ENV, **env})
    failed = node.start_refused(timeout=120)
    assert not node.event("server.listening")
    assert not (tmp_path / "data" / "wal").exists()  # refused before the WAL opened
    return failed


@pytest.mark.parametrize("wrong", ["bucket", "credentials"])
def test_every_state_8_a_wrong_store_configuration_refuses_to_start(
    tmp_path: Path, seaweed_s3: SeaweedS3, s3_bucket: S3Bucket, wrong: str
) -> None:
    env = s3_bucket.env()
    bucket = s3_bucket.name
    if wrong == "bucket":
        bucket = f"{s3_bucket.name}-typo"
        env["OURIOS_STORE_URL"] = f"s3://{bucket}"
        codes = {"NoSuchBucket"}
    else:
        env["AWS_SECRET_ACCESS_KEY"] = "not-" + seaweed_s3.secret_key
        codes = {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"}
    failed = _refused(tmp_path, env)
    assert failed["error_type"] == "store_unusable", failed
    assert failed["bucket"] == bucket and failed["endpoint"] == seaweed_s3.endpoint_url
    assert failed["error_code"] in codes, failed
    message = str(failed["error"])
    assert bucket in message and str(failed["error_code"]) in message
    assert s3_bucket.keys() == []  # nothing was written


def test_every_state_8_a_store_down_at_start_starts_and_says_so(
    tmp_path: Path, seaweed_s3: SeaweedS3, s3_bucket: S3Bucket
) -> None:
    up = urlsplit(seaweed_s3.endpoint_url)
    gate = _Gate((up.hostname or "127.0.0.1", up.port or 80))
    env = {
        **s3_bucket.env(),
        "OURIOS_STORE_ENDPOINT_URL": gate.url,
        "AWS_ENDPOINT_URL_S3": gate.url,
    }
    try:
        with ServeProcess(tmp_path / "data", {**ENV, **env}) as node:
            assert node.get("/readyz")[0] == 200
            assert _metric(node, "ourios_store_up") == 0.0
            (down,) = node.event("store.unavailable")
            assert down["error_type"] == "s3_connection", down
            assert not node.event("server.start_failed")
            gate.open()  # the store answers from now on
            poll_until(
                "ourios_store_up 1",
                lambda: _metric(node, "ourios_store_up") == 1.0,
                deadline_s=60,
                detail=node.tail,
                every_s=0.1,
            )
            assert node.event("store.available")
            assert s3_bucket.keys() == []  # the probe's object was deleted
            assert node.terminate() == 0
    finally:
        gate.close()

"""The store's configuration is checked at start-up (issue 22 item 8; DESIGN.md §6).

A real ``ourios serve`` against a real SeaweedFS (started with an identities file, so
every request is signed and checked):

1. A bucket that does not exist, or credentials the server does not know: a permanent
   error. The start is refused before the WAL opens, with one ``server.start_failed``
   naming the bucket, the endpoint and the store's error code, exit status 1.
2. The store down at start (its server killed, the endpoint refusing connections): a
   transient error. The node starts and is ready (the WAL absorbs an outage) with
   ``ourios_store_up`` 0 and a ``store.unavailable`` event; once the server is back the
   probe finds it and the gauge is 1, without a publish.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import S3Bucket, SeaweedS3
from tests.support.serve import ServeProcess
from tests.support.tools import require_tool

ENV = {
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_WORKERS": "0",
    "OURIOS_STORE_PROBE_SECS": "1",
}


def _metric(server: ServeProcess, name: str) -> float | None:
    status, body = server.get("/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _refused(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    node = ServeProcess(tmp_path / "data", {**ENV, **env})
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            node.start(timeout=120)
    finally:
        node.close()
    assert not node.event("server.listening")
    assert not (tmp_path / "data" / "wal").exists()  # refused before the WAL opened
    (failed,) = node.event("server.start_failed")
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


def test_every_state_8_a_store_down_at_start_starts_and_says_so(tmp_path: Path) -> None:
    with SeaweedS3(require_tool("weed"), tmp_path / "seaweed") as weed:
        bucket = S3Bucket.create(weed)
        weed.kill()  # the endpoint refuses connections
        with ServeProcess(tmp_path / "data", {**ENV, **bucket.env()}) as node:
            assert node.get("/readyz")[0] == 200
            assert _metric(node, "ourios_store_up") == 0.0
            (down,) = node.event("store.unavailable")
            assert down["error_type"] == "s3_connection", down
            assert not node.event("server.start_failed")
            weed.restart()
            deadline = time.monotonic() + 60
            while _metric(node, "ourios_store_up") != 1.0:
                assert time.monotonic() < deadline, node.tail()
                time.sleep(0.1)  # a real process's gauge: polled with a deadline
            assert node.event("store.available")
            assert bucket.keys() == []  # the probe's object was deleted
            assert node.terminate() == 0

"""A real SeaweedFS S3 server for integration tests (`weed server -s3`).

One `weed` process runs master, volume, filer and S3 gateway, bound to 127.0.0.1 on
free ports, in its own process group, logging to `<root>/weed.log`. It is started with
an S3 identities file, so every request must be signed with `access_key`/`secret_key`
(anonymous and wrongly signed requests are refused) - the same way the ingester
authenticates through the standard AWS environment variables (`env()`).

Readiness is polled from outside (bounded by `start_timeout_s`): the server is ready
once a bucket can be created and an object written and deleted, so the first test never
races volume registration. `close()` SIGKILLs the process group: on SIGTERM SeaweedFS
takes ~25 s to stop, and nothing it holds outlives the test session.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.closing import ClosedOnExit

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

_PORT_NAMES = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
)
_READY_PROBE_BUCKET = "ourios-readiness-probe"
_POLL_INTERVAL_S = 0.05
_START_ATTEMPTS = 3  # fresh ports each time: a free port can be taken before weed binds
_LOG_TAIL_BYTES = 4000


class SeaweedStartError(RuntimeError):
    """SeaweedFS exited or did not become ready; the message carries its log tail."""


@dataclass(frozen=True)
class SeaweedPorts:
    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    @classmethod
    def pick_free(cls) -> SeaweedPorts:
        """Distinct free ports on 127.0.0.1, held open together so none repeats."""
        socks: list[socket.socket] = []
        try:
            for _ in _PORT_NAMES:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", 0))
            ports = [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
        return cls(**dict(zip(_PORT_NAMES, ports, strict=True)))


def _s3_config(access_key: str, secret_key: str) -> dict[str, object]:
    return {
        "identities": [
            {
                "name": "ourios-test",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }


def weed_server_args(weed: str, root: Path, ports: SeaweedPorts, s3_config: Path) -> list[str]:
    """The `weed server` command line: loopback only, every port explicit, no extras."""
    return [
        weed,
        # glog writes its own log files to $TMPDIR or /tmp unless told where.
        f"-logdir={root / 'glog'}",
        "server",
        "-s3",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        # The Iceberg and Lance endpoints default to fixed ports (8181, 9101), which
        # would collide between concurrent servers; tests need neither.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_config}",
        # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them in our root.
        f"-filer.localSocket={root / 'filer.sock'}",
        f"-s3.localSocket={root / 's3.sock'}",
        # Small volumes, count derived from free space: buckets start fast.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        # No network beyond loopback here; do not try to report usage.
        "-master.telemetry=false",
    ]


class SeaweedS3(ClosedOnExit):
    """A running SeaweedFS S3 endpoint with explicit credentials.

    Use as a context manager or call `start()` / `close()`. `client()` returns one
    shared, thread-safe boto3 S3 client (path-style addressing, signed requests), closed
    by `close()`; build another from `endpoint_url` and the keys if a test needs its own
    configuration.
    """

    def __init__(
        self,
        weed: str,
        root: Path,
        *,
        access_key: str = "OURIOSTESTACCESSKEY",
        secret_key: str | None = None,
        region: str = "us-east-1",
        start_timeout_s: float = 60.0,
    ) -> None:
        # Absolute: the server runs with its root as working directory.
        self.weed = os.path.abspath(weed) if os.sep in weed else weed
        self.root = root
        self.access_key = access_key
        self.secret_key = secret_key if secret_key is not None else secrets.token_hex(20)
        self.region = region
        self.start_timeout_s = start_timeout_s
        self.log_path = root / "weed.log"
        self.startup_seconds: float | None = None
        self._ports: SeaweedPorts | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._client: S3Client | None = None
        self._client_lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> SeaweedS3:
        if self._proc is not None:
            raise RuntimeError("SeaweedS3 already started")
        for sub in ("data", "glog", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        s3_config = self.root / "s3.json"
        s3_config.write_text(json.dumps(_s3_config(self.access_key, self.secret_key)))
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        for attempt in range(1, _START_ATTEMPTS + 1):
            proc = self._spawn(SeaweedPorts.pick_free(), s3_config, attempt)
            try:
                self._wait_ready(proc, deadline)
            except SeaweedStartError:
                exited = proc.poll() is not None
                self._kill()
                if exited and attempt < _START_ATTEMPTS and time.monotonic() < deadline:
                    continue  # most likely a port taken between pick_free and bind
                raise
            except BaseException:
                self._kill()  # interrupted: never leave a server nobody will close
                raise
            self.startup_seconds = time.monotonic() - started
            return self
        raise AssertionError("unreachable")

    def kill(self) -> None:
        """SIGKILL the server's process group, keeping its ports and data directory, so
        ``restart`` brings the same endpoint back: a store outage and its end."""
        self._kill()

    def restart(self) -> SeaweedS3:
        """Start the server again after ``kill``, on the same ports and data, and wait
        until it serves (bounded by ``start_timeout_s``)."""
        if self._proc is not None:
            raise RuntimeError("SeaweedS3 is still running")
        started = time.monotonic()
        proc = self._spawn(self.ports, self.root / "s3.json", 0)
        try:
            self._wait_ready(proc, started + self.start_timeout_s)
        except BaseException:
            self._kill()
            raise
        return self

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        self._kill()

    def __enter__(self) -> SeaweedS3:
        return self.start()

    # --- what tests use ----------------------------------------------------------------

    @property
    def ports(self) -> SeaweedPorts:
        if self._ports is None:
            raise RuntimeError("SeaweedS3 not started")
        return self._ports

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.s3}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("SeaweedS3 not started")
        return self._proc.pid

    def client(self) -> S3Client:
        """The shared S3 client for this server (created on first use)."""
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client(
                    Config(
                        s3={"addressing_style": "path"},
                        retries={"max_attempts": 3, "mode": "standard"},
                        connect_timeout=5,
                        read_timeout=60,
                    )
                )
            return self._client

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` and return the name."""
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete bucket `name` with all its objects."""
        client = self.client()
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            keys: list[ObjectIdentifierTypeDef] = [
                {"Key": obj["Key"]} for obj in page.get("Contents", [])
            ]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)

    def env(self) -> dict[str, str]:
        """Environment for a subprocess (the ingester, a verifier) to reach this server.

        The standard AWS variables boto3 reads, plus the ingester's own endpoint setting.
        Merge it over `os.environ`.
        """
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
            "OURIOS_STORE_ENDPOINT_URL": self.endpoint_url,
        }

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "(no log)"
        return data[-max_bytes:].decode("utf-8", errors="replace")

    # --- internals ---------------------------------------------------------------------

    def _make_client(self, config: Config) -> S3Client:
        client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )
        return client

    def _spawn(self, ports: SeaweedPorts, s3_config: Path, attempt: int) -> subprocess.Popen[bytes]:
        self._ports = ports
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"=== ourios tests: start attempt {attempt}, ports {ports}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            weed_server_args(self.weed, self.root, ports, s3_config),
            cwd=self.root,
            env={**os.environ, "TMPDIR": str(self.root / "tmp")},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self._proc

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        probe = self._make_client(
            Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
                connect_timeout=1,
                read_timeout=5,
            )
        )
        last: Exception | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    _probe_write(probe)
                    return
                except (BotoCoreError, ClientError) as exc:
                    last = exc
                # Waiting on the process doubles as the poll interval and notices exit.
                try:
                    code = proc.wait(timeout=_POLL_INTERVAL_S)
                except subprocess.TimeoutExpired:
                    continue
                raise SeaweedStartError(
                    f"weed server exited with {code} before becoming ready;"
                    f" log {self.log_path}:\n{self.log_tail()}"
                )
        finally:
            probe.close()
        raise SeaweedStartError(
            f"weed server not ready after {self.start_timeout_s:.0f} s"
            f" (last error: {last!r}); log {self.log_path}:\n{self.log_tail()}"
        )

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # exited between poll() and killpg()
            proc.wait(timeout=30)
            if self._ports is not None:
                _remove_grpc_sockets(self._ports)
        if self._log is not None:
            self._log.close()
            self._log = None


def _probe_write(probe: S3Client) -> None:
    """One readiness probe: a bucket can be created, written to and removed."""
    try:
        probe.create_bucket(Bucket=_READY_PROBE_BUCKET)
    except ClientError as exc:
        # A previous probe may have created it before a later step failed.
        if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
    probe.put_object(Bucket=_READY_PROBE_BUCKET, Key="probe", Body=b"ok")
    probe.delete_object(Bucket=_READY_PROBE_BUCKET, Key="probe")
    probe.delete_bucket(Bucket=_READY_PROBE_BUCKET)


def _remove_grpc_sockets(ports: SeaweedPorts) -> None:
    """Remove the gRPC Unix sockets weed always creates in /tmp (no flag moves them);
    a SIGKILLed server cannot remove its own."""
    for kind, port in (
        ("master", ports.master_grpc),
        ("volume", ports.volume_grpc),
        ("filer", ports.filer_grpc),
        ("s3", ports.s3_grpc),
    ):
        path = Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")
        with contextlib.suppress(FileNotFoundError):
            if path.is_socket():
                path.unlink()


@dataclass(frozen=True)
class S3Bucket:
    """A bucket in a `SeaweedS3` server, created for one test."""

    name: str
    server: SeaweedS3

    @classmethod
    def create(cls, server: SeaweedS3, prefix: str = "t") -> S3Bucket:
        return cls(server.make_bucket(f"{prefix}-{uuid.uuid4().hex[:24]}"), server)

    def url(self, prefix: str = "") -> str:
        """`s3://bucket/prefix`, the form `OURIOS_STORE_URL` takes."""
        return f"s3://{self.name}/{prefix}" if prefix else f"s3://{self.name}"

    def keys(self, prefix: str = "") -> list[str]:
        """All object keys under `prefix`, sorted."""
        paginator = self.server.client().get_paginator("list_objects_v2")
        return sorted(
            obj["Key"]
            for page in paginator.paginate(Bucket=self.name, Prefix=prefix)
            for obj in page.get("Contents", [])
        )

    def env(self) -> dict[str, str]:
        """The server's `env()` plus `OURIOS_STORE_URL` pointing at this bucket."""
        return {**self.server.env(), "OURIOS_STORE_URL": self.url()}

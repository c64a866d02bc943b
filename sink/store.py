"""Object stores: where published Parquet objects (and archived WAL segments) go.

Contract (``ObjectStore``), the same for every implementation:

- keys are relative, ``/``-separated, and pass ``sink.keys.check_key``; a store with a
  prefix applies it itself, so callers never see it;
- ``put`` is atomic and may overwrite: a reader sees the old bytes or the new bytes,
  never a prefix of them;
- ``put_if_absent`` is an atomic conditional create that never replaces existing
  bytes: True when this call created the object, False when the key already existed,
  whatever its content (also when an earlier attempt of the same call created it and
  its reply was lost; ``get`` and compare if it matters);
- ``exists`` says whether a key holds an object, durably: True only for an object a
  crash of this node can no longer take away (``LocalStore`` fsyncs its directory
  first); recovery relies on it to suppress what an object holds;
- ``get`` of a missing key raises ``ObjectNotFound``; ``delete`` of a missing key is a
  no-op (as in S3); ``list(prefix)`` returns every key starting with ``prefix``,
  sorted;
- every failure is a ``StoreError``::

      StoreError          (op, key, error_type, ambiguous, attempts)
      ├── ObjectNotFound  get of a missing key
      └── InvalidKey      the key is not a store key (also a ``KeyFormatError``)

  ``error_type`` is a Prometheus label value (``s3_timeout``, ``s3_connection``,
  ``s3_throttled``, ``s3_5xx``, ``s3_access_denied``, ``s3_auth``, ``s3_credentials``,
  ``s3_no_such_bucket``, ``s3_not_found``, ``s3_precondition``, ``s3_conflict``,
  ``s3_client_error``, ``s3_checksum``, ``s3_error``, ``local_io``, ``local_denied``,
  ``local_no_space``, ``local_not_found``, ``memory_not_found``, ``invalid_key``, ``injected``,
  ``hold_timeout``); ``ambiguous`` is True when a
  write may have taken effect although the call failed (a timeout or a reset after
  the request was sent, a 5xx reply, a failed directory fsync after the rename): the
  object may exist, and a retry must be prepared to find it (RFC 0055 §9.2).

``LocalStore`` (``file://``, the embedded default) writes a temp file in the
destination directory, fsyncs it, renames it over the key (``put``) or hard-links it
to the key (``put_if_absent``: ``link`` fails on an existing name, so it never
replaces), then fsyncs the directory; a crash leaves the old object or the new one,
never a partial file under a key's name, and at worst a ``.<name>.<hex>.tmp`` file
that ``list`` ignores. ``S3Store`` uses boto3 with botocore's own retries off and its
own bounded retry loop (exponential backoff, full jitter); its conditional create is
``PutObject`` with ``If-None-Match: *`` (412 → False), which AWS S3 and SeaweedFS
honour. The test doubles the package ships (``MemoryStore``, ``FailingStore``) are in
``sink.testing``.
"""

from __future__ import annotations

import builtins
import errno
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import unquote, urlsplit

from botocore import exceptions as bexc

from sink.keys import KeyFormatError, check_key, join_prefix, normalize_prefix

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

__all__ = [
    "InvalidKey",
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "Op",
    "RetryPolicy",
    "S3Store",
    "StoreError",
    "from_url",
]

Op = Literal["put", "put_if_absent", "get", "exists", "list", "delete"]
_MUTATING_OPS: Final[frozenset[Op]] = frozenset({"put", "put_if_absent", "delete"})
_T = TypeVar("_T")


class StoreError(Exception):
    """A store operation failed; the fields are what the publisher's metrics and logs need."""

    def __init__(
        self,
        op: Op,
        key: str,
        error_type: str,
        detail: str,
        *,
        ambiguous: bool = False,
        attempts: int = 1,
    ) -> None:
        self.op: Op = op
        self.key = key
        #: the ``error_type`` label value of ``ourios_sink_publish_failures_total``
        self.error_type = error_type
        #: True when the operation may have taken effect although it failed
        self.ambiguous = ambiguous
        #: how many requests were made (the retry budget spent)
        self.attempts = attempts
        self.detail = detail
        maybe = "; it may have taken effect" if ambiguous else ""
        super().__init__(
            f"store {op} {key!r} failed ({error_type}) after {attempts} attempt"
            f"{'s' if attempts != 1 else ''}: {detail}{maybe}"
        )


class ObjectNotFound(StoreError):
    """``get`` of a key that holds no object."""


class InvalidKey(StoreError, KeyFormatError):
    """The key is not a relative store key (``..``, absolute, empty segment, ...)."""


def _checked(op: Op, key: str) -> str:
    try:
        check_key(key)
    except KeyFormatError as exc:
        raise InvalidKey(op, key, "invalid_key", str(exc)) from exc
    return key


def _check_list_prefix(prefix: str) -> None:
    segments = prefix.split("/")
    if prefix.startswith("/") or any(s in (".", "..") for s in segments) or "\x00" in prefix:
        raise InvalidKey("list", prefix, "invalid_key", "a list prefix must be relative")


@runtime_checkable
class ObjectStore(Protocol):
    """What the publisher, the archiver and the verifier need from an object store."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically, replacing any object there."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` atomically unless it exists; never replaces existing bytes."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; ``ObjectNotFound`` when there is none."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object (durably: module docstring)."""
        ...

    def list(self, prefix: str) -> builtins.list[str]:
        """Every key starting with ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        ...

    def describe(self) -> str:
        """Where the objects go, for logs: ``s3://bucket/prefix at http://...``, ``file:///...``."""
        ...


# ---------------------------------------------------------------------------- local


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_error_type(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "local_no_space"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR):
        # the key's path refuses the object (permissions, a file where a directory must
        # be): a retry of the same key cannot cure it (sink.deadletter)
        return "local_denied"
    return "local_io"


class LocalStore:
    """Objects as files under ``root`` (``file://``): temp → fsync → rename/link → dir fsync.

    A key maps to ``root/<key>``; ``check_key`` refuses ``..``, absolute keys and
    segments starting with ``.``, so every path stays under ``root`` and no key can
    name a temp file. Directories are created on demand, each new one's parent
    fsynced. ``put_if_absent`` needs hard links (ext4, xfs, tmpfs and most local
    filesystems have them).

    On the node's own volume (the embedded default) it reports to the node's free-space
    figure: ``on_write`` is told the bytes each object adds, and ``on_no_space`` is asked
    when writing a temp fails with ENOSPC — True when it freed space (the emergency
    reserve), and the temp is written once more.
    """

    def __init__(
        self,
        root: Path,
        *,
        on_write: Callable[[int], None] | None = None,
        on_no_space: Callable[[str], bool] | None = None,
    ) -> None:
        if not root.is_absolute():
            raise ValueError(f"LocalStore root {str(root)!r} must be an absolute path")
        self._root = root
        self.on_write = on_write
        self.on_no_space = on_no_space

    @property
    def root(self) -> Path:
        return self._root

    def describe(self) -> str:
        return self._root.as_uri()

    def _path(self, op: Op, key: str) -> Path:
        return self._root.joinpath(*_checked(op, key).split("/"))

    def _error(self, op: Op, key: str, exc: OSError, *, ambiguous: bool) -> StoreError:
        where = f": {exc.filename}" if exc.filename else ""
        return StoreError(
            op, key, _local_error_type(exc), f"{exc.strerror or exc}{where}", ambiguous=ambiguous
        )

    def _ensure_dir(self, directory: Path) -> None:
        if directory.is_dir():
            return
        missing: builtins.list[Path] = []
        probe = directory
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        for new in reversed(missing):
            try:
                os.mkdir(new)
            except FileExistsError:
                pass  # a concurrent put created it; fsyncing the parent again is harmless
            _fsync_dir(new.parent)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        try:
            temp = self._write_temp_once(path, data)
        except OSError as exc:
            ask = self.on_no_space
            if _local_error_type(exc) != "local_no_space" or ask is None:
                raise
            if not ask(f"the store's write of {path} ({len(data)} bytes): {exc}"):
                raise
            temp = self._write_temp_once(path, data)
        if self.on_write is not None:
            self.on_write(len(data))
        return temp

    def _write_temp_once(self, path: Path, data: bytes) -> Path:
        self._ensure_dir(path.parent)
        temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return temp

    def put(self, key: str, data: bytes) -> None:
        path = self._path("put", key)
        try:
            temp = self._write_temp(path, data)
        except OSError as exc:
            raise self._error("put", key, exc, ambiguous=False) from exc
        try:
            os.replace(temp, path)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise self._error("put", key, exc, ambiguous=False) from exc
        try:
            _fsync_dir(path.parent)
        except OSError as exc:
            # The new bytes are visible under the key but may not survive a crash.
            raise self._error("put", key, exc, ambiguous=True) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path("put_if_absent", key)
        try:
            temp = self._write_temp(path, data)
        except OSError as exc:
            raise self._error("put_if_absent", key, exc, ambiguous=False) from exc
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self._error("put_if_absent", key, exc, ambiguous=False) from exc
        finally:
            temp.unlink(missing_ok=True)
        try:
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error("put_if_absent", key, exc, ambiguous=True) from exc
        return True

    def get(self, key: str) -> bytes:
        path = self._path("get", key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound("get", key, "local_not_found", "no such object") from exc
        except OSError as exc:
            raise self._error("get", key, exc, ambiguous=False) from exc

    def exists(self, key: str) -> bool:
        path = self._path("exists", key)
        try:
            if not path.is_file():
                return False
            # A put killed between its rename and its directory fsync left a name that
            # a power loss could still take: make it durable before anyone relies on it.
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error("exists", key, exc, ambiguous=False) from exc
        return True

    def list(self, prefix: str) -> builtins.list[str]:
        _check_list_prefix(prefix)
        head, _, _ = prefix.rpartition("/")
        start = self._root.joinpath(*head.split("/")) if head else self._root
        found: builtins.list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel = Path(dirpath).relative_to(self._root).as_posix()
                base = "" if rel == "." else rel + "/"
                found.extend(
                    base + name
                    for name in filenames
                    if not name.startswith(".") and (base + name).startswith(prefix)
                )
        except OSError as exc:
            raise self._error("list", prefix, exc, ambiguous=False) from exc
        found.sort()
        return found

    def delete(self, key: str) -> None:
        path = self._path("delete", key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error("delete", key, exc, ambiguous=False) from exc
        try:
            _fsync_dir(path.parent)
        except OSError as exc:
            raise self._error("delete", key, exc, ambiguous=True) from exc


# ---------------------------------------------------------------------------- S3


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: at most ``max_attempts`` requests per operation, full jitter.

    The wait before retry *n* (1-based) is uniform in ``[0, min(max_delay,
    base_delay * 2**(n-1))]`` seconds.
    """

    max_attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts={self.max_attempts}: must be >= 1")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ValueError(
                f"RetryPolicy delays base={self.base_delay} max={self.max_delay}:"
                " must satisfy 0 <= base <= max"
            )

    def delay(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * 2.0 ** (retry - 1)))


@dataclass(frozen=True, slots=True)
class _Failure:
    error_type: str
    retryable: bool
    ambiguous: bool  # the request may have been applied (only meaningful for writes)


_THROTTLING_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)
_TIMEOUT_CODES: Final = frozenset({"RequestTimeout", "RequestTimeoutException"})
_AUTH_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "RequestTimeTooSkewed",
        "AuthorizationHeaderMalformed",
    }
)


def _classify_client_error(exc: bexc.ClientError) -> _Failure:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _THROTTLING_CODES or status == 429:
        return _Failure("s3_throttled", retryable=True, ambiguous=False)
    if code in _TIMEOUT_CODES:
        # S3 gave up reading the request body: nothing was stored.
        return _Failure("s3_timeout", retryable=True, ambiguous=False)
    if status >= 500 or code == "InternalError":
        return _Failure("s3_5xx", retryable=True, ambiguous=True)
    if status == 412 or code == "PreconditionFailed":
        return _Failure("s3_precondition", retryable=False, ambiguous=False)
    if status == 409 and code in ("ConditionalRequestConflict", "OperationAborted"):
        return _Failure("s3_conflict", retryable=True, ambiguous=False)
    if code == "NoSuchBucket":
        return _Failure("s3_no_such_bucket", retryable=False, ambiguous=False)
    if code in ("NoSuchKey", "NotFound") or status == 404:
        return _Failure("s3_not_found", retryable=False, ambiguous=False)
    if code in _AUTH_CODES:
        return _Failure("s3_auth", retryable=False, ambiguous=False)
    if status == 403 or code in ("AccessDenied", "AllAccessDisabled"):
        return _Failure("s3_access_denied", retryable=False, ambiguous=False)
    return _Failure("s3_client_error", retryable=False, ambiguous=False)


def _classify(exc: Exception) -> _Failure | None:
    """How a botocore failure is counted and whether it is retried; None: not botocore's."""
    if isinstance(exc, bexc.ClientError):
        return _classify_client_error(exc)
    # Order matters: ConnectTimeoutError is a ConnectionError, ReadTimeoutError an
    # HTTPClientError. A connect timeout or refusal is before the request was sent.
    if isinstance(exc, bexc.ConnectTimeoutError):
        return _Failure("s3_timeout", retryable=True, ambiguous=False)
    if isinstance(exc, bexc.ReadTimeoutError):
        return _Failure("s3_timeout", retryable=True, ambiguous=True)
    if isinstance(exc, bexc.EndpointConnectionError | bexc.ProxyConnectionError):
        return _Failure("s3_connection", retryable=True, ambiguous=False)
    if isinstance(exc, bexc.ConnectionError | bexc.HTTPClientError | bexc.IncompleteReadError):
        # SSL errors, resets and closed connections: possibly after the request was sent.
        return _Failure("s3_connection", retryable=True, ambiguous=True)
    if isinstance(exc, bexc.ChecksumError | bexc.FlexibleChecksumError):
        return _Failure("s3_checksum", retryable=True, ambiguous=True)
    if isinstance(
        exc,
        bexc.NoCredentialsError | bexc.PartialCredentialsError | bexc.CredentialRetrievalError,
    ):
        return _Failure("s3_credentials", retryable=False, ambiguous=False)
    if isinstance(exc, bexc.BotoCoreError):
        return _Failure("s3_error", retryable=False, ambiguous=False)
    return None


class S3Store:
    """Objects in an S3 bucket (AWS or an S3-compatible server via ``endpoint_url``).

    Credentials and, when ``region`` is None, the region come from the standard AWS
    chain (environment, shared files, IMDS/IRSA). botocore's retries are disabled so
    that ``retry.max_attempts`` bounds the requests of one operation exactly; every
    request is retried only for throttling, 5xx, timeouts and connection failures,
    never for other 4xx replies. With ``endpoint_url`` set, path-style addressing is
    used (S3-compatible servers rarely serve virtual-host buckets). boto3 clients are
    thread-safe, so one store serves every thread.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: S3Client | None = None,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("S3Store needs a bucket name")
        self._bucket = bucket
        self._prefix = normalize_prefix(prefix)
        self._retry = retry if retry is not None else RetryPolicy()
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._client = (
            client
            if client is not None
            else self._make_client(endpoint_url, region, connect_timeout, read_timeout)
        )

    @staticmethod
    def _make_client(
        endpoint_url: str | None, region: str | None, connect_timeout: float, read_timeout: float
    ) -> S3Client:
        import boto3.session
        from botocore.config import Config

        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path"} if endpoint_url else {},
            user_agent_extra="ourios",
        )
        client: S3Client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        return client

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def region(self) -> str | None:
        """The region the client signs for: the setting, else the AWS chain's."""
        region: str | None = self._client.meta.region_name
        return region

    def describe(self) -> str:
        where = f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"
        return f"{where} at {self._client.meta.endpoint_url}"

    def _full(self, op: Op, key: str) -> str:
        return join_prefix(self._prefix, _checked(op, key))

    def _call(self, op: Op, key: str, request: Callable[[], _T]) -> _T:
        ambiguous = False
        attempt = 0
        while True:
            attempt += 1
            try:
                return request()
            except Exception as exc:
                failure = _classify(exc)
                if failure is None:
                    raise
                # Ambiguity is sticky: once a write may have landed, the call's
                # outcome stays "maybe", whatever later attempts report.
                ambiguous = ambiguous or (failure.ambiguous and op in _MUTATING_OPS)
                if failure.retryable and attempt < self._retry.max_attempts:
                    self._sleep(self._retry.delay(attempt, self._rng))
                    continue
                cls = ObjectNotFound if failure.error_type == "s3_not_found" else StoreError
                raise cls(
                    op,
                    key,
                    failure.error_type,
                    f"{type(exc).__name__}: {exc}",
                    ambiguous=ambiguous,
                    attempts=attempt,
                ) from exc

    def put(self, key: str, data: bytes) -> None:
        full = self._full("put", key)
        self._call(
            "put", key, lambda: self._client.put_object(Bucket=self._bucket, Key=full, Body=data)
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._full("put_if_absent", key)
        try:
            self._call(
                "put_if_absent",
                key,
                lambda: self._client.put_object(
                    Bucket=self._bucket, Key=full, Body=data, IfNoneMatch="*"
                ),
            )
        except StoreError as exc:
            if exc.error_type == "s3_precondition":
                return False
            raise
        return True

    def get(self, key: str) -> bytes:
        full = self._full("get", key)

        def request() -> bytes:
            body = self._client.get_object(Bucket=self._bucket, Key=full)["Body"]
            try:
                return body.read()
            finally:
                body.close()

        return self._call("get", key, request)

    def exists(self, key: str) -> bool:
        full = self._full("exists", key)
        try:
            self._call(
                "exists", key, lambda: self._client.head_object(Bucket=self._bucket, Key=full)
            )
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix: str) -> builtins.list[str]:
        _check_list_prefix(prefix)
        full = (
            join_prefix(self._prefix, prefix)
            if prefix
            else (self._prefix + "/" if self._prefix else "")
        )
        strip = len(self._prefix) + 1 if self._prefix else 0

        def request() -> builtins.list[str]:
            keys: builtins.list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", ()))
            return keys

        keys = self._call("list", prefix, request)
        keys.sort()
        return keys

    def delete(self, key: str) -> None:
        full = self._full("delete", key)
        self._call("delete", key, lambda: self._client.delete_object(Bucket=self._bucket, Key=full))


# ---------------------------------------------------------------------------- URLs

_ACCEPTED: Final = "file:///absolute/path or s3://bucket[/prefix]"


def from_url(
    url: str,
    endpoint_url: str | None = None,
    region: str | None = None,
    *,
    on_write: Callable[[int], None] | None = None,
    on_no_space: Callable[[str], bool] | None = None,
) -> ObjectStore:
    """The store ``OURIOS_STORE_URL`` names; ``endpoint_url`` and ``region`` apply to
    ``s3://`` only (``region`` None: the AWS chain decides); ``on_write`` and
    ``on_no_space`` to ``file://`` only (``LocalStore``).

    Raises ValueError naming the URL and the accepted schemes for anything else.
    """
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"store URL {url!r} must not have a query or fragment: {_ACCEPTED}")
    if parts.scheme == "file":
        if endpoint_url is not None:
            raise ValueError(
                f"store endpoint URL {endpoint_url!r} applies only to s3:// stores, not {url!r}"
            )
        if region is not None:
            raise ValueError(f"store region {region!r} applies only to s3:// stores, not {url!r}")
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise ValueError(f"store URL {url!r} must be an absolute path: {_ACCEPTED}")
        return LocalStore(Path(path), on_write=on_write, on_no_space=on_no_space)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"store URL {url!r} has no bucket: {_ACCEPTED}")
        try:
            prefix = normalize_prefix(parts.path)
        except KeyFormatError as exc:
            raise ValueError(f"store URL {url!r} has an invalid prefix: {exc}") from exc
        return S3Store(parts.netloc, prefix, endpoint_url=endpoint_url, region=region)
    raise ValueError(f"unsupported store URL {url!r}: expected {_ACCEPTED}")

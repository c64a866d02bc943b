"""The object store's configuration checked at start-up, and whether it answers since
(issue 22 item 8; DESIGN.md §6, RUNBOOK "OuriosStoreDown").

**The probe** lists ``probe/<node>`` under the store's prefix, then PUTs and DELETEs
that key (a key no reader lists: ``sink/keys.py`` puts objects under ``records/``,
``audit/`` and ``wal-archive/``). The LIST proves the bucket exists — a PUT alone does
not everywhere: SeaweedFS creates a missing bucket on a PUT from an admin identity —
and that the node may list it, which recovery's ``exists`` needs (S3 answers a HEAD of
a missing key with 403 instead of 404 without it). The PUT proves the node may write
there, which a HEAD of the bucket would not. A DELETE the store refuses for good (a
write-once bucket policy) is logged (``store.probe_not_deleted``) and not held against
the start: the node never needs to delete its objects, and the one probe object stays
at its fixed key. Its outcome is one of three:

* it answered: the store is up;
* a **permanent** error — no such bucket, access denied, bad or missing credentials,
  any other 4xx (a wrong region, an invalid bucket name): the configuration is wrong and
  no retry will change it, so the start is refused with one ``server.start_failed``
  naming the bucket, the endpoint and the store's error code (``StoreUnusable``), before
  the WAL is opened;
* a **transient** one — the endpoint refuses connections, times out, throttles or
  answers 5xx: the node starts (the WAL absorbs an outage, as it does one that begins
  later), logs ``store.unavailable`` and exports ``ourios_store_up`` 0.

A ``file://`` store (the embedded one) is only ever transient: its errors are a volume
that is not mounted yet, or full, and the node must start on a full volume.

**Health since**: every store call the node makes goes through ``WatchedStore``, which
sets ``ourios_store_up`` 1 when the store answered (a missing key or a failed
precondition is an answer) and 0 when it did not. While it is 0, ``StoreProbe`` probes
again every ``store.probe_secs``, so the gauge comes back without waiting for the next
publish; ``store.available`` is logged when it does.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Final, TypeVar

from prometheus_client.core import GaugeMetricFamily

from app.threads import Supervised, Supervisor, start_thread
from sink import LocalStore, ObjectStore, StoreError

_T = TypeVar("_T")

#: error types that are the store answering (the key's state), not the store failing
ANSWERS: Final = frozenset({"s3_not_found", "s3_precondition", "local_not_found", "invalid_key"})
#: error types a retry can change: the store did not answer this time
TRANSIENT: Final = frozenset(
    {"s3_timeout", "s3_connection", "s3_throttled", "s3_5xx", "s3_checksum", "s3_conflict"}
)

Events = Callable[[str, Mapping[str, object], str], None]


class StoreUnusable(Exception):
    """The store's configuration is wrong (a permanent error at the start-up probe)."""

    error_type = "store_unusable"

    def __init__(self, where: str, bucket: str, endpoint: str, code: str, error: StoreError):
        super().__init__(
            f"the object store {where} refused the start-up probe with {code} "
            f"({error.error_type}): {error.detail}. This does not pass with time: check "
            f"store.url (OURIOS_STORE_URL: bucket {bucket!r}), store.endpoint_url and "
            f"store.region, and the credentials the AWS chain gives this pod"
        )
        self.bucket = bucket
        self.endpoint = endpoint
        self.code = code
        self.store_error_type = error.error_type

    def fields(self) -> dict[str, object]:
        return {
            "bucket": self.bucket,
            "endpoint": self.endpoint,
            "error_code": self.code,
            "store_error_type": self.store_error_type,
        }


def error_code(error: StoreError) -> str:
    """The store's own code for a failure (``NoSuchBucket``, ``AccessDenied``,
    ``SignatureDoesNotMatch``), else the failing exception's class name."""
    cause = error.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    return type(cause).__name__ if cause is not None else error.error_type


def permanent(store: ObjectStore, error: StoreError) -> bool:
    """Whether ``error`` is the configuration's fault (module docstring)."""
    if isinstance(store, LocalStore):
        return False
    return error.error_type not in TRANSIENT and error.error_type not in ANSWERS


class StoreHealth:
    """Whether the store answered the node's last call (``ourios_store_up``)."""

    def __init__(self, store: ObjectStore, events: Events, probe_key: str) -> None:
        self.store = store
        self.probe_key = probe_key
        self._events = events
        self._lock = threading.Lock()
        self._up: bool | None = None
        self.changed = threading.Event()

    @property
    def up(self) -> bool:
        return bool(self._up)

    def gauges(self) -> Iterator[GaugeMetricFamily]:
        """``ourios_store_up`` for the metrics' collector."""
        g = GaugeMetricFamily(
            "ourios_store_up",
            "1 while the object store answers the node's calls, 0 while it does not (a "
            "transient error at the start-up probe, or a failed call since).",
        )
        g.add_metric([], 1.0 if self.up else 0.0)
        yield g

    def answered(self) -> None:
        with self._lock:
            was, self._up = self._up, True
        if was is False:
            self._events(
                "store.available",
                {"store": self.store.describe(), "action": "publishing resumes"},
                "info",
            )

    def failed(self, error: StoreError) -> None:
        with self._lock:
            was, self._up = self._up, False
        if was is not False:
            self.changed.set()  # wake the prober
            self._events(
                "store.unavailable",
                {
                    "store": self.store.describe(),
                    "op": error.op,
                    "key": error.key,
                    "error_code": error_code(error),
                    "error_type": error.error_type,
                    "error": str(error),
                    "action": "the node keeps acknowledging (the WAL holds what is not "
                    "published); the store is probed again every store.probe_secs and "
                    "ourios_store_up goes back to 1 when it answers",
                },
                "warning",
            )

    def probe(self) -> StoreError | None:
        """LIST, PUT then DELETE the probe key (module docstring); None when the store
        answered. A failure is recorded here (``failed``) and returned."""
        try:
            self.store.list(self.probe_key)
            self.store.put(self.probe_key, b"ourios start-up probe\n")
        except StoreError as exc:
            if exc.error_type in ANSWERS:
                self.answered()
                return None
            self.failed(exc)
            return exc
        try:
            self.store.delete(self.probe_key)
        except StoreError as exc:
            if exc.error_type in TRANSIENT:
                self.failed(exc)
                return exc
            self._events(
                "store.probe_not_deleted",
                {
                    "store": self.store.describe(),
                    "key": self.probe_key,
                    "error_code": error_code(exc),
                    "error": str(exc),
                    "action": "none needed: the node never deletes its objects; this one "
                    "small object stays at its fixed key",
                },
                "warning",
            )
        self.answered()
        return None


def probe_at_start(health: StoreHealth, bucket: str, endpoint: str) -> None:
    """The start-up probe: raise ``StoreUnusable`` (naming ``bucket`` and ``endpoint``)
    on a permanent error; a transient one is recorded (the node starts with
    ``ourios_store_up`` 0)."""
    error = health.probe()
    if error is not None and permanent(health.store, error):
        where = health.store.describe()
        raise StoreUnusable(where, bucket, endpoint, error_code(error), error) from error


class StoreProbe:
    """Probes the store again every ``interval`` seconds while ``health`` says it is down
    (module docstring). ``start`` / ``close``."""

    def __init__(
        self, health: StoreHealth, interval: float, threads: Supervisor | None = None
    ) -> None:
        self._health = health
        self._interval = interval
        self._threads = threads
        self._stop = threading.Event()
        self._thread: Supervised | None = None

    def start(self) -> None:
        self._thread = start_thread(
            self._threads,
            "store_probe",
            self._run,
            thread_name="ourios-store-probe",
            stop=self._stop,
        )

    def close(self, timeout: float = 30.0) -> bool:
        self._stop.set()
        self._health.changed.set()
        if self._thread is None:
            return True
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        health = self._health
        while not self._stop.is_set():
            if health.up:
                health.changed.wait()  # until a call fails (or close)
                health.changed.clear()
                continue
            if self._stop.wait(self._interval):
                return
            if not health.up:
                health.probe()  # anything but a StoreError is the supervisor's to report


class WatchedStore:
    """An ``ObjectStore`` that tells ``StoreHealth`` whether each call was answered."""

    def __init__(self, inner: ObjectStore, health: StoreHealth) -> None:
        self.inner = inner
        self._health = health

    def describe(self) -> str:
        return self.inner.describe()

    def _run(self, call: Callable[[], _T]) -> _T:
        try:
            result = call()
        except StoreError as exc:
            if exc.error_type in ANSWERS:
                self._health.answered()
            else:
                self._health.failed(exc)
            raise
        self._health.answered()
        return result

    def put(self, key: str, data: bytes) -> None:
        self._run(lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._run(lambda: self.inner.put_if_absent(key, data))

    def get(self, key: str) -> bytes:
        return self._run(lambda: self.inner.get(key))

    def exists(self, key: str) -> bool:
        return self._run(lambda: self.inner.exists(key))

    def list(self, prefix: str) -> builtins.list[str]:
        return self._run(lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._run(lambda: self.inner.delete(key))

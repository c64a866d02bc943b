"""A small concurrent OTLP/HTTP load driver that remembers what was acknowledged.

``AckLoad(ledger, port, senders=..., tenants=..., seed=...)`` starts ``senders``
threads, each with one raw HTTP/1.1 keep-alive socket (no client library: the test must
see exactly which request got which answer). Each sender posts protobuf
``ExportLogsServiceRequest`` bodies to ``/v1/logs``, one request in flight per
connection, for a tenant drawn from ``tenants``. Every record carries a unique id, in
the attribute ``rid`` and at the end of its body (``... rid=<id>``), of the form
``r<round>-s<sender>-q<request>-<index>``; the round comes from the ledger, so ids stay
unique across every server restart of a test.

Each request ends in exactly one ledger outcome:

- ``acked``: a complete 2xx response was read. The server promises these survive.
- ``refused``: a complete non-2xx response. The server may still hold the records (a
  frame written before a failed fsync is replayed), so they may appear.
- ``unknown``: the request was (perhaps partly) written but no complete response came
  back (the server was killed, the connection broke, a timeout). They may appear.
- ``unsent``: the connection could not be opened, so not one byte left the client.
  They must never appear.

A sender stops when ``stop()`` is called (after its request in flight is answered) or
when its connection breaks or cannot be opened (the server was killed): a driver never
reconnects to a dead server. ``wait_acked(n)`` blocks, on a condition variable the
senders notify, until this run has ``n`` acknowledged requests or every sender stopped.
"""

from __future__ import annotations

import enum
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import BinaryIO, Final

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["AckLedger", "AckLoad", "Outcome", "RequestRecord", "rid_of_body"]

RID_ATTRIBUTE: Final = "rid"
_BODY_MARK: Final = " rid="
_MAX_HEAD_BYTES: Final = 64 * 1024

#: Message shapes, so the miner builds a few templates with parameters around the ids.
_SHAPES: Final = (
    "user {user} logged in from 10.{a}.{b}.{c}",
    "GET /api/v1/items/{n} returned {status} in {ms} ms",
    "cache miss for key {hex} on shard {a}",
    "worker {user} finished job {n} after {ms} ms",
    "connection from 192.168.{a}.{b} closed by peer",
)
_USERS: Final = ("alice", "bob", "carol", "dave", "erin", "frank")


class Outcome(enum.Enum):
    ACKED = 1
    REFUSED = 2
    UNKNOWN = 3
    UNSENT = 4


@dataclass(frozen=True)
class RequestRecord:
    """One request's fate: which round and sender sent it, to which tenant, its ids."""

    round: int
    sender: int
    seq: int
    tenant: str
    rids: tuple[str, ...]
    outcome: Outcome
    status: int = 0  # the HTTP status when a response was read
    detail: str = ""  # why it is unknown / unsent


def rid_of_body(body: str | None) -> str | None:
    """The id at the end of a body written by this driver (None when there is none)."""
    if body is None:
        return None
    head, mark, rid = body.rpartition(_BODY_MARK)
    return rid if mark and head else None


class AckLedger:
    """Every request of every round of a test, by outcome; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds = 0
        self.requests: list[RequestRecord] = []
        self._by_rid: dict[str, RequestRecord] = {}

    def begin_round(self) -> int:
        with self._lock:
            self._rounds += 1
            return self._rounds

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            for rid in record.rids:
                if rid in self._by_rid:
                    raise AssertionError(f"record id {rid} generated twice")
                self._by_rid[rid] = record
            self.requests.append(record)

    def request_of(self, rid: str) -> RequestRecord | None:
        with self._lock:
            return self._by_rid.get(rid)

    def rids(self, *outcomes: Outcome) -> set[str]:
        with self._lock:
            return {rid for r in self.requests if r.outcome in outcomes for rid in r.rids}

    def requests_with(self, *outcomes: Outcome, rounds: Iterable[int] | None = None) -> int:
        wanted = None if rounds is None else set(rounds)
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.outcome in outcomes and (wanted is None or r.round in wanted)
            )

    def records_with(self, *outcomes: Outcome) -> int:
        with self._lock:
            return sum(len(r.rids) for r in self.requests if r.outcome in outcomes)

    def summary(self) -> dict[str, Counter[str]]:
        """Per round: requests by outcome name."""
        out: dict[str, Counter[str]] = {}
        with self._lock:
            for r in self.requests:
                out.setdefault(f"round {r.round}", Counter())[r.outcome.name.lower()] += 1
        return out

    def details(self) -> dict[str, Counter[str]]:
        """Per round: why requests ended unknown or unsent (the exceptions), for
        failure messages."""
        out: dict[str, Counter[str]] = {}
        with self._lock:
            for r in self.requests:
                if r.detail:
                    out.setdefault(f"round {r.round}", Counter())[r.detail[:120]] += 1
        return out


class _ConnectionBroken(Exception):
    pass


class _Connection:
    """One keep-alive HTTP/1.1 connection; ``exchange`` writes a request, reads a reply."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file: BinaryIO = self._sock.makefile("rb")
        self.reusable = True

    def send(self, request: bytes) -> None:
        self._sock.sendall(request)

    def read_response(self) -> int:
        """The status of a complete response; raises ``_ConnectionBroken`` otherwise."""
        status_line = self._file.readline(_MAX_HEAD_BYTES)
        if not status_line.endswith(b"\r\n"):
            raise _ConnectionBroken(f"no status line (got {status_line[:40]!r})")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise _ConnectionBroken(f"bad status line {status_line[:60]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        while True:
            line = self._file.readline(_MAX_HEAD_BYTES)
            if not line.endswith(b"\r\n"):
                raise _ConnectionBroken("connection ended inside the response head")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"connection" and b"close" in value:
                self.reusable = False
        if chunked:
            self._read_chunked()
        elif length is not None:
            self._read_exact(length)
        else:
            self.reusable = False
            self._file.read()  # the body runs to EOF
        return status

    def _read_exact(self, n: int) -> bytes:
        data = self._file.read(n)
        if len(data) != n:
            raise _ConnectionBroken(f"response body cut at {len(data)} of {n} bytes")
        return data

    def _read_chunked(self) -> None:
        while True:
            size_line = self._file.readline(_MAX_HEAD_BYTES)
            if not size_line.endswith(b"\r\n"):
                raise _ConnectionBroken("connection ended inside a chunk size")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while self._file.readline(_MAX_HEAD_BYTES) not in (b"\r\n", b""):
                    pass  # trailers
                return
            self._read_exact(size + 2)

    def close(self) -> None:
        self._file.close()
        self._sock.close()


@dataclass
class _Counts:
    acked: int = 0
    running: int = 0
    per_outcome: Counter[Outcome] = field(default_factory=Counter)


class AckLoad:
    """The driver (module docstring). Use as a context manager so its threads are always
    joined: ``__exit__`` stops and joins them."""

    def __init__(
        self,
        ledger: AckLedger,
        port: int,
        *,
        senders: int,
        tenants: Sequence[str],
        seed: int,
        records_per_request: tuple[int, int] = (1, 8),
        host: str = "127.0.0.1",
        timeout: float = 30.0,
        fresh_templates: float = 0.0,
    ) -> None:
        """``fresh_templates``: the share of records whose body is a message no earlier
        one resembles (random words), so the miner keeps creating templates and the
        node keeps publishing template events under load."""
        if senders < 1 or not tenants:
            raise ValueError("need at least one sender and one tenant")
        self.ledger = ledger
        self.round = ledger.begin_round()
        self._port = port
        self._host = host
        self._senders = senders
        self._tenants = tuple(tenants)
        self._seed = seed
        self._records = records_per_request
        self._fresh = fresh_templates
        self._timeout = timeout
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._counts = _Counts()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> AckLoad:
        with self._cond:
            self._counts.running = self._senders
        for i in range(self._senders):
            t = threading.Thread(
                target=self._run, args=(i,), name=f"ackload-r{self.round}-s{i}", daemon=True
            )
            self._threads.append(t)
            t.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask every sender to stop after its request in flight, and join them."""
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float = 30.0) -> None:
        """Wait for the senders to end by themselves (after the server died)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise TimeoutError(f"senders still running after {timeout:g} s: {alive}")

    def __enter__(self) -> AckLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation -----------------------------------------------------------------------

    @property
    def acked(self) -> int:
        with self._cond:
            return self._counts.acked

    def wait_acked(self, n: int, timeout: float = 30.0) -> int:
        """Block until this run has ``n`` acknowledged requests or no sender is left;
        returns the count then. Raises ``TimeoutError`` after ``timeout`` seconds."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._counts.acked >= n or self._counts.running == 0, timeout
            )
            if not done:
                raise TimeoutError(
                    f"round {self.round}: {self._counts.acked} of {n} requests acknowledged"
                    f" in {timeout:g} s ({dict(self._counts.per_outcome)})"
                )
            return self._counts.acked

    # -- the senders -----------------------------------------------------------------------

    def _record(self, record: RequestRecord) -> None:
        self.ledger.add(record)
        with self._cond:
            self._counts.per_outcome[record.outcome] += 1
            if record.outcome is Outcome.ACKED:
                self._counts.acked += 1
                self._cond.notify_all()

    def _run(self, sender: int) -> None:
        rng = random.Random(f"{self._seed}:{self.round}:{sender}")
        conn: _Connection | None = None
        try:
            seq = 0
            while not self._stop.is_set():
                seq += 1
                tenant = rng.choice(self._tenants)
                rids, body = self._build(rng, sender, seq, tenant)
                request = self._http(body, tenant)

                # Unknown until a complete response says otherwise.
                sent = RequestRecord(self.round, sender, seq, tenant, rids, Outcome.UNKNOWN)
                if conn is None:
                    try:
                        conn = _Connection(self._host, self._port, self._timeout)
                    except OSError as exc:
                        detail = f"connect: {exc!r}"
                        self._record(replace(sent, outcome=Outcome.UNSENT, detail=detail))
                        return
                try:
                    conn.send(request)
                    status = conn.read_response()
                except (OSError, ValueError, _ConnectionBroken) as exc:
                    self._record(replace(sent, detail=repr(exc)))
                    return
                outcome = Outcome.ACKED if 200 <= status < 300 else Outcome.REFUSED
                self._record(replace(sent, outcome=outcome, status=status))
                if not conn.reusable:
                    conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()
            with self._cond:
                self._counts.running -= 1
                self._cond.notify_all()

    def _build(
        self, rng: random.Random, sender: int, seq: int, tenant: str
    ) -> tuple[tuple[str, ...], bytes]:
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        rl.resource.attributes.append(_kv("service.name", f"ackload-{tenant}"))
        sl = rl.scope_logs.add()
        sl.scope.name = "tests.support.ackload"
        now = time.time_ns()
        rids: list[str] = []
        for k in range(rng.randint(*self._records)):
            rid = f"r{self.round}-s{sender}-q{seq}-{k}"
            rids.append(rid)
            text = rng.choice(_SHAPES).format(
                user=rng.choice(_USERS),
                a=rng.randrange(256),
                b=rng.randrange(256),
                c=rng.randrange(256),
                n=rng.randrange(100_000),
                status=rng.choice((200, 404, 500)),
                ms=rng.randrange(1, 5000),
                hex=f"{rng.getrandbits(48):012x}",
            )
            if self._fresh and rng.random() < self._fresh:
                text = " ".join(_word(rng) for _ in range(4))
            lr = sl.log_records.add()
            lr.time_unix_nano = now
            lr.observed_time_unix_nano = now
            lr.severity_number = 9
            lr.severity_text = "INFO"
            lr.body.string_value = f"{text}{_BODY_MARK}{rid}"
            lr.attributes.append(_kv(RID_ATTRIBUTE, rid))
            lr.attributes.append(_kv("sender", str(sender)))
        return tuple(rids), req.SerializeToString()

    def _http(self, body: bytes, tenant: str) -> bytes:
        head = (
            f"POST /v1/logs HTTP/1.1\r\n"
            f"Host: {self._host}:{self._port}\r\n"
            f"Content-Type: application/x-protobuf\r\n"
            f"X-Ourios-Tenant: {tenant}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"\r\n"
        )
        return head.encode("ascii") + body


def _word(rng: random.Random) -> str:
    """A random lower-case word: letters only, so the miner never reads it as a number."""
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))

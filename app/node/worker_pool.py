"""The core's side of the worker processes (DESIGN.md §5): listeners, supervision and
the channels.

``Listeners`` binds the two ports once, in the core: the HTTP socket listens here and
is inherited by every worker (one accept queue: a worker that dies loses no queued
connection), and the gRPC port is reserved by a bound, non-listening socket with
``SO_REUSEPORT``, beside which each worker binds its own gRPC listener (grpcio cannot
adopt a descriptor). Nothing else can take either port while the core lives.

``Workers`` starts ``server.workers`` processes (``python -m app.receive.worker_process``) from its
supervising thread and restarts one that exits, with a short back-off when one keeps
dying at start; the kernel kills every worker when that thread ends
(``PR_SET_PDEATHSIG``, armed by the worker), so no worker outlives the core. Each
worker's channel has a reader thread here that

* hands an ``INGEST`` to the stages (``app.ingest.stages``; a refusal is answered at once,
  nothing written) and answers with what they say — acknowledged only after the
  covering fsync and the turn;
* answers ``STATE`` (ready, alive) and ``METRICS`` (first ``FLUSH``-ing every worker,
  so a scrape counts every request a client has had its answer to);
* counts each ``OBSERVED`` report in the core's registry (one series per name and
  label set, whatever the number of workers, and a worker's death loses no count);
* delivers the answers to the core's own calls (``FLUSH``, ``DECODE``, ``ENCODE``,
  ``STOP``).

``encode_records`` is the publisher's records encoder with workers, at most
``server.encode_concurrency`` encodes at once (``app.node.encode_dispatch``).

A request in flight when its worker dies is answered to nobody: its client sees the
connection drop and retries; if its frame was appended it is durable and turned like
any other (at most a second copy when the retry lands too, as with any lost answer).

``stop`` sends ``STOP`` to every worker (each stops accepting, finishes its requests —
the stages still answer them — and exits), waits for them, then kills any straggler.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection, Unavailable
from app.ingest.stages import Stages
from app.node.encode_dispatch import EncodeDispatch, EncodeSlots
from app.node.recovery import DecodeStopped, Undecodable
from app.receive import channel
from app.receive.api import IngestOutcome, ListenerBindError
from app.receive.channel import ChannelClosed, Connection, MessageKind
from app.threads import Supervised, Supervisor, start_thread
from sink.parquet import RecordColumns

__all__ = ["Launcher", "Listeners", "NodeState", "Process", "Workers", "worker_launcher"]

log = logging.getLogger("ourios.workers")

#: A worker that exits within this long of its start is restarted only after it.
RESTART_BACKOFF_S: Final = 1.0
#: How long a port still in use is retried at start (a killed node's workers die of it).
BIND_RETRY_S: Final = 10.0
#: How long ``start`` waits for the workers' listeners.
START_TIMEOUT_S: Final = 120.0
_RECOVERING: Final = "the node is recovering (replaying its WAL); retry shortly"

EventSink = Callable[[str, dict[str, object]], None]


class Listeners:
    """The HTTP listening socket and the gRPC port's reservation (module docstring).

    A port still held by the workers of a node that was just killed (they die of it a
    moment later) is retried for up to ``BIND_RETRY_S`` before the start is refused."""

    def __init__(self, host: str, http_port: int, grpc_port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        deadline = time.monotonic() + BIND_RETRY_S
        while True:
            self.http = socket.socket(family, socket.SOCK_STREAM)
            self.grpc = socket.socket(family, socket.SOCK_STREAM)
            try:
                self._bind(host, http_port, grpc_port)
            except ListenerBindError as exc:
                self.close()
                if exc.reason != os.strerror(errno.EADDRINUSE) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the previous node's workers are still being reaped
                continue
            break
        self.http_port: int = self.http.getsockname()[1]
        self.grpc_port: int = self.grpc.getsockname()[1]

    def _bind(self, host: str, http_port: int, grpc_port: int) -> None:
        try:
            self.http.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.http.bind((host, http_port))
            self.http.listen(2048)
        except OSError as exc:
            raise ListenerBindError("HTTP", host, http_port, exc.strerror or str(exc)) from exc
        try:
            self.grpc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self.grpc.bind((host, grpc_port))
        except OSError as exc:
            raise ListenerBindError("gRPC", host, grpc_port, exc.strerror or str(exc)) from exc

    def close(self) -> None:
        self.http.close()
        self.grpc.close()


class NodeState:
    """What the workers' ``STATE`` calls read (the pipeline's ``ready``/``alive``, and
    why it is not alive, which a worker's ``/healthz`` says)."""

    def __init__(
        self,
        ready: Callable[[], bool],
        alive: Callable[[], bool],
        detail: Callable[[], str] = lambda: "",
    ) -> None:
        self.ready = ready
        self.alive = alive
        self.detail = detail


@dataclass
class _Link:
    index: int
    proc: Process
    conn: Connection
    started_at: float
    hello: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None


class Process(Protocol):
    """What the supervisor needs of a worker process (``subprocess.Popen`` has it)."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


#: Starts worker ``index`` on its end of the channel (which the caller closes after).
Launcher = Callable[[int, socket.socket], Process]


def worker_launcher(listeners: Listeners, config_file: Path | None) -> Launcher:
    """``python -m app.receive.worker_process`` with the channel and the HTTP socket inherited."""

    def launch(index: int, worker_end: socket.socket) -> Process:
        http_fd = listeners.http.fileno()
        cmd = [
            sys.executable,
            "-m",
            "app.receive.worker_process",
            "--index",
            str(index),
            "--parent",
            str(os.getpid()),
            "--channel-fd",
            str(worker_end.fileno()),
            "--http-fd",
            str(http_fd),
            "--grpc-port",
            str(listeners.grpc_port),
        ]
        if config_file is not None:
            cmd += ["--config", str(config_file)]
        return subprocess.Popen(
            cmd, pass_fds=(worker_end.fileno(), http_fd), stdin=subprocess.DEVNULL
        )

    return launch


class Workers:
    """The worker processes and their channels (module docstring)."""

    def __init__(
        self,
        count: int,
        stages: Stages,
        state: NodeState,
        *,
        observe: Callable[[str, str, str, int, float], None],
        exposition: Callable[[], tuple[bytes, str]],
        events: EventSink,
        launch: Launcher,
        backoff: float = RESTART_BACKOFF_S,
        threads: Supervisor | None = None,
        encode_slots: EncodeSlots | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"workers must be >= 1, got {count}")
        self.count = count
        self._stages = stages
        self._state = state
        self._observe = observe
        self._exposition = exposition
        self._events = events
        self._launch = launch
        #: a worker that exits sooner than this after its start is restarted this late
        self._backoff = backoff
        self._links: dict[int, _Link] = {}
        self._lock = threading.Lock()
        self._todo: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._supervisor: Supervised | None = None
        #: runs the supervising loop; hears of a channel reader that raised
        self._threads = threads
        self._stopping = threading.Event()
        #: INGEST is refused (503, retry) until the core has recovered
        self.accepting = False
        self.restarts = 0
        #: the publisher's records encodes, within ``encode_slots`` (one, by default)
        self.encoder = EncodeDispatch(self._live_connections, encode_slots or EncodeSlots(1))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the workers and wait until each has its listeners up (RuntimeError
        naming the worker otherwise)."""
        self.launch()
        self.wait_started(timeout)

    def launch(self) -> None:
        """Start the workers without waiting for them: a worker's interpreter starting
        up on another core overlaps the core's own start-up work (recovery's
        preparation), which would otherwise add to every restart."""
        # Restartable, and restarted on this very thread: the kernel kills the workers
        # when the thread that started them ends (PR_SET_PDEATHSIG). A spawn or reap
        # the crash interrupted is lost with it (DESIGN.md §5.10).
        self._supervisor = start_thread(
            self._threads,
            "workers",
            self._supervise,
            thread_name="ourios-supervisor",
            stop=self._stopping,
        )
        for index in range(self.count):
            self._todo.put(("spawn", index))

    def accept(self) -> None:
        """The core has recovered: the workers' INGEST requests go to the stages."""
        self.accepting = True

    def wait_started(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until every launched worker has its listeners up (RuntimeError naming
        the worker otherwise)."""
        deadline = time.monotonic() + timeout
        for index in range(self.count):
            while True:
                with self._lock:
                    link = self._links.get(index)
                if link is not None and link.hello.wait(0.05):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {index} did not start within {timeout:g} s")

    def stop(self, timeout: float) -> bool:
        """Stop every worker within ``timeout`` seconds (module docstring): each is sent
        ``STOP``, and one still running at the end is killed. True when each exited by
        itself."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        with self._lock:
            self._stopping.set()
            links = list(self._links.values())
        clean = True
        stoppers = [
            threading.Thread(target=_stop_link, args=(link, timeout), daemon=True) for link in links
        ]
        for t in stoppers:
            t.start()
        for t, link in zip(stoppers, links, strict=True):
            t.join(left())
            try:
                link.proc.wait(max(0.01, left()))
            except subprocess.TimeoutExpired:
                clean = False
                link.proc.kill()
                link.proc.wait()
            link.conn.close("the core stopped")
        self._todo.put(None)
        # each of these ends at once now that every channel is closed
        if self._supervisor is not None:
            self._supervisor.join(max(1.0, left()))
        for t in stoppers:
            t.join(max(1.0, left()))
        for link in links:
            if link.reader is not None:
                link.reader.join(max(1.0, left()))
        return clean

    def pids(self) -> list[int]:
        with self._lock:
            return [link.proc.pid for link in self._links.values()]

    def processes(self) -> dict[int, int]:
        """Each running worker's pid by its index (the metrics' process_* per worker)."""
        with self._lock:
            return {link.index: link.proc.pid for link in self._links.values()}

    # -- supervision ---------------------------------------------------------------------

    def _supervise(self) -> None:
        # Spawning happens here only: the kernel kills a worker when the thread that
        # started it ends, and this thread lives until ``stop``.
        while True:
            item = self._todo.get()
            if item is None:
                return
            what, index = item
            if what == "spawn":
                if not self._stopping.is_set():
                    self._spawn(index)
            else:
                self._reap(index)

    def _spawn(self, index: int) -> None:
        core_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = self._launch(index, worker_end)
        except OSError as exc:
            core_end.close()
            self._events("worker.spawn_failed", {"index": index, "error": str(exc)})
            self._retry_later(index)
            return
        finally:
            worker_end.close()  # the worker has its own copy now
        link = _Link(index, proc, Connection(core_end), time.monotonic())
        link.reader = threading.Thread(
            target=self._read, args=(link,), name=f"ourios-link-{index}", daemon=True
        )
        with self._lock:
            # ``stop`` snapshots the links under this lock after setting the flag: a
            # worker launched while it ran is either in its snapshot or ended here.
            stopping = self._stopping.is_set()
            if not stopping:
                self._links[index] = link
        if stopping:
            link.conn.close("the core is stopping")
            proc.kill()
            proc.wait()
            return
        link.reader.start()

    def _reap(self, index: int) -> None:
        with self._lock:
            link = self._links.get(index)
        if link is None:
            return
        link.conn.close("the worker exited")
        try:
            code = link.proc.wait(30)
        except subprocess.TimeoutExpired:
            link.proc.kill()
            code = link.proc.wait()
        if self._stopping.is_set():
            return
        lived = time.monotonic() - link.started_at
        self.restarts += 1
        self._events(
            "worker.exited",
            {
                "index": index,
                "pid": link.proc.pid,
                "returncode": code,
                "lived_seconds": round(lived, 3),
                "restarting": True,
            },
        )
        if lived < self._backoff:
            self._retry_later(index)
        else:
            self._todo.put(("spawn", index))

    def _retry_later(self, index: int) -> None:
        def later() -> None:
            if not self._stopping.wait(self._backoff):
                self._todo.put(("spawn", index))

        threading.Thread(target=later, name="ourios-respawn", daemon=True).start()

    # -- a channel's reader ----------------------------------------------------------------

    def _read(self, link: _Link) -> None:
        conn = link.conn
        try:
            while True:
                kind, ident, body = conn.receive()
                if kind is MessageKind.INGEST:
                    self._ingest(conn, ident, body)
                elif kind is MessageKind.OBSERVED:
                    self._observe(*channel.decode_observed(body))
                elif kind is MessageKind.STATE:
                    alive = self._state.alive()
                    flags = (1 if self._state.ready() else 0) | (2 if alive else 0)
                    detail = b"" if alive else self._state.detail().encode()
                    conn.send(MessageKind.STATE_IS, ident, [bytes([flags]), detail])
                elif kind is MessageKind.METRICS:
                    threading.Thread(
                        target=self._metrics, args=(conn, ident), name="ourios-scrape", daemon=True
                    ).start()
                elif kind is MessageKind.HELLO:
                    link.hello.set()
                    self._events("worker.ready", {"index": link.index, "pid": link.proc.pid})
                elif kind in (
                    MessageKind.FLUSHED,
                    MessageKind.DECODED,
                    MessageKind.ENCODED,
                    MessageKind.REFUSAL,
                    MessageKind.STOPPING,
                ):
                    conn.deliver(kind, ident, body)
                else:
                    raise ChannelClosed(f"the core does not take {kind.name}")
        except ChannelClosed as exc:
            if not self._stopping.is_set():
                log.warning("worker %d: %s", link.index, exc)
        except Exception as exc:  # noqa: BLE001 - the worker is replaced; the core lives on
            # The reader's restart is its worker's (reaped below, then spawned again):
            # one thread.crashed with the traceback, counted against the budget.
            if self._threads is not None:
                self._threads.crashed("link", exc)
            else:
                log.exception("worker %d: the channel reader failed", link.index)
        conn.close("the reader ended")
        if not self._stopping.is_set():
            self._todo.put(("reap", link.index))

    def _ingest(self, conn: Connection, ident: int, body: memoryview) -> None:
        transport, tenant, payload, batch = channel.decode_ingest(body)

        def answer(outcome: IngestOutcome | None, refusal: IngestRejection | None) -> None:
            if outcome is not None:
                conn.send(
                    MessageKind.ACK,
                    ident,
                    channel.encode_ack(outcome.records, outcome.rejected, outcome.message),
                )
            else:
                assert refusal is not None
                conn.send(MessageKind.REFUSAL, ident, channel.encode_refusal(refusal))

        try:
            if not self.accepting:
                refusal = Unavailable(_RECOVERING, retry_after=1, error_type="recovering")
                refusal.records = len(batch)
                raise refusal
            self._stages.submit(tenant, payload, batch, answer)
        except IngestRejection as exc:
            if not exc.records:
                exc.records = len(batch)
            answer(None, exc)

    def scrape(self) -> tuple[bytes, str]:
        """The core's exposition once every worker has ``FLUSH``-ed its reports, so it
        counts every request a client has had its answer to."""
        with self._lock:
            links = list(self._links.values())
        for link in links:  # a dying worker's last reports may be missing; its counts stay
            with contextlib.suppress(ChannelClosed, TimeoutError):
                link.conn.call(MessageKind.FLUSH, [], 5.0)
        return self._exposition()

    def _metrics(self, conn: Connection, ident: int) -> None:
        text, content_type = self.scrape()
        with contextlib.suppress(ChannelClosed):
            conn.send(MessageKind.TEXT, ident, channel.encode_text(content_type, text))

    # -- the publisher's encoding -------------------------------------------------------------

    def encode_records(self, cols: RecordColumns, compression: str) -> bytes:
        """The publisher's records encoder (``EncodeDispatch.encode_records``)."""
        return self.encoder.encode_records(cols, compression)

    def _live_connections(self) -> list[Connection]:
        with self._lock:
            return [link.conn for link in self._links.values() if not link.conn.closed]

    # -- replay's decoding ------------------------------------------------------------------

    def decode_in_order(
        self,
        frames: Iterable[tuple[str, bytes]],
        *,
        stop: threading.Event,
        attempts: int,
        window: int = 64,
    ) -> Iterator[FlatBatch | Undecodable]:
        """Decode WAL payloads on the workers, keeping up to ``window`` in flight, and
        yield the batches in input order (``app.node.recovery.Decoder``).

        A payload that fails is sent again, alone, to the next worker, up to
        ``attempts`` failures, then yields ``Undecodable``: a worker's refusal or
        exception (a ``MemoryError`` included) is one failure, and so is its death or
        silence while it held the payload as a retry. A death in the first, windowed
        send is not counted — the payload may only have shared a queue with the one
        that killed the worker. ``DecodeStopped`` once ``stop`` is set or the workers
        are stopping: the window is abandoned (its answers are dropped)."""
        pending: deque[tuple[str, bytes, _Decode]] = deque()
        rr = itertools.cycle(range(self.count))
        it = iter(frames)
        exhausted = False
        try:
            while pending or not exhausted:
                while not exhausted and len(pending) < window:
                    self._check_stop(stop)
                    try:
                        tenant, payload = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.append((tenant, payload, self._decode_call(next(rr), tenant, payload)))
                if not pending:
                    break
                tenant, payload, call = pending.popleft()
                yield self._decoded(tenant, payload, call, rr, stop, attempts)
        finally:
            for _, _, left in pending:
                left.forget()

    def _check_stop(self, stop: threading.Event) -> None:
        if stop.is_set() or self._stopping.is_set():
            raise DecodeStopped("the replay was stopped")

    def _decoded(
        self,
        tenant: str,
        payload: bytes,
        call: _Decode,
        rr: Iterator[int],
        stop: threading.Event,
        attempts: int,
    ) -> FlatBatch | Undecodable:
        """One payload's batch, retried on the next worker until ``attempts`` failures."""
        failures = 0
        error = ""
        retry = False
        while True:
            result = call.result(lambda: stop.is_set() or self._stopping.is_set())
            self._check_stop(stop)
            if isinstance(result, FlatBatch):
                return result
            if isinstance(result, IngestRejection):
                failures += 1
                error = str(result)
            elif result is _DIED:
                failures += 1 if retry else 0
                error = f"the worker holding it died or did not answer ({call.reason})"
            else:  # no live worker took it: the supervisor is starting one
                stop.wait(0.05)
                call = self._decode_call(next(rr), tenant, payload)
                continue
            if failures >= attempts:
                return Undecodable(error, failures)
            retry = True
            call = self._decode_call(next(rr), tenant, payload)

    def _decode_call(self, index: int, tenant: str, payload: bytes) -> _Decode:
        with self._lock:
            link = self._links.get(index)
        call = None
        if link is not None:
            try:
                call = link.conn.start(
                    MessageKind.DECODE, channel.encode_decode_request(tenant, payload)
                )
            except ChannelClosed:
                call = None
        return _Decode(tenant, call)


#: ``_Decode.result``: the worker died, the channel closed or the answer timed out.
_DIED: Final = object()
#: How often a decode waiting for its worker looks at the stop.
DECODE_POLL_S: Final = 0.1
#: How long a decode waits for its worker before it counts as lost.
DECODE_TIMEOUT_S: Final = 60.0


@dataclass(slots=True)
class _Decode:
    """One DECODE in flight on a worker's channel (None: no worker took it)."""

    tenant: str
    call: channel.Call | None
    reason: str = ""

    def result(self, stopping: Callable[[], bool]) -> FlatBatch | IngestRejection | object | None:
        """The batch, the worker's refusal, ``_DIED``, or None when no worker took it or
        ``stopping()`` became true first."""
        if self.call is None:
            return None
        waited = 0.0
        while True:
            try:
                answer = self.call.wait(DECODE_POLL_S)
            except TimeoutError:
                waited += DECODE_POLL_S
                if stopping():
                    return None
                if waited < DECODE_TIMEOUT_S:
                    continue
                self.call.forget()
                self.reason = f"no answer in {DECODE_TIMEOUT_S:g} s"
                return _DIED
            except ChannelClosed as exc:
                self.reason = str(exc)
                return _DIED
            break
        if answer.kind is MessageKind.DECODED:
            return FlatBatch(self.tenant, channel.decode_batch(answer.body))
        return channel.decode_refusal(answer.body)

    def forget(self) -> None:
        if self.call is not None:
            self.call.forget()


def _stop_link(link: _Link, timeout: float) -> None:
    try:
        link.conn.call(MessageKind.STOP, [], timeout)
    except (ChannelClosed, TimeoutError):
        pass

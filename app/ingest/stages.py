"""The core's ingest stages: a request is acknowledged at the fsync covering its frame,
and its turn runs afterwards, in commit order, behind a bounded backlog (DESIGN.md §5).

A request reaches the core as (tenant, WAL payload, decoded batch) — over a worker's
channel, or from the in-process receivers (``LocalPort``, ``server.workers`` 0). Three
stages take it from there, each on one thread, so the core never holds a thread per
request:

1. ``submit`` (the caller's thread): the backlog bound, admission and the WAL append
   (``Pipeline.admit_and_append``); a refusal is raised at once and nothing was
   written. Appends and the queueing behind them happen under one lock, so the
   committer sees the frames in the journal's sequence.
2. the committer thread: waits for the fsync covering each frame, in sequence (the
   journal's group commit makes the first waiter lead the next fsync; the committer is
   every frame's waiter, so each fsync covers every frame appended while the previous
   one ran), then **answers**: acknowledged once that fsync returned OK and no rotation
   obligation is pending (``Pending.wait``'s promise), refused when it failed.
3. the turn thread: first the frames a restart replays (``start(replay=...)``), then
   each acknowledged frame in commit order (``Pipeline.turn_and_finish``): mining,
   buffering, the mark. Only a turn sets the mark (its own frame end), so the mark
   never covers a frame whose turn has not run, and nothing replayed is ever a mark.

A stop (``close``) answers every submitted request and turns what it can: with
``drain``, every acknowledged frame until the time it is given runs out, then the turn
thread stops after the frame in hand; without (a replay cut short, ``halt``), nothing
more is turned. What is left is durable, and counted (``left``): the next start replays
it, since only a turn sets the mark.

Frames appended and not yet turned are the backlog, bounded by ``turn_backlog_bytes``:
at the bound ``submit`` refuses with 503 ``ingest_backlog`` and a retry hint, so a turn
thread that falls behind (a slow miner, a long replay) costs the clients a retry,
never the volume. A tenant's new frame is always turned after its older ones, replayed
ones included: the turn thread takes them in that order. One tenant's share of the
backlog is bounded too (``miner.tenant_backlog_bytes``, DESIGN.md §5.14): above it only
that tenant is refused, 503 ``tenant_backlog``, so one tenant cannot fill the backlog
for every other.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from app import points
from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection, Unavailable
from app.ingest.pipeline import Pipeline, Ticket
from app.receive.api import IngestOutcome
from app.threads import Supervised, Supervisor, start_thread

__all__ = ["Answer", "IngestBacklogFull", "LocalPort", "Stages", "TenantBacklogFull"]

log = logging.getLogger("ourios.stages")

#: Called once per submitted request, from the committer thread: the outcome, or the
#: refusal.
Answer = Callable[[IngestOutcome | None, IngestRejection | None], None]
#: The hint a request refused for the backlog gets: the turn thread catches up in
#: seconds unless something is badly wrong.
BACKLOG_RETRY_AFTER_S: Final = 1

_INTERNAL: Final = "internal error; the server log has the details"

Item = TypeVar("Item")


class IngestBacklogFull(Unavailable):
    """503 / UNAVAILABLE: frames acknowledged but not yet turned reached the bound."""

    def __init__(self, bound: int, backlog: int, frames: int) -> None:
        super().__init__(
            f"the ingest backlog is full: {backlog} bytes in {frames} frames are "
            f"acknowledged and waiting for their turn (wal.turn_backlog_bytes={bound}); "
            f"retry shortly",
            retry_after=BACKLOG_RETRY_AFTER_S,
            error_type="ingest_backlog",
        )


class TenantBacklogFull(Unavailable):
    """503 / UNAVAILABLE: this tenant's frames waiting for their turn reached its share."""

    def __init__(self, tenant: str, bound: int, backlog: int, frames: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its share of the ingest backlog: {backlog} bytes in "
            f"{frames} frames are acknowledged and waiting for their turn "
            f"(miner.tenant_backlog_bytes={bound}); other tenants are not affected; "
            f"retry shortly",
            retry_after=BACKLOG_RETRY_AFTER_S,
            error_type="tenant_backlog",
        )


class Stages:
    """Threads ``ourios-commit`` and ``ourios-turn``: ``start``, ``submit``, ``close``."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        backlog_bytes: int,
        tenant_backlog_bytes: int | None = None,
        threads: Supervisor | None = None,
    ) -> None:
        if backlog_bytes < 1:
            raise ValueError(f"backlog_bytes must be >= 1, got {backlog_bytes}")
        #: one tenant's share of the backlog (None: only the node-wide bound)
        self.tenant_backlog_limit = tenant_backlog_bytes
        #: tenant -> [bytes, frames] waiting, for tenants with a frame waiting
        self._tenant_backlog: dict[str, list[int]] = {}
        self._pipeline = pipeline
        #: runs the two threads; a crash of either fails the node at once (``start``)
        self._threads = threads
        self.backlog_limit = backlog_bytes
        self._submit_lock = threading.Lock()
        self._durable: queue.SimpleQueue[tuple[Ticket, Answer] | None] = queue.SimpleQueue()
        self._turns: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._committer: Supervised | None = None
        self._turner: Supervised | None = None
        self._closed = False
        self._halt = threading.Event()
        self._backlog_lock = threading.Lock()
        self._turned = threading.Condition(self._backlog_lock)
        self._backlog_bytes = 0
        self._backlog_frames = 0
        #: (frames, bytes) acknowledged and never turned: the halt came first
        self._left = (0, 0)
        #: the replay's outcome once its last frame was turned (None: still replaying)
        self.replay_error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(
        self,
        *,
        replay: Iterable[Item] | None = None,
        turn_replayed: Callable[[Item], None] | None = None,
        replayed: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        """Start the threads. With ``replay``, the turn thread first turns each of its
        items (``turn_replayed``), then calls ``replayed(error)`` — error is what ended
        the replay early, None when it ran to the end — and only then turns new frames.
        """
        # Neither may be restarted (DESIGN.md §5.10): a committer that raised holds a
        # request between its append and its answer — the client would never be
        # answered and the turn gate would wait for that frame's sequence for ever; a
        # turn thread that raised may have dropped a frame whose turn did not run, and
        # the next turn's mark would pass it. So a crash fails the node at once.
        self._committer = start_thread(
            self._threads, "committer", self._commit, thread_name="ourios-commit", restart=False
        )
        self._turner = start_thread(
            self._threads,
            "turn",
            lambda: self._turn(replay, turn_replayed, replayed),
            thread_name="ourios-turn",
            restart=False,
        )

    def submit(self, tenant: str, payload: bytes, batch: FlatBatch, answer: Answer) -> None:
        """Admit and append; the answer comes from the committer thread. Raises the
        ``IngestRejection`` of a refusal (nothing written), or when closed."""
        with self._submit_lock:
            if self._closed:
                raise Unavailable("the node is shutting down; retry", error_type="shutting_down")
            if self._committer is not None and not self._committer.is_alive():
                # nothing would ever answer it: refused, nothing written
                raise Unavailable(
                    "the node's commit thread stopped (see thread.failed); retry on another node",
                    error_type="thread_failed",
                )
            with self._backlog_lock:
                backlog, frames = self._backlog_bytes, self._backlog_frames
                mine = self._tenant_backlog.get(tenant)
            if frames and backlog + len(payload) > self.backlog_limit:
                refusal: Unavailable = IngestBacklogFull(self.backlog_limit, backlog, frames)
                refusal.records = len(batch)
                raise refusal
            share = self.tenant_backlog_limit
            if share is not None and mine is not None and mine[0] + len(payload) > share:
                refusal = TenantBacklogFull(tenant, share, mine[0], mine[1])
                refusal.records = len(batch)
                if self._pipeline.shares is not None:
                    self._pipeline.shares.refused(tenant, "backlog", refusal.retry_after)
                raise refusal
            ticket = self._pipeline.admit_and_append(tenant, payload, batch)
            with self._backlog_lock:
                self._backlog_bytes += ticket.pending.size
                self._backlog_frames += 1
                waiting = self._tenant_backlog.setdefault(tenant, [0, 0])
                waiting[0] += ticket.pending.size
                waiting[1] += 1
            self._durable.put((ticket, answer))

    def halt(self) -> None:
        """Turn nothing more (a replay cut short by a stop: nothing new may be turned on
        top of it); the turn thread stops after the item in hand."""
        self._halt.set()

    def close(self, timeout: float, *, drain: bool = True, halt_secs: float = 5.0) -> bool:
        """Refuse new submissions and answer every submitted one. With ``drain`` the turn
        thread turns acknowledged frames for up to ``timeout`` seconds, then stops after
        the frame it is on; without, it stops at once after that frame (what it leaves
        is durable: the next start replays it; ``left`` counts it). False when a thread
        did not end within ``timeout`` + ``halt_secs`` seconds."""
        with self._submit_lock:
            if self._closed:
                return True
            self._closed = True
            if not drain:
                self._halt.set()
            self._durable.put(None)
        deadline = time.monotonic() + timeout
        threads = [t for t in (self._committer, self._turner) if t is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            self._halt.set()  # out of time: what is not turned stays in the WAL
            deadline = time.monotonic() + halt_secs
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    @property
    def left(self) -> tuple[int, int]:
        """(frames, bytes) acknowledged and never turned (the halt came first)."""
        with self._backlog_lock:
            return self._left

    @property
    def backlog(self) -> tuple[int, int]:
        """(bytes, frames) appended and not yet turned."""
        with self._backlog_lock:
            return self._backlog_bytes, self._backlog_frames

    def wait_turned(self, timeout: float) -> bool:
        """Block until every frame appended so far has had its turn (False: timed out)."""
        with self._turned:
            return self._turned.wait_for(lambda: self._backlog_frames == 0, timeout)

    # -- the threads ------------------------------------------------------------------

    def _commit(self) -> None:
        while True:
            item = self._durable.get()
            if item is None:
                self._turns.put(None)
                return
            ticket, answer = item
            self._pipeline.await_durable(ticket)
            if ticket.error is None:
                points.hit("stages.acknowledged")
                _answer(answer, IngestOutcome(records=len(ticket.batch)), None)
            else:
                _answer(answer, None, self._pipeline.refusal_of(ticket))
            self._turns.put(ticket)

    def _turn(
        self,
        replay: Iterable[Item] | None,
        turn_replayed: Callable[[Item], None] | None,
        replayed: Callable[[BaseException | None], None] | None,
    ) -> None:
        if replay is not None:
            error: BaseException | None = None
            items = iter(replay)
            try:
                assert turn_replayed is not None
                for item in items:
                    if self._halt.is_set():
                        break
                    turn_replayed(item)
            except BaseException as exc:  # noqa: BLE001 - reported; the node stops on it
                log.exception("the replay failed")
                error = exc
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()  # a replay cut short: its decoding ahead is abandoned
            self.replay_error = error
            if replayed is not None:
                replayed(error)
            if error is not None:
                self._halt.set()  # nothing new is turned on top of a failed replay
        while True:
            ticket = self._turns.get()
            if ticket is None:
                return
            turned = not self._halt.is_set()
            if turned:
                points.hit("stages.turn")
                try:
                    self._pipeline.turn_and_finish(ticket)
                except IngestRejection:
                    pass  # answered already: a failed sync, or a tenant refused since
                except Exception:  # noqa: BLE001 - the frame is durable; the next start
                    log.exception("an ingest turn failed unexpectedly (%s)", ticket.tenant)
            with self._turned:
                if not turned and ticket.error is None:
                    frames, size = self._left
                    self._left = (frames + 1, size + ticket.pending.size)
                self._backlog_bytes -= ticket.pending.size
                self._backlog_frames -= 1
                waiting = self._tenant_backlog[ticket.tenant]
                waiting[0] -= ticket.pending.size
                waiting[1] -= 1
                if not waiting[1]:
                    del self._tenant_backlog[ticket.tenant]
                self._turned.notify_all()


def _answer(answer: Answer, outcome: IngestOutcome | None, error: IngestRejection | None) -> None:
    try:
        answer(outcome, error)
    except Exception:  # noqa: BLE001 - a worker gone mid-request: the client retries
        log.debug("an answer could not be delivered", exc_info=True)


class LocalPort:
    """The receivers' ``IngestPort`` in the core itself (``server.workers`` 0): each
    request goes through the stages and its thread waits for the answer."""

    def __init__(self, stages: Stages, pipeline: Pipeline) -> None:
        self._stages = stages
        self._pipeline = pipeline

    def ingest(
        self, tenant: str, payload: bytes, batch: FlatBatch, transport: str
    ) -> IngestOutcome:
        done = threading.Event()
        got: list[IngestOutcome | IngestRejection] = []

        def answer(outcome: IngestOutcome | None, refusal: IngestRejection | None) -> None:
            got.append(outcome if outcome is not None else refusal or IngestRejection(_INTERNAL))
            done.set()

        self._stages.submit(tenant, payload, batch, answer)
        done.wait()
        result = got[0]
        if isinstance(result, IngestRejection):
            raise result
        return result

    @property
    def ready(self) -> bool:
        return self._pipeline.ready

    @property
    def alive(self) -> bool:
        return self._pipeline.alive

    @property
    def health_detail(self) -> str:
        return self._pipeline.health_detail

"""The core's ingest stages for requests that arrive over the workers' channels.

A worker's request reaches the core as (tenant, WAL payload, decoded batch) on that
worker's reader thread. Three stages take it from there, each on one thread, so the
core never holds a thread per request:

1. ``submit`` (the channel's reader thread): admission and the WAL append
   (``Pipeline.admit_and_append``); a refusal is answered at once, and nothing was
   written. Appends and the queueing behind them happen under one lock, so the
   committer sees the frames in the journal's sequence.
2. the committer thread: waits for the fsync covering each frame, in sequence. The
   journal's group commit makes the first waiter lead the next fsync; the committer is
   every frame's waiter, so each fsync covers every frame appended while the previous
   one ran (``Pipeline.await_durable``).
3. the turn thread: mines and buffers each frame in commit order
   (``Pipeline.turn_and_finish``) and then answers the worker. So a 200 is sent only
   after the covering fsync and the turn, as for the in-process receivers.

The stages overlap: while the turn thread mines one batch, the committer's fsync is
already covering the next ones, and the readers append behind it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Final

from app.ingest.pipeline import Pipeline, Ticket
from app.receive.api import IngestOutcome
from app.receive.otlp import FlatBatch, IngestRejection

__all__ = ["Answer", "Stages"]

log = logging.getLogger("ourios.stages")

#: Called once per submitted request, from the turn thread: the outcome, or the refusal.
Answer = Callable[[IngestOutcome | None, IngestRejection | None], None]

_INTERNAL: Final = "internal error; the server log has the details"


class Stages:
    """Threads ``ourios-commit`` and ``ourios-turn``: ``start``, ``submit``, ``close``."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._submit_lock = threading.Lock()
        self._durable: queue.SimpleQueue[tuple[Ticket, Answer] | None] = queue.SimpleQueue()
        self._turns: queue.SimpleQueue[tuple[Ticket, Answer] | None] = queue.SimpleQueue()
        self._committer: threading.Thread | None = None
        self._turner: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        self._committer = threading.Thread(target=self._commit, name="ourios-commit")
        self._turner = threading.Thread(target=self._turn, name="ourios-turn")
        self._committer.start()
        self._turner.start()

    def submit(self, tenant: str, payload: bytes, batch: FlatBatch, answer: Answer) -> None:
        """Admit and append; the answer comes from the turn thread. Raises the
        ``IngestRejection`` of a refusal (nothing written), or when closed."""
        with self._submit_lock:
            if self._closed:
                raise IngestRejection("the node is shutting down", error_type="shutting_down")
            ticket = self._pipeline.admit_and_append(tenant, payload, batch)
            self._durable.put((ticket, answer))

    def close(self, timeout: float) -> bool:
        """Refuse new submissions, finish every submitted one (each is answered), join.
        False when a thread did not end within ``timeout`` seconds."""
        with self._submit_lock:
            if self._closed:
                return True
            self._closed = True
            self._durable.put(None)
        joined = True
        for thread in (self._committer, self._turner):
            if thread is not None:
                thread.join(timeout)
                joined = joined and not thread.is_alive()
        return joined

    def _commit(self) -> None:
        while True:
            item = self._durable.get()
            if item is None:
                self._turns.put(None)
                return
            self._pipeline.await_durable(item[0])
            self._turns.put(item)

    def _turn(self) -> None:
        while True:
            item = self._turns.get()
            if item is None:
                return
            ticket, answer = item
            try:
                outcome = self._pipeline.turn_and_finish(ticket)
            except IngestRejection as exc:
                _answer(answer, None, exc)
            except Exception:  # noqa: BLE001 - the client is told; the turn thread lives on
                log.exception("an ingest turn failed unexpectedly (tenant %r)", ticket.tenant)
                _answer(answer, None, IngestRejection(_INTERNAL))
            else:
                _answer(answer, outcome, None)


def _answer(answer: Answer, outcome: IngestOutcome | None, error: IngestRejection | None) -> None:
    try:
        answer(outcome, error)
    except Exception:  # noqa: BLE001 - a worker gone mid-request: the client retries
        log.debug("an answer could not be delivered", exc_info=True)

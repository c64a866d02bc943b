"""The publisher's records encodes on the workers, at most ``server.encode_concurrency``
at once (DESIGN.md §5, issue 23 item 6).

``EncodeDispatch.encode_records`` is the publisher's records encoder with workers: the
partition's rows go to a worker as an Arrow IPC stream and its Parquet object comes
back, because the encoding is a large share of the core's CPU (docs/BENCHMARKS.md,
issue 14). The encode is a pure function of the rows, so when no worker answers — none
is up, it died, it timed out, it refused — the core encodes the same rows itself and
gets the same object, or the same ``EncodeError``.

**The bound** (``EncodeSlots``). A WAL rotation's cut publishes every tenant's partition
at once, and its flush lanes used to send every encode together: for a second or more
the encodes, the lanes' Arrow serialisation and the object writes wanted more CPUs than
the node has, and the workers' event loops — the requests being served — waited for one
(docs/BENCHMARKS.md "The half-load tail"). So an encode first takes one of
``server.encode_concurrency`` slots, and a publish that finds none free waits for one
before it serialises anything: what waits is a partition detached for its publish,
which the sink's memory bound counts already (DESIGN.md §5.12), and no encoded copy or
IPC stream exists for it yet. A slot is held until the object is back, by a worker or by
the core's own encode, and each of those ends: the worker's answer within
``ENCODE_TIMEOUT_S``, or the core's encode. The cut's own deadline and stall metrics
measure the cut as it runs, waits included.

**A publish's CPU, not only its encode.** The publisher holds the same slot for the whole
CPU part of a records publish — re-matching its rows to the pinned template versions,
the encode, and settling its rows once the store has them — and not while it writes the
object (``sink.publisher``, its ``encode_slot``). With the slot on the encode alone, the
other lanes' re-matching and settling ran beside every worker encode and the half-load
p99 stayed at 50–200 ms, every slow request inside a rotation cut's burst; with the CPU
part under the slot it is 13–22 ms (docs/BENCHMARKS.md, 2026-12-06 17:00 UTC). A slot is
re-entrant on its thread: the publish that holds one encodes without taking a second.

**A cut's publishes rest their slot** (``server.encode_duty_percent``). Even one at a
time, a rotation's cut holds the slot back to back for a second or more — a CPU busy
beside the requests' — and the requests that arrive then wait for a CPU (half-load p99
24–29 ms at 460 req/s, every slow request inside a burst). A publish run inside
``paced`` (the cut's flush lanes) leaves its slot resting, after holding it t seconds,
for t × (100 / percent − 1): at 50 % the cut spreads its CPU over twice the time and the
requests' p99 was 12–18 ms (docs/BENCHMARKS.md, 2026-12-06 18:31 UTC). The spiller's and
recovery's publishes do not rest it: a replay's backlog drains at full speed (at 50 %
for them too the replay fell from ~120,000 to 86,000–98,000 records/s).

**A worker that does not answer.** A worker that timed out an encode is sent no more
encodes for the life of its channel (the core encodes in its place): a hung worker that
is not dead would otherwise take a slot for ``ENCODE_TIMEOUT_S`` at every turn it came
round to, and with one slot every publish of the node would wait behind it. One
``worker.encode_timeout`` warning says which; a worker restarted after it died has a new
channel and gets encodes again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from app.receive import channel
from app.receive.channel import ChannelClosed, Connection, MessageKind
from sink.parquet import RecordColumns, encode_records

__all__ = ["ENCODE_TIMEOUT_S", "EncodeDispatch", "EncodeSlots"]

log = logging.getLogger(__name__)

#: How long an encode waits for its worker before the core encodes the rows itself.
ENCODE_TIMEOUT_S: Final = 120.0


class EncodeSlots:
    """At most ``limit`` encodes in flight; the others wait for a slot (module
    docstring). Thread-safe; its counters are the node's ``ourios_encode_*`` metrics."""

    def __init__(
        self, limit: int, duty_percent: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1:
            raise ValueError(f"server.encode_concurrency must be >= 1, got {limit}")
        if not 1 <= duty_percent <= 100:
            raise ValueError(f"server.encode_duty_percent must be 1..100, got {duty_percent}")
        self.limit = limit
        #: how long a paced holder's slot rests per second it was held (module docstring)
        self.rest_factor = 100.0 / duty_percent - 1.0
        self._clock = clock
        #: when each resting slot may be taken again
        self._resting: list[float] = []
        self._cond = threading.Condition()
        #: encodes holding a slot now, and the most there ever were at once
        self.in_flight = 0
        self.max_in_flight = 0
        #: publishes waiting for a slot now; all that ever waited; their waits summed
        self.waiting = 0
        self.waited = 0
        self.wait_seconds = 0.0
        #: the rests paced holders left their slots to, summed (seconds)
        self.rest_seconds = 0.0
        #: how deep the current thread is inside ``slot`` (re-entrant: module docstring),
        #: and whether it is inside ``paced``
        self._held = threading.local()

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot for the block's duration, waiting for one first when all are
        taken (each holder ends: module docstring); a thread that holds one already
        keeps using it."""
        depth: int = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        with self._cond:
            if self._taken() >= self.limit:
                self.waiting += 1
                self.waited += 1
                began = time.monotonic()
                while self._taken() >= self.limit:
                    rest = min(self._resting, default=None)
                    self._cond.wait(None if rest is None else max(0.0, rest - self._clock()))
                self.waiting -= 1
                self.wait_seconds += time.monotonic() - began
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._held.depth = 1
        taken_at = self._clock()
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                self.in_flight -= 1
                if self.rest_factor and getattr(self._held, "paced", False):
                    now = self._clock()
                    rest = (now - taken_at) * self.rest_factor
                    self._resting.append(now + rest)
                    self.rest_seconds += rest
                self._cond.notify()

    def _taken(self) -> int:
        """Slots held or resting now (under the condition's lock)."""
        if self._resting:
            now = self._clock()
            self._resting = [t for t in self._resting if t > now]
        return self.in_flight + len(self._resting)

    @contextmanager
    def paced(self) -> Iterator[None]:
        """The block's slots rest after they are given back (a cut's publish: module
        docstring)."""
        self._held.paced = True
        try:
            yield
        finally:
            self._held.paced = False


class EncodeDispatch:
    """Sends each records encode to the next live worker in turn, within the slots
    (module docstring). ``connections`` lists the live workers' channels."""

    def __init__(self, connections: Callable[[], list[Connection]], slots: EncodeSlots) -> None:
        self._connections = connections
        self.slots = slots
        self._turn = itertools.count()
        #: channels whose worker timed out an encode: sent no more (module docstring)
        self._unanswered: weakref.WeakSet[Connection] = weakref.WeakSet()

    def encode_records(self, cols: RecordColumns, compression: str) -> bytes:
        """The Parquet object of ``cols`` (``sink.parquet.encode_records``), encoded by a
        worker, or here when none answers."""
        with self.slots.slot():
            conns = [c for c in self._connections() if c not in self._unanswered]
            if conns:
                conn = conns[next(self._turn) % len(conns)]
                try:
                    # serialised inside the slot: a waiting publish holds no IPC copy
                    answer = conn.call(
                        MessageKind.ENCODE,
                        channel.encode_encode_request(compression, cols.table()),
                        ENCODE_TIMEOUT_S,
                    )
                except TimeoutError:
                    self._unanswered.add(conn)
                    log.warning(
                        "worker.encode_timeout: a worker did not answer an encode in %.0f s; "
                        "the core encodes in its place while that worker's channel lasts",
                        ENCODE_TIMEOUT_S,
                    )
                except (ChannelClosed, ValueError):
                    pass  # ValueError: a partition over the channel's frame bound
                else:
                    if answer.kind is MessageKind.ENCODED:
                        return bytes(answer.body)
            return encode_records(cols, compression)

"""Named sync points: ``points.hit("barrier.after_quiesce")`` at the steps RFC0052.1 and
RFC0052.14 name, so a test can hold a thread there and release it — interleavings are
made deterministic instead of timing-based (DESIGN.md §5).

In production nothing is registered and ``hit`` is one dictionary lookup. A test uses::

    with points.hold("barrier.before_stamp") as held:
        ...start the thread...
        assert held.reached.wait(10)
        ...do the interleaved thing...
        held.release()

Points in the code: ``barrier.after_quiesce`` (capture, exclusion held),
``barrier.before_flush``, ``barrier.after_flush``, ``barrier.before_stamp`` (a cut
running), ``turn.before_mine`` (inside an ingest turn), ``housekeeping.before_pass``;
for RFC 0055: ``ingest.appended`` (a request's frame written, before its sync wait),
``turn.settling`` (a turn about to settle its tenant's entry), ``settlement.claimed``,
``settlement.lost`` (a trigger that found the claim taken), ``settlement.read`` (between
two bounded reads: no lock held), ``settlement.before_swap``; for issue 18 item 6:
``settlement.intent`` (the intent is durable in PUBLISHED, nothing of the span published
yet) and ``settlement.published`` (the span's publish returned, its marks not written);
for the core's stages (``app.ingest.stages``): ``stages.acknowledged`` (a frame durable,
before its answer is sent) and ``stages.turn`` (the turn thread about to turn an
acknowledged frame); for issue 16 (exactly once in the store): ``publish.intended`` (an
object's claim is durable in PUBLISHING, its PUT not started), ``publish.stored`` (the
PUT returned, the publish not settled: its rows are still registered in flight),
``barrier.stamped`` (a cut's CHECKPOINT and PUBLISHED are written, its intents not yet
trimmed) and ``barrier.after_trim``.

The WAL's fault-injecting filesystem has the same kind of point inside its I/O seam,
named by an operation instead of a string: ``wal.testing.FaultyFs.hold_at(op, glob)``
returns a ``wal.testing.HeldFsPoint`` with the same ``reached`` / ``release()`` pair as
a ``HeldPoint`` here (the WAL imports nothing from ``app``, so the two cannot share a
registry).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holds: dict[str, HeldPoint] = {}


class HeldPoint:
    """A sync point held by ``hold``: ``reached`` is set when a thread arrives, which
    then waits until ``release()``."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.remaining = count  # how many hits to hold (then pass through)
        self.reached = threading.Event()
        self._go = threading.Event()
        self.hits = 0

    def release(self) -> None:
        self._go.set()

    def _wait(self) -> None:
        self.reached.set()
        if not self._go.wait(120):
            raise TimeoutError(f"sync point {self.name} was never released")


def hit(name: str) -> None:
    if not _holds:
        return
    with _lock:
        held = _holds.get(name)
        if held is None:
            return
        held.hits += 1
        if held.remaining <= 0:
            return
        held.remaining -= 1
    held._wait()


@contextmanager
def hold(name: str, count: int = 1) -> Iterator[HeldPoint]:
    """Hold the next ``count`` threads reaching ``name`` until ``release()``."""
    held = HeldPoint(name, count)
    with _lock:
        if name in _holds:
            raise RuntimeError(f"sync point {name} is already held")
        _holds[name] = held
    try:
        yield held
    finally:
        held.release()
        with _lock:
            _holds.pop(name, None)

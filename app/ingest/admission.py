"""Admission: whether a new batch may be appended at all (DESIGN.md §7, §12).

The pipeline asks ``Admission.check`` before every append; a refusal raises an
``Unavailable`` (503 / UNAVAILABLE, its ``error_type`` naming the bound, a Retry-After
of the housekeeping cadence) and nothing is written. ``check`` reads state and never
makes a system call: free space is sampled by the housekeeping tick (``observe``),
never on the append path (segment-set seed §12.9).

Free space means the figure of ``app.base.diskspace``: the last sample less what the node
wrote since (WAL frames and segment files, snapshots, the embedded store's objects) and
less the emergency reserve while it is released — the free space as of the last
append. ``check`` reads it per request, so a WAL written faster than the cadence still
stops at stop water instead of filling the volume between two ticks.

Three bounds, each refusing the same way:

* ``disk_stop_water`` — that figure, less the batch about to be written, is below
  ``disk.stop_water_bytes`` (0 never refuses on the figure);
* ``disk_full`` — the WAL itself hit ENOSPC/EDQUOT (its no-space latch,
  ``Journal.no_space``). ``check`` sees it on the very next request, so a disk that
  filled between two samples refuses at once, not one cadence later;
* ``wal_unreclaimed_limit`` — the WAL's own incremental unreclaimed-bytes figure is over
  ``wal.unreclaimed_bytes_limit`` (0 = off). ``check`` compares it live (one int read).

A refusal is *entered* wherever it is first seen (``check`` or the tick) and *left*
only by the tick: when a sample shows free space at or above the resume point (stop
water plus an eighth of the gap to low water, ``resume_bytes``; above zero when stop
water is 0) the tick clears the WAL's latch it observed before sampling (a newer one
stays), and when the unreclaimed figure is back at or below its limit the bound lifts.
So admission resumes by itself — no restart, and no append needed to find out — and it
cannot flap faster than the cadence. The margin above stop water is what keeps it from
flapping at all: resuming exactly at stop water would re-enter it a few batches later,
two events a tick, while nothing is being reclaimed.

The disk has three levels, ``healthy`` → ``low_water`` → ``stop_water``; each change of
level emits exactly one event (``disk.low_water`` entering low water from healthy,
``disk.stop_water`` entering stop water from anywhere, ``disk.recovered`` leaving a
level downwards), and the unreclaimed bound ``wal.unreclaimed.limit`` /
``wal.unreclaimed.recovered``. While a level is below healthy, or a bound refuses, the
tick is *urgent*: the housekeeper asks the barrier for a cut now and runs another pass
as soon as that cut ends (``app.cadence.housekeeping``). Each event says what the node is doing
about it, and only what the code does.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.base.diskspace import DiskSpace
from app.base.rejections import Unavailable
from wal import Journal, NoSpace


class DiskLevel(enum.Enum):
    HEALTHY = "healthy"
    LOW_WATER = "low_water"
    STOP_WATER = "stop_water"


class Bound(enum.Enum):
    """What refused a batch; the value is the ``error_type`` label."""

    DISK_FULL = "disk_full"
    DISK_STOP_WATER = "disk_stop_water"
    UNRECLAIMED = "wal_unreclaimed_limit"


@dataclass(frozen=True, slots=True)
class TickDecision:
    """What one housekeeping tick learned, for the housekeeper."""

    level: DiskLevel
    refusing: tuple[Bound, ...]
    free_bytes: int | None

    @property
    def urgent(self) -> bool:
        """Below healthy, or refusing: reclaim now rather than at the next tick."""
        return self.level is not DiskLevel.HEALTHY or bool(self.refusing)


class Admission:
    """Refuses new batches while a bound holds; admits everything when none is set."""

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        low_water_bytes: int = 0,
        stop_water_bytes: int = 0,
        unreclaimed_bytes_limit: int = 0,
        retry_after_secs: int = 60,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        space: DiskSpace | None = None,
        on_urgent: Callable[[], None] | None = None,
        hurry: str = "housekeeping runs at its next tick",
    ) -> None:
        self._journal = journal
        #: the free space as of the last write (``app.base.diskspace``); None: samples only
        self.space = space
        self.low_water_bytes = low_water_bytes
        self.stop_water_bytes = stop_water_bytes
        self.unreclaimed_bytes_limit = unreclaimed_bytes_limit
        self.retry_after_secs = retry_after_secs
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._lock = threading.Lock()
        self._level = DiskLevel.HEALTHY
        self._level_since = clock()
        self._free: int | None = None
        self._sampled_at: float | None = None
        #: the latch the disk refusal was entered or last confirmed on (its cause)
        self._latch: NoSpace | None = None
        self._unreclaimed_since: float | None = None
        #: refused requests per bound since the bound was entered (for the recovery event)
        self._refused: dict[Bound, int] = {}
        #: called (outside the lock) when a refusal is entered between ticks, so the
        #: housekeeper runs a pass now instead of at its next tick
        self.on_urgent = on_urgent
        #: what the housekeeper does on an urgent tick, in the events' words: the
        #: assembly says it (``app.cadence.housekeeping.hurry_words``)
        self.hurry = hurry

    @property
    def path(self) -> Path | None:
        return None if self._journal is None else self._journal.root

    # -- the request path -----------------------------------------------------------------

    @property
    def resume_bytes(self) -> int:
        """Free space at which a tick leaves stop water (and clears the WAL's latch):
        stop water plus an eighth of the gap to low water, so admitting again does not
        put the volume straight back under stop water; 1 when stop water is 0."""
        stop = self.stop_water_bytes
        if not stop:
            return 1
        return stop + max(0, self.low_water_bytes - stop) // 8

    def check(self, tenant: str, nbytes: int = 0) -> None:
        """Raise ``Unavailable`` naming the bound when a batch of ``nbytes`` must be
        refused; return when it may be appended. Reads state only (no system call, no
        sample)."""
        journal = self._journal
        if journal is not None:
            latch = journal.no_space
            if latch is not None and self._latch is None:
                self._enter_full(latch)
            limit = self.unreclaimed_bytes_limit
            if limit and self._unreclaimed_since is None and journal.unreclaimed_bytes > limit:
                self._enter_unreclaimed(journal.unreclaimed_bytes)
        space = self.space
        if space is not None and self.stop_water_bytes and self._level is not DiskLevel.STOP_WATER:
            free = space.free_bytes
            if free is not None and free - nbytes < self.stop_water_bytes:
                self._enter_stop_water(free, nbytes)
        if self._level is DiskLevel.STOP_WATER or self._unreclaimed_since is not None:
            refusal = self._refusal()
            if refusal is not None:
                raise refusal

    def _refusal(self) -> Unavailable | None:
        # read outside the lock: the figure takes the journal's mutex for its end LSN
        figure = self.space.free_bytes if self.space is not None else None
        with self._lock:
            bound: Bound | None
            if self._level is DiskLevel.STOP_WATER:
                bound = Bound.DISK_FULL if self._latch is not None else Bound.DISK_STOP_WATER
            elif self._unreclaimed_since is not None:
                bound = Bound.UNRECLAIMED
            else:
                return None
            self._refused[bound] = self._refused.get(bound, 0) + 1
            message = self._message(bound, figure)
        return Unavailable(message, retry_after=self.retry_after_secs, error_type=bound.value)

    def _message(self, bound: Bound, figure: int | None) -> str:
        cadence = self.retry_after_secs
        figure = self._free if figure is None else figure
        free = "unknown" if figure is None else f"{figure}"
        if bound is Bound.DISK_FULL:
            latch = self._latch
            assert latch is not None
            return (
                f"disk full: the WAL's {latch.op} of {Path(latch.path).name} failed with "
                f"{latch.error}; {free} bytes free as of the last append, "
                f"disk.stop_water_bytes={self.stop_water_bytes}; new batches are refused until "
                f"housekeeping frees space (retry after {cadence} s)"
            )
        if bound is Bound.DISK_STOP_WATER:
            return (
                f"disk below stop water: {free} bytes free on the WAL's filesystem as of the "
                f"last append, under disk.stop_water_bytes={self.stop_water_bytes}; new batches "
                f"are refused until housekeeping frees space (retry after {cadence} s)"
            )
        unreclaimed = 0 if self._journal is None else self._journal.unreclaimed_bytes
        return (
            f"WAL over its unreclaimed bound: {unreclaimed} unreclaimed bytes, over "
            f"wal.unreclaimed_bytes_limit={self.unreclaimed_bytes_limit}; new batches are "
            f"refused until housekeeping reclaims below it (retry after {cadence} s)"
        )

    def _enter_full(self, latch: NoSpace, *, wake: bool = True) -> None:
        with self._lock:
            if self._latch is not None:
                return
            self._latch = latch
            before = self._level
            self._set_level_locked(DiskLevel.STOP_WATER)
        if before is not DiskLevel.STOP_WATER:
            self._emit_stop_water(f"the WAL's {latch.op} of {latch.path} failed: {latch.error}")
        if wake:
            self._urgent()

    def _enter_stop_water(self, free: int, nbytes: int) -> None:
        """The figure fell below stop water between two ticks (``check``)."""
        with self._lock:
            if self._level is DiskLevel.STOP_WATER:
                return
            self._free = free
            self._set_level_locked(DiskLevel.STOP_WATER)
        space = self.space
        written = space.written_since_sample() if space is not None else 0
        owed = space.owed if space is not None else 0
        self._emit_stop_water(
            f"free space as of the last append, {free} bytes (the last sample less {written} "
            f"bytes written since"
            + (f" and the {owed}-byte reserve owed" if owed else "")
            + f"), would fall below disk.stop_water_bytes with a {nbytes}-byte batch"
        )
        self._urgent()

    def _enter_unreclaimed(self, unreclaimed: int, *, wake: bool = True) -> None:
        with self._lock:
            if self._unreclaimed_since is not None:
                return
            self._unreclaimed_since = self._clock()
            self._refused[Bound.UNRECLAIMED] = 0
        self._events(
            "wal.unreclaimed.limit",
            {
                "unreclaimed_bytes": unreclaimed,
                "limit": self.unreclaimed_bytes_limit,
                "action": self._refusing_action(),
            },
        )
        if wake:
            self._urgent()

    def _urgent(self) -> None:
        if self.on_urgent is not None:
            self.on_urgent()

    # -- the tick -------------------------------------------------------------------------

    def observe(self, free_bytes: int | None, latch: NoSpace | None) -> TickDecision:
        """The housekeeping tick: ``free_bytes`` is the figure just after the sample
        (``DiskSpace.free_bytes``; None when the sample failed) and ``latch`` is
        ``Journal.no_space`` read *before* it was sampled. Moves the levels, clears what
        the sample shows is over, and says whether to hurry."""
        journal = self._journal
        if latch is not None and self._latch is None:
            self._enter_full(latch, wake=False)  # this tick is the hurry
        events: list[tuple[str, dict[str, object]]] = []
        with self._lock:
            now = self._clock()
            if free_bytes is not None:
                self._free = free_bytes
                self._sampled_at = now
                stop = self.stop_water_bytes
                # Entering stop water is at stop water; leaving it needs the resume point.
                floor = self.resume_bytes if self._level is DiskLevel.STOP_WATER else stop
                if self._latch is not None and free_bytes >= max(floor, 1):
                    # The sample shows room again: clear the latch seen before sampling.
                    # One set after the sample was taken is newer evidence and stays.
                    if journal is not None and latch is not None:
                        journal.clear_no_space(latch.seq)
                    self._latch = None if journal is None else journal.no_space
                if self._latch is not None or (stop and free_bytes < floor):
                    level = DiskLevel.STOP_WATER
                elif free_bytes < self.low_water_bytes:
                    level = DiskLevel.LOW_WATER
                else:
                    level = DiskLevel.HEALTHY
                before, since = self._level, self._level_since
                if level is not before:
                    self._set_level_locked(level)
                    events.extend(self._level_events(before, level, since, now))
            limit = self.unreclaimed_bytes_limit
            unreclaimed = 0 if journal is None else journal.unreclaimed_bytes
            entered_unreclaimed = False
            if self._unreclaimed_since is not None:
                if not limit or unreclaimed <= limit:
                    since = self._unreclaimed_since
                    self._unreclaimed_since = None
                    events.append(
                        (
                            "wal.unreclaimed.recovered",
                            {
                                "unreclaimed_bytes": unreclaimed,
                                "limit": limit,
                                "refused_requests": self._refused.pop(Bound.UNRECLAIMED, 0),
                                "seconds": round(now - since, 3),
                                "action": self._resumed_action(self._level),
                            },
                        )
                    )
            elif limit and unreclaimed > limit:
                entered_unreclaimed = True
        for name, fields in events:
            self._events(name, fields)
        if entered_unreclaimed:
            self._enter_unreclaimed(unreclaimed, wake=False)
        with self._lock:
            return TickDecision(self._level, self._refusing_locked(), self._free)

    def _set_level_locked(self, level: DiskLevel) -> None:
        before = self._level
        self._level = level
        self._level_since = self._clock()
        if level is DiskLevel.STOP_WATER and before is not DiskLevel.STOP_WATER:
            self._refused[Bound.DISK_FULL] = 0
            self._refused[Bound.DISK_STOP_WATER] = 0

    def _level_events(
        self, before: DiskLevel, after: DiskLevel, since: float, now: float
    ) -> list[tuple[str, dict[str, object]]]:
        base: dict[str, object] = {
            "path": str(self.path),
            "free_bytes": self._free,
            "low_water_bytes": self.low_water_bytes,
            "stop_water_bytes": self.stop_water_bytes,
        }
        if after is DiskLevel.STOP_WATER:
            cause = "free space sampled below disk.stop_water_bytes"
            if self.space is not None and self.space.owed:
                cause += f" (less the {self.space.owed}-byte reserve owed)"
            return [("disk.stop_water", {**base, **self._stop_fields(cause)})]
        if before is DiskLevel.STOP_WATER:
            refused = self._refused.pop(Bound.DISK_FULL, 0) + self._refused.pop(
                Bound.DISK_STOP_WATER, 0
            )
            return [
                (
                    "disk.recovered",
                    {
                        **base,
                        "from": before.value,
                        "to": after.value,
                        "refused_requests": refused,
                        "seconds": round(now - since, 3),
                        "action": self._resumed_action(after),
                    },
                )
            ]
        if after is DiskLevel.LOW_WATER:
            return [
                (
                    "disk.low_water",
                    {
                        **base,
                        "action": f"still admitting; {self.hurry}",
                    },
                )
            ]
        return [("disk.recovered", {**base, "from": before.value, "to": after.value})]

    def _emit_stop_water(self, cause: str) -> None:
        fields: dict[str, object] = {
            "path": str(self.path),
            "free_bytes": self._free,
            "low_water_bytes": self.low_water_bytes,
            "stop_water_bytes": self.stop_water_bytes,
            **self._stop_fields(cause),
        }
        self._events("disk.stop_water", fields)

    def _stop_fields(self, cause: str) -> dict[str, object]:
        return {
            "cause": cause,
            "retry_after_secs": self.retry_after_secs,
            "action": self._refusing_action(),
        }

    def _refusing_action(self) -> str:
        return (
            f"refusing new batches (503, Retry-After {self.retry_after_secs} s); {self.hurry}; "
            f"admission resumes by itself when the bound clears"
        )

    def _resumed_action(self, level: DiskLevel) -> str:
        others = [b.value for b in self._refusing_locked()]
        if others:
            return f"this bound cleared; still refusing on {', '.join(others)}"
        if level is DiskLevel.LOW_WATER:
            return f"admitting again; still below low water: {self.hurry}"
        return "admitting again"

    # -- state ----------------------------------------------------------------------------

    def _refusing_locked(self) -> tuple[Bound, ...]:
        out: list[Bound] = []
        if self._level is DiskLevel.STOP_WATER:
            out.append(Bound.DISK_FULL if self._latch is not None else Bound.DISK_STOP_WATER)
        if self._unreclaimed_since is not None:
            out.append(Bound.UNRECLAIMED)
        return tuple(out)

    @property
    def refusing(self) -> tuple[Bound, ...]:
        """The bounds refusing batches now (empty: admitting)."""
        with self._lock:
            return self._refusing_locked()

    @property
    def level(self) -> DiskLevel:
        return self._level

    @property
    def free_bytes(self) -> int | None:
        return self._free

"""Admission and the housekeeping tick that samples the disk, for their tests: the
water marks, an event recorder, an ``Admission`` over a journal, and a ``journal``
fixture's body."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from app.ingest.admission import Admission
from tests.support.walkit import SMALL, faulty
from wal import Journal

MiB = 1 << 20
LOW, STOP = 8 * MiB, 2 * MiB
CADENCE = 7


class Events:
    """Records the events an ``Admission`` or a ``Housekeeper`` emits, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []

    def __call__(self, name: str, fields: object) -> None:
        self.seen.append((name, dict(fields)))  # type: ignore[call-overload]

    def names(self) -> list[str]:
        return [n for n, _ in self.seen]

    def last(self, name: str) -> dict[str, object]:
        return [f for n, f in self.seen if n == name][-1]


def faulty_journal(tmp_path: Path) -> Iterator[Journal]:
    """The body of a ``journal`` fixture: a journal on a ``FaultyFs``, closed after."""
    j = Journal.open(tmp_path / "wal", SMALL, fs=faulty(tmp_path))
    yield j
    j.close()


def admission(
    journal: Journal, events: Events, hurried: tuple[threading.Event, str] | None = None, **kw: int
) -> Admission:
    """An admission with the suite's bounds; ``hurried``: the wake it rings and the words
    it says, as the node gives them (shared with the housekeeper built on it)."""
    wake, hurry = hurried if hurried is not None else (None, "housekeeping runs at its next tick")
    return Admission(
        journal,
        low_water_bytes=kw.get("low", LOW),
        stop_water_bytes=kw.get("stop", STOP),
        unreclaimed_bytes_limit=kw.get("limit", 0),
        retry_after_secs=CADENCE,
        events=events,
        on_urgent=None if wake is None else wake.set,
        hurry=hurry,
    )

"""TAIL.6: a cut's publishes run inside the node's ``paced`` context, so the encode slots
they take rest after them (``server.encode_duty_percent``); the spiller's and recovery's
publishes, which do not go through a cut, do not. The cut runner's flush alone, with
the publisher replaced by one that records whether each publish ran paced."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest

from app.cadence.cut_runner import CutRunner
from sink.buffers import Detached, PublishOutcome


class Pacing:
    def __init__(self) -> None:
        self.local = threading.local()
        self.entered = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        self.local.on = True
        self.entered += 1
        try:
            yield
        finally:
            self.local.on = False


@pytest.mark.parametrize("lanes", [1, 4])
def test_tail_6_every_publish_of_a_cut_runs_paced(lanes: int) -> None:
    pacing = Pacing()
    seen: list[bool] = []
    lock = threading.Lock()

    def publish(d: Detached) -> PublishOutcome:
        with lock:
            seen.append(getattr(pacing.local, "on", False))
        return PublishOutcome(cast(int, d), True)

    cuts = SimpleNamespace(publisher=SimpleNamespace(publish=publish))
    none = cast(Any, None)
    runner = CutRunner(
        cast(Any, cuts),
        none,
        none,
        none,
        barrier_secs=5.0,
        segment_age_secs=60.0,
        request_cut=lambda: None,
        flush_concurrency=lanes,
        paced=pacing,
    )
    batches = cast(list[Detached], list(range(10)))
    assert runner._flush(batches) == [True] * 10
    assert seen == [True] * 10
    assert pacing.entered == 10

"""app.ingest.stages: the core's three ingest stages for the workers' requests.

Interleavings are made deterministic with the fs seam's holds (``FaultyFs.hold_at``)
and the named sync points (``app.points``): never by sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import points
from app.ingest.stages import Stages
from app.receive.api import IngestOutcome
from app.receive.otlp import FlatBatch, IngestRejection, decode_request, flatten
from tests.support.noderig import NodeRig, request


class Answers:
    """Collects each request's answer; ``wait(n)`` blocks until n have come."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.got: list[tuple[str, IngestOutcome | None, IngestRejection | None]] = []

    def for_(self, tag: str):  # type: ignore[no-untyped-def]
        def answer(outcome: IngestOutcome | None, refusal: IngestRejection | None) -> None:
            with self._cond:
                self.got.append((tag, outcome, refusal))
                self._cond.notify_all()

        return answer

    def wait(self, n: int, timeout: float = 30.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.got) >= n, timeout), self.got


def batch_of(tag: str, n: int = 3, tenant: str = "t") -> tuple[bytes, FlatBatch]:
    data = request(tag, n).SerializeToString()
    return data, flatten(decode_request(data, "application/x-protobuf"), tenant)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[NodeRig]:
    rig = NodeRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


@pytest.fixture
def stages(rig: NodeRig) -> Iterator[Stages]:
    stages = Stages(rig.pipeline)
    stages.start()
    try:
        yield stages
    finally:
        assert stages.close(30)


def test_stages_answer_only_after_the_covering_fsync(rig: NodeRig, stages: Stages) -> None:
    answers = Answers()
    hold = rig.fs.hold_at("fsync", "*.wal")
    data, batch = batch_of("a")
    try:
        stages.submit("t", data, batch, answers.for_("a"))
        assert hold.reached.wait(10)
        # The frame is written and its fsync is running: no answer may exist yet.
        assert answers.got == []
        assert rig.pipeline.latest is None
    finally:
        hold.release()  # even when an assertion failed: the teardown joins the committer
    answers.wait(1)
    ((tag, outcome, refusal),) = answers.got
    assert tag == "a" and refusal is None and outcome == IngestOutcome(3)
    assert rig.pipeline.latest is not None


def test_stages_answer_after_the_turn_in_commit_order(rig: NodeRig, stages: Stages) -> None:
    answers = Answers()
    with points.hold("turn.before_mine") as held:
        try:
            for tag in ("a", "b", "c"):
                data, batch = batch_of(tag)
                stages.submit("t", data, batch, answers.for_(tag))
            assert held.reached.wait(10)
            # durable, but the first turn is held: nothing is acknowledged before its turn
            assert answers.got == []
        finally:
            held.release()
    answers.wait(3)
    assert [tag for tag, _, _ in answers.got] == ["a", "b", "c"]
    assert sorted(rig.published_rids()) == []  # buffered, not yet published
    rig.pipeline.publish_all_now("test")
    assert sorted(rig.published_rids()) == sorted(
        f"{tag}/{i}" for tag in ("a", "b", "c") for i in range(3)
    )


def test_a_refusal_at_admission_is_raised_to_the_submitter_and_writes_nothing(
    rig: NodeRig, stages: Stages
) -> None:
    answers = Answers()
    before = rig.journal.end_lsn
    data, batch = batch_of("big")
    huge = data + b"\x00" * rig.journal.config.max_frame_bytes
    with pytest.raises(IngestRejection) as info:
        stages.submit("t", huge, batch, answers.for_("big"))
    assert info.value.http_status == 413
    assert rig.journal.end_lsn == before and answers.got == []


def test_close_answers_everything_submitted_then_refuses(rig: NodeRig) -> None:
    stages = Stages(rig.pipeline)
    stages.start()
    answers = Answers()
    for tag in ("a", "b"):
        data, batch = batch_of(tag)
        stages.submit("t", data, batch, answers.for_(tag))
    assert stages.close(30)
    assert [(tag, refusal) for tag, _, refusal in answers.got] == [("a", None), ("b", None)]
    data, batch = batch_of("c")
    with pytest.raises(IngestRejection, match="shutting down"):
        stages.submit("t", data, batch, answers.for_("c"))

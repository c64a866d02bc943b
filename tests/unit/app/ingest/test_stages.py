"""app.ingest.stages: the core's three ingest stages for the workers' requests.

Interleavings are made deterministic with the fs seam's holds (``FaultyFs.hold_at``)
and the named sync points (``app.points``): never by sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import pytest

from app import points
from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection
from app.ingest.stages import IngestBacklogFull, Stages, TenantBacklogFull
from app.receive.api import IngestOutcome
from app.receive.otlp import decode_request, flatten
from app.threads import Supervisor
from tests.support.noderig import NodeRig, request
from wal import WalOffset

_Refusal = TypeVar("_Refusal", bound=IngestRejection)


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


def submit_until_refused(
    stages: Stages, answers: Answers, tenant: str, tag: str, refused: type[_Refusal]
) -> tuple[int, _Refusal]:
    """Submit ``tenant``'s frames (tagged ``tag`` 0, 1, ...) while the turn is held, until
    the stages refuse one with ``refused``; how many were accepted first, and the refusal
    (at most ten tries: a bound that never refuses fails the test)."""
    for sent in range(10):
        data, batch = batch_of(f"{tag}{sent}", tenant=tenant)
        try:
            stages.submit(tenant, data, batch, answers.for_(f"{tag}{sent}"))
        except refused as exc:
            return sent, exc
    raise AssertionError(f"{refused.__name__}: the bound never refused")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[NodeRig]:
    with NodeRig(tmp_path) as rig:
        yield rig


BACKLOG = 64 << 20


@pytest.fixture
def stages(rig: NodeRig) -> Iterator[Stages]:
    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG)
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
    finally:
        hold.release()  # even when an assertion failed: the teardown joins the committer
    answers.wait(1)
    ((tag, outcome, refusal),) = answers.got
    assert tag == "a" and refusal is None and outcome == IngestOutcome(3)


def test_issue15_the_ack_comes_before_the_turn_and_no_mark_covers_an_unturned_frame(
    rig: NodeRig, stages: Stages
) -> None:
    """A turn held does not hold the acknowledgement; a cut captured between the acks
    and the turns has no mark (nothing turned), so no checkpoint covers those frames."""
    answers = Answers()
    with points.hold("stages.turn") as held:
        try:
            for tag in ("a", "b", "c"):
                data, batch = batch_of(tag)
                stages.submit("t", data, batch, answers.for_(tag))
            answers.wait(3)  # all three acknowledged while the first turn is held
            assert held.reached.wait(10)
            assert [(tag, refusal) for tag, _, refusal in answers.got] == [
                ("a", None),
                ("b", None),
                ("c", None),
            ]
            assert rig.pipeline.last_durable is None and rig.pipeline.latest is None
            outcome = rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
            assert outcome.mark is None and rig.journal.last_checkpoint is None
        finally:
            held.release()
    assert stages.wait_turned(30)
    latest: WalOffset | None = rig.pipeline.latest  # declared: not the narrowed None above
    assert latest is not None and latest.lsn == rig.journal.end_lsn  # c's own end
    outcome = rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
    checkpoint: WalOffset | None = rig.journal.last_checkpoint  # not the narrowed None above
    assert outcome.complete and checkpoint == latest
    assert sorted(rig.published_rids()) == sorted(
        f"{tag}/{i}" for tag in ("a", "b", "c") for i in range(3)
    )


def test_issue15_the_backlog_bound_refuses_writes_nothing_and_resumes(rig: NodeRig) -> None:
    data, batch = batch_of("a")
    frame = len(data) + 64  # a frame's bytes: the payload and its header
    stages = Stages(rig.pipeline, backlog_bytes=3 * frame)
    stages.start()
    answers = Answers()
    try:
        with points.hold("stages.turn") as held:
            try:
                sent, refusal = submit_until_refused(stages, answers, "t", "b", IngestBacklogFull)
                data, batch = batch_of(f"b{sent}")
                assert 2 <= sent <= 3
                assert refusal.http_status == 503 and refusal.retry_after == 1
                assert refusal.error_type == "ingest_backlog"
                assert f"wal.turn_backlog_bytes={3 * frame}" in refusal.message
                before = rig.journal.end_lsn
                with pytest.raises(IngestBacklogFull):
                    stages.submit("t", data, batch, answers.for_("again"))
                assert rig.journal.end_lsn == before  # nothing written after the refusal
                answers.wait(sent)  # every accepted frame was acknowledged meanwhile
            finally:
                held.release()
        assert stages.wait_turned(30)
        data, batch = batch_of("after")
        stages.submit("t", data, batch, answers.for_("after"))  # the turn thread moved
        answers.wait(sent + 1)
    finally:
        assert stages.close(30)


def test_issue15_replayed_frames_are_turned_before_new_ones(rig: NodeRig) -> None:
    """The turn thread turns every replayed item before any new frame, whatever order
    they arrive in."""
    order: list[str] = []
    release = threading.Event()

    def replay() -> Iterator[str]:
        yield "replayed-1"
        assert release.wait(30)  # new frames are acknowledged while the replay runs
        yield "replayed-2"

    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG)
    answers = Answers()
    finished: list[BaseException | None] = []
    stages.start(replay=replay(), turn_replayed=order.append, replayed=finished.append)
    try:
        with points.hold("stages.turn", count=1) as held:
            data, batch = batch_of("new")
            stages.submit("t", data, batch, answers.for_("new"))
            answers.wait(1)  # acknowledged before the replay has finished
            assert order == ["replayed-1"] and not held.reached.is_set()
            release.set()
            assert held.reached.wait(10)  # the new frame's turn, after the replay
            assert order == ["replayed-1", "replayed-2"] and finished == [None]
            held.release()
        assert stages.wait_turned(30)
        assert rig.published_rids() == [] and rig.pipeline.latest is not None
    finally:
        release.set()
        assert stages.close(30)


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
    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG)
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


def test_bounded_2_one_tenant_over_its_backlog_share_is_refused_and_others_are_not(
    rig: NodeRig,
) -> None:
    data, _ = batch_of("a")
    frame = len(data) + 64
    stages = Stages(rig.pipeline, backlog_bytes=20 * frame, tenant_backlog_bytes=3 * frame)
    stages.start()
    answers = Answers()
    try:
        with points.hold("stages.turn") as held:
            try:
                sent, refusal = submit_until_refused(
                    stages, answers, "noisy", "n", TenantBacklogFull
                )
                assert 2 <= sent <= 3
                assert refusal.error_type == "tenant_backlog" and refusal.retry_after
                assert "'noisy'" in str(refusal) and "miner.tenant_backlog_bytes" in str(refusal)
                # the node-wide backlog has room, and another tenant is admitted
                for i in range(2):
                    data, batch = batch_of(f"q{i}", tenant="quiet")
                    stages.submit("quiet", data, batch, answers.for_(f"q{i}"))
            finally:
                held.release()
        answers.wait(sent + 2)
        assert all(refusal is None for _, _, refusal in answers.got)
        assert stages.wait_turned(30)
        data, batch = batch_of("again", tenant="noisy")
        stages.submit("noisy", data, batch, answers.for_("again"))  # its share is free again
        answers.wait(sent + 3)
    finally:
        stages.close(30)


def test_every_state_1_a_drain_out_of_time_stops_after_the_frame_in_hand_and_counts_the_rest(
    rig: NodeRig,
) -> None:
    """``close`` with a turn held past its time: the turn thread stops after that frame,
    what it never turned is counted (``left``) and stays above the mark (in the WAL)."""
    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG)
    stages.start()
    answers = Answers()
    closed: list[bool] = []
    with points.hold("stages.turn", count=1) as held:
        try:
            for tag in ("a", "b", "c"):
                data, batch = batch_of(tag)
                stages.submit("t", data, batch, answers.for_(tag))
            answers.wait(3)
            assert held.reached.wait(10)  # a's turn is held
            closer = threading.Thread(target=lambda: closed.append(stages.close(0.0)))
            closer.start()
        finally:
            held.release()  # a's turn ends; b and c are never turned
    closer.join(30)
    assert closed == [True]
    frames, size = stages.left
    assert frames == 2 and size > 0
    latest = rig.pipeline.latest
    assert latest is not None and latest.lsn < rig.journal.end_lsn  # b, c above the mark
    assert rig.published_rids() == []


def test_every_state_1_a_halted_replay_turns_nothing_more_and_nothing_new(rig: NodeRig) -> None:
    """``halt`` during a replay: the replay ends at its next item (its iterator closed:
    a decoding window ahead is abandoned), ``replayed`` is still called, and frames
    acknowledged behind the replay are answered and left, never turned."""
    order: list[str] = []
    release = threading.Event()
    waiting = threading.Event()
    closed = threading.Event()

    def replay() -> Iterator[str]:
        try:
            yield "replayed-1"
            waiting.set()  # replayed-1 is turned
            assert release.wait(30)
            yield "replayed-2"
        finally:
            closed.set()

    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG)
    answers = Answers()
    finished: list[BaseException | None] = []
    stages.start(replay=replay(), turn_replayed=order.append, replayed=finished.append)
    data, batch = batch_of("new")
    stages.submit("t", data, batch, answers.for_("new"))
    answers.wait(1)
    assert waiting.wait(30)
    stages.halt()
    release.set()
    assert stages.close(30, drain=False)
    assert order == ["replayed-1"] and finished == [None] and closed.is_set()
    assert stages.left[0] == 1 and rig.pipeline.latest is None


def test_every_state_3_a_crashed_turn_thread_is_not_restarted_and_fails_the_node(
    tmp_path: Path,
) -> None:
    """The turn thread raises (here: at the end of its replay). It is not run again — a
    restart could drop a frame whose turn did not run, and the next turn's mark would
    pass it — so the node is not alive at once, naming the thread; the replay is not
    run a second time."""
    failed = threading.Event()
    events: list[tuple[str, dict[str, object]]] = []

    def record(name: str, fields: Mapping[str, object]) -> None:
        events.append((name, dict(fields)))
        if name == "thread.failed":
            failed.set()

    threads = Supervisor(events=record)
    rig = NodeRig(tmp_path, threads=threads)
    ends: list[BaseException | None] = []

    def replayed(error: BaseException | None) -> None:
        ends.append(error)
        raise RuntimeError("injected: the turn thread's own bookkeeping failed")

    stages = Stages(rig.pipeline, backlog_bytes=BACKLOG, threads=threads)
    try:
        assert rig.pipeline.health_detail == ""  # alive
        stages.start(replay=[], turn_replayed=lambda item: None, replayed=replayed)
        assert failed.wait(10), events
        assert ends == [None]  # once: never restarted into a second replay
        assert not rig.pipeline.alive and not rig.pipeline.ready
        assert "thread turn stopped" in rig.pipeline.health_detail
        assert "may not be restarted" in rig.pipeline.health_detail
        (crashed,) = [f for n, f in events if n == "thread.crashed"]
        assert crashed["thread"] == "turn" and crashed["restarting"] is False
        assert "injected: the turn thread" in str(crashed["traceback"])
        assert threads.restarts["turn"] == 0
    finally:
        assert stages.close(30)
        rig.close()

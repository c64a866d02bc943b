"""app.node.recovery in steps (issue 15): a node is ready after recovery's preparation,
before the replay — and what admission decides meanwhile is what it decides after it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from app.base.batch import FlatBatch
from app.base.rejections import IngestRejection
from app.ingest.tenants import SettlementInProgress
from app.node.recovery import Decoder, Undecodable, decode_here
from app.receive.otlp import decode_request, flatten
from tests.support.decode_slots import spy_native
from tests.support.minerfaults import FaultPlan, FaultyMiners
from tests.support.noderig import NodeRig, request
from wal import WalConfig

EVERY_TIME = 1_000


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[list[NodeRig]]:
    made: list[NodeRig] = []
    yield made
    for rig in made:
        rig.close()


def admit(rig: NodeRig, tenant: str, tag: str) -> IngestRejection | None:
    """Stage 1 for one batch of ``tenant``: None when admitted (and appended)."""
    data = request(tag).SerializeToString()
    batch = flatten(decode_request(data, "application/x-protobuf"), tenant)
    try:
        ticket = rig.pipeline.admit_and_append(tenant, data, batch)
    except IngestRejection as exc:
        return exc
    rig.pipeline.await_durable(ticket)
    rig.pipeline.turn_and_finish(ticket)
    return None


def test_issue15_the_slot_limit_during_the_replay_is_the_limit_after_it(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = NodeRig(tmp_path, config=WalConfig(segment_max_bytes=64 * 1024, max_tenants=2))
    rigs.append(rig)
    rig.ingest("a", "a0")
    rig.ingest("b", "b0")
    rig.restart(crash=True, replay=False)  # prepared: ready, nothing replayed yet
    assert rig.recovery.backlog_bytes > 0
    during = admit(rig, "c", "c0")
    assert during is not None and "max_tenants" in during.message
    assert admit(rig, "a", "a1") is None  # a tenant the WAL holds keeps its slot
    rig.replay_now()
    after = admit(rig, "c", "c1")
    assert after is not None and type(after) is type(during)
    assert after.http_status == during.http_status and after.error_type == during.error_type
    assert admit(rig, "b", "b1") is None


def test_issue15_a_tenant_whose_replay_fails_is_refused_as_settling_as_after_the_replay(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    plan = FaultPlan()
    rig = NodeRig(tmp_path, miners_factory=lambda allocator: FaultyMiners(allocator, plan))
    rigs.append(rig)
    rig.ingest("a", "a0")
    rig.ingest("a", "poison")
    rig.ingest("b", "b0")
    plan.fail_at("op poison step 1 ", "after", times=EVERY_TIME)
    rig.restart(crash=True, replay=False)
    items = rig.recovery.items()
    rig.recovery.turn(next(items))  # a0: fine
    assert admit(rig, "a", "a1") is None  # nothing known against it yet
    rig.recovery.turn(next(items))  # the poison frame: a settles after the start
    during = admit(rig, "a", "a2")
    assert isinstance(during, SettlementInProgress)
    for item in items:
        rig.recovery.turn(item)
    rig.recovery.replayed()
    rig.recovery.finish()
    after = admit(rig, "a", "a3")
    assert isinstance(after, SettlementInProgress)
    assert admit(rig, "b", "b1") is None


def test_issue15_nothing_replayed_is_a_mark(tmp_path: Path, rigs: list[NodeRig]) -> None:
    rig = NodeRig(tmp_path)
    rigs.append(rig)
    for i in range(3):
        rig.ingest("a", f"a{i}")
    rig.restart(crash=True)  # replayed in full: no checkpoint was ever written
    assert rig.pipeline.last_durable is None and rig.pipeline.latest is None
    outcome = rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
    assert outcome.mark is None and rig.journal.last_checkpoint is None
    mark = rig.ingest("a", "live")  # the first new turn is the first mark
    outcome = rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
    assert outcome.mark == mark and rig.journal.last_checkpoint == mark


def test_native_4_the_in_process_replay_decodes_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without workers the replay decodes on its own thread (decode_here): the native
    # decoder's columns, equal to the reference's; a payload it leaves to upb (here an
    # id of a bad length, which the WAL never holds) still gets the upb path's answer,
    # which the replay isolates after its attempts.
    answered = spy_native(monkeypatch)
    payloads = [request(tag, n).SerializeToString() for tag, n in (("a", 2), ("b", 5))]
    bad = request("c", 1)
    bad.resource_logs[0].scope_logs[0].log_records[0].span_id = b"\x01"
    frames = [("t1", payloads[0]), ("t2", payloads[1]), ("t1", bad.SerializeToString())]
    out = list(decode_here(frames))
    assert answered == [2, 5]
    for (tenant, data), got in zip(frames[:2], out[:2], strict=True):
        assert got == flatten(decode_request(data, "application/x-protobuf"), tenant)
    assert isinstance(out[2], Undecodable) and "span_id is 1 bytes" in out[2].error


MARKER = b"undecodable-"


def breaking(marker: bytes) -> Decoder:
    """``decode_here``, with every payload holding ``marker`` replaced by bytes that are
    no OTLP request: it fails each of its attempts."""

    def decode(
        frames: Iterable[tuple[str, bytes]], *, stop: threading.Event, attempts: int
    ) -> Iterator[FlatBatch | Undecodable]:
        broken = ((t, b"\xff\xff" if marker in p else p) for t, p in frames)
        return decode_here(broken, stop=stop, attempts=attempts)

    return decode


def test_every_state_4_a_replayed_frame_that_does_not_decode_is_isolated_and_the_rest_replay(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = NodeRig(tmp_path, decode=breaking(MARKER))
    rigs.append(rig)
    rig.ingest("a", "a0")
    bad = rig.ingest("a", MARKER.decode() + "x")
    rig.ingest("b", "b0")
    rig.ingest("a", "a1")
    report = rig.restart(crash=True)  # the start does not fail on it

    assert list(report.isolated) == [str(bad)] and report.frames == 4
    (fields,) = [f for name, f in rig.events if name == "replay.frame_isolated"]
    assert fields["tenant"] == "a" and fields["attempts"] == 3 and not fields["in_store"]
    assert str(fields["segment"]).endswith(".wal") and isinstance(fields["offset"], int)
    kept = Path(str(fields["saved"]))
    assert kept.read_bytes() == request(f"{MARKER.decode()}x").SerializeToString()
    assert json.loads(kept.with_suffix(".json").read_text())["frame"] == str(bad)
    rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
    assert sorted(rig.published_rids()) == sorted(
        f"{tag}/{i}" for tag in ("a0", "b0", "a1") for i in range(3)
    )
    # its tenant's tree went on past it: a rebuild of the tenant never decodes it
    assert rig.pipeline.folded["a"].lsn > bad.lsn
    assert rig.pipeline.settler.attempts("a", bad) == rig.pipeline.settler.max_attempts


def test_every_state_1_a_cancelled_replay_ends_at_its_next_frame_and_loses_nothing(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = NodeRig(tmp_path)
    rigs.append(rig)
    for i in range(4):
        rig.ingest("a", f"a{i}")
    rig.restart(crash=True, replay=False)
    items = rig.recovery.items()
    rig.recovery.turn(next(items))
    rig.recovery.cancel()
    assert list(items) == []  # the rest is not turned (nor decoded)
    assert rig.recovery.backlog_bytes > 0  # and not reported as replayed
    report = rig.restart(crash=True)  # the next start replays everything
    assert report.frames == 4
    rig.barrier.run_cut(rig.barrier.capture(rotate_idle=False))
    assert sorted(rig.published_rids()) == sorted(f"a{n}/{i}" for n in range(4) for i in range(3))

"""A poison batch is isolated, not retried forever (issue 18 item 4; RFC 0055 §9.4).

A frame whose mining fails on every attempt is retried at most
``wal.frame_mining_attempts`` times in a process — its ingest turn, each settlement
rebuild, a start-up replay — and then isolated: the rebuild skips mining it and its
records are published without templates (``template_id`` 0), so its tenant's entry
resolves, the node-wide mark moves past it and every other tenant's checkpoint,
snapshots and reclamation go on. Recovery's replay applies the same guard: a replayed
frame whose mining raises becomes an entry settled after the start (the tenant's later
frames with it), so a restart never fails on it. Where even the template-less rows
cannot be buffered, or the settlement keeps failing for a reason no frame explains, the
tenant is refused as unrecoverable instead (its frames stay in the WAL).

``NodeRig`` (the real journal, pipeline, barrier, snapshots and housekeeping on a
``FaultyFs``, an in-memory store), failures from ``tests.support.minerfaults``.
"""

from __future__ import annotations

import io
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.cadence.barrier import CutOutcome
from app.ingest.settlement import NO_TEMPLATE, SettleResult
from app.ingest.tenants import SettlementInProgress, TenantUnrecoverable
from tests.support.minerfaults import FaultPlan, Trigger
from tests.support.noderig import FaultyRigs, NodeRig, rids
from wal import WalOffset

Make = Callable[..., tuple[NodeRig, FaultPlan]]
EVERY_TIME = 10**9
BIG = 200  # records per frame: ≈11 KiB, five frames to a 64 KiB segment


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    with FaultyRigs(tmp_path) as rigs:
        yield rigs.build


def step(rig: NodeRig) -> CutOutcome:
    while rig.barrier.pending is not None:
        rig.barrier.step()
    out = rig.barrier.step()
    assert out is not None
    return out


def poison(plan: FaultPlan, tag: str) -> Trigger:
    """Mining fails at record 1 of frame ``tag`` (after widening with it), every time."""
    return plan.fail_at(f"op {tag} step 1 ", "after", times=EVERY_TIME)


def settling_frame(rig: NodeRig, tenant: str) -> WalOffset:
    """The frame the latest ``tenant.settling`` event names."""
    found = [f for n, f in rig.events if n == "tenant.settling" and f["tenant"] == tenant]
    assert found, rig.events
    lsn, _, segment = str(found[-1]["frame"]).partition("@")
    return WalOffset(uuid.UUID(segment), int(lsn))


def templates(rig: NodeRig, tenant: str) -> dict[str, list[int]]:
    """rid -> the template ids of its published rows (one per copy)."""
    out: dict[str, list[int]] = {}
    for key in rig.memory.list("records/"):
        table = pq.read_table(io.BytesIO(rig.memory.get(key)))
        for t, attrs, tid, params in zip(
            table.column("tenant").to_pylist(),
            table.column("attributes").to_pylist(),
            table.column("template_id").to_pylist(),
            table.column("template_params").to_pylist(),
            strict=True,
        ):
            if t == tenant:
                for k, v in attrs:
                    if k == "rid":
                        out.setdefault(v, []).append(tid)
                        if tid == NO_TEMPLATE:
                            assert params == []
    return out


def copies(rig: NodeRig, tenant: str) -> Counter[str]:
    return Counter(rig.published_rids(tenant))


def isolated_events(rig: NodeRig) -> list[dict[str, object]]:
    return [f for n, f in rig.events if n == "tenant.frame_isolated"]


def segment_bases(rig: NodeRig) -> list[int]:
    return sorted(int(p.stem) for p in (rig.root / "data" / "wal").glob("*.wal"))


# -- the bound -------------------------------------------------------------------------------


def test_nowedge_4_a_frame_failing_every_time_is_isolated_at_the_bound_and_the_mark_moves_on(
    make: Make,
) -> None:
    rig, plan = make()  # wal.frame_mining_attempts = 3
    rig.ingest("T", "a0")
    u0 = rig.ingest("U", "u0")
    assert step(rig).mark == u0
    trigger = poison(plan, "tx")
    rig.ingest("T", "tx")  # acknowledged; mining fails (attempt 1)
    tx = settling_frame(rig, "T")
    u1 = rig.ingest("U", "u1", BIG)

    first = step(rig)  # the tick's rebuild fails on tx (attempt 2): the mark stays clamped

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.FAILED]
    assert first.mark == u0 and rig.journal.last_checkpoint == u0
    assert rig.pipeline.settler.attempts("T", tx) == 2 and not isolated_events(rig)

    second = step(rig)  # attempt 3 fails: at the bound, rebuilt at once with tx isolated

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert trigger.fired == 3  # mined exactly the bound's times, never again
    assert second.ok and second.mark == u1 and rig.journal.last_checkpoint == u1
    (event,) = isolated_events(rig)
    assert event["tenant"] == "T" and event["frame"] == str(tx) and event["attempts"] == 3
    assert event["records"] == 3 and event["published"] is True
    assert "InjectedMiningFailure" in str(event["error"])
    assert rig.pipeline.settler.isolated_frames == 1
    got = templates(rig, "T")
    assert {r: got[r] for r in rids("tx")} == {r: [NO_TEMPLATE] for r in rids("tx")}
    assert all(len(got[r]) == 1 and got[r][0] != NO_TEMPLATE for r in rids("a0"))
    assert copies(rig, "U") == Counter([*rids("u0"), *rids("u1", BIG)])
    assert not rig.pipeline.unmined.tenants() and not rig.pipeline.refused

    rig.ingest("T", "t2")  # the tenant goes on, mined with templates
    step(rig)
    assert all(templates(rig, "T")[r] != [NO_TEMPLATE] for r in rids("t2"))
    for i in range(6):
        rig.ingest("U", f"u{i + 2}", BIG)  # rotate past tx's segment
    step(rig)
    rig.housekeeper.step()
    assert segment_bases(rig)[0] > tx.lsn  # the segment holding tx is reclaimed

    rig.restart(crash=True)  # T's snapshot is past tx: nothing of it is mined again

    assert trigger.fired == 3 and not rig.pipeline.unmined.tenants()
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("tx"), *rids("t2")])


def test_nowedge_4_with_one_attempt_the_first_settlement_isolates_without_mining_again(
    make: Make,
) -> None:
    rig, plan = make(mining_attempts=1)
    rig.ingest("T", "a0")
    step(rig)
    trigger = poison(plan, "tx")
    rig.ingest("T", "tx")
    u1 = rig.ingest("U", "u1")

    out = step(rig)

    assert trigger.fired == 1 and out.mark == u1
    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert templates(rig, "T")["tx/1"] == [NO_TEMPLATE]


def test_a_frame_that_fails_once_is_not_isolated(make: Make) -> None:
    """The bound counts failures of one frame: a transient failure settles as before."""
    rig, plan = make(mining_attempts=2)
    rig.ingest("T", "a0")
    step(rig)
    plan.fail_at("op tx step 1 ", "after", times=1)
    rig.ingest("T", "tx")
    step(rig)
    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert not isolated_events(rig)
    assert all(t != [NO_TEMPLATE] for t in templates(rig, "T").values())


# -- replay's guard --------------------------------------------------------------------------


def test_nowedge_4_replay_turns_a_failing_frame_into_an_entry_and_the_node_starts(
    make: Make,
) -> None:
    """A frame that mined live but fails on replay (and every time after): the start
    does not fail; the tenant's later frames are left to its settlement; the others'
    rows are published and their mark moves on; at the bound the frame is isolated."""
    rig, plan = make()
    rig.ingest("T", "a0")
    u0 = rig.ingest("U", "u0")
    step(rig)
    tx = rig.ingest("T", "tx")
    rig.ingest("T", "ty")
    rig.ingest("U", "u1")
    trigger = poison(plan, "tx")  # from now on: the replay is its first attempt

    report = rig.restart(crash=True)

    assert report.unmined == {"T": str(tx)} and report.frames_unmined == 2  # tx and ty
    assert rig.pipeline.unmined.tenants() == {"T"} and trigger.fired == 1
    assert copies(rig, "U") == Counter([*rids("u0"), *rids("u1")])  # replayed and published
    with pytest.raises(SettlementInProgress):
        rig.ingest("T", "t2")  # refused until settled, with a hint
    u2 = rig.ingest("U", "u2")
    assert rig.pipeline.last_durable == u0  # clamped at the checkpoint meanwhile

    step(rig)  # attempt 2
    assert trigger.fired == 2 and rig.journal.last_checkpoint == u0
    out = step(rig)  # attempt 3: isolated, settled

    assert trigger.fired == 3 and out.mark == u2 and rig.journal.last_checkpoint == u2
    got = templates(rig, "T")
    assert {r: got[r] for r in rids("tx")} == {r: [NO_TEMPLATE] for r in rids("tx")}
    assert all(len(got[r]) == 1 and got[r][0] != NO_TEMPLATE for r in rids("ty"))
    assert all(len(got[r]) == 1 for r in rids("a0"))
    rig.ingest("T", "t3")

    rig.restart(crash=True)  # its snapshot is past tx now: the start mines nothing of it

    assert trigger.fired == 3 and rig.report.frames_unmined == 0
    assert all(len(v) == 1 for v in templates(rig, "T").values())


def test_nowedge_4_a_live_failure_then_a_restart_counts_again_and_isolates(make: Make) -> None:
    rig, plan = make()
    rig.ingest("T", "a0")
    rig.ingest("U", "u0")
    step(rig)
    trigger = poison(plan, "tx")
    rig.ingest("T", "tx")  # attempt 1, then the node dies before any tick
    rig.ingest("U", "u1")

    report = rig.restart(crash=True)

    assert list(report.unmined) == ["T"] and trigger.fired == 2  # attempt 1 of this process
    u2 = rig.ingest("U", "u2")
    step(rig)
    out = step(rig)
    assert trigger.fired == 4 and out.ok and out.mark == u2
    assert rig.journal.last_checkpoint == u2 and u2.lsn > settling_frame(rig, "T").lsn
    assert templates(rig, "T")["tx/1"] == [NO_TEMPLATE]
    assert copies(rig, "U") == Counter([*rids("u0"), *rids("u1"), *rids("u2")])


# -- where isolating the frame is not enough: the tenant ------------------------------------


def test_a_frame_whose_rows_cannot_be_buffered_even_untemplated_isolates_its_tenant(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emit fails every time for that frame's rows: after the bound the tenant is
    refused as unrecoverable — its frames stay in the WAL, its frontier behind — and the
    checkpoint moves on for everyone else; a restart (the fault gone) publishes it all."""
    rig, _ = make()
    rig.ingest("T", "a0")
    step(rig)
    real = rig.buffers.add_records

    def add_records(tenant: str, day: int, batch: pa.RecordBatch, **kw: object) -> object:
        attrs = batch.column("attributes").to_pylist()
        if any(v.startswith("tx/") for a in attrs for k, v in a if k == "rid"):
            raise RuntimeError("injected failure inside the emit of tx's rows")
        return real(tenant, day, batch, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rig.buffers, "add_records", add_records)
    rig.ingest("T", "tx")
    step(rig)
    u1 = rig.ingest("U", "u1")
    out = step(rig)

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.UNRECOVERABLE]
    assert out.mark == u1 and rig.journal.last_checkpoint == u1
    assert rig.pipeline.refused == {"T"}
    with pytest.raises(TenantUnrecoverable):
        rig.ingest("T", "t2")
    (event,) = [f for n, f in rig.events if n == "tenant.unrecoverable"]
    assert event["tenant"] == "T" and event["reason"] == "isolated_frame_emit_failed"
    assert rig.journal.published_marks()["T"].terminal
    assert not any(r.startswith("tx/") for r in copies(rig, "T"))

    monkeypatch.undo()
    rig.restart()

    assert copies(rig, "T")["tx/0"] == 1  # replayed above its own frontier: nothing lost


def test_a_settlement_failing_for_no_frame_isolates_the_tenant_at_the_bound(
    make: Make,
) -> None:
    rig, plan = make(mining_attempts=2)
    rig.ingest("T", "a0")
    step(rig)
    plan.fail_at("op tx step 0 ", "before")
    rig.ingest("T", "tx")
    plan.replace_failures = EVERY_TIME  # the swap fails every time
    u1 = rig.ingest("U", "u1")

    step(rig)
    assert [o.result for o in rig.barrier.settlements] == [SettleResult.FAILED]
    out = step(rig)

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.UNRECOVERABLE]
    assert out.mark == u1 and rig.pipeline.refused == {"T"}
    (event,) = [f for n, f in rig.events if n == "tenant.unrecoverable"]
    assert event["reason"] == "settlement_failed"


def test_nowedge_4_a_replayed_entry_re_emits_above_the_gates_its_replay_applied(
    make: Make,
) -> None:
    """A tenant refused as unrecoverable keeps its frontier R behind the checkpoint X
    (its frame above R never published). After a restart whose replay fails on that
    frame again, the settlement must publish above R — the replay's gate — not above X,
    or the frame's records (below X) would never reach the store."""
    rig, plan = make(mining_attempts=2)
    rig.ingest("T", "a0")
    u0 = rig.ingest("U", "u0")
    step(rig)
    poison(plan, "tx")
    plan.replace_failures = EVERY_TIME  # the swap fails too: the tenant is refused
    rig.ingest("T", "tx")
    step(rig)
    step(rig)
    assert rig.pipeline.refused == {"T"}
    u1 = rig.ingest("U", "u1")
    assert step(rig).mark == u1  # X moves past tx; T's frontier stays at u0
    marks = rig.journal.published_marks()["T"]
    assert marks.terminal and marks.records == u0
    plan.replace_failures = 0

    report = rig.restart(crash=True)  # the replay meets tx again (above T's frontier)

    assert list(report.unmined) == ["T"]
    rig.ingest("U", "u2")
    cut = rig.barrier.run_cut(rig.barrier.capture())  # a cut before any settlement
    assert cut.ok and cut.checkpointed is False  # clamped at X
    # T's rows above its frontier were dropped with its tree: the cut must not claim them
    assert rig.journal.published_marks()["T"].records == u0

    report = rig.restart(crash=True)  # and the replay meets tx once more

    assert list(report.unmined) == ["T"]
    rig.ingest("U", "u3")
    step(rig)  # attempt 2 of this process: isolated, settled
    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("tx")])
    assert templates(rig, "T")["tx/0"] == [NO_TEMPLATE]

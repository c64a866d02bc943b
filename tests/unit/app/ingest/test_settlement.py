"""RFC 0055 settlement, in process (``NodeRig``: the real journal, pipeline, barrier,
snapshots and housekeeping on a ``FaultyFs``, an in-memory store).

Mining failures are injected with ``tests.support.minerfaults`` (a miner raising at a
chosen record, before or after mining it), store failures with ``FailingStore``.
Interleavings use named sync points, never sleeps. The criterion ids are RFC 0055's
§5 labels (``rfc0055_1`` …) and its §9.5 draft legs (``rfc0055_9_5``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import pytest

from app import points
from app.base.rejections import PayloadTooLarge
from app.cadence.barrier import CutOutcome
from app.ingest.settlement import EntryState, SettleResult
from app.ingest.snapshot_store import decode_snapshot
from app.ingest.tenants import SettlementInProgress, TenantCapacity, TenantUnrecoverable
from app.receive.otlp import decode_request, flatten
from tests.support.minerfaults import FaultPlan
from tests.support.noderig import FaultyRigs, NodeRig, bodies_request, record_rows, rids
from tests.support.threads import Worker
from wal import ConsumerMode, FloorPinned, WalConfig, WalOffset
from wal.reclamation import UnrecoverableTenant
from wal.segment_ledger import NoConsumerHorizons

T = TypeVar("T")
WAIT_S = 10.0


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[NodeRig, FaultPlan]]]:
    with FaultyRigs(tmp_path) as rigs:
        yield rigs.build


def step(rig: NodeRig) -> CutOutcome:
    out = rig.barrier.step()
    assert out is not None
    return out


def fresh_cut(rig: NodeRig) -> CutOutcome:
    """Run the rotation-fired cuts waiting in the pending slot, then a timer cut."""
    while rig.barrier.pending is not None:
        step(rig)
    return step(rig)


def horizon(rig: NodeRig, tenant: str) -> WalOffset | None:
    path = rig.snapshots.path_of(tenant)
    if not path.exists():
        return None
    return decode_snapshot(path.read_bytes(), path).horizon


def ingest_bodies(rig: NodeRig, tenant: str, tag: str, bodies: Sequence[str]) -> WalOffset:
    """One frame whose records carry ``bodies`` and ``rid`` attributes ``tag/i``."""
    data = bodies_request(tag, bodies).SerializeToString()
    batch = flatten(decode_request(data, "application/x-protobuf"), tenant)
    rig.pipeline.ingest(tenant, data, batch, "test")
    latest = rig.pipeline.latest
    assert latest is not None
    return latest


def copies(rig: NodeRig, tenant: str) -> Counter[str]:
    return Counter(rig.published_rids(tenant))


# -- the clamp and the barrier ------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
def test_rfc0055_9_5_an_unresolved_entry_clamps_the_mark_and_withholds_only_its_snapshot(
    make: Callable[..., tuple[NodeRig, FaultPlan]], when: Literal["before", "after"]
) -> None:
    """A barrier taken while an entry is unresolved (healthy store) stamps no mark past
    the clamp and installs no snapshot for the entry's tenant while installing the
    others'; once the tick settles it, the next barrier stamps the latest offset and
    snapshots the tenant again — on the timer alone, with no append for it."""
    rig, plan = make()
    a0 = rig.ingest("T", "a0")
    u0 = rig.ingest("U", "u0")
    assert step(rig).mark == u0
    plan.fail_at("op t1 step 1 ", when)  # record 1 widens T's template ("after": widened)
    assert rig.ingest("T", "t1") == u0  # acknowledged, not mined: the latest stays u0
    assert rig.pipeline.unmined.tenants() == {"T"}
    u1 = rig.ingest("U", "u1")
    assert rig.pipeline.last_durable == u0  # the clamp: the previous acknowledged offset

    cut = rig.barrier.run_cut(rig.barrier.capture())  # a cut without the settle step

    assert cut.ok and cut.mark == u0 and rig.journal.last_checkpoint == u0
    assert horizon(rig, "T") == a0 and horizon(rig, "U") == u1
    with pytest.raises(SettlementInProgress) as refused:
        rig.ingest("T", "t2")
    assert refused.value.error_type == "wal_settling" and "'T'" in refused.value.message
    assert refused.value.retry_after is not None and 1 <= refused.value.retry_after <= 300

    out = step(rig)  # the tick settles T, then captures

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert out.ok and out.mark == u1 and rig.journal.last_checkpoint == u1
    assert horizon(rig, "T") == rig.pipeline.folded["T"] and not rig.pipeline.unmined.tenants()
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("t1")])
    assert rig.pipeline.settler.rebuilds == 1
    assert [n for n, _ in rig.events if n.startswith("tenant.")] == [
        "tenant.settling",
        "tenant.settled",
    ]


def test_rfc0055_9_5_a_restart_in_the_clamped_window_restores_the_previous_snapshot_and_replays(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    rig, plan = make()
    a0 = rig.ingest("T", "a0")
    u0 = rig.ingest("U", "u0")
    step(rig)
    plan.fail_at("op t1 step 0 ", "after")
    rig.ingest("T", "t1")
    rig.ingest("U", "u1")
    cut = rig.barrier.run_cut(rig.barrier.capture())
    assert cut.mark == u0 and horizon(rig, "T") == a0

    report = rig.restart(crash=True)

    assert report.frames_skipped >= 1  # T's a0 (at its snapshot) is folded already
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("t1")])
    assert copies(rig, "U") == Counter([*rids("u0"), *rids("u1")])
    assert rig.pipeline.tenants.slot("T") is not None and rig.ingest("T", "t2")


def test_rfc0055_9_5_two_entries_the_mark_is_the_lower_clamp_until_both_settle(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    rig, plan = make()
    rig.ingest("T", "a0")
    v0 = rig.ingest("V", "v0")
    step(rig)
    plan.fail_at("op t1 step 0 ", "before")
    plan.fail_at("op v1 step 0 ", "before")
    rig.ingest("T", "t1")  # clamp: v0
    u1 = rig.ingest("U", "u1")
    rig.ingest("V", "v1")  # clamp: u1
    u2 = rig.ingest("U", "u2")
    settler = rig.pipeline.settler

    assert rig.pipeline.last_durable == v0
    assert settler.settle("T", force_publish=False).result is SettleResult.SETTLED
    assert rig.pipeline.last_durable == u1  # the remaining entry's clamp, no further
    assert settler.settle("V", force_publish=False).result is SettleResult.SETTLED
    assert rig.pipeline.last_durable == u2  # the latest acknowledged offset again
    assert step(rig).mark == u2
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("t1")])
    assert copies(rig, "V") == Counter([*rids("v0"), *rids("v1")])


# -- the rebuild ------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
def test_rfc0055_3_the_rebuild_publishes_no_row_under_a_template_id_it_did_not_allocate(
    make: Callable[..., tuple[NodeRig, FaultPlan]], when: Literal["before", "after"]
) -> None:
    """The discarded tree's buffered rows are dropped in the swap's section: rows of
    templates the old tree created after the snapshot (ids the replay does not allocate)
    reach no object; the replay's rows carry the rebuilt tree's ids, each with its full
    audit history; each record is present exactly once. ``after``: the failure comes
    after a template was widened and before its event was emitted."""
    rig, plan = make()
    ingest_bodies(rig, "T", "a0", ["user alice logged in from host h1"])
    step(rig)
    before = {tid for _, tid in record_rows(rig, "T")}
    ingest_bodies(rig, "T", "t1", ["disk sda is 91 percent full", "disk sdb is 97 percent full"])
    ingest_bodies(rig, "T", "t2", ["cache miss for key a1 on shard 4"])
    old_tree = {t.template_id for t in rig.miners.miner("T").templates()} - before
    assert len(old_tree) == 2  # created by the live tree after the snapshot
    plan.fail_at("cache miss for key b2", when)  # widens the t2 template
    ingest_bodies(
        rig, "T", "t3", ["cache miss for key b2 on shard 9", "user bob logged in from host h2"]
    )

    out = step(rig)

    settled = rig.barrier.settlements[0]
    assert settled.result is SettleResult.SETTLED and settled.dropped > 0 and out.ok
    rows = record_rows(rig, "T")
    assert Counter(r for r, _ in rows) == Counter(["a0/0", "t1/0", "t1/1", "t2/0", "t3/0", "t3/1"])
    used = {tid for _, tid in rows}
    assert not used & old_tree, "a row was published under the discarded tree's template id"
    audit = rig.audit_rows()
    assert not {r["template_id"] for r in audit} & old_tree
    versions: dict[int, set[int]] = {}
    for r in audit:
        versions.setdefault(r["template_id"], set()).add(r["template_version"])
    for tid in used:
        assert tid in versions and versions[tid] == set(range(1, max(versions[tid]) + 1)), (
            f"template {tid} has an incomplete audit history: {versions.get(tid)}"
        )
    widened = [r for r in audit if r["change"] == "changed" and "shard <*>" in r["template"]]
    assert widened, "the widening lost with the failure was re-derived with its event"


def test_rfc0055_9_5_settlement_rebuilds_from_the_ledger_not_the_directory(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """A visible .snap is no authority in process: the rebuild starts from the
    SnapshotLedger's retained state, whatever the directory holds."""
    rig, plan = make()
    a0 = rig.ingest("T", "a0")
    step(rig)
    assert horizon(rig, "T") == a0 and rig.ledger.state("T") is not None
    rig.ingest("T", "t1")
    plan.fail_at("op t2 step 0 ", "before")
    rig.ingest("T", "t2")
    path = rig.snapshots.path_of("T")
    path.write_bytes(b"renamed but never parent-fsynced, or left by a failed write")
    (path.parent / "T.999999.snap.tmp").write_bytes(b"a stale temp")

    step(rig)

    settled = rig.barrier.settlements[0]
    assert settled.result is SettleResult.SETTLED
    assert settled.frames == 2  # t1 and t2: replayed from the ledger's horizon a0
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("t1"), *rids("t2")])


def test_rfc0055_9_5_settlement_reads_in_bounded_calls_and_an_append_lands_between_them(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    rig, plan = make()
    rig.ingest("T", "a0")
    step(rig)
    for i in range(4):
        rig.ingest("T", f"t{i}")
    plan.fail_at("op t4 step 0 ", "before")
    rig.ingest("T", "t4")
    rig.pipeline.settler.read_limit = 2
    with points.hold("settlement.read") as read:
        settle = Worker("settle", lambda: rig.pipeline.settler.settle("T", force_publish=False))
        assert read.reached.wait(WAIT_S)
        u = rig.ingest("U", "u0")  # the journal mutex and the pipeline locks are free
        assert rig.pipeline.latest == u
        read.release()
        outcome = settle.join()
    assert outcome.result is SettleResult.SETTLED and outcome.frames == 5
    assert read.hits == 3  # 2 + 2 + 1 frames: three calls


def test_rfc0055_9_5_the_tick_and_a_turn_racing_for_one_entry_make_exactly_one_rebuild(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The loser observes the entry Settling and runs only after the rebuild installed
    the tenant; a request issued mid-rebuild is refused with a hint; another tenant's
    request is admitted (it waits for its turn in commit order); no settlement path
    takes the ingest gate (the tick never enters it)."""
    rig, plan = make()
    rig.ingest("T", "a0")
    step(rig)
    plan.fail_at("op t1 step 0 ", "before")
    with points.hold("turn.before_mine") as first:
        w1 = Worker("t1", lambda: rig.ingest("T", "t1"))
        assert first.reached.wait(WAIT_S)
        with points.hold("ingest.appended") as appended:
            w2 = Worker("t2", lambda: rig.ingest("T", "t2"))  # admitted before the failure
            assert appended.reached.wait(WAIT_S)
        with points.hold("turn.settling") as loser, points.hold("settlement.claimed") as won:
            first.release()  # t1's turn fails to mine; t2's turn finds the entry
            w1.join()
            assert loser.reached.wait(WAIT_S)
            tick = Worker("barrier", lambda: rig.barrier.step(timer=False))
            assert won.reached.wait(WAIT_S)
            with pytest.raises(SettlementInProgress) as refused:
                rig.ingest("T", "t3")
            assert refused.value.retry_after == 1  # a rebuild is running
            other = Worker("u0", lambda: rig.ingest("U", "u0"))
            with points.hold("settlement.lost") as lost:
                loser.release()
                assert lost.reached.wait(WAIT_S)
            assert rig.pipeline.unmined.of("T")[0].state is EntryState.SETTLING
            won.release()
            tick.join()
            w2.join()
            other.join()
    assert rig.pipeline.settler.rebuilds == 1
    step(rig)
    assert copies(rig, "T") == Counter([*rids("a0"), *rids("t1"), *rids("t2")])
    assert copies(rig, "U") == Counter(rids("u0"))


# -- failures inside the settlement -------------------------------------------------------


@pytest.mark.parametrize("where", ["replay", "replace_tenant"])
def test_rfc0055_9_5_a_failure_inside_the_settlement_returns_the_entry_to_unresolved(
    make: Callable[..., tuple[NodeRig, FaultPlan]], where: str
) -> None:
    rig, plan = make()
    rig.ingest("T", "a0")
    step(rig)
    rig.ingest("T", "t1")
    plan.fail_at("op t2 step 0 ", "before")
    rig.ingest("T", "t2")
    if where == "replay":
        plan.fail_at("op t1 step 2 ", "after")  # t1 is re-mined by the rebuild
    else:
        plan.replace_failures = 1

    first = step(rig)

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.FAILED]
    (entry,) = rig.pipeline.unmined.of("T")
    assert entry.state is EntryState.UNRESOLVED and entry.failures == 1
    assert entry.done.is_set()  # waiters were signalled
    assert first.ok and first.mark == rig.journal.last_checkpoint
    with pytest.raises(SettlementInProgress):
        rig.ingest("T", "t3")  # still refused, with a fresh hint

    step(rig)  # the next tick claims it afresh

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert rig.pipeline.settler.rebuilds == 1
    step(rig)
    got = copies(rig, "T")
    assert set(got) == {*rids("a0"), *rids("t1"), *rids("t2")}
    assert all(n <= 2 for n in got.values()) and got["a0/0"] == 1


# -- the copy bounds ----------------------------------------------------------------------


def test_rfc0055_9_5_copies_exactly_once_at_most_twice_never_absent_and_no_more_after_restarts(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """Records at or below the tenant's frontier are present exactly once; records in
    the ambiguous span (published by the discarded tree before the failure, above the
    frontier) at most twice; none absent. Once the settlement's forced frontier write
    has landed, repeated crashes replay nothing of the span again."""
    rig, plan = make(flush_bytes=1)  # every frame's rows take the size trigger
    rig.publisher.start()
    rig.ingest("T", "a0")
    step(rig)  # X at a0: the frontier
    for tag in ("b1", "b2"):
        rig.ingest("T", tag)  # published by the publisher thread, above X
    for item in rig.buffers.in_flight.pending_for("T"):
        item.wait()
    assert set(copies(rig, "T")) == {*rids("a0"), *rids("b1"), *rids("b2")}
    plan.fail_at("op t3 step 1 ", "after")
    rig.ingest("T", "t3")

    rig.barrier.settle()
    settled = rig.barrier.settlements[0]
    assert settled.result is SettleResult.SETTLED and settled.marks_written

    got = copies(rig, "T")
    assert all(got[r] == 1 for r in rids("a0"))  # at or below the frontier
    assert all(1 <= got[r] <= 2 for r in [*rids("b1"), *rids("b2")])  # the ambiguous span
    assert all(got[r] == 1 for r in rids("t3"))  # never absent
    print(f"copies after the settlement: {sorted(got.items())}")
    assert rig.journal.published_marks()["T"].records == rig.pipeline.folded["T"]
    for _ in range(2):
        rig.restart(crash=True)
        assert copies(rig, "T") == got  # no further copy, however often it crashes


def test_rfc0055_1_restart_does_not_republish_a_settled_audit_group(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    rig, plan = make()
    rig.ingest("T", "a0")
    step(rig)
    plan.fail_at("op t1 step 1 ", "after")  # a widening whose event the failure lost
    rig.ingest("T", "t1")
    rig.barrier.settle()
    assert rig.barrier.settlements[0].marks_written
    audit = Counter(
        (r["template_id"], r["template_version"], r["wal_lsn"]) for r in rig.audit_rows()
    )
    assert audit and all(n == 1 for n in audit.values())

    rig.restart(crash=True)

    again = Counter(
        (r["template_id"], r["template_version"], r["wal_lsn"]) for r in rig.audit_rows()
    )
    assert again == audit and rig.report.audit_events_suppressed >= 0


# -- an unrecoverable tenant ----------------------------------------------------------------


BIG = 200  # records per frame: ≈11 KiB, five frames to a 64 KiB segment


def test_rfc0055_9_5_an_unrecoverable_tenant_is_isolated_and_the_checkpoint_advances_for_others(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """Restorable horizon below reclaimed_through: the entry is not rebuilt; the tenant is
    refused (server-terminal, naming it) after the size check; its entry leaves the
    clamp set, so the node-wide checkpoint advances past its frame; no snapshot is
    installed for it; its frames stay pinned while housekeeping goes on; the state is
    exported once. Its PUBLISHED frontier stays behind, so a restart replays it in
    full — nothing acknowledged is lost."""
    rig, plan = make()
    for i in range(8):
        rig.ingest("T", f"t{i}", BIG)  # several segments of T
    u0 = rig.ingest("U", "u0")
    assert fresh_cut(rig).mark == u0
    rig.housekeeper.step()
    reclaimed = rig.journal.reclaimed_through("T")
    assert reclaimed is not None  # T's older segments are gone, covered by its snapshot
    t_horizon = horizon(rig, "T")
    plan.fail_at("op tx step 0 ", "before")
    rig.ingest("T", "tx")
    plan.restore_failures = 1  # the retained state does not restore: horizon none

    rig.barrier.settle()

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.UNRECOVERABLE]
    assert rig.pipeline.refused == {"T"} and not rig.pipeline.unmined.tenants()
    with pytest.raises(TenantUnrecoverable) as refused:
        rig.ingest("T", "ty")
    assert refused.value.error_type == "wal_tenant_unrecoverable"
    assert refused.value.retry_after is None and "'T'" in refused.value.message
    big = b"x" * (rig.config.max_frame_bytes + 1)
    batch = flatten(decode_request(b"", "application/x-protobuf"), "T")
    with pytest.raises(PayloadTooLarge):
        rig.pipeline.ingest("T", big, batch, "test")  # the size check comes first
    events = [f for n, f in rig.events if n == "tenant.unrecoverable"]
    assert len(events) == 1 and events[0]["tenant"] == "T"
    marks = rig.journal.published_marks()["T"]
    assert marks.terminal and marks.records is not None and marks.records.lsn <= u0.lsn

    u1 = rig.ingest("U", "u1")
    out = fresh_cut(rig)
    assert out.ok and out.mark == u1 and rig.journal.last_checkpoint == u1  # past T's frame
    assert horizon(rig, "T") == t_horizon and horizon(rig, "U") == u1
    rig.barrier.settle()
    assert rig.barrier.settlements == []  # a refused entry is not retried
    rig.housekeeper.step()
    floor = rig.journal.reclaim_state().floor
    assert isinstance(floor, FloorPinned) and "T" in floor.pinned
    assert rig.journal.published_marks()["T"] == marks  # its frontier stays behind
    assert "T" not in copies(rig, "T") or not any(r.startswith("tx/") for r in copies(rig, "T"))

    report = rig.restart()  # the snapshot on disk restores: the start is not refused

    assert report.frontiers >= 2
    got = copies(rig, "T")
    assert all(got[r] == 1 for r in rids("tx"))  # replayed above T's own frontier
    assert all(got[r] >= 1 for i in range(8) for r in rids(f"t{i}", BIG))
    assert copies(rig, "U") == Counter([*rids("u0"), *rids("u1")])
    rig.ingest("T", "tz")  # the terminal bit governs the horizon, not admission


def test_unrecoverable_at_restart_halts_naming_the_tenant(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The same shape found at start-up (no restorable snapshot, frames reclaimed under
    Known) refuses the start naming the tenant (RFC 0052 §3.2)."""
    rig, _ = make()
    for i in range(8):
        rig.ingest("T", f"t{i}", BIG)
    fresh_cut(rig)
    rig.housekeeper.step()
    assert rig.journal.reclaimed_through("T") is not None
    rig.close()
    rig.snapshots.path_of("T").unlink()
    with pytest.raises(UnrecoverableTenant, match="'T'"):
        rig.start()
    rig.journal.close()


def test_rfc0055_4_a_first_write_whose_mining_fails_keeps_its_reservation_through_restart(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """Settlement installs a tenant outside admission, so the failed first write keeps
    its Reserved slot: another new id cannot take it, and the settlement converts it to
    Held (RFC0055.4: max_tenants holds across the unwind and the restart)."""
    rig, plan = make(config=WalConfig(segment_max_bytes=64 * 1024, max_tenants=2))
    rig.ingest("U", "u0")
    plan.fail_at("op t0 step 0 ", "before")
    rig.ingest("T", "t0")  # acknowledged; its mining failed: Reserved, pending settlement
    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved, usage.free) == (1, 1, 0)
    with pytest.raises(TenantCapacity) as refused:
        rig.ingest("V", "v0")
    assert refused.value.count == 2 and refused.value.limit == 2
    assert "'V'" in refused.value.message and refused.value.retry_after is None

    step(rig)

    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved, usage.free) == (2, 0, 0)
    assert copies(rig, "T") == Counter(rids("t0"))
    rig.restart(crash=True)
    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved, usage.free) == (2, 0, 0)  # seeded before listeners
    with pytest.raises(TenantCapacity):
        rig.ingest("V", "v0")
    rig.ingest("T", "t1")


def test_rfc0055_9_5_a_tenant_with_no_installed_snapshot_is_rebuilt_by_a_full_replay(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """From empty, replaying from its oldest surviving frame — never the span alone — so
    a template defined before the span is in the rebuilt tree."""
    rig, plan = make()
    ingest_bodies(rig, "T", "a0", ["disk sda is 91 percent full"])
    plan.fail_at("disk sdb", "after")
    ingest_bodies(rig, "T", "t1", ["disk sdb is 97 percent full"])  # widens a0's template
    assert rig.ledger.state("T") is None

    rig.barrier.settle()

    settled = rig.barrier.settlements[0]
    assert settled.result is SettleResult.SETTLED and settled.frames == 2
    templates = [t.template for t in rig.miners.miner("T").templates()]
    assert templates == ["disk <*> is <*> percent full"]
    assert copies(rig, "T") == Counter(["a0/0", "t1/0"])


def test_rfc0055_9_5_a_failure_after_mining_returned_is_settled_the_same_way(
    make: Callable[..., tuple[NodeRig, FaultPlan]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mined, then the emit into the sink raised with part of it buffered: the record is
    present at most twice, never absent."""
    rig, _ = make()
    rig.ingest("T", "a0")
    step(rig)
    real = rig.buffers.add_records
    failures = [1]

    def add_records(tenant: str, day: int, batch: object, **kw: object) -> object:
        if tenant == "T" and failures:
            failures.pop()
            raise RuntimeError("injected failure inside the emit")
        return real(tenant, day, batch, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rig.buffers, "add_records", add_records)
    rig.ingest("T", "t1")  # its template events were buffered before the failure
    assert rig.pipeline.unmined.tenants() == {"T"}

    step(rig)

    assert rig.pipeline.settler.rebuilds == 1
    got = copies(rig, "T")
    assert set(got) == {*rids("a0"), *rids("t1")} and all(n == 1 for n in got.values())


def test_rfc0055_9_5_a_no_consumer_entry_rebuilds_from_empty_rather_than_refusing(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """reclaimed_through written under NoConsumer is checkpoint-covered (no miner state
    was ever expected): a tenant with no restorable snapshot rebuilds from empty and
    pins, while the same shape under Known is refused (the unrecoverable test)."""
    rig, plan = make()
    for i in range(8):
        rig.ingest("T", f"t{i}", BIG)
    fresh_cut(rig)
    rig.journal.maintain(NoConsumerHorizons(), rig.config.max_unlinks_per_pass)
    reclaimed = rig.journal.reclaimed_through("T")
    assert reclaimed is not None and reclaimed[0] is ConsumerMode.NO_CONSUMER
    plan.fail_at("op tx step 0 ", "before")
    rig.ingest("T", "tx")
    plan.restore_failures = 1

    rig.barrier.settle()

    assert [o.result for o in rig.barrier.settlements] == [SettleResult.SETTLED]
    assert not rig.pipeline.refused

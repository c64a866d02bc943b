"""Tenant slots (RFC 0055 §9.1, §9.5): ``max_tenants`` admission under the admission
mutex — Reserved (shared by concurrent first writes), Held, the reservation kept while
an unacknowledged frame can still be replayed, seeded from recovery — on the table
alone and through the real pipeline (``NodeRig``).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import points
from app.base.rejections import PayloadTooLarge, Unavailable
from app.ingest.pipeline import LATCH_CLEAR
from app.ingest.tenants import (
    NewTenantRate,
    SettlementInProgress,
    SlotState,
    TenantCapacity,
    TenantCountExceeded,
    TenantTable,
    TenantUnrecoverable,
    TurnResult,
)
from app.receive.otlp import decode_request, flatten
from tests.support.noderig import NodeRig, rids, rig_factory
from wal import AppendError, RotationExhausted, RotationKind, WalConfig

WAIT_S = 10.0


def cfg(max_tenants: int) -> WalConfig:
    return WalConfig(segment_max_bytes=64 * 1024, max_tenants=max_tenants)


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    yield from rig_factory(tmp_path)


# -- the table ---------------------------------------------------------------------------


def test_concurrent_first_writes_for_one_id_share_one_reserved_slot() -> None:
    table = TenantTable(2)
    first = table.admit("a", 1)
    second = table.admit("a", 1)
    assert first.first and second.first
    assert (table.usage().held, table.usage().reserved) == (0, 1)
    table.finish(first, TurnResult.NO_FRAME)
    assert table.slot("a") is SlotState.RESERVED  # the other write is still in flight
    table.finish(second, TurnResult.MINED)
    assert table.slot("a") is SlotState.HELD and table.usage().free == 1
    again = table.admit("a", 1)
    assert not again.first  # a held tenant takes nothing


@pytest.mark.parametrize(
    ("result", "kept"),
    [
        pytest.param(TurnResult.NO_FRAME, False, id="append_failed_released"),
        pytest.param(TurnResult.FRAME_LEFT, True, id="sync_failed_kept"),
        pytest.param(TurnResult.UNMINED, True, id="mining_failed_kept"),
    ],
)
def test_a_reservation_is_released_only_when_nothing_can_replay_or_settle_it(
    result: TurnResult, kept: bool
) -> None:
    table = TenantTable(1)
    table.finish(table.admit("a", 1), result)
    assert (table.slot("a") is SlotState.RESERVED) is kept
    if kept:
        with pytest.raises(TenantCapacity):
            table.admit("b", 1)
    else:
        table.admit("b", 1)


def test_the_usage_states_sum_to_the_limit() -> None:
    table = TenantTable(4)
    table.seed(["a"])
    table.admit("b", 1)
    usage = table.usage()
    assert (usage.held, usage.reserved, usage.free) == (1, 1, 2)
    assert usage.held + usage.reserved + usage.free == usage.limit


def test_seeding_more_tenants_than_the_limit_refuses_the_start() -> None:
    with pytest.raises(TenantCountExceeded, match="restored 3 tenants but max_tenants=2"):
        TenantTable(2).seed(["a", "b", "c"])


def test_a_settling_tenant_is_refused_with_the_hint_and_an_unrecoverable_one_without() -> None:
    table = TenantTable(4)
    table.set_settling("a", True)
    with pytest.raises(SettlementInProgress) as settling:
        table.admit("a", 7)
    assert settling.value.retry_after == 7 and settling.value.error_type == "wal_settling"
    table.set_unrecoverable("a", "detail")
    table.set_settling("a", False)  # one refusal reason: the terminal one stays
    with pytest.raises(TenantUnrecoverable) as terminal:
        table.admit("a", 7)
    assert terminal.value.retry_after is None and "'a'" in terminal.value.message


# -- through the pipeline ------------------------------------------------------------------


def test_rfc0055_9_5_a_new_tenant_at_the_limit_is_refused_naming_it_and_held_ones_are_admitted(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig(config=cfg(2))
    rig.ingest("A", "a0")
    rig.ingest("B", "b0")
    with pytest.raises(TenantCapacity) as refused:
        rig.ingest("C", "c0")
    err = refused.value
    assert (err.http_status, err.error_type, err.retry_after) == (503, "wal_tenant_cap", None)
    assert "'C'" in err.message and "2 of max_tenants=2" in err.message
    assert err.records == 3
    rig.ingest("A", "a1")  # existing tenants are unaffected
    assert rig.pipeline.failed_epoch == LATCH_CLEAR  # no latch
    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved, usage.free) == (2, 0, 0)
    assert rig.journal.end_lsn == rig.pipeline.latest.lsn  # type: ignore[union-attr]


def test_rfc0055_9_5_a_burst_of_new_ids_never_overshoots_the_limit(
    make_rig: Callable[..., NodeRig],
) -> None:
    seed = random.SystemRandom().randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    limit = 5
    rig = make_rig(config=cfg(limit))
    names = [f"t{rng.randrange(10**6):06d}-{i}" for i in range(16)]
    start = threading.Barrier(len(names))
    outcomes: dict[str, str] = {}
    lock = threading.Lock()

    def send(name: str) -> None:
        start.wait(WAIT_S)
        try:
            rig.ingest(name, name)
            got = "ok"
        except TenantCapacity:
            got = "cap"
        with lock:
            outcomes[name] = got

    threads = [threading.Thread(target=send, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert Counter(outcomes.values()) == {"ok": limit, "cap": len(names) - limit}, seed
    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved, usage.free) == (limit, 0, 0)


def test_rfc0055_9_5_two_concurrent_first_writes_for_one_new_id_share_a_slot(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig(config=cfg(1))
    results: list[str] = []
    with points.hold("turn.before_mine") as turn:
        first = threading.Thread(target=lambda: results.append(str(rig.ingest("N", "n0"))))
        first.start()
        assert turn.reached.wait(WAIT_S)
        with points.hold("ingest.appended") as appended:
            second = threading.Thread(target=lambda: results.append(str(rig.ingest("N", "n1"))))
            second.start()
            assert appended.reached.wait(WAIT_S)
            usage = rig.pipeline.tenants.usage()
            assert (usage.held, usage.reserved, usage.free) == (0, 1, 0)  # one shared slot
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert len(results) == 2
    usage = rig.pipeline.tenants.usage()
    assert (usage.held, usage.reserved) == (1, 0)


def test_rfc0055_4_a_failed_sync_keeps_the_reservation_and_a_restart_holds_the_tenant(
    make_rig: Callable[..., NodeRig],
) -> None:
    """A sync that failed leaves the frame in the segment, unacknowledged: replay after
    a restart re-mines it and seeds the tenant Held, so the slot must not be given away
    meanwhile (the recovered set would exceed max_tenants)."""
    rig = make_rig(config=cfg(2))
    rig.ingest("A", "a0")
    rig.fs.fail("fsync", "*.wal")
    with pytest.raises(Unavailable, match="transient"):
        rig.ingest("N", "n0")
    assert rig.pipeline.tenants.slot("N") is SlotState.RESERVED
    with pytest.raises(TenantCapacity):
        rig.ingest("M", "m0")
    rig.fs.clear_faults()
    rig.restart(crash=True)  # the page cache survives a process crash
    assert rig.pipeline.tenants.slot("N") is SlotState.HELD
    assert sorted(rig.published_rids("N")) == sorted(rids("n0"))  # refused, yet replayed
    with pytest.raises(TenantCapacity):
        rig.ingest("M", "m0")


def test_a_failed_append_releases_the_reservation(make_rig: Callable[..., NodeRig]) -> None:
    rig = make_rig(config=cfg(2))
    rig.ingest("A", "a0")
    rig.fs.fail("write", "*.wal")
    with pytest.raises(Unavailable):
        rig.ingest("N", "n0")
    assert rig.pipeline.tenants.slot("N") is None  # nothing was left behind
    rig.fs.clear_faults()
    rig.ingest("M", "m0")


def test_rfc0055_9_5_a_restart_seeds_the_table_before_any_request(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig(config=cfg(2))
    rig.ingest("A", "a0")
    rig.ingest("B", "b0")
    rig.restart()
    usage = rig.pipeline.tenants.usage()  # seeded by recovery, before any request
    assert (usage.held, usage.reserved, usage.free) == (2, 0, 0)
    with pytest.raises(TenantCapacity):
        rig.ingest("C", "c0")
    rig.ingest("B", "b1")  # a held tenant is admitted at once


def test_rfc0055_9_5_the_size_and_the_wal_state_are_reported_before_the_tenant_state(
    make_rig: Callable[..., NodeRig],
) -> None:
    """Order of the checks: an oversize batch is TooLarge and a terminal WAL reports the
    WAL's state, whatever the tenant's own state (here: refused as unrecoverable)."""
    rig = make_rig()
    rig.ingest("T", "t0")
    rig.pipeline.tenants.set_unrecoverable("T", "a test's verdict")
    with pytest.raises(TenantUnrecoverable):
        rig.ingest("T", "t1")
    data = b"x" * (rig.config.max_frame_bytes + 1)
    batch = flatten(decode_request(b"", "application/x-protobuf"), "T")
    with pytest.raises(PayloadTooLarge):
        rig.pipeline.ingest("T", data, batch, "test")
    rig.fs.fail("open", "*.wal.partial", count=None)  # every rotation fails from here
    for _ in range(rig.config.rotation_retry_attempts):
        with pytest.raises(AppendError):
            rig.journal.rotate(RotationKind.OWED)
    assert isinstance(rig.journal.rotation_state, RotationExhausted)
    with pytest.raises(Unavailable) as terminal:
        rig.ingest("T", "t2")
    assert terminal.value.error_type == "wal_rotation_terminal"
    assert not isinstance(terminal.value, TenantUnrecoverable)


def test_bounded_4_open_mode_takes_new_tenants_at_the_configured_rate() -> None:
    now = [1000.0]
    events: list[str] = []
    table = TenantTable(1024)
    table.limit_new_tenants(
        6, clock=lambda: now[0], events=lambda name, fields: events.append(name)
    )
    for i in range(6):  # a burst of a minute's worth
        table.finish(table.admit(f"t{i}", 1), TurnResult.MINED)
    with pytest.raises(NewTenantRate) as info:
        table.admit("t6", 1)
    refusal = info.value
    assert refusal.http_status == 503 and refusal.retry_after == 10  # one every 10 s
    assert "server.open_new_tenants_per_minute=6" in refusal.message
    assert refusal.error_type == "open_new_tenant_rate"
    assert table.slot("t6") is None  # nothing reserved
    assert table.admit("t0", 1).first is False  # a held tenant is admitted as before
    with pytest.raises(NewTenantRate):
        table.admit("t7", 1)
    assert events == ["tenant.open_rate_limited"]  # one event, not one per refusal
    now[0] += 10
    table.finish(table.admit("t6", 1), TurnResult.MINED)
    usage = table.usage()
    assert (usage.held, usage.reserved, usage.free) == (7, 0, 1017)


def test_token_mode_has_no_new_tenant_rate() -> None:
    table = TenantTable(1024)
    for i in range(200):
        table.finish(table.admit(f"t{i}", 1), TurnResult.MINED)
    assert table.usage().held == 200

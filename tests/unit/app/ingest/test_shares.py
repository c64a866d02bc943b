"""app.ingest.shares: each tenant's share of the ingest turn, a bucket of the turn's time
charged with mining work at its measured cost, that decides admission only (DESIGN.md
§5.14). A fake clock and given mining seconds; no timing."""

from __future__ import annotations

import pytest

from app.ingest.shares import COST_WINDOW_S, FIRST_BATCHES, TenantOverShare, TurnShares

#: the seconds a unit takes in these tests unless a test says otherwise
US = 1e-6


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _shares(clock: Clock, events: list[tuple[str, dict[str, object]]]) -> TurnShares:
    # 10 % of the turn, a 2 s burst: a full bucket holds 0.2 s of the turn
    return TurnShares(10, 2, clock=clock, events=lambda n, f: events.append((n, dict(f))))


def _turn(shares: TurnShares, tenant: str, records: int, work: int, unit: float = US) -> None:
    shares.charge(tenant, shares.admit(tenant, records), work, records, work * unit)


def test_bounded_2_a_tenant_over_its_share_is_refused_and_no_other_is() -> None:
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    _turn(shares, "a", 100, 200)  # another tenant is being served
    # the noisy tenant's first batch is admitted whatever it costs, then it is in debt:
    # 500,000 units at a microsecond are 0.5 s of the turn, its bucket held 0.2 s
    _turn(shares, "noisy", 100, 500_000)
    assert shares.balance("noisy") == pytest.approx(-0.3)
    with pytest.raises(TenantOverShare) as info:
        shares.admit("noisy", 100)
    refusal = info.value
    assert refusal.error_type == "tenant_turn_share"
    assert "'noisy'" in str(refusal) and "miner.tenant_turn_percent=10" in str(refusal)
    assert refusal.retry_after == 2  # 0.3 s of debt at a tenth of the clock, capped at the burst
    # every other tenant is admitted as before
    for tenant in ("a", "b", "c"):
        _turn(shares, tenant, 100, 200)
    assert [n for n, _ in events] == ["tenant.share.exceeded"]
    assert events[0][1]["tenant"] == "noisy" and events[0][1]["reason"] == "turn_share"
    assert shares.over_share == 1
    # refused again: no second event; the refill admits it again, one recovery event
    with pytest.raises(TenantOverShare):
        shares.admit("noisy", 100)
    clock.now += 3.5
    shares.admit("noisy", 1)
    assert [n for n, _ in events] == ["tenant.share.exceeded", "tenant.share.recovered"]
    assert events[1][1]["refused_batches"] == 2 and shares.over_share == 0


def test_bounded_2_waiting_batches_are_reserved_so_they_cannot_pile_up() -> None:
    # Costs are known only after the turn; the batches admitted meanwhile are reserved at
    # the tenant's recent work per record, so a costly tenant cannot queue many.
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    _turn(shares, "a", 100, 200)
    for _ in range(8):
        _turn(shares, "t", 10, 1000)  # 100 units a record
        clock.now += 1
    _turn(shares, "a", 100, 200)
    clock.now += 5  # the bucket is full again: 0.2 s, 200,000 units at a microsecond
    first = shares.admit("t", 1000)  # nothing waiting: admitted
    assert first > 50_000
    admitted = 1
    with pytest.raises(TenantOverShare):
        for _ in range(100):
            shares.admit("t", 1000)
            admitted += 1
    assert admitted < 5
    shares.release("t", first)  # an append that failed gives its reservation back


def test_bounded_2_the_bucket_is_capped_at_its_burst() -> None:
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    shares.admit("t", 1)
    clock.now += 3600
    assert shares.balance("t") == pytest.approx(0.2)


def test_bounded_2_the_share_is_of_the_turns_measured_time() -> None:
    # The same work costs a tenant ten times the share on a node where a unit takes ten
    # times as long (a slower or a loaded machine): the share is of the turn's time.
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    assert shares.unit_secs == pytest.approx(US)
    _turn(shares, "a", 100, 50_000)
    _turn(shares, "noisy", 100, 50_000)  # 0.05 s of 0.2: admitted again
    shares.charge("noisy", shares.admit("noisy", 1), 0, 1)
    for _ in range(int(6 * COST_WINDOW_S)):  # the turn now measures 10 µs a unit
        clock.now += 1
        _turn(shares, "a", 100, 2_000, unit=10 * US)
    assert shares.unit_secs == pytest.approx(10 * US, rel=0.05)
    clock.now += 5
    _turn(shares, "noisy", 100, 50_000, unit=10 * US)  # 0.5 s of the turn now
    with pytest.raises(TenantOverShare):
        shares.admit("noisy", 100)
    # what its mining took, measured: 0.5 s over the last ~10 s
    assert shares.share_max == pytest.approx(0.05, rel=0.05)


def test_bounded_2_a_tenant_alone_is_not_held_to_its_share() -> None:
    # Work-conserving: with no other tenant served, nobody waits for the turn; its debt
    # is held to one burst, so once another tenant arrives it is refused for at most
    # about a burst.
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    for _ in range(5):
        _turn(shares, "solo", 100, 1_000_000)  # a second of the turn each
    assert shares.balance("solo") == pytest.approx(-0.2)
    assert events == []
    _turn(shares, "a", 100, 200)
    with pytest.raises(TenantOverShare) as info:
        shares.admit("solo", 100)
    assert info.value.retry_after == 2
    clock.now += 4.1
    shares.admit("solo", 100)


def test_bounded_2_a_tenant_is_charged_what_its_own_units_take() -> None:
    # A tenant whose units take ten times the others' is charged its own cost, so the
    # time its mining takes, not the node's average, is what its share bounds; one slow
    # turn of a small tenant moves its cost little.
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    for _ in range(30):
        clock.now += 1
        _turn(shares, "a", 100, 20_000)  # 1 µs a unit
        _turn(shares, "slow", 100, 2_000, unit=10 * US)
        _turn(shares, "small", 100, 200)
    _turn(shares, "small", 100, 200, unit=100 * US)  # descheduled once: 20 ms for 200 units
    clock.now += 10  # full buckets
    before = shares.balance("slow"), shares.balance("small")
    _turn(shares, "slow", 100, 2_000, unit=10 * US)
    _turn(shares, "small", 100, 200)
    assert before[0] - shares.balance("slow") == pytest.approx(2_000 * 10 * US, rel=0.2)
    assert before[1] - shares.balance("small") < 200 * 5 * US


def test_bounded_2_a_new_tenant_cannot_pile_up_costly_batches_before_its_first_turn() -> None:
    # Before its first turn a tenant's records are assumed the costliest there can be;
    # its first few concurrent batches are admitted whatever that estimate, then no more
    # until a turn tells what they cost.
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = TurnShares(
        10, 2, clock=clock, events=lambda n, f: events.append((n, dict(f))), first_per_record=161
    )
    _turn(shares, "a", 100, 200)
    estimates = [shares.admit("new", 400) for _ in range(FIRST_BATCHES)]
    assert estimates == [400 * 161] * FIRST_BATCHES
    with pytest.raises(TenantOverShare):
        shares.admit("new", 400)  # 0.26 s of the turn estimated waiting: its bucket holds 0.2
    for estimate in estimates:
        shares.charge("new", estimate, 800, 400, 800 * US)  # it costs 2 units a record
    assert shares.admit("new", 400) == 800

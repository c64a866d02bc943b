"""app.ingest.shares: each tenant's share of the ingest turn, a bucket of mining work
units that decides admission only (DESIGN.md §5.14). A fake clock; no timing."""

from __future__ import annotations

import pytest

from app.ingest.shares import TenantOverShare, TurnShares


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _shares(clock: Clock, events: list[tuple[str, dict[str, object]]]) -> TurnShares:
    return TurnShares(1000, 2, clock=clock, events=lambda n, f: events.append((n, dict(f))))


def test_bounded_2_a_tenant_over_its_share_is_refused_and_no_other_is() -> None:
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    # the noisy tenant's first batch is admitted whatever it costs, then it is in debt
    estimate = shares.admit("noisy", 100)
    shares.charge("noisy", estimate, work=5000, records=100)
    with pytest.raises(TenantOverShare) as info:
        shares.admit("noisy", 100)
    refusal = info.value
    assert refusal.error_type == "tenant_turn_share"
    assert "'noisy'" in str(refusal) and "miner.tenant_work_per_sec=1000" in str(refusal)
    assert refusal.retry_after == 2  # its 3000-unit debt at 1000 a second, capped at the burst
    # every other tenant is admitted as before
    for tenant in ("a", "b", "c"):
        shares.charge(tenant, shares.admit(tenant, 100), work=200, records=100)
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
    shares.charge("t", shares.admit("t", 10), work=1000, records=10)  # 100 units a record
    clock.now += 10  # the bucket is full again: 2000 units
    first = shares.admit("t", 10)  # nothing waiting: admitted
    assert first > 100
    admitted = 1
    with pytest.raises(TenantOverShare):
        for _ in range(100):
            shares.admit("t", 10)
            admitted += 1
    assert admitted < 100
    shares.release("t", first)  # an append that failed gives its reservation back


def test_bounded_2_the_bucket_is_capped_at_its_burst() -> None:
    clock = Clock()
    events: list[tuple[str, dict[str, object]]] = []
    shares = _shares(clock, events)
    shares.admit("t", 1)
    clock.now += 3600
    assert shares.balance("t") == 2000.0

"""Tests for app/receive/inflight.py: the per-process in-flight budget (issue 21 item 3)."""

from __future__ import annotations

import grpc
import pytest

from app.receive.inflight import (
    EVENT_EVERY_S,
    RETRY_AFTER_S,
    BodyTimeout,
    InflightBudget,
    Overloaded,
)

MiB = 1 << 20


def test_bounded_3_requests_beyond_the_count_are_refused_with_a_retry() -> None:
    budget = InflightBudget(2, 64 * MiB)
    first, second = budget.take(1), budget.take(1)
    with pytest.raises(Overloaded) as info:
        budget.take(1)
    refusal = info.value
    assert (refusal.http_status, refusal.grpc_code) == (503, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert refusal.retry_after == RETRY_AFTER_S
    assert refusal.error_type == "max_inflight_requests"
    assert "server.max_inflight_requests=2" in refusal.message
    first.release()
    first.release()  # idempotent
    third = budget.take(1)
    assert budget.requests == 2
    for ticket in (second, third):
        ticket.release()
    assert (budget.requests, budget.bytes) == (0, 0)


def test_bounded_3_bytes_beyond_the_budget_are_refused_and_nothing_is_held() -> None:
    budget = InflightBudget(10, 4 * MiB)
    held = budget.take(3 * MiB)
    with pytest.raises(Overloaded) as info:
        budget.take(2 * MiB)
    assert info.value.error_type == "max_inflight_bytes"
    assert "server.max_inflight_bytes=4194304" in info.value.message
    assert (budget.requests, budget.bytes) == (1, 3 * MiB)
    held.release()


def test_a_ticket_grows_step_by_step_until_the_budget_refuses() -> None:
    budget = InflightBudget(10, 4 * MiB)
    ticket = budget.take(MiB)
    ticket.grow(MiB)
    ticket.grow(MiB)
    with pytest.raises(Overloaded):
        ticket.grow(2 * MiB)
    assert (ticket.held, budget.bytes) == (3 * MiB, 3 * MiB)  # the failed step took nothing
    ticket.resize(10)  # a shrink always succeeds
    assert budget.bytes == 10
    ticket.release()
    assert budget.bytes == 0
    with pytest.raises(RuntimeError):
        ticket.grow(1)


def test_refusals_emit_one_event_a_minute_with_what_was_refused_since() -> None:
    now = [100.0]
    events: list[tuple[str, dict[str, object]]] = []
    budget = InflightBudget(
        1,
        MiB * 4,
        events=lambda name, fields: events.append((name, dict(fields))),
        clock=lambda: now[0],
    )
    ticket = budget.take(1)
    for _ in range(5):
        with pytest.raises(Overloaded):
            budget.take(1)
    assert [name for name, _ in events] == ["receiver.inflight_limit"]
    assert events[0][1]["bound"] == "server.max_inflight_requests"
    now[0] += EVENT_EVERY_S
    with pytest.raises(Overloaded):
        budget.take(1)
    assert len(events) == 2
    assert events[1][1]["refused_since_last_event"] == 5  # four since, plus this one
    assert budget.refused == {"max_inflight_requests": 6}
    ticket.release()


def test_decode_slots_bound_what_is_parsed_at_once() -> None:
    budget = InflightBudget(10, 4 * MiB, decodes=1)
    with budget.decoding():
        assert not budget._slots.acquire(blocking=False)
    assert budget._slots.acquire(blocking=False)
    budget._slots.release()


def test_body_timeout_names_the_setting() -> None:
    refusal = BodyTimeout(30.0)
    assert refusal.http_status == 408
    assert refusal.error_type == "body_read_timeout"
    assert "server.body_read_timeout_secs=30 s" in refusal.message


@pytest.mark.parametrize("kwargs", [{"max_requests": 0}, {"max_bytes": 0}, {"decodes": 0}])
def test_bad_bounds_are_refused(kwargs: dict[str, int]) -> None:
    args = {"max_requests": 1, "max_bytes": 1, "decodes": 1, **kwargs}
    with pytest.raises(ValueError):
        InflightBudget(args["max_requests"], args["max_bytes"], args["decodes"])


def test_bounded_3_large_bodies_leave_a_quarter_of_the_bytes_to_small_requests() -> None:
    budget = InflightBudget(100, 16 * MiB)
    large = [budget.take(4 * MiB) for _ in range(3)]  # 12 MiB: the large share
    with pytest.raises(Overloaded) as info:
        budget.take(2 * MiB)
    assert "kept for small requests" in info.value.message
    small = [budget.take(MiB) for _ in range(4)]  # the last quarter is theirs
    # A small body that grows large (gzip inflating) joins the large share.
    small[0].release()
    grower = budget.take(1000)
    with pytest.raises(Overloaded):
        grower.grow(2 * MiB)
    for ticket in (*large, *small, grower):
        ticket.release()
    assert (budget.bytes, budget.large_bytes, budget.requests) == (0, 0, 0)
    grower = budget.take(1000)
    grower.grow(2 * MiB)
    assert budget.large_bytes == 2 * MiB + 1000
    grower.resize(10)  # once large, it stays counted as large until released
    assert budget.large_bytes == 10
    grower.release()
    assert budget.large_bytes == 0

"""app.node.encode_dispatch: the encode slots (issue 23 item 6), each interleaving placed
with events; the dispatch through real channels is tests/unit/app/node/test_worker_pool.py's
and a real node's rotation cut tests/integration/test_encode_bound_serve.py's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

import pyarrow as pa
import pytest

from app.node import encode_dispatch
from app.node.encode_dispatch import EncodeDispatch, EncodeSlots
from app.receive import channel
from app.receive.channel import Connection, MessageKind


def _until(what: str, check: Callable[[], bool]) -> None:
    """Wait for another thread to reach a state it cannot signal (it is parked inside
    ``Condition.wait``); the deadline bounds a failure, it is not a pace."""
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class Holder:
    """A thread that takes a slot and keeps it until ``release``."""

    def __init__(self, slots: EncodeSlots) -> None:
        self.inside = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(slots,), daemon=True)
        self._thread.start()

    def _run(self, slots: EncodeSlots) -> None:
        with slots.slot():
            self.inside.set()
            assert self._go.wait(30)

    def release(self) -> None:
        self._go.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def test_tail_6_no_more_encodes_than_the_slots_hold_at_once() -> None:
    slots = EncodeSlots(2)
    holders = [Holder(slots) for _ in range(5)]
    _until("two inside, three waiting", lambda: slots.in_flight == 2 and slots.waiting == 3)
    inside = [h for h in holders if h.inside.is_set()]
    assert len(inside) == 2
    # one leaves: exactly one waiter takes its slot
    inside[0].release()
    _until("a waiter took the slot", lambda: slots.waiting == 2 and slots.in_flight == 2)
    assert sum(h.inside.is_set() for h in holders) == 3
    for h in holders:
        if h.inside.is_set() and h is not inside[0]:
            h.release()
    _until("the rest ran", lambda: all(h.inside.is_set() for h in holders))
    for h in holders:
        h.release()
    assert (slots.in_flight, slots.waiting, slots.max_in_flight, slots.waited) == (0, 0, 2, 3)
    assert slots.wait_seconds > 0


def test_a_slot_is_given_back_when_the_encode_raises() -> None:
    slots = EncodeSlots(1)
    with pytest.raises(RuntimeError), slots.slot():
        raise RuntimeError("the encode failed")
    assert slots.in_flight == 0
    with slots.slot():  # taken at once: nothing waits for the failed one
        assert slots.in_flight == 1
    assert slots.waited == 0


def test_tail_6_a_thread_that_holds_a_slot_encodes_without_taking_a_second() -> None:
    """The publisher holds a slot around a publish's CPU part and the encode inside it
    asks for one again: the same thread keeps its slot (with one slot a second take would
    wait for itself for ever), and another thread still waits until it is given back."""
    slots = EncodeSlots(1)
    nested = threading.Event()

    def publish() -> None:
        with slots.slot(), slots.slot():
            assert slots.in_flight == 1
            nested.set()

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and nested.is_set(), "the nested take waited for its own slot"
    assert (slots.in_flight, slots.max_in_flight, slots.waited) == (0, 1, 0)
    holder = Holder(slots)
    assert holder.inside.wait(10)
    other = Holder(slots)
    _until("the other thread waits", lambda: slots.waiting == 1)
    assert not other.inside.is_set()
    holder.release()
    assert other.inside.wait(10)
    other.release()
    assert slots.in_flight == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tail_6_a_paced_publish_leaves_its_slot_resting_and_an_unpaced_one_does_not() -> None:
    """At 50 % a slot a cut's publish held for 2 s rests 2 s after it (the clock is the
    slots' own, moved by hand); the spiller's and recovery's publishes leave none."""
    clock = FakeClock()
    slots = EncodeSlots(1, duty_percent=50, clock=clock)
    assert slots.rest_factor == 1.0
    with slots.slot():  # not paced: nothing rests after it
        clock.now += 2.0
    with slots.slot():
        pass
    assert slots.waited == 0 and slots.rest_seconds == 0.0
    with slots.paced(), slots.slot():
        clock.now += 2.0  # held 2 s: the slot rests until now + 2
    assert slots.rest_seconds == 2.0  # ourios_encode_slot_rest_seconds_total
    checks: list[int] = []
    taken = slots._taken

    def counted() -> int:  # the waiter's every look at the slots, under their lock
        checks.append(taken())
        return checks[-1]

    slots._taken = counted  # type: ignore[method-assign]
    waiter = Holder(slots)
    _until("the next publish waits for the resting slot", lambda: slots.waiting == 1)
    assert not waiter.inside.is_set()
    clock.now += 1.0  # still resting
    looked = len(checks)
    with slots._cond:
        slots._cond.notify_all()
    _until("the waiter looked again", lambda: len(checks) > looked)
    with slots._cond:  # it decided under this lock: still waiting, nothing taken
        assert slots.waiting == 1 and slots.in_flight == 0, checks
    assert not waiter.inside.is_set()
    clock.now += 1.5  # past the rest
    with slots._cond:
        slots._cond.notify_all()
    assert waiter.inside.wait(10)
    waiter.release()
    assert slots.waited == 1 and slots.in_flight == 0


def test_at_100_percent_no_slot_rests() -> None:
    slots = EncodeSlots(1, duty_percent=100)
    assert slots.rest_factor == 0.0
    with slots.paced(), slots.slot():
        pass
    with slots.slot():
        assert slots.waited == 0


def test_a_duty_outside_1_to_100_is_refused_naming_the_setting() -> None:
    for bad in (0, 101):
        with pytest.raises(ValueError, match="server.encode_duty_percent"):
            EncodeSlots(1, duty_percent=bad)


def test_a_bound_below_one_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"server\.encode_concurrency must be >= 1, got 0"):
        EncodeSlots(0)


class _Conn:
    """A worker's channel as the dispatch sees it: ``hung`` never answers (a timeout)."""

    def __init__(self, hung: bool) -> None:
        self.hung = hung
        self.calls = 0

    def call(self, kind: MessageKind, body: object, timeout: float) -> object:
        self.calls += 1
        if self.hung:
            raise TimeoutError(f"no answer in {timeout} s")
        return type("Answer", (), {"kind": MessageKind.ENCODED, "body": b"worker"})()


class _Cols:
    def table(self) -> pa.Table:
        return pa.table({"a": [1]})


def test_tail_6_a_worker_that_timed_out_an_encode_is_sent_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one slot, a hung worker chosen at every turn would stall every publish for
    the whole timeout each time: after its first timeout it is passed over, the other
    worker and (when none is left) the core encode."""
    monkeypatch.setattr(encode_dispatch, "encode_records", lambda cols, compression: b"core")
    monkeypatch.setattr(channel, "encode_encode_request", lambda compression, table: [b""])
    hung, good = _Conn(hung=True), _Conn(hung=False)
    dispatch = EncodeDispatch(lambda: cast("list[Connection]", [hung, good]), EncodeSlots(1))
    got = [dispatch.encode_records(_Cols(), "zstd") for _ in range(6)]  # type: ignore[arg-type]
    assert got == [b"core"] + [b"worker"] * 5
    assert hung.calls == 1 and good.calls == 5
    alone = EncodeDispatch(lambda: cast("list[Connection]", [hung]), EncodeSlots(1))
    alone._unanswered.add(cast("Connection", hung))  # the state the first timeout leaves
    assert alone.encode_records(_Cols(), "zstd") == b"core"  # type: ignore[arg-type]
    assert hung.calls == 1

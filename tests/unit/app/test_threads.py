"""``app.threads``: a supervised loop that raises is logged once with its traceback,
counted, and run again on the same thread after a backoff; over its budget, or when it
may not be restarted, it is failed and the verdict names it (issue 22 item 3)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import pytest

from app.threads import Supervisor, start_thread
from tests.support.threads import WAIT_S


class Events:
    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, object]]] = []
        self.lock = threading.Lock()
        self.crashed = threading.Event()

    def __call__(self, name: str, fields: Mapping[str, object]) -> None:
        with self.lock:
            self.got.append((name, dict(fields)))
        if name == "thread.crashed":
            self.crashed.set()

    def named(self, name: str) -> list[dict[str, object]]:
        with self.lock:
            return [f for n, f in self.got if n == name]


class Boom(RuntimeError):
    pass


def crash_then(times: int, then: Callable[[], None]) -> tuple[Callable[[], None], list[int]]:
    """A loop that raises ``Boom`` on its first ``times`` runs, then calls ``then``;
    the list holds the thread id of every run."""
    runs: list[int] = []

    def loop() -> None:
        runs.append(threading.get_ident())
        if len(runs) <= times:
            raise Boom(f"injected crash {len(runs)}")
        then()

    return loop, runs


def supervisor(events: Events, restarts: int = 5) -> Supervisor:
    return Supervisor(events=events, restarts=restarts, backoff_first=0.001, backoff_max=0.01)


def test_every_state_3_a_crashed_loop_is_logged_once_counted_and_restarted() -> None:
    events = Events()
    threads = supervisor(events)
    done = threading.Event()
    loop, runs = crash_then(2, done.set)
    handle = threads.start("housekeeping", loop, thread_name="ourios-housekeeping")
    assert done.wait(WAIT_S)
    handle.join(WAIT_S)
    assert not handle.is_alive() and handle.name == "ourios-housekeeping"
    crashed = events.named("thread.crashed")
    assert [c["error"] for c in crashed] == [
        "Boom: injected crash 1",
        "Boom: injected crash 2",
    ]
    for c in crashed:  # once each, with the traceback down to the raising line
        assert c["thread"] == "housekeeping" and c["restarting"] is True
        assert 'raise Boom(f"injected crash {len(runs)}")' in str(c["traceback"])
    assert threads.restarts["housekeeping"] == 2
    assert len(set(runs)) == 1  # restarted on the same thread (PR_SET_PDEATHSIG)
    assert threads.healthy and threads.verdict() == "" and not events.named("thread.failed")


def test_every_state_3_a_loop_over_its_budget_fails_the_verdict_naming_it() -> None:
    events = Events()
    threads = supervisor(events, restarts=2)
    loop, runs = crash_then(10**6, lambda: None)
    handle = threads.start("barrier", loop)
    handle.join(WAIT_S)
    assert not handle.is_alive()
    assert len(runs) == 3 and threads.restarts["barrier"] == 2
    assert not threads.healthy
    assert "thread barrier stopped: Boom: injected crash 3" in threads.verdict()
    assert "server.thread_restarts=2" in threads.verdict()
    (failed,) = events.named("thread.failed")
    assert failed["thread"] == "barrier"
    assert [c["restarting"] for c in events.named("thread.crashed")] == [True, True, False]


def test_every_state_3_a_loop_that_may_not_restart_fails_at_its_first_crash() -> None:
    events = Events()
    threads = supervisor(events)
    loop, runs = crash_then(1, lambda: None)
    threads.start("turn", loop, restart=False).join(WAIT_S)
    assert len(runs) == 1 and threads.restarts["turn"] == 0
    assert set(threads.failed) == {"turn"} and "may not be restarted" in threads.failed["turn"]
    assert len(events.named("thread.crashed")) == 1


def test_a_crash_outside_the_window_is_forgotten() -> None:
    now = [0.0]
    events = Events()
    threads = Supervisor(
        events=events, restarts=1, window=60.0, backoff_first=0.0, clock=lambda: now[0]
    )
    assert threads.crashed("link", Boom("one"))
    now[0] = 61.0
    assert threads.crashed("link", Boom("two"))  # the first left the window
    assert not threads.crashed("link", Boom("three"))
    assert set(threads.failed) == {"link"}


def test_the_owners_stop_ends_a_restart_wait() -> None:
    events = Events()
    threads = Supervisor(events=events, backoff_first=3600.0)
    stop = threading.Event()
    loop, runs = crash_then(1, lambda: None)
    handle = threads.start("age_sweep", loop, stop=stop)
    assert events.crashed.wait(WAIT_S)  # reported: the hour's wait begins
    stop.set()
    handle.join(WAIT_S)
    assert not handle.is_alive() and len(runs) == 1 and threads.healthy


def test_without_a_supervisor_a_plain_thread_runs_the_loop_once() -> None:
    ran = threading.Event()
    handle = start_thread(None, "x", ran.set, thread_name="ourios-x")
    handle.join(WAIT_S)
    assert ran.is_set() and handle.name == "ourios-x"


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="restarts must be >= 0"):
        Supervisor(restarts=-1)

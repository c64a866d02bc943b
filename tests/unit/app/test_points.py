"""``app.points``: a held point stops the thread that reaches it until released; an
unheld point passes straight through; a hold covers only its ``count`` hits."""

from __future__ import annotations

import threading

import pytest

from app import points


def test_unheld_point_passes_through() -> None:
    points.hit("test.points.nobody_holds_this")  # returns at once: nothing registered


def hitting(name: str) -> tuple[threading.Thread, threading.Event]:
    """A started thread that hits the point ``name`` and then sets the event it returns."""
    done = threading.Event()

    def worker() -> None:
        points.hit(name)
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    return thread, done


def test_held_point_stops_the_thread_until_released() -> None:
    with points.hold("test.points.stop") as held:
        thread, done = hitting("test.points.stop")
        assert held.reached.wait(10)
        assert not done.is_set()  # still parked at the point
        held.release()
        assert done.wait(10)
        thread.join(10)
    assert held.hits == 1


def test_hold_covers_only_count_hits() -> None:
    with points.hold("test.points.count", count=1) as held:
        held.release()  # the first hit passes at once
        points.hit("test.points.count")
        points.hit("test.points.count")  # beyond the count: not held either
    assert held.hits == 2
    assert held.remaining == 0


def test_a_point_cannot_be_held_twice() -> None:
    with points.hold("test.points.twice"):
        with pytest.raises(RuntimeError, match="test.points.twice"):
            with points.hold("test.points.twice"):
                pass


def test_leaving_the_hold_releases_a_waiting_thread_and_unregisters() -> None:
    with points.hold("test.points.leave") as held:
        thread, done = hitting("test.points.leave")
        assert held.reached.wait(10)
    assert done.wait(10)  # the context's exit released it
    thread.join(10)
    with points.hold("test.points.leave"):  # and the name is free again
        pass

"""The ingest benchmark's breakdown of the core's CPU by thread (soak/bench/ingest.py)."""

from __future__ import annotations

import os
import threading

import pytest

from soak.bench.ingest import thread_cpu_seconds, thread_groups


def test_threads_group_by_name_without_their_number_and_ended_ones_are_the_rest() -> None:
    start = {1: 1.0, 2: 0.5, 3: 0.25}
    end = {1: 3.0, 2: 1.5, 3: 0.75, 4: 0.5}  # 4 started inside the window
    names = {1: "ourios-turn", 2: "ourios-link-0", 3: "ourios-link-1", 4: "ourios-flush-7"}
    # the process used 5.0 s: 2.0 + 1.0 + 0.5 + 0.5 by the living threads, 1.0 by ended ones
    groups = thread_groups(start, end, names, total=5.0)
    assert groups == {
        "ourios-turn": 2.0,
        "ourios-link": 1.5,
        "ourios-flush": 0.5,
        "(threads that ended)": 1.0,
    }


def test_a_thread_without_a_name_is_unnamed_and_nothing_is_negative() -> None:
    groups = thread_groups({}, {9: 0.5}, {}, total=0.25)
    assert groups == {"unnamed": 0.5}


def test_every_living_thread_of_this_process_is_read() -> None:
    if not os.path.isdir(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc")
    seen = thread_cpu_seconds(os.getpid())
    assert threading.get_native_id() in seen
    assert all(v >= 0 for v in seen.values())

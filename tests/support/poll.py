"""Waiting for another process's observable state, with a deadline.

``poll_until(what, check, deadline_s=..., detail=...)`` asks ``check`` again until it
returns something truthy and returns that; past the deadline it fails naming ``what``
and ``detail()`` (a log's tail, the last scrape). Every wait in the tests for a real
``ourios serve`` (its events, metrics, data directory), a SeaweedFS or the kernel's
process table goes through it, so none is a hand-written sleep loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["poll_until"]

_T = TypeVar("_T")


def poll_until(
    what: str,
    check: Callable[[], _T],
    *,
    deadline_s: float,
    detail: Callable[[], str],
    every_s: float = 0.05,
) -> _T:
    """Poll a real process's observable state (its events, metrics, data directory) until
    ``check`` returns something truthy, and return it; after ``deadline_s`` fail naming
    ``what`` and ``detail()`` (its log's tail, say), asking every ``every_s``. The
    deadline bounds a failure, it is not a pace: an external process can only be observed
    by asking again."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {deadline_s:g} s:\n{detail()}")
        time.sleep(every_s)  # polling another process's state, not synchronising threads

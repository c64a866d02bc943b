"""Fixtures every test can use; the machinery lives in `tests/support/`.

- `seaweed_s3` (session): a real SeaweedFS S3 server (`tests.support.SeaweedS3`).
- `s3_bucket` (function): a fresh, uniquely named `tests.support.S3Bucket` in it.
- `seaweed` (function): a SeaweedFS of the test's own, for a test that kills and
  restarts it (a store outage).
- `small_tmpfs` (function): factory `small_tmpfs(size_bytes) -> Path`, a mounted tmpfs.
- `_no_leaked_threads` (autouse): fails a test that leaves a thread it started running.
  Mark a test `@pytest.mark.thread_leak_ok(reason)` only for a thread it cannot stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.seaweed import S3Bucket, SeaweedS3
from tests.support.tmpfs import TmpfsMounts
from tests.support.tools import require_tool

pytest_plugins = ["pytester"]

# How long a test's threads get to finish after it returns (joined, not slept);
# the ini option `thread_leak_join_seconds` overrides it.
THREAD_JOIN_WINDOW_S = 2.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "thread_leak_join_seconds",
        "seconds a test's leftover threads are joined before the test is failed",
        default=str(THREAD_JOIN_WINDOW_S),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "thread_leak_ok(reason): the test may leave threads running (say why)",
    )


def leaked_threads(
    before: set[threading.Thread], join_window_s: float = THREAD_JOIN_WINDOW_S
) -> list[threading.Thread]:
    """Threads alive now that were not in `before`, after joining them for the window.

    Dummy threads (foreign threads that called into Python, e.g. from a C extension)
    are not started through `threading` and cannot be joined, so they are ignored.
    """
    new = [
        t
        for t in threading.enumerate()
        if t not in before and not isinstance(t, threading._DummyThread)
    ]
    deadline = time.monotonic() + join_window_s
    for t in new:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t for t in new if t.is_alive()]


def describe_threads(threads: list[threading.Thread]) -> str:
    parts = []
    for t in threads:
        target = getattr(t, "_target", None)
        where = f", target={getattr(target, '__qualname__', target)!s}" if target else ""
        parts.append(f"{t.name!r} ({'daemon' if t.daemon else 'non-daemon'}{where})")
    return ", ".join(parts)


@pytest.fixture(autouse=True)
def _no_leaked_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    if request.node.get_closest_marker("thread_leak_ok") is not None:
        return
    window = float(request.config.getini("thread_leak_join_seconds"))
    leaked = leaked_threads(before, window)
    if leaked:
        pytest.fail(
            f"test left {len(leaked)} thread(s) running after a {window:g} s"
            f" join window: {describe_threads(leaked)}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A running SeaweedFS S3 server shared by the session (start-up takes ~3 s)."""
    weed = require_tool("weed")
    with SeaweedS3(weed, tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS of this test's own: it is killed and restarted, so not the shared one."""
    with SeaweedS3(require_tool("weed"), tmp_path / "seaweed") as server:
        yield server


@pytest.fixture
def s3_bucket(seaweed_s3: SeaweedS3) -> Iterator[S3Bucket]:
    """A fresh bucket in `seaweed_s3`, deleted with its objects after the test."""
    bucket = S3Bucket.create(seaweed_s3)
    yield bucket
    seaweed_s3.delete_bucket(bucket.name)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[TmpfsMounts]:
    """Factory: `small_tmpfs(size_bytes) -> Path` mounts a tmpfs of that size."""
    with TmpfsMounts(tmp_path / "mounts") as mounts:
        yield mounts

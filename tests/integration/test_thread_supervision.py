"""A background thread that dies is never silent, in a real ``ourios serve`` (issue 22
item 3; DESIGN.md §5.10).

A ``sitecustomize`` probe that only the served process loads gives the node a
free-space sample of the test's choosing (``open_disk_space``'s ``measure``; no
production setting can turn it on) and a fault point in it: while the control file
``crash`` holds a count, the housekeeping tick's sample raises an unexpected exception
— the way ENOSPC on the reserve's fallocate followed by EIO on its clean-up once killed
the thread while /healthz and /readyz stayed 200 and stop-water refusals never lifted
(only that thread lifts them).

1. The sample says the volume is full: stop water, new batches refused.
2. One injected crash: logged once with its traceback (``thread.crashed``), counted in
   ``ourios_thread_restarts_total{thread="housekeeping"}``, the thread restarted — the
   sample says there is room again and the refusals lift, with no restart of the node.
3. Crashes every tick, over ``server.thread_restarts``: ``thread.failed``, and /healthz
   and /readyz answer 503 naming the thread, so Kubernetes would restart the pod.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.support.noderig import request
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape
from tests.support.serve import ROOT, ServeProcess

DEADLINE_S = 60.0
STOP_WATER = 1 << 20
ROOMY = 10 << 30

_PROBE = '''"""Probe for tests/integration/test_thread_supervision.py (loaded as sitecustomize by
the ourios serve that test starts): the free-space sample and a fault point in it."""

import os


def _install(control):
    import functools
    from pathlib import Path

    from app.base import diskspace
    from app.node import server

    control = Path(control)

    def measure(path):
        crash = control / "crash"
        if crash.exists():
            left = int(crash.read_text())
            if left:
                if left > 0:
                    tmp = control / "crash.tmp"
                    tmp.write_text(str(left - 1))
                    os.replace(tmp, crash)
                raise RuntimeError("injected housekeeping fault")
        free = control / "free"
        return int(free.read_text()) if free.exists() else diskspace.statvfs_free(path)

    server.open_disk_space = functools.partial(diskspace.open_disk_space, measure=measure)


if os.environ.get("EVERY_STATE_3_CONTROL"):
    _install(os.environ["EVERY_STATE_3_CONTROL"])
'''


def _set(control: Path, name: str, value: int) -> None:
    """Replace a control file whole (the node reads it at every tick)."""
    tmp = control / f"{name}.tmp"
    tmp.write_text(str(value))
    os.replace(tmp, control / name)


def _wait(what: str, check: Callable[[], object], serve: ServeProcess) -> object:
    return poll_until(what, check, deadline_s=DEADLINE_S, detail=lambda: serve.tail(40))


def _metric(serve: ServeProcess, series: str) -> float | None:
    s = try_scrape(serve)
    return s.series(series) if s else None


def _post(serve: ServeProcess, tag: str) -> tuple[int, bytes]:
    status, body, _ = serve.post_logs(request(tag, 2).SerializeToString())
    return status, body


def _crashes(serve: ServeProcess) -> list[dict[str, object]]:
    return [e for e in serve.event("thread.crashed") if e["thread"] == "housekeeping"]


def test_every_state_3_a_crashed_housekeeping_thread_is_logged_counted_restarted_then_fails_healthz(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_PROBE)
    control = tmp_path / "control"
    control.mkdir()
    _set(control, "free", ROOMY)
    env = {
        "PYTHONPATH": f"{probe}{os.pathsep}{ROOT}",
        "EVERY_STATE_3_CONTROL": str(control),
        "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
        "OURIOS_DISK_LOW_WATER_BYTES": str(2 * STOP_WATER),
        "OURIOS_DISK_STOP_WATER_BYTES": str(STOP_WATER),
        "OURIOS_SERVER_THREAD_RESTARTS": "1",
    }
    with ServeProcess(tmp_path / "data", env) as serve:
        assert _post(serve, "before")[0] == 200

        # 1. The volume is full: stop water, refused.
        _set(control, "free", 0)
        _wait("disk.stop_water", lambda: serve.event("disk.stop_water"), serve)
        status, body = _post(serve, "full")
        assert status == 503 and b"disk.stop_water_bytes" in body, (status, body)

        # 2. One crash: logged once with its traceback, counted, restarted; it lifts.
        _set(control, "crash", 1)
        _wait("thread.crashed", lambda: _crashes(serve), serve)
        (crash,) = _crashes(serve)
        assert crash["level"] == "error" and crash["restarting"] is True
        assert crash["error"] == "RuntimeError: injected housekeeping fault"
        trace = str(crash["traceback"])
        assert "observe_disk" in trace and "injected housekeeping fault" in trace
        assert serve.get("/healthz") == (200, b"ok\n")
        series = 'ourios_thread_restarts_total{thread="housekeeping"}'
        _wait("the restart counted", lambda: _metric(serve, series) == 1.0, serve)
        _set(control, "free", ROOMY)
        _wait("disk.recovered", lambda: serve.event("disk.recovered"), serve)
        assert _post(serve, "after")[0] == 200
        # logged once: the one event line, no second copy of the traceback elsewhere
        assert sum("injected housekeeping fault" in line for line in serve.lines) == 1

        # 3. A crash at every tick, past server.thread_restarts=1: failed, /healthz 503.
        _set(control, "crash", -1)
        _wait("thread.failed", lambda: serve.event("thread.failed"), serve)
        (failed,) = serve.event("thread.failed")
        assert failed["thread"] == "housekeeping"
        status, text = serve.get("/healthz")
        assert status == 503 and b"thread housekeeping stopped" in text, (status, text)
        assert serve.get("/readyz")[0] == 503
        assert _metric(serve, 'ourios_thread_failed{thread="housekeeping"}') == 1.0
        assert len(_crashes(serve)) == 2
        serve.terminate()
        (stopped,) = serve.event("server.stopped")
        assert stopped["threads_failed"] == ["housekeeping"]

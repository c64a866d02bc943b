"""SIGTERM in every state (issue 22 item 1, DESIGN.md §6): a real ``ourios serve`` exits
within ``server.shutdown_grace_secs`` + ``server.final_cut_secs`` of SIGTERM with the
documented status, ``server.stopped`` is its last line, and a restart publishes every
acknowledged record exactly once.

The states, each a parameter:

* ``replaying`` — a node SIGKILLed under load restarts over a WAL it must replay (two
  workers decoding 64 frames ahead; a probe holds the replay at its first frame until
  the SIGTERM, then lets it run): the replay ends at its next
  frame, its decoding window on the workers is abandoned, exit 75
  (``replay_unfinished``). It used to turn on through the workers' stop and then wait
  for ever for decodes the stopped workers would never answer, behind
  ``server.stopped``.
* ``store_down`` — a real SeaweedFS frozen with SIGSTOP (every request hangs until the
  client's read timeout, 30 s, far beyond the budget) under a node that acknowledged
  rows it has not published, with no timed cut running: the final cut itself is inside
  a store call at the budget, is abandoned (``timed_out``), exit 75.
* ``disk_full`` — the data directory on a real tmpfs filled to the last block while the
  node is loaded (appends refused with 503); the store is elsewhere.
* ``backlog_full`` — the turn thread slowed by a probe and ``wal.turn_backlog_bytes`` at
  its minimum, the backlog full (503 ``ingest_backlog``): the drain turns what it can in
  its time and leaves the rest in the WAL, exit 75.

The exit deadline is the product's documented promise, asserted as such (small settings
keep it short); everything else waits on the process's own events. The seed is printed
(``EVERY_STATE_SEED`` reruns one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import seed_from
from tests.support.parquet_read import download_prefix, read_kind
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape
from tests.support.seaweed import S3Bucket, SeaweedS3
from tests.support.serve import ROOT, ServeProcess
from tests.support.tmpfs import TmpfsMounts
from tests.support.tools import require_tool

TENANTS = ("acme", "globex")
GRACE_S = 3
FINAL_CUT_S = 4
#: the promise under test: SIGTERM to exit
BOUND_S = GRACE_S + FINAL_CUT_S
#: how long a test waits for an exit that broke the promise before it says so
HANG_S = BOUND_S + 25
#: a condition in the process's own events or metrics is awaited at most this long
DEADLINE_S = 60.0
PREFIX = "every-state"

BASE_ENV = {
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": str(GRACE_S),
    "OURIOS_SERVER_FINAL_CUT_SECS": str(FINAL_CUT_S),
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_WORKERS": "0",
}

_PROBE = '''"""Probe for tests/crash/test_sigterm_every_state_serve.py (sitecustomize of the core
that test starts): a slow replay, or a slow turn thread."""
import os, sys, time

_mode = os.environ.get("EVERY_STATE_SLOW")
if _mode and "--channel-fd" not in sys.argv:  # the core, not its workers
    _delay = float(os.environ["EVERY_STATE_DELAY"])
    if _mode == "replay":
        import app.node.recovery as _recovery

        _turn = _recovery.Recovery.turn
        _held = [False]

        def _slow_replay(self, item):
            if not _held[0]:  # held at its first frame until the test opens the FIFO
                _held[0] = True
                print('{"event": "probe.replay_held"}', file=sys.stderr, flush=True)
                with open(os.environ["EVERY_STATE_FIFO"], "rb"):
                    pass
            time.sleep(_delay)  # a large backlog, made of few frames
            _turn(self, item)

        _recovery.Recovery.turn = _slow_replay
    elif _mode == "turn":
        import app.ingest.pipeline as _pipeline

        _turn_and_finish = _pipeline.Pipeline.turn_and_finish

        def _slow_turn(self, ticket):
            time.sleep(_delay)  # a miner that cannot keep up
            return _turn_and_finish(self, ticket)

        _pipeline.Pipeline.turn_and_finish = _slow_turn
'''


@dataclass
class Case:
    """One state's node: its environment, where its store is, and how it is read."""

    data: Path
    env: dict[str, str]
    probe_env: dict[str, str]
    read: Callable[[], list[dict[str, Any]]]


def _wait(what: str, check: Callable[[], Any], serve: ServeProcess) -> Any:
    return poll_until(what, check, deadline_s=DEADLINE_S, detail=lambda: serve.tail(60))


def _metric(serve: ServeProcess, name: str) -> float:
    s = try_scrape(serve)
    return (s.value(name) if s else None) or 0.0


def _sigterm(serve: ServeProcess, then: Callable[[], None] | None = None) -> tuple[int, float]:
    """SIGTERM (and ``then``); the exit status and the seconds it took (fails after
    ``HANG_S``)."""
    assert serve.proc is not None
    sent = time.monotonic()
    serve.proc.send_signal(signal.SIGTERM)
    if then is not None:
        then()
    try:
        code = serve.proc.wait(HANG_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"ourios serve still running {HANG_S} s after SIGTERM (the bound is {BOUND_S} s)"
            f":\n{serve.tail(60)}"
        ) from None
    took = time.monotonic() - sent
    serve.kill()  # joins the stderr reader: every line is in
    return code, took


def _assert_stopped_within_the_bound(serve: ServeProcess, code: int, took: float) -> Any:
    assert took <= BOUND_S, f"exit {took:.2f} s after SIGTERM > {BOUND_S} s:\n{serve.tail(40)}"
    last = serve.events[-1]
    assert last["event"] == "server.stopped", serve.tail(20)  # nothing ran on behind it
    assert code == last["exit_code"], (code, last)
    left = last["rows_left_in_wal"] + last["template_events_left_in_wal"]
    unfinished = last["final_cut_error"] in ("replay_unfinished", "timed_out")
    expected = 75 if left or last["frames_left_unturned"] or unfinished else 0
    assert code == expected, last
    return last


def _published_once(case: Case, ledger: AckLedger) -> None:
    rows = case.read()
    counts = Counter(r["attributes"]["rid"] for r in rows)
    twice = sorted(rid for rid, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} records published more than once: {twice[:10]}"
    missing = sorted(ledger.rids(Outcome.ACKED) - counts.keys())
    assert ledger.rids(Outcome.ACKED) and not missing, (
        f"{len(missing)} acknowledged records not in the store: {missing[:10]}"
    )


def _restart_publishes_everything(case: Case, ledger: AckLedger) -> None:
    again = ServeProcess(case.data, case.env).start()
    try:
        code, _ = _sigterm(again)
    finally:
        again.close()
    assert code == 0, again.tail(40)
    _published_once(case, ledger)


def _fill(path: Path, ballast: Path) -> None:
    """Write ``ballast`` until the filesystem of ``path`` has no block left."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 65536)
            except OSError:
                break
        while True:
            try:
                os.write(fd, b"\0" * 512)
            except OSError:
                return
    finally:
        os.close(fd)


# -- the states --------------------------------------------------------------------------


def _replaying(case: Case, ledger: AckLedger, seed: int) -> Any:
    first = ServeProcess(case.data, case.env).start()
    try:
        with AckLoad(ledger, first.http_port, senders=3, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(300, timeout=DEADLINE_S)
            first.kill()  # mid-load: the restart has all of it to replay
            load.join()
    finally:
        first.close()
    fifo = case.data.parent / "replay.fifo"
    os.mkfifo(fifo)
    env = {
        **case.env,
        **case.probe_env,
        "OURIOS_SERVER_WORKERS": "2",  # the replay decodes on them
        "EVERY_STATE_SLOW": "replay",
        "EVERY_STATE_DELAY": "0",
        "EVERY_STATE_FIFO": str(fifo),
    }
    serve = ServeProcess(case.data, env).start(recovered=False)
    try:
        _wait("the replay held at its first frame", lambda: serve.event("probe.replay_held"), serve)
        assert _metric(serve, "ourios_recovery_backlog_bytes") > 0, serve.tail()
        # SIGTERM, then the replay runs on (the workers decoding 64 frames ahead) while
        # the node stops: it must end at its next frame.
        code, took = _sigterm(serve, then=lambda: os.close(os.open(fifo, os.O_WRONLY)))
    finally:
        serve.close()
    stopped = _assert_stopped_within_the_bound(serve, code, took)
    assert not serve.event("recovery.done")
    assert stopped["final_cut_error"] == "replay_unfinished" and code == 75, stopped
    (stages,) = serve.event("stages.stopped")
    assert stages["stages_joined"] and stages["replay_unfinished_bytes"] > 0, stages
    assert stopped["threads_left"] == [], stopped
    return stopped


def _store_down(case: Case, ledger: AckLedger, seed: int, seaweed: SeaweedS3) -> Any:
    serve = ServeProcess(case.data, case.env).start()
    frozen = False
    try:
        with AckLoad(ledger, serve.http_port, senders=3, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(60, timeout=DEADLINE_S)
            os.killpg(seaweed.pid, signal.SIGSTOP)  # every request to the store now hangs
            frozen = True
            load.wait_acked(load.acked + 60, timeout=DEADLINE_S)  # the WAL still acknowledges
        code, took = _sigterm(serve)
    finally:
        serve.close()
        if frozen:
            os.killpg(seaweed.pid, signal.SIGCONT)
    stopped = _assert_stopped_within_the_bound(serve, code, took)
    assert code == 75 and not stopped["final_cut_ok"], stopped
    # the final cut was still inside a store call at the budget: abandoned, and named
    assert stopped["final_cut_error"] == "timed_out", stopped
    assert "ourios-final-cut" in stopped["threads_left"], stopped
    return stopped


def _disk_full(case: Case, ledger: AckLedger, seed: int) -> Any:
    serve = ServeProcess(case.data, case.env).start()
    ballast = case.data / "ballast"
    try:
        with AckLoad(ledger, serve.http_port, senders=3, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(60, timeout=DEADLINE_S)
            refused_before = ledger.requests_with(Outcome.REFUSED)
            _fill(case.data, ballast)  # the volume is full now
            _wait(
                "a batch refused on the full disk",
                lambda: ledger.requests_with(Outcome.REFUSED) > refused_before,
                serve,
            )
        code, took = _sigterm(serve)
    finally:
        serve.close()
    ballast.unlink()  # an operator frees the volume before the restart
    return _assert_stopped_within_the_bound(serve, code, took)


def _backlog_full(case: Case, ledger: AckLedger, seed: int) -> Any:
    env = {
        **case.env,
        **case.probe_env,
        "OURIOS_WAL_TURN_BACKLOG_BYTES": str(1 << 20),
        "EVERY_STATE_SLOW": "turn",
        "EVERY_STATE_DELAY": "0.25",
    }
    serve = ServeProcess(case.data, env).start()
    try:
        with AckLoad(
            ledger,
            serve.http_port,
            senders=4,
            tenants=TENANTS,
            seed=seed,
            records_per_request=(150, 150),
        ) as load:
            _wait(
                "a batch refused for the backlog",
                lambda: ledger.requests_with(Outcome.REFUSED) > 0,
                serve,
            )
            load.stop()
        assert _metric(serve, "ourios_ingest_backlog_bytes") > (1 << 20) // 2, serve.tail()
        code, took = _sigterm(serve)
    finally:
        serve.close()
    stopped = _assert_stopped_within_the_bound(serve, code, took)
    assert stopped["frames_left_unturned"] > 0 and code == 75, stopped
    assert stopped["threads_left"] == [], stopped
    return stopped


# -- the test ----------------------------------------------------------------------------


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    directory = tmp_path / "probe"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(_PROBE)
    return {"PYTHONPATH": f"{directory}{os.pathsep}{ROOT}"}


@pytest.fixture
def frozen_store(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS of this test's own (it is frozen with SIGSTOP: not the shared one)."""
    with SeaweedS3(require_tool("weed"), tmp_path / "seaweed") as server:
        yield server


@pytest.mark.parametrize(
    "state",
    ["replaying", pytest.param("store_down", marks=pytest.mark.slow), "disk_full", "backlog_full"],
)
def test_every_state_1_sigterm_exits_within_grace_and_final_cut_and_loses_nothing(
    state: str, tmp_path: Path, probe_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    seed = seed_from("EVERY_STATE_SEED")
    ledger = AckLedger()
    env = dict(BASE_ENV)
    data = tmp_path / "data"
    objects = data / "objects"
    if state == "disk_full":
        mounts: TmpfsMounts = request.getfixturevalue("small_tmpfs")
        data = mounts(12 << 20) / "data"
        objects = tmp_path / "objects"  # the store is not on the full volume
        env["OURIOS_STORE_URL"] = f"file://{objects}"

    def read_local() -> list[dict[str, Any]]:
        return read_kind(objects, "records", "pyarrow")

    read: Callable[[], list[dict[str, Any]]] = read_local
    seaweed: SeaweedS3 | None = None
    if state == "store_down":
        seaweed = request.getfixturevalue("frozen_store")
        bucket = S3Bucket.create(seaweed, "every-state")
        env.update(seaweed.env())
        env["OURIOS_STORE_URL"] = bucket.url(PREFIX)
        # no cut (timed or rotation-fired) before the stop: the final cut itself meets
        # the frozen store, and is abandoned
        env["OURIOS_WAL_BARRIER_SECS"] = "86400"
        env["OURIOS_WAL_SEGMENT_MAX_BYTES"] = str(64 << 20)
        dest = tmp_path / "downloaded"

        def read_bucket() -> list[dict[str, Any]]:
            download_prefix(bucket.server.client(), bucket.name, PREFIX, dest)
            return read_kind(dest, "records", "pyarrow")

        read = read_bucket
    if state == "replaying":
        # no cut (neither timed nor rotation-fired): the restart replays all of it
        env["OURIOS_WAL_BARRIER_SECS"] = "86400"
        env["OURIOS_WAL_SEGMENT_MAX_BYTES"] = str(64 << 20)
    case = Case(data, env, probe_env, read)

    if state == "replaying":
        _replaying(case, ledger, seed)
    elif state == "store_down":
        assert seaweed is not None
        _store_down(case, ledger, seed, seaweed)
    elif state == "disk_full":
        _disk_full(case, ledger, seed)
    else:
        _backlog_full(case, ledger, seed)
    _restart_publishes_everything(case, ledger)

"""A poison batch in a real ``ourios serve`` (issue 18 item 4): isolated, not retried
forever, and no crash-loop.

A ``sitecustomize`` probe that only the served process loads builds the node's miners
as ``tests.support.minerfaults.FaultyMiners`` (``MinerCluster``'s ``miner_type`` seam;
no production setting can turn it on) with one trigger: any record whose body holds the
marker ``poison-`` raises, on every attempt and in every process — the ingest turn,
each settlement rebuild, and the start-up replay. Tenant ``victim`` sends one such
batch while tenants ``acme`` and ``globex`` load the node concurrently.

What must happen, before and after a SIGKILL and restart:

* the victim's frame is isolated after ``wal.frame_mining_attempts`` (3) failures
  (``tenant.frame_isolated``), its records published with ``template_id`` 0;
* the checkpoint moves past it and the segment holding it is reclaimed while the other
  tenants keep loading; the victim is admitted again;
* a second poison batch acknowledged just before a SIGKILL is met by the restart's
  replay, which does not fail the start (``recovery.done`` names it as unmined): the
  node becomes ready, isolates it the same way, and the checkpoint and reclamation move
  on again; a third start meets neither frame (its replay mines nothing of them);
* every record acknowledged to the other tenants is published, and every poison record
  exactly once.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import CYCLE_ENV
from tests.support.noderig import request
from tests.support.parquet_read import read_kind
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape
from tests.support.serve import ROOT, ServeProcess

TENANTS = ("acme", "globex")
VICTIM = "victim"
MARKER = "poison-"
ENV = {**CYCLE_ENV, "OURIOS_WAL_FRAME_MINING_ATTEMPTS": "3"}
DEADLINE_S = 90.0

_PROBE = '''"""Probe for tests/crash/test_poison_frame_serve.py (loaded as sitecustomize by the
ourios serve that test starts): mining fails at every record holding the marker."""

import os


def _install(marker, held):
    import threading

    from tests.support.minerfaults import FaultPlan, install_in_serve

    seen = []
    never = threading.Event()

    def poison(body):
        # The frame marked ``held`` fails its first attempt (the turn's: the tenant is
        # settling) and its settlement's attempt then never returns, so the test's
        # SIGKILL always lands before the frame can be isolated in this process.
        if held and held in body:
            seen.append(body)
            if len(seen) > 1:
                never.wait()
        return marker in body

    plan = FaultPlan()  # armed from the start: the replay fails on it too
    plan.fail_at(poison, "before", times=10**9)
    install_in_serve(plan, arm_after_recovery=False)


if os.environ.get("NOWEDGE4_POISON"):
    _install(os.environ["NOWEDGE4_POISON"], os.environ.get("NOWEDGE4_HOLD", ""))
'''


def _wait(what: str, check: Callable[[], Any], serve: ServeProcess) -> Any:
    """Poll a real process's observable state until ``check`` returns something truthy."""
    return poll_until(what, check, deadline_s=DEADLINE_S, detail=lambda: serve.tail(60))


def _lsn(offset: object) -> int:
    return int(str(offset).partition("@")[0])


def _checkpoint(serve: ServeProcess) -> int:
    s = try_scrape(serve)
    lsn = s.value("ourios_wal_checkpoint_lsn_bytes") if s else None
    return int(lsn) if lsn is not None else -1


def _segment_of(wal: Path, lsn: int) -> Path:
    """The segment holding the frame that ends at ``lsn`` (names are base LSNs)."""
    below = [p for p in sorted(wal.glob("*.wal")) if int(p.stem) < lsn]
    assert below, f"no segment below LSN {lsn} in {wal}"
    return below[-1]


def _isolated(serve: ServeProcess, frame: str) -> dict[str, Any] | None:
    found = [e for e in serve.event("tenant.frame_isolated") if e["frame"] == frame]
    return found[0] if found else None


def _settling(serve: ServeProcess, exclude: set[str]) -> str | None:
    found = [
        e["frame"]
        for e in serve.event("tenant.settling")
        if e["tenant"] == VICTIM and e["frame"] not in exclude
    ]
    return str(found[0]) if found else None


def _post(serve: ServeProcess, tag: str) -> None:
    status, body, _ = serve.post_logs(
        request(tag, 3).SerializeToString(), {"X-Ourios-Tenant": VICTIM}
    )
    assert status == 200, (tag, status, body, serve.tail())


def _isolates_and_moves_on(serve: ServeProcess, data: Path, frame: str) -> None:
    """The frame is isolated at the bound; the checkpoint passes it; its segment goes."""
    event = _wait(f"tenant.frame_isolated for {frame}", lambda: _isolated(serve, frame), serve)
    assert event["tenant"] == VICTIM and event["attempts"] == 3 and event["records"] == 3
    lsn = _lsn(frame)
    segment = _segment_of(data / "wal", lsn)
    _wait(f"a checkpoint past {frame}", lambda: _checkpoint(serve) >= lsn, serve)
    _wait(f"{segment.name} (holding {frame}) reclaimed", lambda: not segment.exists(), serve)
    status, body = serve.get("/metrics")
    assert re.search(rb"^ourios_wal_isolated_frames_total 1\.0$", body, re.M), body[-2000:]
    assert re.search(rb"^ourios_wal_settling_tenants 0\.0$", body, re.M)


def test_nowedge_4_a_poison_frame_is_isolated_and_the_others_publish_and_reclaim_across_a_restart(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_PROBE)
    data = tmp_path / "data"
    env = {**ENV, "PYTHONPATH": f"{probe}{os.pathsep}{ROOT}", "NOWEDGE4_POISON": MARKER}
    ledger = AckLedger()

    # -- the first node: a poison batch under load --------------------------------------
    # the first node never finishes settling the second poison frame (NOWEDGE4_HOLD)
    first = ServeProcess(data, {**env, "NOWEDGE4_HOLD": f"{MARKER}2"}).start()
    try:
        with AckLoad(ledger, first.http_port, senders=3, tenants=TENANTS, seed=18) as load:
            load.wait_acked(30, timeout=60)
            _post(first, "v0")
            _post(first, f"{MARKER}1")  # acknowledged: the frame is durable
            p1 = _wait("the first poison frame", lambda: _settling(first, set()), first)
            _isolates_and_moves_on(first, data, p1)
            _post(first, "v1")  # the victim is admitted again
            load.wait_acked(load.acked + 20, timeout=60)  # the others never stopped

            _post(first, f"{MARKER}2")
            p2 = _wait("the second poison frame", lambda: _settling(first, {p1}), first)
            first.kill()  # its settlement is held: the replay meets the frame
            load.join()
    finally:
        first.kill()
    assert not _isolated(first, p2)

    # -- the restart: the replay fails on it, the node starts anyway ----------------------
    second = ServeProcess(data, env).start()  # ready: no crash-loop
    try:
        (done,) = second.event("recovery.done")
        assert done["unmined"] == {VICTIM: p2} and done["frames_unmined"] >= 1, done
        (replayed,) = [e for e in second.event("tenant.settling") if e["frame"] == p2]
        assert replayed["during"] == "recovery"
        with AckLoad(ledger, second.http_port, senders=3, tenants=TENANTS, seed=19) as load:
            load.wait_acked(20, timeout=60)
            _isolates_and_moves_on(second, data, p2)
            _post(second, "v2")
            load.wait_acked(load.acked + 20, timeout=60)
        second.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert second.terminate() == 0, second.tail()
    finally:
        second.kill()

    # -- a third start meets neither frame ------------------------------------------------
    third = ServeProcess(data, env).start()
    try:
        (done,) = third.event("recovery.done")
        assert done["frames_unmined"] == 0 and done["unmined"] == {}, done
        assert not third.event("tenant.settling")
        assert third.terminate() == 0, third.tail()
    finally:
        third.kill()

    # -- what the store holds ---------------------------------------------------------------
    rows = read_kind(data / "objects", "records", "pyarrow")
    present = Counter(r["attributes"].get("rid") for r in rows if r["tenant"] in TENANTS)
    acked = {
        rid
        for rid in ledger.rids(Outcome.ACKED)
        if (req := ledger.request_of(rid)) is not None and req.tenant in TENANTS
    }
    missing = sorted(acked - set(present))
    assert acked and not missing, f"{len(missing)} acknowledged records lost: {missing[:10]}"
    victim = [r for r in rows if r["tenant"] == VICTIM]
    poison = Counter(r["attributes"]["rid"] for r in victim if MARKER in r["attributes"]["rid"])
    assert poison == Counter(f"{MARKER}{n}/{i}" for n in (1, 2) for i in range(3)), poison
    assert all(
        r["template_id"] == 0 and r["template_params"] == []
        for r in victim
        if MARKER in r["attributes"]["rid"]
    )
    clean = [r for r in victim if MARKER not in r["attributes"]["rid"]]
    assert {r["attributes"]["rid"] for r in clean} == {
        f"v{n}/{i}" for n in range(3) for i in range(3)
    }
    assert all(r["template_id"] != 0 for r in clean)

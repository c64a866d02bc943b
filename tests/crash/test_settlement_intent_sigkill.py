"""Issue 18 item 6 with a real ``ourios serve``: SIGKILL between a settlement's publish
and its marks (RFC 0055 §9.4 "intent then confirm").

A ``sitecustomize`` probe that only the served process loads builds the node's miners as
``tests.support.minerfaults.FaultyMiners`` (``MinerCluster``'s ``miner_type`` seam; no
production setting can turn it on) with one trigger — the record whose body holds
``disk sda2`` fails after it is mined, once, armed only once the node is ready — and, in
the instance the test kills, holds the barrier thread at the named sync point
``settlement.published`` (``app.points``): the settlement's publish has returned, its
marks are not written. The probe says so on stderr (one JSON event line, read by
``tests.support.serve``) and the test SIGKILLs the process. In the ``partial`` variant
the probe also fails every records write of that instance once the mining failure has
fired, so the span's template events are in the store and its records are not.

Then the node restarts on the same data directory, becomes ready (recovery has
published before that) and stops with SIGTERM. What the store must hold: every
acknowledged record exactly once, every template event (an id at a version) exactly
once, no record under a template id without a ``created`` event; PUBLISHED held the
``publishing`` bit when the process died and holds it no more.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.noderig import bodies_request
from tests.support.parquet_read import read_kind
from tests.support.serve import ROOT, ServeProcess
from wal import OsFs, PublishedMarks
from wal.published_file import PublishedFile

TENANT = "acme"
ENV = {
    "OURIOS_WAL_BARRIER_SECS": "1",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "20",
}
DEADLINE_S = 60.0

A0 = ["op a0 step 0 took 0 ms", "op a0 step 1 took 7 ms", "op a0 step 2 took 14 ms"]
#: widens a0's template (an id the snapshot holds), creates one, fails widening it
T1 = ["op t1 step 0 took 0 ms", "disk sda1 is 91 percent full", "disk sda2 is 17 percent full"]

_PROBE = '''"""Probe for tests/crash/test_settlement_intent_sigkill.py (loaded as sitecustomize by
the ourios serve that test starts)."""

import json
import os
import sys
import threading


def _install(hold, fail_records):
    from app import points
    from sink import store
    from tests.support.minerfaults import FaultPlan, install_in_serve

    plan = FaultPlan(armed=False)
    plan.fail_at("disk sda2 ", "after")
    install_in_serve(plan, arm_after_recovery=True)

    if hold:
        hit = points.hit

        def held_hit(name):
            if name == hold:
                line = json.dumps({"event": "probe.held", "at": name})
                sys.stderr.write(line + "\\n")
                sys.stderr.flush()
                threading.Event().wait(120)  # until the test's SIGKILL
            hit(name)

        points.hit = held_hit

    if fail_records:
        for op in ("put", "put_if_absent"):
            real = getattr(store.LocalStore, op)

            def failing(self, key, data, _real=real, _op=op):
                if key.startswith("records/") and plan.log:  # once the mining failed
                    raise store.StoreError(_op, key, "injected", "injected by the probe")
                return _real(self, key, data)

            setattr(store.LocalStore, op, failing)


if os.environ.get("NOWEDGE6_PROBE"):
    _install(os.environ.get("NOWEDGE6_HOLD", ""), bool(os.environ.get("NOWEDGE6_FAIL_RECORDS")))
'''


def _request(tag: str, bodies: list[str]) -> bytes:
    data: bytes = bodies_request(
        tag, bodies
    ).SerializeToString()  # protobuf's generated classes are untyped
    return data


def _post(serve: ServeProcess, tag: str, bodies: list[str]) -> None:
    status, body, _ = serve.post_logs(_request(tag, bodies), {"X-Ourios-Tenant": TENANT})
    assert status == 200, (tag, status, body, serve.tail())


def _wait(what: str, check: Callable[[], Any], serve: ServeProcess) -> Any:
    """Poll a real process's observable state (its stderr events, its data directory)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)  # polling a live process's log and directory
    raise AssertionError(f"no {what} within {DEADLINE_S} s:\n{serve.tail(60)}")


def _marks(data: Path) -> PublishedMarks | None:
    loaded = PublishedFile.read_only(OsFs(), data / "wal")
    if loaded is None:
        return None
    record = loaded[1]
    for slot, entry in record.entries.items():
        if record.dictionary[slot].tenant == TENANT:
            return entry.marks
    return None


def _rids(data: Path) -> Counter[str]:
    if not (data / "objects" / "records").exists():
        return Counter()
    rows = read_kind(data / "objects", "records", "pyarrow")
    return Counter(r["attributes"]["rid"] for r in rows if r["tenant"] == TENANT)


@pytest.mark.parametrize("variant", ["published", "partial"])
def test_nowedge_6_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy(
    tmp_path: Path, variant: str
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_PROBE)
    data = tmp_path / "data"
    env = {**ENV, "PYTHONPATH": f"{probe}{os.pathsep}{ROOT}", "NOWEDGE6_PROBE": "1"}
    killed = {**env, "NOWEDGE6_HOLD": "settlement.published"}
    if variant == "partial":
        killed["NOWEDGE6_FAIL_RECORDS"] = "1"

    first = ServeProcess(data, killed).start()
    try:
        _post(first, "a0", A0)
        if variant == "published":
            _wait(
                "a0 published", lambda: _rids(data) == Counter(f"a0/{i}" for i in range(3)), first
            )
        frontier = _wait("a PUBLISHED frontier for the tenant", lambda: _marks(data), first)
        assert not frontier.publishing
        _post(first, "t1", T1)  # acknowledged: its mining fails, an unmined entry
        _wait(
            "the settlement held between its publish and its marks",
            lambda: first.event("probe.held"),
            first,
        )
        first.kill()
    finally:
        first.kill()
    settled = first.event("tenant.settled")
    assert [e["tenant"] for e in settled] == [TENANT], first.tail()
    at_death = _marks(data)  # asserted last: what the store holds is the point
    landed = _rids(data)
    if variant == "published":
        assert landed == Counter(f"{t}/{i}" for t in ("a0", "t1") for i in range(3))
    else:
        assert landed == Counter(f"a0/{i}" for i in range(3)), landed  # t1's events only
        stored = read_kind(data / "objects", "audit", "pyarrow")
        assert any("disk" in r["template"] for r in stored), stored  # the span's events

    second = ServeProcess(data, env).start()
    try:
        (done,) = second.event("recovery.done")
        assert second.terminate() == 0, second.tail()
    finally:
        second.kill()

    assert _rids(data) == Counter(f"{t}/{i}" for t in ("a0", "t1") for i in range(3))
    audit = read_kind(data / "objects", "audit", "pyarrow")
    events = Counter((r["template_id"], r["template_version"]) for r in audit)
    assert all(n == 1 for n in events.values()), f"template events twice: {events}"
    created = {r["template_id"] for r in audit if r["change"] == "created"}
    rows = read_kind(data / "objects", "records", "pyarrow")
    assert {r["template_id"] for r in rows} <= created, "a record names an unknown template"
    after = _marks(data)
    assert after is not None and not after.publishing, after
    assert at_death is not None and at_death.publishing, at_death  # the bit was set
    assert list(done["intents"]) == [TENANT] and done["intents_confirmed"] == 1, done

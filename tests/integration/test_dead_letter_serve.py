"""Issue 22 item 6 on a real ``ourios serve`` with its embedded store: one tenant's
partition that the store refuses for good (its directory in the store is a file, so
every put for that tenant fails ``local_denied``) is dead-lettered after
``sink.dead_letter_attempts``, the other tenant's rows reach the store, the cuts
complete, and the stop leaves no row in the WAL (DESIGN.md §5.13).

Before the change the refused partition went back into every cut and no cut completed:
no ``sink.partition.dead_lettered`` ever came, and the stop left the rows in the WAL.
Everything waits on the node's own events and metrics with a deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from tests.support.noderig import request
from tests.support.parquet_read import read_kind
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape
from tests.support.serve import ServeProcess

ENV = {
    "OURIOS_SERVER_WORKERS": "1",
    "OURIOS_WAL_BARRIER_SECS": "1",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
    "OURIOS_SINK_DEAD_LETTER_ATTEMPTS": "2",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "10",
}
#: a bound on a failure, not a pace: each condition holds in seconds on an idle machine
DEADLINE_S = 60.0


def wait_for(condition: Callable[[], bool], what: str, detail: Callable[[], str]) -> None:
    poll_until(what, condition, deadline_s=DEADLINE_S, detail=detail, every_s=0.1)


def cuts_ok(serve: ServeProcess) -> float:
    s = try_scrape(serve)
    return s.total("ourios_cadence_runs_total", cadence="barrier", outcome="ok") if s else 0.0


def post(serve: ServeProcess, tenant: str, tag: str) -> list[str]:
    status, body, _ = serve.post_logs(
        request(tag, 20).SerializeToString(), {"X-Ourios-Tenant": tenant}
    )
    assert status == 200, body
    return [f"{tag}/{i}" for i in range(20)]


def test_every_state_6_a_tenant_the_store_refuses_is_dead_lettered_and_the_others_publish(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    objects = tmp_path / "objects"
    (objects / "records").mkdir(parents=True)
    (objects / "records" / "tenant=bad").write_text("a file where a directory must be")
    serve = ServeProcess(data, {**ENV, "OURIOS_STORE_URL": objects.as_uri()})
    good: list[str] = []
    bad: list[str] = []
    with serve.start():
        for i in range(3):
            good += post(serve, "good", f"g{i}")
            bad += post(serve, "bad", f"b{i}")
        # A denial counts against its partition only while other objects land (a store
        # denying everything is the node's fault, not the tenant's: DESIGN.md §5.13), so
        # the good tenant keeps sending as a live node's tenants do; without it the bad
        # partition's strikes depend on whether the good rows landed before or after them.
        sent = 0

        def dead_lettered() -> bool:
            nonlocal good, sent
            if serve.event("sink.partition.dead_lettered"):
                return True
            good += post(serve, "good", f"g-wait{sent}")
            sent += 1
            return False

        wait_for(dead_lettered, "the refused partition dead-lettered", serve.tail)
        good += post(serve, "good", "g-after")
        done = cuts_ok(serve)
        wait_for(lambda: cuts_ok(serve) >= done + 2, "cuts completing", serve.tail)
        code = serve.terminate()

    assert code == 0, serve.tail()
    (stopped,) = serve.event("server.stopped")
    assert stopped["rows_left_in_wal"] == 0, stopped
    events = serve.event("sink.partition.dead_lettered")
    assert {(e["tenant"], e["error_type"]) for e in events} == {("bad", "local_denied")}
    (objects / "records" / "tenant=bad").unlink()  # the blocker, not an object
    published = [r["attributes"]["rid"] for r in read_kind(objects, "records", "pyarrow")]
    assert sorted(published) == sorted(good)  # once each, and nothing of the refused tenant
    kept = [
        v
        for path in sorted((data / "deadletter" / "records" / "tenant=bad").rglob("*.parquet"))
        for attrs in pq.read_table(path).column("attributes").to_pylist()
        for k, v in attrs
        if k == "rid"
    ]
    assert sorted(kept) == sorted(bad)

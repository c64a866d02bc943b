"""Ready while replaying (issue 15): a real ``ourios serve`` restarted over a WAL it must
replay answers 200 to a new batch before ``recovery.done``; that batch is turned after
the tenant's replayed frames (its records carry the templates the replay restored) and
published once; a SIGKILL during the replay loses nothing acknowledged.

The replay is held at its first frame by a small probe the restarted node loads as
sitecustomize: it blocks on a FIFO until the test opens it for writing — so "before
``recovery.done``" is a fact of the test, not a race it usually wins.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.ackload import AckLedger, AckLoad, Outcome, rid_of_body
from tests.support.crashrig import seed_from
from tests.support.scrape import scrape
from tests.support.serve import ROOT, ServeProcess

TENANTS = ("acme", "globex")
ENV = {
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": "65536",
    # no cut before the kill: the restart replays everything the first run wrote
    "OURIOS_WAL_BARRIER_SECS": "86400",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "86400",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "10",
}

_PROBE = """
import os, sys
_fifo = os.environ.get("READY_TEST_FIFO")
if _fifo and "--channel-fd" not in sys.argv:  # the core, not its workers
    import app.node.recovery as _recovery
    _turn = _recovery.Recovery.turn
    _held = [False]

    def _hold_first(self, item):
        if not _held[0]:
            _held[0] = True
            with open(_fifo, "rb"):  # blocks until the test opens it for writing
                pass
        _turn(self, item)

    _recovery.Recovery.turn = _hold_first
"""


def _objects(data_dir: Path, kind: str = "records") -> list[Path]:
    return sorted((data_dir / "objects" / kind).glob("tenant=*/date=*/*.parquet"))


def _published(data_dir: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in _objects(data_dir):
        rows.extend(pq.read_table(path, columns=["tenant", "body", "template_id"]).to_pylist())
    return rows


def _new_batch(n: int) -> tuple[list[str], bytes]:
    """Records in the shape the load used ("user <u> logged in from <ip>"), so the
    tenant's restored miner already holds their template."""
    req = ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    rids = []
    for i in range(n):
        rid = f"new-{i}"
        rids.append(rid)
        lr = sl.log_records.add()
        lr.time_unix_nano = lr.observed_time_unix_nano = 1_764_000_000_000_000_000 + i
        lr.body.string_value = f"user alice logged in from 10.1.2.{i} rid={rid}"
    return rids, req.SerializeToString()


def _load_then_kill(data_dir: Path, ledger: AckLedger, seed: int) -> None:
    with ServeProcess(data_dir, ENV) as serve:
        with AckLoad(ledger, serve.http_port, senders=4, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(300, timeout=120)
            serve.kill()
            load.join()


def _release(fifo: Path) -> None:
    fd = os.open(fifo, os.O_WRONLY)  # the probe's open returns; it then sees EOF
    os.close(fd)


@pytest.fixture
def probe(tmp_path: Path) -> tuple[dict[str, str], Path]:
    directory = tmp_path / "probe"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(_PROBE)
    fifo = tmp_path / "replay.fifo"
    os.mkfifo(fifo)
    env = {**ENV, "PYTHONPATH": f"{directory}{os.pathsep}{ROOT}", "READY_TEST_FIFO": str(fifo)}
    return env, fifo


def test_issue15_a_new_batch_is_acknowledged_before_recovery_done_and_turned_after_the_replay(
    tmp_path: Path, probe: tuple[dict[str, str], Path]
) -> None:
    seed = seed_from("READY_SEED")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ledger = AckLedger()
    _load_then_kill(data_dir, ledger, seed)
    env, fifo = probe
    rids, body = _new_batch(20)
    with ServeProcess(data_dir, env).start(recovered=False) as serve:
        status, _, _ = serve.post_logs(body, {"X-Ourios-Tenant": "acme"})
        assert status == 200, serve.tail()
        assert serve.event("recovery.done") == []  # acknowledged while the replay waits
        left = _gauge(serve, "ourios_recovery_backlog_bytes")
        assert left is not None and left > 0
        _release(fifo)
        _wait_event(serve, "recovery.done")
        assert serve.terminate() == 0, serve.tail()
    rows = _published(data_dir)
    counts = Counter(rid_of_body(str(r["body"])) for r in rows)
    assert {rid: counts[rid] for rid in rids} == dict.fromkeys(rids, 1)  # once each
    missing = ledger.rids(Outcome.ACKED) - counts.keys()
    assert not missing, f"acknowledged and lost: {sorted(missing)[:10]}"
    # Turned after the replay: mined against the tree the replay rebuilt, the new records
    # share the template the first run's records of that shape got.
    replayed = {
        r["template_id"]
        for r in rows
        if r["tenant"] == "acme"
        and str(r["body"]).startswith("user ")
        and " logged in from " in str(r["body"])
        and not str(r["body"]).endswith(tuple(f"rid={rid}" for rid in rids))
    }
    new = {r["template_id"] for r in rows if rid_of_body(str(r["body"])) in set(rids)}
    assert len(new) == 1 and new <= replayed, (new, replayed)


def test_issue15_a_sigkill_during_the_replay_loses_nothing_acknowledged(
    tmp_path: Path, probe: tuple[dict[str, str], Path]
) -> None:
    seed = seed_from("READY_SEED")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ledger = AckLedger()
    _load_then_kill(data_dir, ledger, seed)
    env, _fifo = probe
    rids, body = _new_batch(20)
    serve = ServeProcess(data_dir, env).start(recovered=False)
    try:
        status, _, _ = serve.post_logs(body, {"X-Ourios-Tenant": "acme"})
        assert status == 200, serve.tail()
        assert serve.event("recovery.done") == []
        serve.kill()  # the replay is still held at its first frame
    finally:
        serve.close()
    with ServeProcess(data_dir, ENV) as serve:
        _wait_event(serve, "recovery.done")
        assert serve.terminate() == 0, serve.tail()
    counts = Counter(rid_of_body(str(r["body"])) for r in _published(data_dir))
    missing = (ledger.rids(Outcome.ACKED) | set(rids)) - counts.keys()
    assert not missing, f"acknowledged and lost: {sorted(missing)[:10]}"


def _gauge(serve: ServeProcess, name: str) -> float | None:
    return scrape(serve).value(name)


def _wait_event(serve: ServeProcess, name: str, timeout: float = 120.0) -> None:
    done = threading.Event()
    deadline = timeout
    while not serve.event(name):
        if deadline <= 0:
            raise AssertionError(f"no {name} in {timeout} s:\n{serve.tail()}")
        done.wait(0.05)  # the process's event stream: an external condition
        deadline -= 0.05

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
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.ackload import AckLedger, AckLoad, Outcome, rid_of_body
from tests.support.crashrig import NO_CUT_ENV, seed_from
from tests.support.noderig import bodies_request
from tests.support.scrape import scrape
from tests.support.serve import ROOT, ServeProcess

TENANTS = ("acme", "globex")
# no cut before the kill: the restart replays everything the first run wrote
ENV = {**NO_CUT_ENV, "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "10"}

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
    rids = [f"new-{i}" for i in range(n)]
    bodies = [f"user alice logged in from 10.1.2.{i} rid={rid}" for i, rid in enumerate(rids)]
    return rids, bodies_request(None, bodies, observed=True).SerializeToString()


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


@pytest.fixture
def killed(tmp_path: Path) -> tuple[Path, AckLedger]:
    """A data directory a node was SIGKILLed in under load, before any cut (so a restart
    replays all of it), and the ledger of what that load had acknowledged."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ledger = AckLedger()
    _load_then_kill(data_dir, ledger, seed_from("READY_SEED"))
    return data_dir, ledger


def test_issue15_a_new_batch_is_acknowledged_before_recovery_done_and_turned_after_the_replay(
    killed: tuple[Path, AckLedger], probe: tuple[dict[str, str], Path]
) -> None:
    data_dir, ledger = killed
    env, fifo = probe
    rids, body = _new_batch(20)
    with ServeProcess(data_dir, env).start(recovered=False) as serve:
        status, _, _ = serve.post_logs(body, {"X-Ourios-Tenant": "acme"})
        assert status == 200, serve.tail()
        assert serve.event("recovery.done") == []  # acknowledged while the replay waits
        left = _gauge(serve, "ourios_recovery_backlog_bytes")
        assert left is not None and left > 0
        _release(fifo)
        serve.wait_event("recovery.done", deadline_s=120)
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
    killed: tuple[Path, AckLedger], probe: tuple[dict[str, str], Path]
) -> None:
    data_dir, ledger = killed
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
        serve.wait_event("recovery.done", deadline_s=120)
        assert serve.terminate() == 0, serve.tail()
    counts = Counter(rid_of_body(str(r["body"])) for r in _published(data_dir))
    missing = (ledger.rids(Outcome.ACKED) | set(rids)) - counts.keys()
    assert not missing, f"acknowledged and lost: {sorted(missing)[:10]}"


def _gauge(serve: ServeProcess, name: str) -> float | None:
    return scrape(serve).value(name)

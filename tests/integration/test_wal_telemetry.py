"""RFC0052.7: the WAL's state is exported (RFC 0052 §3.5, DESIGN.md §9).

- A real `ourios serve` exports every name of the interface (``INTERFACE`` in
  tests/chart/test_alerts.py), with its type and labels, and `promtool check metrics`
  has nothing to say about the scrape; the two absent-when-clear gauges are absent
  exactly when their state is clear.
- A node whose store always fails keeps acknowledging; its unreclaimed bytes grow while
  the checkpoint stands (the figure below the checkpoint would read flat), and
  ``ourios_sink_publish_failures_total`` rises. Shown on a real server with a dead S3
  endpoint (the scrape) and in-process after a healthy cut (``reclaim_state`` and the
  collector together, the checkpoint standing at a real mark while segments roll).
- Each state transition is one log event, at the transition: the terminal rotation
  state, the floor's pinned/lifted, the barrier's latch.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from app.base.config import load_settings
from app.base.rejections import IngestRejection, Unavailable
from app.node.metrics import Metrics
from tests.chart.test_alerts import ABSENT_WHEN_CLEAR, INTERFACE
from tests.support.noderig import NodeRig, request
from tests.support.scrape import Scrape, scrape, scrape_until
from tests.support.serve import ServeProcess
from tests.support.tools import require_tool
from wal import RotationExhausted

FAST_TIMERS = {"OURIOS_WAL_BARRIER_SECS": "1", "OURIOS_WAL_HOUSEKEEPING_SECS": "1"}
HISTOGRAMS = [name for name, (kind, _) in INTERFACE.items() if kind == "histogram"]


def post(server: ServeProcess, tag: str, n: int = 5) -> None:
    status, body, _ = server.post_logs(request(tag, n).SerializeToString())
    assert status == 200, (status, body, server.tail())


def dead_port() -> int:
    """A local TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- every name is in a live scrape ----------------------------------------------------


def warm(s: Scrape) -> bool:
    """Every counter and histogram a healthy node moves has samples, and a cut after the
    ingest installed the tenant's snapshot and a pass lifted its pin."""
    return (
        s.value("ourios_wal_retain_floor", state="min") == 1
        and (s.value("ourios_wal_checkpoint_lsn_bytes") or 0) > 0
        and s.value("ourios_cadence_runs_total", cadence="barrier", outcome="ok") is not None
        and s.value("ourios_cadence_runs_total", cadence="housekeeping", outcome="ok") is not None
        and all((s.value(f"{h}_count") or 0) > 0 for h in HISTOGRAMS)
    )


def test_rfc0052_7_every_name_is_in_a_live_scrape(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    with ServeProcess(tmp_path / "node", FAST_TIMERS) as server:
        # A fresh WAL holds no frame: no age is reported for it.
        idle = scrape(server)
        assert idle.value("ourios_wal_unreclaimed_bytes") == 0
        assert "ourios_wal_oldest_unreclaimed_age_seconds" not in idle.families

        post(server, "scrape")
        s = scrape_until(server, warm)

        missing = sorted(set(INTERFACE) - ABSENT_WHEN_CLEAR - set(s.families))
        assert missing == [], f"not exported: {missing}"
        for name, (kind, labels) in INTERFACE.items():
            if name not in s.families:
                continue
            scraped_kind, samples = s.families[name]
            assert scraped_kind == kind, (name, scraped_kind)
            label_sets = {frozenset(x.labels) - {"le"} for x in samples}
            assert label_sets <= {labels}, (name, label_sets)
            # No series before the first failure: the documented empty families.
            if name not in (
                "ourios_sink_publish_failures_total",
                "ourios_wal_archive_failures_total",
                "ourios_sink_dead_lettered_total",
            ):
                assert samples, f"{name} has no sample"

        # A healthy node: no latch, frames unreclaimed (the current segment's), an age.
        assert "ourios_barrier_failed_epoch" not in s.families
        assert (s.value("ourios_wal_unreclaimed_bytes") or 0) > 0
        age = s.value("ourios_wal_oldest_unreclaimed_age_seconds")
        assert age is not None and age >= 0
        assert (s.value("ourios_wal_checkpoint_lsn_bytes") or 0) > 0
        assert (s.value("ourios_barrier_epoch") or 0) > 1
        for family, states, current in (
            ("ourios_wal_retain_floor", ("unknown", "none", "min", "pinned"), "min"),
            ("ourios_wal_rotation_state", ("healthy", "retrying", "terminal"), "healthy"),
        ):
            values = {st: s.value(family, state=st) for st in states}
            assert values == {st: 1.0 if st == current else 0.0 for st in states}, family
        assert s.value("ourios_wal_tenants", state="held") == 1
        limit = s.value("ourios_wal_tenants_limit")
        assert limit is not None and s.value("ourios_wal_tenants", state="free") == limit - 1
        assert s.value("ourios_ingest_requests_total", transport="http", outcome="ok") == 1
        assert s.value("ourios_ingest_records_total", transport="http", outcome="ok") == 5
        assert (s.value("ourios_disk_free_bytes") or 0) > 0
        assert s.value("ourios_ingest_ack_seconds_bucket", le="+Inf") == 1

        # promtool's lint of the exposition: no errors and no naming warnings.
        lint = subprocess.run(
            [promtool, "check", "metrics"],
            input=s.text,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
        assert lint.stdout + lint.stderr == "", lint.stdout + lint.stderr

        assert server.terminate() == 0
    assert len(server.event("recovery.done")) == 1


# -- unreclaimed bytes grow while the checkpoint stands ---------------------------------


def test_rfc0052_7_growing_unreclaimed_bytes_while_the_checkpoint_stands(tmp_path: Path) -> None:
    """A real node whose S3 endpoint refuses every connection."""
    env = {
        **FAST_TIMERS,
        "OURIOS_STORE_URL": "s3://ourios-dead/logs",
        "OURIOS_STORE_ENDPOINT_URL": f"http://127.0.0.1:{dead_port()}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    failures = "ourios_sink_publish_failures_total"
    with ServeProcess(tmp_path / "node", env) as server:
        rounds: list[Scrape] = []
        seen: list[Scrape] = []

        def failed_more(s: Scrape) -> bool:
            seen.append(s)
            return s.total(failures) > (rounds[-1].total(failures) if rounds else 0)

        for i in range(4):
            post(server, f"outage-{i}", 50)  # acknowledged: durable in the WAL
            rounds.append(scrape_until(server, failed_more))
        server.kill()  # the final cut could only fail against the dead store

    unreclaimed = [r.value("ourios_wal_unreclaimed_bytes") or 0 for r in rounds]
    assert all(b > a for a, b in zip(unreclaimed, unreclaimed[1:], strict=False)), unreclaimed
    assert {s.value("ourios_wal_checkpoint_lsn_bytes") for s in seen} == {0}, "the checkpoint moved"
    totals = [r.total(failures) for r in rounds]
    assert all(b > a for a, b in zip(totals, totals[1:], strict=False)), totals
    error_types = {x.labels["error_type"] for x in rounds[-1].families[failures][1]}
    # A records publish waiting on its failed template events counts as audit_not_durable;
    # while the store gate is shut (DESIGN.md §5.12) the others fail at once as
    # store_unavailable, without reaching the store.
    assert "s3_connection" in error_types, error_types
    assert error_types <= {"s3_connection", "audit_not_durable", "store_unavailable"}, error_types
    last = rounds[-1]
    assert (last.value("ourios_cadence_runs_total", cadence="barrier", outcome="refused") or 0) > 0
    assert last.value("ourios_ingest_requests_total", transport="http", outcome="ok") == 4
    assert "ourios_barrier_failed_epoch" not in last.families  # a failing store is no latch
    assert last.value("ourios_wal_oldest_unreclaimed_age_seconds") is not None


# -- in-process: a node rig with the collector bound to it -------------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[NodeRig]:
    with NodeRig(tmp_path) as node:
        yield node


def collector(rig: NodeRig, tmp_path: Path) -> Callable[[], Scrape]:
    """The production collector read against the rig (what /metrics would serve)."""
    metrics = Metrics(load_settings({"OURIOS_SERVER_DATA_DIR": str(tmp_path / "settings")}))
    metrics.bind(rig.pipeline)
    return lambda: Scrape.parse(generate_latest(metrics.registry).decode())


def journal_events_to(rig: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    # NodeRig's journal reports into rig.record_event like the pipeline, barrier and
    # housekeeper: one ordered stream holds every transition, as `ourios serve`'s one
    # EventLog does. Checked, not assumed: the WAL wraps its sink in its mutex (events
    # raised under it go out after it), and the wrapped sink is the rig's.
    mutex = getattr(rig.journal.events, "__self__", None)
    assert getattr(mutex, "_sink", None) == rig.record_event


def cut_ok(rig: NodeRig) -> bool:
    """Run the barrier's timer step; True when its cut completed."""
    out = rig.barrier.step()
    return out is not None and out.ok


def names(rig: NodeRig, prefix: str) -> list[str]:
    """The transition events with ``prefix``, read back from the JSON log stream the
    production ``EventLog`` wrote (one object per line), in order."""
    logged = [str(line["event"]) for line in rig.logged_events()]
    assert logged == [name for name, _ in rig.events]  # the stream is the whole story
    return [name for name in logged if name.startswith(prefix)]


def test_rfc0052_7_unreclaimed_bytes_grow_in_process_after_a_healthy_cut(
    rig: NodeRig, tmp_path: Path
) -> None:
    read = collector(rig, tmp_path)
    rig.ingest("t", "healthy")
    assert cut_ok(rig)
    rig.housekeeper.step()
    mark = rig.journal.reclaim_state().checkpoint
    assert mark is not None

    rig.store.fail(ops=("put",), always=True)
    states, scrapes = [], []
    for i in range(6):
        rig.ingest("t", f"outage-{i}", 300)  # ~18 KiB frames: segments roll
        out = rig.barrier.step()
        assert out is not None and not out.ok and out.flush_failures > 0
        rig.housekeeper.step()
        states.append(rig.journal.reclaim_state())
        scrapes.append(read())

    assert all(st.checkpoint == mark for st in states), "the checkpoint moved"
    grown = [st.unreclaimed_bytes for st in states]
    assert all(b > a for a, b in zip(grown, grown[1:], strict=False)), grown
    assert states[-1].segments > states[0].segments  # rolled, and nothing reclaimed
    # The exported figures are the same numbers, read at collection time.
    assert [s.value("ourios_wal_unreclaimed_bytes") for s in scrapes] == grown
    assert {s.value("ourios_wal_checkpoint_lsn_bytes") for s in scrapes} == {mark.lsn}
    assert [s.value("ourios_wal_segments") for s in scrapes] == [st.segments for st in states]
    totals = [s.total("ourios_sink_publish_failures_total") for s in scrapes]
    assert all(b > a for a, b in zip(totals, totals[1:], strict=False)), totals
    assert (scrapes[-1].value("ourios_sink_parked_partitions") or 0) + (
        scrapes[-1].value("ourios_sink_buffered_bytes") or 0
    ) > 0


# -- transitions are emitted once --------------------------------------------------------


def ingest_refused(rig: NodeRig, tag: str) -> IngestRejection | None:
    try:
        rig.ingest("t", tag, 200)
    except IngestRejection as exc:
        return exc
    return None


def terminal_rotation(rig: NodeRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal_events_to(rig, monkeypatch)
    read = collector(rig, tmp_path)
    rig.ingest("t", "before")
    rig.fs.fail("open", "*.wal.partial", count=None)  # every rotation fails from here
    refusals: list[IngestRejection] = []
    for i in range(12):  # ~12 KiB frames: rotations are owed after a few
        exc = ingest_refused(rig, f"r{i}")
        if exc is not None:
            refusals.append(exc)
        rig.barrier.step()  # the idle rotation draws on the same budget
    assert isinstance(rig.journal.rotation_state, RotationExhausted)
    assert len(refusals) >= 4 and all(isinstance(e, Unavailable) for e in refusals)
    assert "terminal" in refusals[-1].message

    assert names(rig, "wal.rotation.") == ["wal.rotation.retrying", "wal.rotation.terminal"]
    terminal = [f for n, f in rig.events if n == "wal.rotation.terminal"][0]
    assert terminal["attempts"] == rig.journal.config.rotation_retry_attempts
    assert ".wal.partial" in str(terminal["first_error"])
    s = read()
    assert s.value("ourios_wal_rotation_state", state="terminal") == 1
    assert s.value("ourios_wal_rotation_state", state="healthy") == 0
    assert s.value("ourios_wal_rotation_failed_attempts") == 3


def floor_pinned_and_lifted(rig: NodeRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = collector(rig, tmp_path)
    pinned_gauge: list[float | None] = []

    def steps(n: int) -> None:
        for _ in range(n):
            rig.housekeeper.step()
            pinned_gauge.append(read().value("ourios_wal_retain_floor", state="pinned"))

    for tenant in ("first", "second"):  # two full transitions, each pinned then lifted
        rig.ingest(tenant, "a")  # frames and no snapshot yet: pinned, by design
        steps(2)
        assert names(rig, "wal.floor.") == ["wal.floor.pinned", "wal.floor.lifted"] * (
            tenant == "second"
        )
        assert read().value("ourios_wal_retain_floor_pinned_tenants") == 1
        rig.fs.fail("open", f"{tenant}.*.snap.tmp", count=1)
        assert cut_ok(rig)  # its install fails, the checkpoint passes its frames: held
        steps(2)
        rig.ingest(tenant, "b")
        assert cut_ok(rig)  # installs its snapshot
        steps(2)
    assert names(rig, "wal.floor.") == [
        "wal.floor.pinned",
        "wal.floor.lifted",
        "wal.floor.pinned",
        "wal.floor.lifted",
    ]
    assert pinned_gauge == [1, 1, 1, 1, 0, 0] * 2
    pinned = [f for n, f in rig.events if n == "wal.floor.pinned"]
    assert [p["example_tenants"] for p in pinned] == [["first"], ["second"]]


def latch_set(rig: NodeRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A barrier tick that raises latches its epoch, once however often it repeats (a
    mining failure no longer latches: RFC 0055 settles it,
    tests/unit/app/ingest/test_settlement.py)."""
    read = collector(rig, tmp_path)
    rig.ingest("good", "a")
    assert cut_ok(rig)
    assert "ourios_barrier_failed_epoch" not in read().families
    epoch = rig.pipeline.epoch

    def capture(reason: str) -> object:
        raise RuntimeError("injected tick failure")

    monkeypatch.setattr(rig.pipeline.cuts, "capture_cut_locked", capture)
    for i in range(3):
        rig.ingest("good", f"g{i}")
        try:
            rig.barrier.step()
        except RuntimeError as exc:  # what the barrier thread's loop does with it
            rig.barrier.tick_failed(exc)
    assert rig.pipeline.failed_epoch == epoch
    assert read().value("ourios_barrier_failed_epoch") == epoch
    assert names(rig, "barrier.latch.") == ["barrier.latch.set"], [n for n, _ in rig.events]


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(terminal_rotation, id="rotation_terminal"),
        pytest.param(floor_pinned_and_lifted, id="floor_pinned_lifted"),
        pytest.param(latch_set, id="latch_set"),
    ],
)
def test_rfc0052_7_transition_events_are_emitted_once(
    scenario: Callable[[NodeRig, Path, pytest.MonkeyPatch], None],
    rig: NodeRig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenario(rig, tmp_path, monkeypatch)

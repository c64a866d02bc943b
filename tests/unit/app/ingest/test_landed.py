"""Issue 16: exactly once in the store across crashes (``app/ingest/landed.py``,
``wal/intents.py``, ``app/node/recovery.py``).

Every object's claim is durable in PUBLISHING before its PUT; a restart asks the store
which of the objects above the frontiers exist and forwards nothing they hold. The crash
model is ``NodeRig``'s (``restart(crash=True)``: the process is abandoned, the journal's
and the intents' files are what the kernel keeps); a publish left registered in flight
is a publish the kill interrupted. The real-process tests are
``tests/crash/test_exactly_once_serve.py``.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from app.ingest.landed import LandedCheck
from app.receive.otlp import decode_request, flatten
from sink.buffers import Detached
from sink.spool import Spiller
from sink.testing import FailingStore, MemoryStore
from tests.support.noderig import NodeRig, bodies_request, request, rids
from wal import IntentLog, IntentRecord, ObjectKind, OsFs

NANOS_PER_DAY = 86_400 * 1_000_000_000


@pytest.fixture
def rigs() -> Iterator[list[NodeRig]]:
    made: list[NodeRig] = []
    yield made
    for rig in made:
        rig.close()


def rig_at(path: Path, rigs: list[NodeRig], **kwargs: Any) -> NodeRig:
    rig = NodeRig(path, **kwargs)
    rigs.append(rig)
    return rig


def once(rig: NodeRig, expected: list[str], tenant: str | None = None) -> None:
    """Every expected rid exactly once, nothing else."""
    counts = Counter(rig.published_rids(tenant))
    assert sorted(counts) == sorted(expected), (sorted(counts), sorted(expected))
    twice = {r: n for r, n in counts.items() if n > 1}
    assert not twice, f"published more than once: {twice}"


def events_once(rig: NodeRig) -> Counter[tuple[object, object, object]]:
    events = Counter(
        (e["tenant"], e["template_id"], e["template_version"]) for e in rig.audit_rows()
    )
    assert all(n == 1 for n in events.values()), events
    return events


def drain_records(rig: NodeRig) -> list[Detached]:
    """Detach everything buffered; publish the template events now (records never land
    ahead of them) and hand back the records partitions, registered in flight."""
    out: list[Detached] = []
    for d in rig.buffers.drain_all("age"):
        if d.partition.kind is ObjectKind.AUDIT:
            assert rig.publisher.publish(d).ok
        else:
            out.append(d)
    return out


def drain_publish(rig: NodeRig) -> None:
    """Publish everything buffered now (the size trigger or the age sweep would), with
    no cut: nothing of it is below a frontier."""
    for d in rig.buffers.drain_all("age"):
        rig.publisher.publish(d)


def test_issue16_rows_published_above_the_frontier_are_not_published_again(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a0")
    rig.barrier.step()  # a frontier: a0 is below it
    rig.ingest("acme", "a1")
    rig.ingest("globex", "g1")
    drain_publish(rig)  # published above the frontier, no cut after it
    rig.ingest("acme", "a2")  # buffered only: the crash takes it to the WAL alone

    report = rig.restart(crash=True)

    assert report is not None
    # a1's and g1's records objects and their template events' objects
    assert report.objects_checked == report.objects_found == 4
    assert report.records_landed == 6
    rig.barrier.step()
    once(rig, [*rids("a0"), *rids("a1"), *rids("g1"), *rids("a2")])
    events_once(rig)


def test_issue16_an_object_states_exactly_the_frames_it_holds_after_a_merge(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    """A publish that failed cleanly merges with newer rows while the rows between them
    are in flight elsewhere: the merged object holds a1 and a3 but not a2. Recovery must
    suppress exactly a1 and a3 — a claim of "a1 through a3" would lose a2, whose publish
    the crash interrupted."""
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a1")
    (first,) = drain_records(rig)
    rig.ingest("acme", "a2")
    (second,) = drain_records(rig)  # in flight when the node dies
    rig.ingest("acme", "a3")
    rig.store.fail(ops=["put"])  # refused before anything was written
    assert not rig.publisher.publish(first).ok  # its rows merge with a3's
    (merged,) = drain_records(rig)
    assert rig.publisher.publish(merged).ok
    assert sorted(rig.published_rids()) == sorted([*rids("a1"), *rids("a3")])
    assert second.flight is not None and second.flight.outcome is None

    report = rig.restart(crash=True)

    assert report is not None and report.records_landed == 6
    rig.barrier.step()
    once(rig, [*rids("a1"), *rids("a2"), *rids("a3")])


def test_issue16_an_ambiguous_put_then_a_crash_adds_no_copy(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a1")
    rig.ingest("acme", "a2")
    (d,) = drain_records(rig)
    rig.store.lose_reply(ops=["put"])  # the store took it; the answer was lost
    assert not rig.publisher.publish(d).ok
    rig.ingest("acme", "a3")

    report = rig.restart(crash=True)

    assert report is not None and report.records_landed == 6
    rig.barrier.step()
    once(rig, [*rids("a1"), *rids("a2"), *rids("a3")])


def test_issue16_an_ambiguous_put_retried_in_process_is_stored_once(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a1")
    (d,) = drain_records(rig)
    rig.store.lose_reply(ops=["put"])
    assert not rig.publisher.publish(d).ok
    rig.ingest("acme", "a2")
    rig.barrier.step()  # the retry, under the failed attempt's key, then a2
    once(rig, [*rids("a1"), *rids("a2")])
    assert rig.publisher.stats.already_present == 1


def test_issue16_template_events_published_before_a_crash_are_not_published_again(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    """A template the snapshot holds is widened after the frontier: its ``changed`` event
    reaches the store, the records do not, the node dies. The replay regenerates the same
    event (same id, same version: the snapshot's tree on the same frames) and must not
    write it again; the records go out once."""
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a0")
    rig.barrier.step()  # the snapshot holds a0's template; the frontier is past a0
    before = rig.audit_rows()
    created = {(e["template_id"], e["template_version"]) for e in before}
    rig.ingest("acme", "b1")  # widens it: a changed event of a known id
    rig.store.fail(ops=["put"], prefix="records/", always=True)
    drain_publish(rig)
    changed = [e for e in rig.audit_rows() if e not in before]
    assert changed and all(e["change"] == "changed" for e in changed), changed

    report = rig.restart(crash=True)

    assert report is not None and report.audit_events_landed == len(changed)
    rig.barrier.step()
    events = events_once(rig)
    assert created <= {(tid, ver) for _, tid, ver in events}
    once(rig, [*rids("a0"), *rids("b1")])


def two_day_request(tag: str, day: int) -> ExportLogsServiceRequest:
    times = [day * NANOS_PER_DAY + 5, (day + 1) * NANOS_PER_DAY + 5]
    return bodies_request(tag, [f"op {tag} step {i} took {i} ms" for i in range(2)], times=times)


def test_issue16_a_frame_over_two_days_is_suppressed_per_day(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    day = 20_416
    data = two_day_request("x", day).SerializeToString()
    rig.pipeline.ingest(
        "acme", data, flatten(decode_request(data, "application/x-protobuf"), "acme"), "t"
    )
    second = (dt.date(1970, 1, 1) + dt.timedelta(days=day + 1)).isoformat()
    rig.store.fail(ops=["put"], prefix=f"records/tenant=acme/date={second}/", always=True)
    drain_publish(rig)  # the first day's object lands, the second day's does not
    assert rig.published_rids() == ["x/0"]

    report = rig.restart(crash=True)

    assert report is not None and report.records_landed == 1
    rig.barrier.step()
    once(rig, ["x/0", "x/1"])


def test_issue16_the_cut_trims_the_intents_below_the_frontier(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    assert rig.intent_log is not None
    for i in range(3):
        rig.ingest("acme", f"a{i}")
        drain_publish(rig)
    assert len(rig.intent_log) >= 3
    rig.barrier.step()
    assert len(rig.intent_log) == 0  # every claim is at or below the frontier now
    rig.ingest("acme", "a9")
    drain_publish(rig)
    published_since = len(rig.intent_log)
    assert published_since >= 1  # a9's records (and any template event it made)

    report = rig.restart(crash=True)
    # what was published since the frontier, not the store's size
    assert report is not None and report.objects_checked == published_since
    rig.ingest("acme", "a10")  # a restarted node has no mark before its first turn
    rig.barrier.step()
    once(rig, [r for i in (0, 1, 2, 9, 10) for r in rids(f"a{i}")])
    on_disk = IntentLog.open(OsFs(), tmp_path / "data" / "wal")
    try:
        assert len(on_disk) == 0
    finally:
        on_disk.close()


def test_issue16_the_replay_waits_for_a_store_that_does_not_answer_while_the_node_is_ready(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a1")
    drain_publish(rig)
    faults: list[Any] = []

    def arm(store: FailingStore) -> None:
        faults.append(store.fail(ops=["exists"], nth=1))  # once: then it answers
        faults.append(store.hold(ops=["exists"], nth=2))

    assert rig.restart(crash=True, replay=False, store_faults=arm) is None
    assert rig.pipeline.ready  # prepared: the node serves while the replay waits
    done = threading.Event()

    def replay() -> None:
        rig.replay_now()
        done.set()

    worker = threading.Thread(target=replay, daemon=True)
    worker.start()
    assert faults[1].reached.wait(10)  # asked again after the failure
    assert not done.is_set() and rig.recovery.backlog_bytes > 0
    faults[1].release()
    assert done.wait(10)
    worker.join(10)
    assert rig.report.objects_found == rig.report.objects_checked >= 1
    rig.barrier.step()
    once(rig, [*rids("a1")])


def test_issue16_a_shutdown_while_the_replay_waits_for_the_store_leaves_the_backlog(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    rig = rig_at(tmp_path, rigs)
    rig.ingest("acme", "a1")
    drain_publish(rig)
    held: list[Any] = []
    rig.restart(
        crash=True,
        replay=False,
        store_faults=lambda store: held.append(store.hold(ops=["exists"])),
    )
    items = iter(rig.recovery.items())

    def cancel_when_held() -> None:
        held[0].reached.wait(10)
        rig.recovery.cancel()

    cancel = threading.Timer(0.0, cancel_when_held)
    cancel.start()
    assert list(items) == []  # cancelled before the first frame
    cancel.join(10)
    held[0].release()
    assert rig.recovery.backlog_bytes > 0  # nothing turned: the next start replays it


def test_issue16_two_intents_for_one_key_suppress_only_what_both_claim() -> None:
    """Should two attempts at one key ever state different claims, the object holds
    one of them: only what both state is certainly in it."""
    store = MemoryStore()
    key = "records/tenant=acme/date=2025-11-24/n-1.parquet"
    store.put(key, b"x")
    absent = "records/tenant=acme/date=2025-11-24/n-2.parquet"
    intents = [
        IntentRecord(ObjectKind.RECORDS, "acme", key, 7, frames=(10, 20, 30)),
        IntentRecord(ObjectKind.RECORDS, "acme", key, 7, frames=(10, 30, 40)),
        IntentRecord(ObjectKind.RECORDS, "acme", absent, 7, frames=(50,)),
    ]
    landed = LandedCheck(store, intents).run()
    assert landed is not None and (landed.checked, landed.present) == (2, 1)
    assert [lsn for lsn in (10, 20, 30, 40, 50) if landed.days("acme", lsn)] == [10, 30]


# -- the memory bound (issue 21 item 1, DESIGN.md §5.12) ----------------------------------

CEILING = 24 << 10


def quiesce(rig: NodeRig) -> None:
    """Stop the spiller after the partition it holds (a spill records its intent, then
    writes its file): the counts below are read with no spill half done."""
    assert rig.spiller is not None and rig.spiller.close()


def resume(rig: NodeRig) -> None:
    rig.spiller = Spiller(rig.buffers, rig.publisher.spill)
    rig.spiller.start()


def test_bounded_1_a_restart_during_an_outage_re_derives_the_spool_under_the_ceiling(
    tmp_path: Path, rigs: list[NodeRig]
) -> None:
    """The store stops taking writes (it still answers questions); the node spools what
    does not fit under the ceiling and dies. The restart discards the spool and the
    intents of the objects the store does not hold, and its replay re-derives the rows
    under the same ceiling (spooling again, not taking them all back into memory); when
    the store takes writes again every record is in it once."""
    rig = rig_at(tmp_path, rigs, sink_ceiling=CEILING)

    def down(store: FailingStore) -> None:
        store.fail(always=True, error_type="s3_connection")

    down(rig.store)
    tags = [f"a{i}" for i in range(60)]
    for tag in tags:
        rig.ingest("acme", tag, n=20)
    quiesce(rig)
    assert rig.spool is not None and rig.spool.files > 0
    spooled_before = rig.spool.files
    assert rig.intent_log is not None and len(rig.intent_log) == spooled_before

    report = rig.restart(crash=True, store_faults=down)

    quiesce(rig)
    assert rig.spool_discarded[0] == spooled_before, "the previous run's spool is gone"
    # the spooled objects, and any clean failure whose intent was taken back in memory
    # only (retractions reach the file at its next compaction)
    assert report.objects_checked >= spooled_before and report.objects_found == 0
    assert rig.spool is not None and rig.spool.files > 0, "the replay spooled again"
    frame = max(len(request(t, 20).SerializeToString()) for t in tags)
    assert rig.buffers.peak_held_bytes <= CEILING + 8 * frame
    # the absent objects' intents went; only the new spooled ones are recorded
    assert rig.intent_log is not None and len(rig.intent_log) == rig.spool.files

    resume(rig)
    rig.store.clear()
    rig.clock.advance(10)  # past the store gate's next probe
    rig.ingest("acme", "after", n=20)  # a restarted node has no mark before its turn
    for _ in range(3):
        rig.clock.advance(10)
        rig.barrier.step()
    once(rig, [r for t in [*tags, "after"] for r in rids(t, 20)])
    assert rig.spool.files == 0


def test_bounded_1_the_restart_check_lists_a_crowded_prefix_and_forgets_the_absent(
    tmp_path: Path,
) -> None:
    memory = MemoryStore()
    store = FailingStore(memory)
    prefix = "records/tenant=acme/date=2025-11-24/rig-0-"
    keys = [f"{prefix}0190a3c2-7f1e-7b2a-9c4d-5e6f7081920{i}.parquet" for i in range(5)]
    for key in keys[:2]:
        memory.put(key, b"x")
    lone = "records/tenant=globex/date=2025-11-24/rig-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192aa"
    intents = [
        IntentRecord(ObjectKind.RECORDS, key.split("=")[1].split("/")[0], key, 20_416, (10 + i,))
        for i, key in enumerate([*keys, lone])
    ]
    absent: list[list[str]] = []
    check = LandedCheck(store, intents, list_min=3, on_absent=absent.append)
    landed = check.run()
    assert landed is not None and landed.present == 2 and landed.checked == 6
    assert check.listed == 1
    ops = Counter(op for op, _ in store.calls)
    assert ops == Counter({"list": 1, "exists": 3}), store.calls  # 2 listed + the lone key
    assert absent == [[*keys[2:], lone]]

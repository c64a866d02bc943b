"""Issue 18 item 6: settlement's intent is durable (RFC 0055 §9.4 "intent then confirm").

A settlement on the barrier thread publishes the rows it re-emitted and then records the
raised frontier in PUBLISHED. A crash between the two used to leave nothing on disk
saying the span had been attempted: the restart replayed it from the old frontier under
fresh object names and every such crash added a copy. Now the intent is written first
(the ``publishing`` bit, with the frontier in force and the end of the span), the span's
rows go out under names derived from the rows, and recovery, finding the bit, replays
the span under the same names with the store's conditional create: whatever of it had
landed is not written again, whatever had not is.

The crash model is ``NodeRig``'s (``restart(crash=True)``: the process is abandoned and
the journal's files are what the kernel keeps); the settling thread is held at a named
sync point (``app.points``) and the fs is declared crashed before it is let go, so
nothing it does after the point reaches the disk. The real-process test is
``tests/crash/test_settlement_intent_sigkill.py``.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from app import points
from app.ingest.settlement import SettleResult
from tests.support.minerfaults import FaultPlan
from tests.support.noderig import FaultyRigs, NodeRig, record_rows, rids
from tests.support.threads import Worker
from tests.unit.app.ingest.test_settlement import ingest_bodies, step
from wal import OsFs, PublishedMarks, WalOffset
from wal.published_file import PublishedFile
from wal.testing import SimulatedCrash

WAIT_S = 10.0

#: The failing frame's bodies: the first widens the template the snapshot holds (a
#: ``changed`` event of an id the snapshot knows), the second creates a template (an id
#: every rebuild allocates afresh), the third widens that one and is where mining fails,
#: after mining it (the tree is widened, the events are lost).
T1 = ["op t1 step 0 took 0 ms", "disk sda1 is 91 percent full", "disk sda2 is 17 percent full"]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[NodeRig, FaultPlan]]]:
    with FaultyRigs(tmp_path) as rigs:
        yield rigs.build


def records(rig: NodeRig, tenant: str = "T") -> list[tuple[str, int]]:
    """(rid, template_id) of every published record row of ``tenant``, with repeats."""
    return record_rows(rig, tenant)


def events(rig: NodeRig) -> Counter[tuple[int, int]]:
    """(template_id, template_version) of every published template event, counted."""
    return Counter((r["template_id"], r["template_version"]) for r in rig.audit_rows())


def assert_once(rig: NodeRig, expected: list[str]) -> None:
    """Every acknowledged record exactly once, every template event (an id at a version)
    exactly once, and no record under a template id without a ``created`` event."""
    rows = records(rig)
    got = Counter(r for r, _ in rows)
    assert got == Counter(expected), f"records: {sorted(got.items())}"
    audit = events(rig)
    twice = {k: n for k, n in audit.items() if n > 1}
    assert not twice, f"template events published more than once: {twice}"
    created = {r["template_id"] for r in rig.audit_rows() if r["change"] == "created"}
    orphans = {tid for _, tid in rows} - created
    assert not orphans, f"record rows name template ids with no created event: {orphans}"


def on_disk(rig: NodeRig, tenant: str = "T") -> PublishedMarks | None:
    """The tenant's PUBLISHED entry as a fresh process would read it."""
    loaded = PublishedFile.read_only(OsFs(), rig.root / "data" / "wal")
    assert loaded is not None
    record = loaded[1]
    for slot, entry in record.entries.items():
        if record.dictionary[slot].tenant == tenant:
            return entry.marks
    return None


def die_at(rig: NodeRig, point: str, run: Callable[[], object]) -> None:
    """Run ``run`` on a thread and kill the process when the thread reaches ``point``:
    the fs is declared crashed before the thread is let go, so nothing it does after the
    point reaches the disk (it dies on its next fs call)."""
    with points.hold(point) as held:
        worker = Worker("settling", run)
        assert held.reached.wait(WAIT_S), f"the settlement never reached {point}"
        rig.fs.crash_now()
        held.release()
        try:
            worker.join()
        except SimulatedCrash:
            pass


def settle_failed_frame(
    make: Callable[..., tuple[NodeRig, FaultPlan]], **options: object
) -> tuple[NodeRig, str]:
    """T's frontier and snapshot at a0; then a frame whose mining fails (an entry)."""
    rig, plan = make(**options)
    rig.ingest("T", "a0")
    assert step(rig).complete
    plan.fail_at("disk sda2 ", "after")
    ingest_bodies(rig, "T", "t1", T1)
    assert rig.pipeline.unmined.has("T")
    return rig, "t1"


EXPECTED = [*rids("a0"), *rids("t1")]


def test_nowedge_6_a_sigkill_between_a_settlements_publish_and_its_marks_adds_no_copy(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """Everything the settlement re-emitted reached the store, then the process died
    before PUBLISHED recorded it: the restart republishes none of it — no record, no
    template event a second time — and a further crash adds nothing either."""
    rig, _ = settle_failed_frame(make)
    die_at(rig, "settlement.published", rig.barrier.settle)
    assert Counter(r for r, _ in records(rig)) == Counter(EXPECTED)  # all of it landed
    rig.restart(crash=True)
    assert_once(rig, EXPECTED)
    seen = (Counter(records(rig)), events(rig))
    rig.restart(crash=True)
    assert (Counter(records(rig)), events(rig)) == seen


def test_nowedge_6_the_staged_republish_alone_keeps_the_span_from_being_copied(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The same kill between the settlement's publish and its marks, on a node without
    publish intents: issue 16's check of what landed also suppresses the span, so only
    without it does this test see the settlement's own guard — the span republished
    staged, under the names its attempt used, and found there."""
    rig, _ = settle_failed_frame(make, intents=False)
    die_at(rig, "settlement.published", rig.barrier.settle)
    assert Counter(r for r, _ in records(rig)) == Counter(EXPECTED)
    rig.restart(crash=True)
    assert_once(rig, EXPECTED)


def test_nowedge_6_a_sigkill_after_a_partial_publish_loses_nothing_and_duplicates_nothing(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The settlement's template events reached the store, its records did not (the
    records put failed), and the process died before any marks: the restart publishes
    the records once and no template event again."""
    rig, _ = settle_failed_frame(make)
    rig.store.fail(prefix="records/", always=True)
    die_at(rig, "settlement.published", rig.barrier.settle)
    assert {r for r, _ in records(rig)} == set(rids("a0"))  # the span's events only
    rig.restart(crash=True)
    assert_once(rig, EXPECTED)


def test_nowedge_6_repeated_crashes_inside_the_republish_add_no_copy(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The restart's own republish of the span fails half way (records refused) and the
    process dies again before anything confirms it: the next restart writes what is
    missing and nothing twice — the span and its names are fixed, not growing."""
    rig, _ = settle_failed_frame(make)
    rig.store.fail(prefix="records/", always=True)
    die_at(rig, "settlement.published", rig.barrier.settle)
    # the restart's republish fails too: the intent stays
    rig.fs.crash_now()
    rig.fs.apply_crash(power_loss=False)
    rig.publisher.close(timeout=5)
    rig.store.clear()
    rig.store.fail(prefix="records/", always=True)
    rig.start()
    assert {r for r, _ in records(rig)} == set(rids("a0"))
    rig.restart(crash=True)
    assert_once(rig, EXPECTED)


def _lsn(offset: WalOffset | None) -> int:
    return -1 if offset is None else offset.lsn


def test_nowedge_6_settlement_records_its_intent_before_the_publish_and_clears_it_with_the_marks(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The bit's lifecycle on disk: set (frontier in force, end of the span) before the
    first object of the span is written, still set when the publish returns, cleared by
    the confirm that raises the frontier to the span's end."""
    rig, _ = settle_failed_frame(make)
    frontier = on_disk(rig)
    assert frontier is not None and not frontier.publishing
    (entry,) = rig.pipeline.unmined.of("T")
    through = entry.span.offset  # the failed frame's end: the span the settlement re-emits
    first_put = rig.store.hold()
    worker = Worker("settling", rig.barrier.settle)
    assert first_put.reached.wait(WAIT_S)
    intent = on_disk(rig)
    assert intent is not None and intent.publishing, intent
    assert intent.records == frontier.records and intent.audit == frontier.audit
    assert intent.intent == through
    with points.hold("settlement.published") as published:
        first_put.release()
        assert published.reached.wait(WAIT_S)
        still = on_disk(rig)
        assert still is not None and still.publishing and still.intent == through
    (outcome,) = worker.join()
    assert outcome.result is SettleResult.SETTLED and outcome.marks_written
    confirmed = on_disk(rig)
    assert confirmed == PublishedMarks(through, through)


def test_nowedge_6_a_publish_the_store_refused_keeps_the_intent_until_a_cut_covers_the_span(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """The settlement's records put fails: no confirm, the intent stays on disk (a crash
    now would republish the span under its names). The next cut publishes the requeued
    span as itself; its mark is still below the failed frame (no turn acknowledged it),
    so the intent stays until a cut whose mark reaches the span's end clears the bit."""
    rig, _ = settle_failed_frame(make)
    (entry,) = rig.pipeline.unmined.of("T")
    rig.store.fail(prefix="records/")
    (outcome,) = rig.barrier.settle()
    assert outcome.result is SettleResult.SETTLED and not outcome.marks_written
    (settled,) = [f for n, f in rig.events if n == "tenant.settled"]
    assert settled["intent"] == str(entry.span.offset)
    kept = on_disk(rig)
    assert kept is not None and kept.intent == entry.span.offset
    assert step(rig).complete
    assert_once(rig, EXPECTED)  # the span, published by the cut under its names
    assert on_disk(rig) == kept  # the mark is below the span's end: not confirmed yet
    rig.ingest("U", "u0")
    assert step(rig).complete
    covered = on_disk(rig)
    assert covered is not None and not covered.publishing
    assert _lsn(covered.records) >= entry.span.offset.lsn
    rig.restart(crash=True)
    assert_once(rig, EXPECTED)


def test_nowedge_6_an_intent_without_a_frontier_is_replayed_from_the_tenants_first_frame(
    make: Callable[..., tuple[NodeRig, FaultPlan]],
) -> None:
    """A new node's first settlement, before any checkpoint: the intent has no frontier
    (nothing of the tenant was durable) and the settlement re-emitted every frame of the
    tenant. A cut then stamps a mark below the span's end (the failed frame is above the
    last mined turn) and fails to install the tenant's snapshot, and the process dies:
    the restart must stage the span from the tenant's first frame, as the settlement
    did — not from that checkpoint — or the span's names differ and its records land
    twice."""
    rig, plan = make()
    rig.ingest("U", "u0")
    rig.ingest("T", "t0")
    plan.fail_at("disk sda2 ", "after")
    ingest_bodies(rig, "T", "t1", T1)
    assert rig.journal.last_checkpoint is None
    rig.store.fail(prefix="records/")
    (outcome,) = rig.barrier.settle()
    assert outcome.result is SettleResult.SETTLED and not outcome.marks_written
    intent = on_disk(rig)
    assert intent is not None and intent.records is None and intent.publishing
    rig.fs.fail("open", "T.*.snap.tmp")
    assert step(rig).complete  # publishes the span as itself; the mark is below its end
    assert rig.ledger.state("T") is None  # no snapshot: the replay starts at t0
    x: WalOffset | None = rig.journal.last_checkpoint  # declared: not the narrowed None above
    assert x is not None and intent.intent is not None and x.lsn < intent.intent.lsn
    assert on_disk(rig) == intent
    expected = [*rids("u0"), *rids("t0"), *rids("t1")]
    rows = Counter(r for k in rig.memory.list("records/") for r in _rids_of(rig, k))
    assert rows == Counter(expected)
    rig.restart(crash=True)
    assert Counter(r for k in rig.memory.list("records/") for r in _rids_of(rig, k)) == Counter(
        expected
    )
    assert not {k: n for k, n in events(rig).items() if n > 1}


def _rids_of(rig: NodeRig, key: str) -> list[str]:
    table = pq.read_table(io.BytesIO(rig.memory.get(key)))
    return [v for attrs in table.column("attributes").to_pylist() for k, v in attrs if k == "rid"]

"""Dead letters (issue 22 item 6, DESIGN.md §5.13): a partition the store refuses for
good is written durably to the dead-letter directory after bounded attempts, and the
other partitions' cut completes, so the checkpoint advances for every tenant.

On a ``NodeRig`` with the faulty store double (``FailingStore``): one tenant's records
prefix refused always with a permanent error class, the other tenant's rows flowing.
Before the change the refused partition went back into every cut for ever and no cut
completed (the checkpoint stopped for every tenant)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink.parquet import RecordColumns, encode_records
from tests.support.noderig import NodeRig, checkpoint, rids, rig_factory, step

ATTEMPTS = 3


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., NodeRig]]:
    yield from rig_factory(tmp_path)


def rids_of(table: pa.Table) -> list[str]:
    return [v for attrs in table.column("attributes").to_pylist() for k, v in attrs if k == "rid"]


def dead_letters(rig: NodeRig) -> list[Path]:
    return sorted(p for p in (rig.root / "data" / "deadletter").rglob("*") if p.is_file())


def cuts_until_complete(rig: NodeRig, limit: int = 10) -> int:
    """Run cuts, ingesting a little of the healthy tenant before each, until one is
    complete; how many failed first."""
    for failed in range(limit):
        rig.ingest("good", f"g{failed + 1}")
        rig.clock.advance(60)
        if step(rig).complete:
            return failed
    raise AssertionError(f"no cut completed in {limit}")


@pytest.mark.parametrize("error_type", ["s3_access_denied", "s3_client_error"])
def test_every_state_6_a_partition_refused_for_good_is_dead_lettered_and_the_cut_completes(
    make_rig: Callable[..., NodeRig], error_type: str
) -> None:
    rig = make_rig(dead_letter_attempts=ATTEMPTS)
    rig.store.fail(prefix="records/tenant=bad/", always=True, error_type=error_type)
    rig.ingest("good", "g0")
    rig.ingest("bad", "b0")

    failed = cuts_until_complete(rig)
    # the first ATTEMPTS - 1 cuts fail on the refused partition, the next dead-letters it
    assert failed == ATTEMPTS - 1, failed
    mark = rig.pipeline.latest
    assert checkpoint(rig) == mark, (checkpoint(rig), mark)  # the checkpoint advanced
    good = set(rig.published_rids("good"))
    assert good == {r for i in range(ATTEMPTS + 1) for r in rids(f"g{i}")}, good
    assert not rig.published_rids("bad")

    (path,) = dead_letters(rig)
    relative = path.relative_to(rig.root / "data" / "deadletter").as_posix()
    assert relative.startswith("records/tenant=bad/date="), relative
    assert rids_of(pq.read_table(path)) == list(rids("b0"))
    (event,) = [f for n, f in rig.events if n == "sink.partition.dead_lettered"]
    assert event["tenant"] == "bad" and event["error_type"] == error_type, event
    assert event["attempts"] == ATTEMPTS and event["rows"] == 3, event
    assert rig.publisher.stats.dead_lettered == {("records", error_type): 1}

    # later rows of the refused partition go at their first permanent failure
    rig.ingest("bad", "b1")
    assert cuts_until_complete(rig) == 0
    assert len(dead_letters(rig)) == 2


@pytest.mark.parametrize(
    ("prefix", "error_type"),
    [("", "s3_access_denied"), ("records/tenant=bad/", "s3_connection")],
    ids=["denied-for-every-object", "transient"],
)
def test_every_state_6_no_dead_letter_for_a_node_wide_denial_or_a_transient_error(
    make_rig: Callable[..., NodeRig], prefix: str, error_type: str
) -> None:
    """A denial of every object is the node's misconfiguration, and a transient error
    an outage: the WAL absorbs both, nothing is dead-lettered."""
    rig = make_rig(dead_letter_attempts=1)
    rig.store.fail(prefix=prefix, always=True, error_type=error_type)
    rig.ingest("bad", "b0")
    for i in range(3 * ATTEMPTS):
        rig.ingest("good", f"g{i}")
        rig.clock.advance(60)
        assert not step(rig).complete
    assert not dead_letters(rig)
    assert not rig.publisher.stats.dead_lettered


def test_every_state_6_rows_that_cannot_be_encoded_are_dead_lettered_as_an_arrow_stream(
    make_rig: Callable[..., NodeRig],
) -> None:
    rig = make_rig(dead_letter_attempts=ATTEMPTS)

    def encoder(cols: RecordColumns, compression: str) -> bytes:
        if "bad" in cols.tenant:
            raise ValueError("an encode error")
        return encode_records(cols, compression)

    rig.publisher.records_encoder = encoder
    rig.ingest("good", "g0")
    rig.ingest("bad", "b0")
    assert cuts_until_complete(rig) == ATTEMPTS - 1
    (path,) = dead_letters(rig)
    assert path.name.endswith(".parquet.arrows"), path
    table = pa.ipc.open_stream(io.BytesIO(path.read_bytes())).read_all()
    assert rids_of(table) == list(rids("b0"))
    assert rig.publisher.stats.dead_lettered == {("records", "encode_error"): 1}


def test_every_state_6_a_dead_letter_that_cannot_be_written_keeps_the_rows(
    make_rig: Callable[..., NodeRig],
) -> None:
    """The directory cannot be written (here: a file where it should be): the partition
    is requeued, no cut stamps behind it, and once it can be written it is."""
    rig = make_rig(dead_letter_attempts=1)
    rig.store.fail(prefix="records/tenant=bad/", always=True, error_type="s3_client_error")
    root = rig.root / "data" / "deadletter"
    root.write_bytes(b"not a directory")
    rig.ingest("bad", "b0")
    for i in range(3):
        rig.ingest("good", f"g{i}")
        rig.clock.advance(60)
        assert not step(rig).complete
    assert checkpoint(rig) is None
    root.unlink()
    assert cuts_until_complete(rig) == 0
    (path,) = dead_letters(rig)
    assert rids_of(pq.read_table(path)) == list(rids("b0"))

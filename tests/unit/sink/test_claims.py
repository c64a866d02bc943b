"""``sink.claims``: an object's claim is read off the rows it holds — the frames of a
records object, the (wal_lsn, template_id, template_version) of each audit event."""

from __future__ import annotations

import time

from sink.buffers import NANOS_PER_DAY, Buffers
from sink.claims import Claim, claim_of
from tests.support.sinkrows import frame_rows
from wal import ObjectKind

DAY = 20_000


def buffers() -> Buffers:
    return Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: 1)


def test_a_records_claim_is_the_set_of_frames_its_rows_came_from() -> None:
    b = buffers()
    for lsn in (300, 100, 200, 100):  # a frame's rows may arrive in two batches
        b.add_records("t", DAY, frame_rows("t", DAY, lsn), wal_lsn=lsn, nbytes=1)
    (d,) = b.drain_all("barrier")
    claim = claim_of("t/records/k.parquet", d.partition)
    assert claim == Claim(
        "t/records/k.parquet", ObjectKind.RECORDS, "t", DAY, frames=(100, 200, 300)
    )
    assert claim.events == ()


def test_a_claim_states_only_the_frames_present_not_a_range() -> None:
    b = buffers()
    for lsn in (10, 30):  # frame 20 is held by another object
        b.add_records("t", DAY, frame_rows("t", DAY, lsn), wal_lsn=lsn, nbytes=1)
    (d,) = b.drain_all("barrier")
    assert claim_of("k", d.partition).frames == (10, 30)


def test_an_audit_claim_lists_each_event_in_row_order() -> None:
    b = buffers()
    ts = DAY * NANOS_PER_DAY
    b.add_audit("t", [(7, 2, "a <*>", "changed", ts), (3, 1, "b", "created", ts)], wal_lsn=50)
    b.add_audit("t", [(7, 3, "a <*> <*>", "changed", ts)], wal_lsn=60)
    (d,) = b.drain_all("barrier")
    claim = claim_of("t/audit/k.parquet", d.partition)
    assert claim.kind is ObjectKind.AUDIT and claim.tenant == "t" and claim.day == DAY
    assert claim.events == ((50, 7, 2), (50, 3, 1), (60, 7, 3))
    assert claim.frames == ()

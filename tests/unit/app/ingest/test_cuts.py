"""``app.ingest.cuts``: a cut's size is its drained partitions' and its own ids are
theirs, so a cut waits only for publishes registered before its capture."""

from __future__ import annotations

import time
import uuid

from app.ingest.cuts import Cut
from sink.buffers import Buffers
from tests.support.sinkrows import frame_rows
from wal import WalOffset

DAY = 20_000


def test_a_cut_is_sized_by_its_partitions_and_owns_their_ids() -> None:
    buffers = Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: 3)
    buffers.add_records("a", DAY, frame_rows("a", DAY, 10), wal_lsn=10, nbytes=700)
    buffers.add_records("b", DAY, frame_rows("b", DAY, 20), wal_lsn=20, nbytes=300)
    prior = buffers.last_id
    drained = buffers.drain_all("barrier")
    cut = Cut(3, WalOffset(uuid.uuid4(), 20), drained, prior, "timer")
    assert cut.nbytes == 1_000
    assert cut.own_ids == {d.id for d in drained} and len(cut.own_ids) == 2
    assert all(i > cut.prior_upto for i in cut.own_ids)
    assert cut.snaps == {} and cut.frozen == set()


def test_an_empty_cut_has_no_size_and_no_ids() -> None:
    cut = Cut(1, None, [], 0, "shutdown")
    assert cut.nbytes == 0 and cut.own_ids == set()
    other = Cut(1, None, [], 0, "shutdown")
    other.frozen.add("t")
    assert cut.frozen == set()  # each cut has its own collections

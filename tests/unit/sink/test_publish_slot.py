"""TAIL.6: a publish holds the node's encode slot around its CPU part — encoding its rows
and settling them — and not while its intent and PUT wait on the store
(``sink/publisher.py``, "A publish's CPU"). A records partition with no template events
to write first, so its publish is the only one; the slot, the encoder, the store and the
settlement each say whether the slot was held when they ran."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sink.buffers import Buffers, Detached, PublishOutcome
from sink.parquet import RecordColumns, encode_records
from sink.publisher import Publisher
from sink.testing import MemoryStore
from tests.support.sinkrows import frame_rows

DAY = 20_000


class RecordingSlot:
    """An encode slot that logs when it is taken and given back."""

    def __init__(self) -> None:
        self.held = False
        self.log: list[str] = []

    @contextmanager
    def __call__(self) -> Iterator[None]:
        assert not self.held, "the publisher took the slot while holding it"
        self.held = True
        self.log.append("take")
        try:
            yield
        finally:
            self.held = False
            self.log.append("give")


class WatchedStore(MemoryStore):
    def __init__(self, slot: RecordingSlot) -> None:
        super().__init__()
        self._slot = slot

    def put(self, key: str, data: bytes) -> None:
        self._slot.log.append(f"put held={self._slot.held}")
        super().put(key, data)


class WatchedBuffers(Buffers):
    slot: RecordingSlot

    def published(self, d: Detached) -> PublishOutcome:
        self.slot.log.append(f"settle held={self.slot.held}")
        return super().published(d)


def test_tail_6_a_publish_holds_the_slot_while_it_encodes_and_settles_not_while_it_writes() -> None:
    slot = RecordingSlot()
    buffers = WatchedBuffers(flush_bytes=1, clock=time.monotonic, epoch=lambda: 1)
    buffers.slot = slot

    def encoder(cols: RecordColumns, compression: str) -> bytes:
        slot.log.append(f"encode held={slot.held} thread={threading.current_thread().name}")
        return encode_records(cols, compression)

    store = WatchedStore(slot)
    publisher = Publisher(
        store, buffers, node="t-0", queue_depth=4, records_encoder=encoder, encode_slot=slot
    )
    try:
        rows = frame_rows("t", DAY, 1, 3, template_id=100, params=True)
        detached = buffers.add_records("t", DAY, rows, wal_lsn=1, nbytes=10)
        assert detached is not None
        outcome = publisher.publish(detached)
    finally:
        publisher.close(10)
    assert outcome.ok
    here = threading.current_thread().name
    assert slot.log == [
        "take",
        f"encode held=True thread={here}",
        "give",
        "put held=False",
        "take",
        "settle held=True",
        "give",
    ]
    assert len(store.snapshot()) == 1

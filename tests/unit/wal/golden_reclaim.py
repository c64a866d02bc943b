"""Golden RECLAIM file (RFC 0052 §3.2). Regenerate only on purpose:

    .venv/bin/python -m tests.unit.wal.golden_reclaim

A small geometry (T = 4, U = 2) so the whole 2,016-byte file is committed: header, an
older record in slot 0 and the live one in slot 1, with every kind of field set.
"""

from __future__ import annotations

from tests.unit.wal.golden import SEGMENT_A, SEGMENT_B, write_golden
from wal.reclaim_file import (
    FLAG_CHECKPOINT_ARMED,
    FLAG_CHECKPOINT_SEEN,
    FLAG_PUBLISHED_SEEDED_ARMED,
    ConsumerMode,
    DictRecord,
    Geometry,
    PlannedUnlink,
    ReclaimEntry,
    ReclaimRecord,
    encode_file_header,
    encode_slot,
)
from wal.types import WalOffset

GEOMETRY = Geometry(max_tenants=4, max_unlinks=2)


def golden_live_record() -> ReclaimRecord:
    """Generation 7: ids 0, 1 (tombstoned) and 2 assigned, id 3 unused; one planned
    record, uncertain, at position 0."""
    return ReclaimRecord(
        generation=7,
        flags=FLAG_CHECKPOINT_ARMED | FLAG_CHECKPOINT_SEEN | FLAG_PUBLISHED_SEEDED_ARMED,
        consumer_mode=ConsumerMode.KNOWN,
        next_slot_id=3,
        dictionary={
            0: DictRecord("acme"),
            1: DictRecord("retired.tenant", tombstoned=True),
            2: DictRecord("z" * 128),
        },
        entries={
            0: ReclaimEntry(ConsumerMode.KNOWN, WalOffset(SEGMENT_A, 4_096)),
            2: ReclaimEntry(ConsumerMode.NO_CONSUMER, WalOffset(SEGMENT_A, 65_536)),
        },
        planned=[
            PlannedUnlink(
                SEGMENT_B,
                {0: WalOffset(SEGMENT_B, 1 << 40), 2: WalOffset(SEGMENT_B, (1 << 40) + 99)},
                uncertain=True,
            )
        ],
    )


def golden_older_record() -> ReclaimRecord:
    """Generation 6: the previous write (one tenant, mode unrecorded)."""
    return ReclaimRecord(
        generation=6,
        flags=FLAG_CHECKPOINT_ARMED,
        next_slot_id=1,
        dictionary={0: DictRecord("acme")},
    )


def golden_reclaim_file() -> bytes:
    return (
        encode_file_header(GEOMETRY)
        + encode_slot(golden_older_record(), GEOMETRY)
        + encode_slot(golden_live_record(), GEOMETRY)
    )


FILES = {
    "reclaim_v1_t4_u2.bin": golden_reclaim_file,
}


if __name__ == "__main__":
    write_golden(FILES)

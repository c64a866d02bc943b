"""Golden PUBLISHED file (RFC 0055, ``wal/published_file.py``). Regenerate only on purpose:

    .venv/bin/python -m tests.unit.wal.golden_published

A small geometry (T = 4) so the whole 1,600-byte file is committed: header, an older
record in slot 0 and the live one in slot 1, with every flag and kind of entry set.
"""

from __future__ import annotations

from tests.unit.wal.golden import SEGMENT_A, SEGMENT_B, write_golden
from wal.published_file import (
    PublishedEntry,
    PublishedRecord,
    encode_file_header,
    encode_slot,
)
from wal.reclaim_file import DictRecord
from wal.types import WalOffset

MAX_TENANTS = 4


def golden_live_record() -> PublishedRecord:
    """Generation 9: ids 0, 1 (tombstoned), 2 and 3 assigned; 0 has both frontiers, 2 is
    mid-settlement (publishing: the frontier of both sides in the records offset, the
    end of the span in the audit offset), 3 is terminal with no frontier."""
    return PublishedRecord(
        generation=9,
        next_slot_id=4,
        dictionary={
            0: DictRecord("acme"),
            1: DictRecord("retired.tenant", tombstoned=True),
            2: DictRecord("z" * 128),
            3: DictRecord("initech"),
        },
        entries={
            0: PublishedEntry(
                WalOffset(SEGMENT_A, 4_096), WalOffset(SEGMENT_A, 2_048), generation=8
            ),
            2: PublishedEntry(
                WalOffset(SEGMENT_B, 1 << 40),
                WalOffset(SEGMENT_B, (1 << 40) + 4_096),
                publishing=True,
                generation=9,
            ),
            3: PublishedEntry(None, None, terminal=True, generation=9),
        },
    )


def golden_older_record() -> PublishedRecord:
    """Generation 8: the previous write (one tenant, both frontiers)."""
    return PublishedRecord(
        generation=8,
        next_slot_id=1,
        dictionary={0: DictRecord("acme")},
        entries={
            0: PublishedEntry(
                WalOffset(SEGMENT_A, 4_096), WalOffset(SEGMENT_A, 2_048), generation=8
            )
        },
    )


def golden_published_file() -> bytes:
    return (
        encode_file_header(MAX_TENANTS)
        + encode_slot(golden_older_record(), MAX_TENANTS)
        + encode_slot(golden_live_record(), MAX_TENANTS)
    )


FILES = {
    "published_v1_t4.bin": golden_published_file,
}


if __name__ == "__main__":
    write_golden(FILES)

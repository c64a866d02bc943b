"""Golden HIGHWATER file (issue 22 item 5, ``wal/highwater_file.py``). Regenerate only
on purpose:

    .venv/bin/python -m tests.unit.wal.golden_highwater

The whole 144-byte file: header, an older record in slot 0 (the previous segment) and
the live one in slot 1.
"""

from __future__ import annotations

from tests.unit.wal.golden import SEGMENT_A, SEGMENT_B, write_golden
from wal.highwater_file import HighWaterRecord, encode_file_header, encode_slot


def golden_live_record() -> HighWaterRecord:
    """Generation 7: segment B, based at 1 << 40, synced 3 MiB into it."""
    return HighWaterRecord(7, SEGMENT_B, 1 << 40, (1 << 40) + 3 * (1 << 20))


def golden_older_record() -> HighWaterRecord:
    """Generation 6: the previous segment's last record before it rotated."""
    return HighWaterRecord(6, SEGMENT_A, 4_096, 1_052_672)


def golden_highwater_file() -> bytes:
    return (
        encode_file_header()
        + encode_slot(golden_older_record(), 1)
        + encode_slot(golden_live_record(), 1)
    )


FILES = {
    "highwater_v1.bin": golden_highwater_file,
}


if __name__ == "__main__":
    write_golden(FILES)

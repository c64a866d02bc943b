"""Golden inputs for the on-disk layouts. Regenerate the files only on purpose:

    .venv/bin/python -m tests.unit.wal.golden

A test fails when an encoder's output no longer matches the committed bytes, which is
how an accidental format change is caught.

``data/segment_header_v2_refused.bin`` is the last version-2 segment header, kept (not
regenerated) to show that a version this build does not read is refused by its version;
version 3 added the predecessor's synced high-water (issue 18 item 5).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from wal.checkpoint_file import encode_checkpoint
from wal.frame import encode_frame
from wal.segment import FLAG_HAS_PREDECESSOR, FLAG_PREDECESSOR_SEALED, SegmentHeader
from wal.types import FrameKind, WalOffset

DATA = Path(__file__).parent / "data"
SEGMENT_UUID = uuid.UUID("01890f3e-4a5b-7c6d-8e9f-0a1b2c3d4e5f")
#: the two segments the golden two-slot files (RECLAIM, PUBLISHED, HIGHWATER) name
SEGMENT_A = SEGMENT_UUID
SEGMENT_B = uuid.UUID("01890f3e-5000-7111-9222-333344445555")


def golden_frame() -> bytes:
    return encode_frame(FrameKind.TENANT_BATCH, b"acme", b"\x0a\x03abc", max_payload=1 << 20)


def golden_header() -> SegmentHeader:
    return SegmentHeader(
        123_456, SEGMENT_UUID, FLAG_HAS_PREDECESSOR | FLAG_PREDECESSOR_SEALED, 100_000, 120_000
    )


def golden_checkpoint() -> bytes:
    return encode_checkpoint(WalOffset(SEGMENT_UUID, 987_654_321))


FILES = {
    "frame_tenant_batch.bin": golden_frame,
    "segment_header_v3.bin": lambda: golden_header().encode(),
    "checkpoint_v2.bin": golden_checkpoint,
}


def write_golden(files: Mapping[str, Callable[[], bytes]]) -> None:
    """Write each golden file under ``data/`` from its encoder (every golden module's
    ``python -m`` entry point: regenerating is always on purpose)."""
    DATA.mkdir(exist_ok=True)
    for name, make in files.items():
        (DATA / name).write_bytes(make())
        print("wrote", DATA / name)


if __name__ == "__main__":
    write_golden(FILES)

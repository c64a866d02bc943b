"""A WAL whose first segment was sealed by a failed fsync (its successor's header records
the synced high-water), and the small file helpers the high-water and quarantine tests
use on it."""

from __future__ import annotations

import io
from pathlib import Path

from tests.support.walkit import SMALL, Ledger, payload
from wal import Journal
from wal.frame import scan_frames
from wal.segment import HEADER_SIZE, SegmentHeader
from wal.testing import FaultyFs

SIZE = 2000


def segments(root: Path) -> list[Path]:
    return sorted(root.glob("*.wal"))


def segment_header(path: Path) -> SegmentHeader:
    return SegmentHeader.decode(path.read_bytes()[:HEADER_SIZE], path)


def frame_starts(path: Path) -> list[int]:
    frames, _ = scan_frames(path.read_bytes(), HEADER_SIZE, path=path)
    return [f.start for f in frames]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def run_cli(fn: object, *args: object, **kw: object) -> tuple[int, str]:
    out = io.StringIO()
    code = fn(*args, out, **kw)  # type: ignore[operator]
    return code, out.getvalue()


def sealed_after_a_failed_fsync(root: Path, fs: FaultyFs, ledger: Ledger) -> int:
    """Five acknowledged frames, then an fsync failure seals the segment (the sixth frame
    is written and never acknowledged), then four acknowledged frames in the successor,
    whose header records the seal. Returns the high-water the successor records."""
    with Journal.open(root, SMALL, fs=fs) as j:
        for i in range(5):
            assert ledger.commit(j, "t", payload(i, SIZE))
        fs.fail("fsync", "*.wal")
        assert not ledger.commit(j, "t", payload(5, SIZE))  # sealed: never acknowledged
        for i in range(6, 10):
            assert ledger.commit(j, "u", payload(i, SIZE))
    sealed, successor = segments(root)
    header = segment_header(successor)
    assert header.predecessor_sealed and header.prev_base_lsn == int(sealed.name[:20])
    return header.prev_high_water

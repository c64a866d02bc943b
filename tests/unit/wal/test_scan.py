"""The segment set reads back as one stream (segment-set seed §9 deliverables 4 and 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.walkit import seeded
from wal import Journal, WalConfig
from wal.fs import OsFs
from wal.scan import list_root, scan_segment
from wal.segment import HEADER_SIZE

MiB = 1024 * 1024
ONE_FILE = WalConfig(segment_max_bytes=16 * 1024 * MiB, max_frame_bytes=64 * 1024)


def _write_stream(root: Path, config: WalConfig, sizes: list[int], seed: int) -> None:
    rng = seeded(seed)
    with Journal.open(root, config) as j:
        batch = []
        for i, size in enumerate(sizes):
            body = rng.randbytes(size)
            batch.append(j.append_batch(f"t{i % 5}", body))
            if len(batch) == 512:
                for p in batch:
                    p.wait()
                batch = []
        for p in batch:
            p.wait()


def _replay(
    root: Path, config: WalConfig, after: int | None = None
) -> list[tuple[str, bytes, int]]:
    with Journal.open(root, config) as j:
        return [(f.tenant, f.payload, f.offset.lsn) for f in j.replay(after)]


def test_a_frame_never_straddles_segments(tmp_path: Path) -> None:
    """Deliverable 4: 200,000 frames at 1 MiB segments; every segment ends on a complete
    frame and the set replays identically to the same stream in one file."""
    rng = seeded(4)
    sizes = [rng.randint(1, 200) for _ in range(200_000)]
    config = WalConfig(segment_max_bytes=1 * MiB, max_frame_bytes=64 * 1024)
    _write_stream(tmp_path / "set", config, sizes, seed=40)
    _write_stream(tmp_path / "one", ONE_FILE, sizes, seed=40)
    listing = list_root(OsFs(), tmp_path / "set")
    assert len(listing.segments) > 20
    for seg in listing.segments:
        scan = scan_segment(OsFs(), seg)
        assert not scan.stop.damaged, f"{seg.path.name}: {scan.stop.reason}"
        assert scan.stop.valid_end == seg.size  # ends exactly on a frame
        assert seg.size <= 1 * MiB
    assert len(list_root(OsFs(), tmp_path / "one").segments) == 1
    assert _replay(tmp_path / "set", config) == _replay(tmp_path / "one", ONE_FILE)


@pytest.mark.parametrize("segments", [1, 2, 7, 40])
def test_recovery_across_a_set_equals_one_file(tmp_path: Path, segments: int) -> None:
    """Deliverable 6: at every boundary (a replay starting from any frame's end) the
    set and the single file yield the same frames."""
    frame = 4000
    per_segment = (64 * 1024 - HEADER_SIZE) // (frame + 10 + 2)  # frames that fit a 64 KiB segment
    sizes = [frame] * (per_segment * segments)
    config = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=8 * 1024)
    _write_stream(tmp_path / "set", config, sizes, seed=segments)
    _write_stream(tmp_path / "one", ONE_FILE, sizes, seed=segments)
    assert len(list_root(OsFs(), tmp_path / "set").segments) == segments
    whole = _replay(tmp_path / "one", ONE_FILE)
    assert _replay(tmp_path / "set", config) == whole
    step = max(1, len(whole) // 25)
    for k in range(0, len(whole), step):
        after = whole[k][2]
        assert _replay(tmp_path / "set", config, after) == whole[k + 1 :]

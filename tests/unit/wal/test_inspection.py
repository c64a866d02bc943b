"""``inspect_root``: the record's entries, the floor, and why each segment is retained."""

from __future__ import annotations

from pathlib import Path

from tests.support.walkit import payload
from wal import Journal, KnownHorizons, WalConfig
from wal.inspection import inspect_root

CFG = WalConfig(segment_max_bytes=64 * 1024)


def test_inspect_explains_retention_with_and_without_horizons(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    with Journal.open(root, CFG) as j:
        offs = [j.commit(f"t{i % 2}", payload(i, 9000)).offset for i in range(30)]
        j.checkpoint(offs[20])
        j.maintain(KnownHorizons({"t0": offs[10], "t1": offs[11]}), 8)
    report = inspect_root(root)
    assert report.reclaim is not None and report.reclaim.consumer_mode == "known"
    assert report.reclaim.checkpoint_seen and set(report.reclaim.entries) == {"t0", "t1"}
    names = [s.name for s in report.segments]
    assert report.eligibility[names[-1]].startswith("the current segment")
    assert "horizons unknown" in report.eligibility[names[0]]
    # with horizons: t1 lags, t0 covered; the third segment is above the checkpoint
    explained = inspect_root(root, horizons={"t0": offs[29], "t1": offs[11]})
    assert "held by t1" in explained.eligibility[names[0]]
    assert "above the checkpoint" in explained.eligibility[names[2]]
    assert explained.floor.startswith("min")
    pinned = inspect_root(root, horizons={"t0": offs[29]})
    assert "pinned by t1" in pinned.eligibility[names[0]]
    assert pinned.floor.startswith("pinned by 1 tenant")
    covered = inspect_root(root, horizons={"t0": offs[29], "t1": offs[29]})
    assert covered.eligibility[names[0]] == ""  # eligible now

"""The current segment's recorded high-water (issue 22 item 5, ``wal/highwater.py``).

The newest segment used to have one high-water, the checkpoint mark, so damage inside
acknowledged frames above it — up to a barrier interval of data — was sealed as a torn
tail and the frames after it dropped uncounted. HIGHWATER records the synced end of
the current segment every ``wal.high_water_bytes``: damage below it is corruption named
by file and offset; a torn tail above it is sealed as before, and the frames that still
verify after the damage are counted and named (``wal.torn_tail``).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from app.cli import wal as walcli
from tests.support.highwater import flip, frame_starts, run_cli, segments
from tests.support.walkit import Ledger, assert_recovers, faulty, payload
from wal import AppendError, CorruptionError, Journal, WalConfig
from wal.commit import Pending
from wal.highwater_file import HighWaterFile
from wal.segment import HEADER_SIZE
from wal.testing import FaultyFs

FRAME = 2000
EVERY = 4096
CFG = WalConfig(segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=EVERY)


def _recorded(root: Path) -> int:
    found = HighWaterFile.read_only(FaultyFs(root.parent / ".peek"), root)
    assert found is not None
    return found[1].lsn


def _killed_after(
    root: Path, fs: FaultyFs, n: int, config: WalConfig = CFG
) -> tuple[Ledger, list[int]]:
    """``n`` acknowledged frames, then the process is killed (the page cache survives;
    no clean close records anything). Returns the ledger and each frame's end LSN."""
    ledger = Ledger()
    j = Journal.open(root, config, fs=fs)
    for i in range(n):
        assert ledger.commit(j, "t", payload(i, FRAME))
    fs.crash_now()
    fs.apply_crash(power_loss=False)
    return ledger, [lsn for _, _, lsn in ledger.acked]


def test_every_state_5_damage_below_the_recorded_high_water_is_corruption(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    _ledger, ends = _killed_after(root, faulty(tmp_path), 8)
    recorded = _recorded(root)
    # recorded by the sync rounds' cadence: within one cadence of the last frame
    assert ends[-1] - EVERY - FRAME <= recorded <= ends[-1] and recorded in ends
    (newest,) = segments(root)
    starts = frame_starts(newest)
    damaged = starts[1]
    flip(newest, damaged + 40)  # inside the second frame: acknowledged, below the mark
    with pytest.raises(CorruptionError) as refused:
        Journal.open(root, CFG)
    err = refused.value
    assert err.path == newest and err.offset == damaged and err.high_water == recorded
    assert "HIGHWATER" in str(err) and "not a torn tail" in str(err)
    code, text = run_cli(walcli.verify, root)
    assert code == walcli.EXIT_PROBLEM, text
    assert f"PROBLEM: {newest.name} at byte {damaged}" in text and "HIGHWATER" in text


def test_every_state_5_a_torn_tail_counts_and_names_the_frames_after_it(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    _ledger, ends = _killed_after(root, faulty(tmp_path), 8)
    recorded = _recorded(root)
    (newest,) = segments(root)
    starts = frame_starts(newest)
    base = int(newest.name[:20])
    above = [s for s in starts if base + s - HEADER_SIZE >= recorded]
    assert len(above) >= 2, (recorded, ends)
    flip(newest, above[0] + 40)  # the first frame above the mark: a torn tail
    events: list[tuple[str, dict[str, object]]] = []
    with Journal.open(root, CFG, events=lambda n, f: events.append((n, dict(f)))) as j:
        assert j.open_report is not None and j.open_report.sealed_newest
        state = j.high_water
        replayed = list(j.replay())
    (torn,) = [f for n, f in events if n == "wal.torn_tail"]
    assert torn["path"] == str(newest) and torn["offset"] == above[0]
    assert torn["frames_after"] == len(above) - 1 == state.torn_tail_frames
    assert torn["frames_after_first_offset"] == above[1]
    assert torn["bytes"] == newest.stat().st_size - above[0] == state.torn_tail_bytes
    assert torn["high_water"] == recorded and "HIGHWATER" in str(torn["high_water_source"])
    assert len(replayed) == len(starts) - len(above)


def test_every_state_5_open_and_a_clean_close_record_what_their_fsync_covered(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    quiet = WalConfig(
        segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=1 << 20
    )
    with Journal.open(root, quiet) as j:
        ends = [j.commit("t", payload(i, FRAME)).offset.lsn for i in range(3)]
        assert j.high_water.recorded_lsn == 0  # below the cadence: nothing recorded yet
    assert _recorded(root) == ends[-1]  # the clean close recorded the whole segment
    (newest,) = segments(root)
    flip(newest, frame_starts(newest)[2] + 40)  # the last frame: acknowledged
    with pytest.raises(CorruptionError, match="HIGHWATER"):
        Journal.open(root, quiet)


def test_every_state_5_a_failed_data_fsync_is_never_claimed(tmp_path: Path) -> None:
    """Frames whose fsync failed lie above the claim: after a power loss they may be cut,
    and that stays a torn tail (every acknowledged frame replays)."""
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    ledger = Ledger()
    one = WalConfig(segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=1)
    j = Journal.open(root, one, fs=fs)
    for i in range(4):
        assert ledger.commit(j, "t", payload(i, FRAME))
    claimed = _recorded(root)
    assert claimed == ledger.acked[-1][2]  # every round records at a 1-byte cadence
    fs.fail("fsync", "*.wal", errno=errno.EIO)
    assert not ledger.commit(j, "t", payload(4, FRAME))  # sealed, never acknowledged
    assert _recorded(root) == claimed
    fs.crash_now()
    fs.apply_crash(power_loss=True)
    assert_recovers(root, ledger, one)


def test_every_state_5_a_frame_appended_during_the_round_is_never_claimed(
    tmp_path: Path,
) -> None:
    """A frame written while the leader's fsync ran is past what that fsync covered; when
    its own round fails, the leader's record after its rounds still claims only the
    synced end, so a power loss that takes the frame is a torn tail, not corruption."""
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    ledger = Ledger()
    one = WalConfig(segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=1)
    late: list[Pending] = []

    def during_the_fsync(seconds: float) -> None:
        if armed and not late:  # the first round's fsync is done; its claim is not yet
            ledger.attempted.add(payload(1, FRAME))
            late.append(j.append_batch("t", payload(1, FRAME)))

    armed = False
    j = Journal.open(root, one, fs=fs, on_fsync=during_the_fsync)
    fs.fail("fsync", "*.wal", nth=2)  # the round the late frame's leader runs for it
    armed = True
    assert ledger.commit(j, "t", payload(0, FRAME))
    assert late, "the late frame was not appended inside the round"
    with pytest.raises(AppendError):
        late[0].wait()  # sealed with its segment, never acknowledged
    assert _recorded(root) == ledger.acked[-1][2]
    fs.crash_now()
    fs.apply_crash(power_loss=True)
    assert_recovers(root, ledger, one)


def test_every_state_5_a_failed_high_water_write_keeps_the_previous_claim(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    events: list[tuple[str, dict[str, object]]] = []
    one = WalConfig(segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=1)
    j = Journal.open(root, one, fs=fs, events=lambda n, f: events.append((n, dict(f))))
    first = j.commit("t", payload(0, FRAME)).offset.lsn
    fs.fail("fsync", "HIGHWATER", count=None, errno=errno.EIO)
    j.commit("t", payload(1, FRAME))  # acknowledged: the sidecar is not the frame's
    j.commit("t", payload(2, FRAME))
    assert _recorded(root) == first and j.high_water.failures == 2
    fs.clear_faults()
    last = j.commit("t", payload(3, FRAME)).offset.lsn
    assert _recorded(root) == last
    names = [n for n, _ in events if n.startswith("wal.high_water")]
    assert names == ["wal.high_water.failed", "wal.high_water.recovered"]
    j.close()


@pytest.mark.parametrize("step", ["pwrite", "fsync"])
def test_every_state_5_a_power_loss_inside_a_high_water_write_recovers(
    tmp_path: Path, step: str
) -> None:
    root = tmp_path / "wal"
    fs = faulty(tmp_path)
    ledger = Ledger()
    one = WalConfig(segment_max_bytes=1 << 20, max_frame_bytes=32 * 1024, high_water_bytes=1)
    j = Journal.open(root, one, fs=fs)
    for i in range(3):
        assert ledger.commit(j, "t", payload(i, FRAME))
    fs.crash_at(step, "HIGHWATER")
    data = payload(3, FRAME)
    ledger.attempted.add(data)
    with pytest.raises(BaseException):  # noqa: B017 - SimulatedCrash is a BaseException
        j.commit("t", data)
    fs.apply_crash(power_loss=True)
    assert_recovers(root, ledger, one)

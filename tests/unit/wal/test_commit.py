"""Group commit: one fsync covers many waiters, the mark is the frame's own end, a failed
write or fsync seals the segment and acknowledges nothing behind it, and the error class
survives the group-commit path (RFC0052.15's WAL half)."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload
from wal import AppendError, ErrorClass, Journal, WalConfig
from wal.errors import RotationRetrying, RotationTerminal, WalIoError, WalNoSpace
from wal.segment import HEADER_SIZE, SegmentHeader
from wal.types import RotationHealthy


def test_concurrent_appenders_are_all_durable_in_order(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    ledger = Ledger()
    lock = threading.Lock()
    with Journal.open(root, SMALL) as j:

        def work(t: int) -> None:
            for i in range(150):
                data = payload(t * 10_000 + i, 300)
                out = j.commit(f"t{t % 4}", data)
                with lock:
                    ledger.acked.append((f"t{t}", data, out.offset.lsn))
                    ledger.attempted.add(data)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    ledger.acked.sort(key=lambda a: a[2])
    offsets = [a[2] for a in ledger.acked]
    assert len(set(offsets)) == len(offsets) == 16 * 150
    replayed = assert_recovers(root, ledger)
    assert len(replayed) == len(offsets)


def test_one_fsync_covers_many_waiters(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        j.commit("t", payload(0, 10))
        hold = fs.hold_at("fsync", "*.wal")
        first = j.append_batch("t", payload(1, 10))
        leader = threading.Thread(target=first.wait)
        leader.start()
        assert hold.reached.wait(10)
        # Written while the leader is inside its fsync: not covered by it.
        rest = [j.append_batch("t", payload(i, 10)) for i in range(2, 12)]
        results: list[int] = []
        waiters = [threading.Thread(target=lambda p=p: results.append(p.wait().seq)) for p in rest]
        for w in waiters:
            w.start()
        fsyncs_before = sum(1 for op, _ in fs.log if op == "fsync")
        hold.release()
        leader.join()
        for w in waiters:
            w.join()
        fsyncs = sum(1 for op, _ in fs.log if op == "fsync") - fsyncs_before
        assert sorted(results) == [p.seq for p in rest]
        # The held fsync is logged once it runs; the ten later waiters share one more.
        assert fsyncs == 2, "the ten later waiters share one covering round"


def test_the_mark_is_the_frames_own_end_not_the_eof(tmp_path: Path) -> None:
    """RFC0052.14's two-turn flush: one sync covers turns A and B; A's mark is A's end."""
    with Journal.open(tmp_path / "wal", SMALL) as j:
        a = j.append_batch("t", payload(1, 100))
        b = j.append_batch("t", payload(2, 100))
        out_a = a.wait()
        out_b = b.wait()
    assert out_a.offset == a.offset and out_b.offset == b.offset
    assert out_a.offset < out_b.offset
    assert out_a.durable_eof.lsn == out_b.offset.lsn  # the EOF reaches B: never a mark
    assert out_a.seq + 1 == out_b.seq


def test_offsets_cross_segments_with_the_uuid_of_their_segment(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "wal", SMALL) as j:
        outs = [j.commit("t", payload(i, 9000)) for i in range(20)]
        segs = j.segment_names()
    uuids = {o.offset.segment for o in outs}
    assert len(uuids) == len(segs)
    assert [o.offset.lsn for o in outs] == sorted(o.offset.lsn for o in outs)


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_write_failure_seals_and_the_next_append_starts_a_new_segment(
    tmp_path: Path, err: int
) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    with Journal.open(root, SMALL, fs=fs) as j:
        assert ledger.commit(j, "t", payload(1, 500))
        fs.fail("write", "*.wal", errno=err, torn_bytes=100)
        with pytest.raises(WalIoError) as info:
            j.commit("t", payload(2, 500))
        assert info.value.error_class is ErrorClass.TRANSIENT
        assert j.rotation_state == RotationHealthy()
        if err == errno.ENOSPC:
            # A full disk latches: nothing is attempted (no rotation budget spent) until
            # the owner reports free space again.
            latch = j.no_space
            assert latch is not None and latch.op == "write"
            with pytest.raises(WalNoSpace) as refused:
                j.commit("t", payload(3, 500))
            assert refused.value.latched and len(j.segment_names()) == 1
            assert j.clear_no_space(latch.seq) == latch and j.no_space is None
        else:
            assert j.no_space is None
        assert ledger.commit(j, "t", payload(3, 500))
        names = j.segment_names()
    assert len(names) == 2
    header = SegmentHeader.decode((root / names[1]).read_bytes()[:HEADER_SIZE], root / names[1])
    assert header.predecessor_sealed and header.prev_base_lsn == 0
    assert_recovers(root, ledger)


def test_fsync_failure_fails_every_unacknowledged_frame_in_the_segment(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    root = tmp_path / "wal"
    ledger = Ledger()
    with Journal.open(root, SMALL, fs=fs) as j:
        assert ledger.commit(j, "t", payload(0, 100))
        hold = fs.hold_at("fsync", "*.wal")
        fs.fail("fsync", "*.wal", errno=errno.EIO)
        ledger.attempted |= {payload(1, 100), payload(2, 100)}
        first = j.append_batch("t", payload(1, 100))
        errors: list[BaseException] = []

        def wait(p: object) -> None:
            try:
                p.wait()  # type: ignore[attr-defined]
            except AppendError as exc:
                errors.append(exc)

        leader = threading.Thread(target=wait, args=(first,))
        leader.start()
        assert hold.reached.wait(10)
        late = j.append_batch("t", payload(2, 100))  # behind the failing fsync, same segment
        follower = threading.Thread(target=wait, args=(late,))
        follower.start()
        hold.release()
        leader.join()
        follower.join()
        assert len(errors) == 2 and all(isinstance(e, WalIoError) for e in errors)
        assert ledger.commit(j, "t", payload(3, 100))  # a fresh segment
        assert len(j.segment_names()) == 2
    assert_recovers(root, ledger)


def test_rfc0052_15_ordinary_io_failures_stay_transient(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        fs.fail("fsync_dir")  # the open-time obligation: outside the rotation budget
        with pytest.raises(WalIoError) as info:
            j.commit("t", payload(1, 10))
        assert info.value.error_class is ErrorClass.TRANSIENT
        assert j.rotation_state == RotationHealthy()
        fs.fail("fsync", "*.wal", errno=errno.ENOSPC)
        with pytest.raises(WalIoError) as info2:
            j.commit("t", payload(2, 10))
        assert info2.value.error_class is ErrorClass.TRANSIENT
        assert "not acknowledged" in str(info2.value)
        assert j.rotation_state == RotationHealthy()
        latch = j.no_space  # ENOSPC latches until the owner reports free space
        assert isinstance(info2.value, WalNoSpace) and latch is not None
        j.clear_no_space(latch.seq)
        j.commit("t", payload(3, 10))


def test_rfc0052_15_retrying_and_terminal_classes_survive_the_group_commit_path(
    tmp_path: Path,
) -> None:
    """A follower (not the thread that ran the fsync) gets the typed error."""
    fs = faulty(tmp_path)
    config = WalConfig(segment_max_bytes=64 * 1024, rotation_retry_attempts=3)
    with Journal.open(tmp_path / "wal", config, fs=fs) as j:
        for i in range(7):
            j.commit("t", payload(i, 9000))
        fs.fail("fsync_dir", count=None)
        hold = fs.hold_at("fsync_dir", nth=2)  # the first discharge, in a sync round
        leader_p = j.append_batch("t", payload(7, 9000))  # rotates: attempt 1
        caught: dict[str, BaseException] = {}

        def wait(name: str, p: object) -> None:
            try:
                p.wait()  # type: ignore[attr-defined]
            except AppendError as exc:
                caught[name] = exc

        leader = threading.Thread(target=wait, args=("leader", leader_p))
        leader.start()
        assert hold.reached.wait(10)
        follower_p = j.append_batch("t", payload(8, 10))
        follower = threading.Thread(target=wait, args=("follower", follower_p))
        follower.start()
        hold.release()
        leader.join()
        follower.join()
        assert isinstance(caught["leader"], RotationRetrying)  # attempt 2 of 3
        assert caught["leader"].error_class is ErrorClass.TRANSIENT
        assert isinstance(caught["follower"], RotationTerminal)  # attempt 3: the follower's round
        assert caught["follower"].error_class is ErrorClass.TERMINAL
        assert "terminal rotation state" in str(caught["follower"])

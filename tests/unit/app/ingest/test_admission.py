"""Admission's bounds, lifted by the housekeeping tick that samples the disk (issue 8;
DESIGN.md §7, §12; segment-set seed §6, §12.9, §12.13, §12.14). The tick itself (what it
samples, the cut it asks for) is tested in ``tests/unit/app/cadence/test_housekeeping.py``.

Stop water, a WAL that hit ENOSPC, and the unreclaimed-bytes limit each refuse a new
batch with 503 / UNAVAILABLE, a Retry-After of the housekeeping cadence, an error type
naming the bound and a message giving the figures; each is lifted by the tick alone,
so admission resumes with no restart and no append; each level change is one event.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.base.rejections import Unavailable
from app.ingest.admission import Admission, Bound, DiskLevel
from tests.support.admissionkit import CADENCE, LOW, STOP, Events, admission, faulty_journal
from tests.support.walkit import SMALL, faulty, payload
from wal import Journal, KnownHorizons
from wal.errors import WalNoSpace


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    yield from faulty_journal(tmp_path)


def refusal(a: Admission) -> Unavailable:
    with pytest.raises(Unavailable) as info:
        a.check("t")
    return info.value


def test_stop_water_refuses_new_batches_and_resumes_by_itself(journal: Journal) -> None:
    events = Events()
    a = admission(journal, events)
    a.check("t")  # nothing sampled yet: admitted
    a.observe(STOP - 1, None)
    r = refusal(a)
    assert (r.http_status, r.retry_after, r.error_type) == (503, CADENCE, "disk_stop_water")
    assert "stop water" in r.message and f"{STOP - 1} bytes free" in r.message
    assert f"disk.stop_water_bytes={STOP}" in r.message and "retry after 7 s" in r.message
    for _ in range(3):  # still below: no further event, still refused
        a.observe(STOP - 100, None)
        refusal(a)
    assert events.names() == ["disk.stop_water"]
    stop = events.last("disk.stop_water")
    assert stop["free_bytes"] == STOP - 1 and "refusing new batches" in str(stop["action"])
    # back at stop water is not enough: resuming there would re-enter it a few batches
    # later; the resume point is an eighth of the way to low water above it
    assert a.resume_bytes == STOP + (LOW - STOP) // 8
    a.observe(STOP, None)
    refusal(a)
    a.observe(a.resume_bytes, None)  # space back (above stop, below low): admitted, no restart
    a.check("t")
    assert a.level is DiskLevel.LOW_WATER and a.refusing == ()
    recovered = events.last("disk.recovered")
    assert recovered["from"] == "stop_water" and recovered["to"] == "low_water"
    assert recovered["refused_requests"] == 5
    a.observe(LOW, None)
    assert events.names() == ["disk.stop_water", "disk.recovered", "disk.recovered"]


def test_low_water_warns_once_and_keeps_admitting(journal: Journal) -> None:
    events = Events()
    a = admission(journal, events)
    decision = a.observe(LOW - 1, None)
    assert decision.level is DiskLevel.LOW_WATER and decision.urgent and not decision.refusing
    a.check("t")
    a.observe(LOW - 5, None)
    assert events.names() == ["disk.low_water"]
    assert events.last("disk.low_water")["free_bytes"] == LOW - 1
    assert not a.observe(LOW + 1, None).urgent
    assert events.names() == ["disk.low_water", "disk.recovered"]


def test_stop_water_zero_never_refuses_on_a_sample(journal: Journal) -> None:
    a = admission(journal, Events(), stop=0)
    a.observe(0, None)
    a.check("t")
    assert a.level is DiskLevel.LOW_WATER


def test_enospc_refuses_at_the_next_request_and_the_tick_alone_lifts_it(
    tmp_path: Path,
) -> None:
    fs = faulty(tmp_path)
    events = Events()
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        a = admission(j, events)
        a.observe(LOW * 4, None)  # healthy by the last sample
        fs.fail("write", "*.wal", errno=errno.ENOSPC, count=None)
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(1, 100))
        r = refusal(a)  # no tick in between: the latch is enough
        assert r.error_type == "disk_full" and r.retry_after == CADENCE
        assert "ENOSPC" in r.message or "No space" in r.message or "injected" in r.message
        assert a.refusing == (Bound.DISK_FULL,)
        assert events.names() == ["disk.stop_water"]
        assert "write" in str(events.last("disk.stop_water")["cause"])
        # the disk is still full at the next tick: nothing lifts
        latch = j.no_space
        a.observe(0, latch)
        refusal(a)
        assert j.no_space == latch and events.names() == ["disk.stop_water"]
        # space returns: the tick clears the latch it saw and admission resumes
        fs.clear_faults()
        a.observe(STOP * 2, j.no_space)
        a.check("t")
        assert j.no_space is None
        j.commit("t", payload(2, 100))  # the same process, no restart
        assert events.names() == ["disk.stop_water", "disk.recovered"]


def test_a_latch_set_after_the_sample_is_not_cleared_by_it(tmp_path: Path) -> None:
    fs = faulty(tmp_path)
    with Journal.open(tmp_path / "wal", SMALL, fs=fs) as j:
        a = admission(j, Events())
        fs.fail("write", "*.wal", errno=errno.ENOSPC, count=None)
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(1, 100))
        seen = j.no_space
        assert seen is not None
        j.clear_no_space(seen.seq)  # (a clear by someone else) then it fills again
        with pytest.raises(WalNoSpace):
            j.commit("t", payload(2, 100))
        newer = j.no_space
        assert newer is not None and newer.seq > seen.seq
        a.observe(STOP * 2, seen)  # the sample predates the newer latch
        assert j.no_space == newer
        assert refusal(a).error_type == "disk_full"


def test_the_unreclaimed_limit_refuses_and_the_timers_alone_clear_it(
    journal: Journal,
) -> None:
    events = Events()
    offs = [journal.commit("t", payload(i, 9000)).offset for i in range(20)]
    limit = journal.unreclaimed_bytes - 1
    a = admission(journal, events, limit=limit)
    r = refusal(a)  # seen live, on the request path
    assert (r.error_type, r.retry_after) == ("wal_unreclaimed_limit", CADENCE)
    assert f"wal.unreclaimed_bytes_limit={limit}" in r.message
    assert f"{journal.unreclaimed_bytes} unreclaimed bytes" in r.message
    assert events.names() == ["wal.unreclaimed.limit"]
    a.observe(LOW * 4, None)  # a tick: still over
    refusal(a)
    # the barrier's checkpoint and a housekeeping pass (the timers) reclaim
    journal.checkpoint(offs[-1])
    journal.maintain(KnownHorizons({"t": offs[-1]}), 64)
    assert journal.unreclaimed_bytes <= limit
    refusal(a)  # reclaimed, but only the tick lifts the bound (no flapping per request)
    decision = a.observe(LOW * 4, None)
    assert decision.refusing == ()
    a.check("t")
    assert events.names() == ["wal.unreclaimed.limit", "wal.unreclaimed.recovered"]

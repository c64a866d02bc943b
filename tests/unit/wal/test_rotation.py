"""RFC0052.4 and RFC0052.5: a rotation that fails at any of its five steps recovers when
the fault clears, gives up distinguishably when it does not, never acknowledges an
incomplete rotation, and never leaves a file open would select (asserted by reopening).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.walkit import SMALL, Ledger, assert_recovers, faulty, payload
from wal import (
    AppendError,
    ErrorClass,
    Journal,
    RotationExhausted,
    RotationFailing,
    RotationKind,
    WalConfig,
)
from wal.errors import RotationRetrying, RotationTerminal
from wal.testing import FaultyFs
from wal.types import DirFsyncOrigin, RotationHealthy, RotationState

#: The five rotation steps and where the fault seam sees them.
STEPS: dict[str, tuple[str, str | None]] = {
    "create": ("open", "*.wal.partial"),
    "header_write": ("write", "*.wal.partial"),
    "header_fsync": ("fsync", "*.wal.partial"),
    "rename": ("rename", "*.wal"),
    "parent_fsync": ("fsync_dir", None),
}
PRE_RENAME = ["create", "header_write", "header_fsync", "rename"]
FRAME = 9000  # seven frames fill a 64 KiB segment; the eighth append rotates
PER_SEGMENT = 7


class Events:
    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str, fields: Mapping[str, object]) -> None:
        self.names.append(name)

    def count(self, name: str) -> int:
        return self.names.count(name)


@dataclass
class Rig:
    root: Path
    fs: FaultyFs
    journal: Journal
    ledger: Ledger
    events: Events
    n: int = 0

    def commit(self) -> bool:
        self.n += 1
        return self.ledger.commit(self.journal, f"t{self.n % 2}", payload(self.n, FRAME))

    def rotation_state(self) -> RotationState:
        """The journal's rotation state, read afresh: mypy would keep an earlier assert's
        narrowing of ``journal.rotation_state`` across the commit that changes it."""
        return self.journal.rotation_state

    def fill_segment(self) -> None:
        for _ in range(PER_SEGMENT):
            assert self.commit()


def rig(tmp_path: Path, config: WalConfig = SMALL) -> Rig:
    fs = faulty(tmp_path)
    events = Events()
    root = tmp_path / "wal"
    journal = Journal.open(root, config, fs=fs, events=events)
    r = Rig(root, fs, journal, Ledger(), events)
    r.fill_segment()  # also discharges the open-time directory fsync
    return r


def inject(r: Rig, step: str, count: int | None, code: int = errno.EIO) -> None:
    op, glob = STEPS[step]
    r.fs.fail(op, glob, count=count, errno=code)


def reopen_and_check(r: Rig) -> Journal:
    """Open must succeed and select exactly the segments the live journal had."""
    live = r.journal.segment_names()
    r.journal.close()
    assert_recovers(r.root, r.ledger)
    again = Journal.open(r.root, SMALL)
    assert again.segment_names() == live
    return again


# -- RFC0052.4: a transient failure recovers without a restart ----------------------


@pytest.mark.parametrize("step", PRE_RENAME)
def test_rfc0052_4_pre_rename_failure_via_append_recovers(tmp_path: Path, step: str) -> None:
    r = rig(tmp_path)
    inject(r, step, 1)
    with pytest.raises(RotationRetrying) as info:
        r.journal.commit("t", payload(0, FRAME))
    assert info.value.error_class is ErrorClass.TRANSIENT and "retrying" in str(info.value)
    assert r.journal.rotation_state == RotationFailing(1, r.journal.rotation_state.first_error)  # type: ignore[union-attr]
    assert r.commit()  # the next append re-enters rotate, which succeeds
    assert r.rotation_state() == RotationHealthy()
    assert r.events.count("wal.rotation.retrying") == 1
    assert r.events.count("wal.rotation.recovered") == 1
    again = reopen_and_check(r)
    assert len(again.segment_names()) == 2
    again.close()


@pytest.mark.parametrize("step", PRE_RENAME)
def test_rfc0052_4_pre_rename_failure_via_rotate_recovers(tmp_path: Path, step: str) -> None:
    r = rig(tmp_path)
    inject(r, step, 1)
    with pytest.raises(RotationRetrying):
        r.journal.rotate(RotationKind.DISCRETIONARY)
    assert len(r.journal.segment_names()) == 1
    assert r.journal.rotate(RotationKind.DISCRETIONARY) is True
    assert r.journal.rotation_state == RotationHealthy()
    assert r.commit()
    reopen_and_check(r).close()


def test_rfc0052_4_parent_fsync_failure_via_append_is_discharged_by_sync(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    inject(r, "parent_fsync", 1)
    assert r.commit()  # installed, frame written, the sync discharges and acks
    assert r.journal.rotation_state == RotationHealthy()
    assert r.journal.dir_fsync_pending is None
    assert r.events.names.count("wal.rotation.retrying") == 1
    assert r.events.names.count("wal.rotation.recovered") == 1
    again = reopen_and_check(r)
    assert len(again.segment_names()) == 2  # the installed segment is selected
    assert again.dir_fsync_pending is DirFsyncOrigin.OPEN
    assert again.commit("t", payload(500, 10)).offset  # the first sync discharges it
    # cast: mypy would keep the property narrowed to OPEN across the commit
    assert cast(DirFsyncOrigin | None, again.dir_fsync_pending) is None
    again.close()


def test_rfc0052_4_parent_fsync_failure_via_rotate(tmp_path: Path) -> None:
    r = rig(tmp_path)
    inject(r, "parent_fsync", 1)
    assert r.journal.rotate(RotationKind.DISCRETIONARY) is True
    assert isinstance(r.journal.rotation_state, RotationFailing)
    assert r.journal.dir_fsync_pending is DirFsyncOrigin.ROTATION
    assert r.commit()  # discharged by the sync without re-entering rotate
    assert r.rotation_state() == RotationHealthy()
    assert len(r.journal.segment_names()) == 2
    reopen_and_check(r).close()


def test_rfc0052_4_no_ack_while_the_rotation_obligation_is_pending(tmp_path: Path) -> None:
    r = rig(tmp_path)
    inject(r, "parent_fsync", 2)  # the rotation's fsync and the first discharge fail
    assert not r.commit()
    assert isinstance(r.journal.rotation_state, RotationFailing)
    assert r.journal.rotation_state.attempts == 2
    assert r.commit()  # the second discharge succeeds
    assert r.rotation_state() == RotationHealthy()
    reopen_and_check(r).close()


def test_rfc0052_4_rotate_is_a_noop_on_a_segment_without_frames(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "wal", SMALL) as j:
        assert j.rotate(RotationKind.DISCRETIONARY) is False
        assert j.rotate(RotationKind.OWED) is False
        j.commit("t", payload(1))
        assert j.rotate(RotationKind.DISCRETIONARY) is True
        assert j.rotate(RotationKind.DISCRETIONARY) is False


def test_rfc0052_4_a_single_frame_larger_than_the_segment_still_lands(tmp_path: Path) -> None:
    config = WalConfig(segment_max_bytes=64 * 1024, max_frame_bytes=200 * 1024)
    ledger = Ledger()
    with Journal.open(tmp_path / "wal", config) as j:
        assert ledger.commit(j, "t", payload(1, 150_000))
        assert ledger.commit(j, "t", payload(2, 150_000))
        assert len(j.segment_names()) == 2
    assert_recovers(tmp_path / "wal", ledger, config)


# -- RFC0052.5: a persistent failure gives up distinguishably and never acks --------


@pytest.mark.parametrize("step", PRE_RENAME)
def test_rfc0052_5_persistent_pre_rename_failure_goes_terminal(tmp_path: Path, step: str) -> None:
    r = rig(tmp_path)
    inject(r, step, None)
    acked_before = len(r.ledger.acked)
    errors: list[AppendError] = []
    for _ in range(6):
        try:
            r.journal.commit("t", payload(0, FRAME))
        except AppendError as exc:
            errors.append(exc)
    assert len(errors) == 6 and len(r.ledger.acked) == acked_before
    assert [type(e) for e in errors[:3]] == [RotationRetrying, RotationRetrying, RotationTerminal]
    assert all(isinstance(e, RotationTerminal) for e in errors[2:])
    state = r.journal.rotation_state
    assert isinstance(state, RotationExhausted) and state.attempts == 3
    first = str(errors[0].first_error)  # type: ignore[attr-defined]
    assert "injected EIO" in first and state.first_error == first
    assert all(e.first_error == first for e in errors)  # type: ignore[attr-defined]
    assert errors[-1].error_class is ErrorClass.TERMINAL and "terminal" in str(errors[-1])
    assert r.events.count("wal.rotation.terminal") == 1
    assert r.events.count("wal.rotation.recovered") == 0
    with pytest.raises(RotationTerminal):
        r.journal.rotate(RotationKind.OWED)
    # The partials of the failed attempts were never cleaned up; open still succeeds.
    reopen_and_check(r).close()


def test_rfc0052_5_persistent_parent_fsync_failure_goes_terminal(tmp_path: Path) -> None:
    r = rig(tmp_path)
    inject(r, "parent_fsync", None)
    results = [r.commit() for _ in range(4)]
    assert results == [False, False, False, False]
    state = r.journal.rotation_state
    assert isinstance(state, RotationExhausted) and state.attempts == 3
    assert "fsync the parent directory" in state.first_error
    assert r.events.count("wal.rotation.terminal") == 1
    reopen_and_check(r).close()


def test_rfc0052_5_terminal_reached_by_rotate_alone(tmp_path: Path) -> None:
    """The barrier's idle rotation draws on the same budget with no append at all."""
    r = rig(tmp_path)
    inject(r, "create", None)
    for expected in (RotationRetrying, RotationRetrying, RotationTerminal, RotationTerminal):
        with pytest.raises(expected):
            r.journal.rotate(RotationKind.DISCRETIONARY)
    assert not r.commit()
    reopen_and_check(r).close()


def test_budget_resets_only_when_the_obligation_itself_succeeds(tmp_path: Path) -> None:
    """Succeeding data syncs behind a failing parent fsync do not reset the count."""
    r = rig(tmp_path, WalConfig(segment_max_bytes=64 * 1024, rotation_retry_attempts=5))
    inject(r, "parent_fsync", None)
    outcomes = [r.commit() for _ in range(5)]
    assert outcomes == [False] * 5
    assert isinstance(r.journal.rotation_state, RotationExhausted)
    r.journal.close()


# -- a property over which step fails and how often ----------------------------------


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    step=st.sampled_from(sorted(STEPS)),
    failures=st.one_of(st.integers(min_value=1, max_value=5), st.none()),
    via_rotate=st.booleans(),
    budget=st.integers(min_value=1, max_value=4),
    code=st.sampled_from([errno.EIO, errno.ENOSPC]),
)
def test_rfc0052_4_5_property_any_step_any_count(
    tmp_path_factory: pytest.TempPathFactory,
    step: str,
    failures: int | None,
    via_rotate: bool,
    budget: int,
    code: int,
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    config = WalConfig(
        segment_max_bytes=64 * 1024,
        rotation_retry_attempts=budget,
        max_unlinks_per_pass=max(budget, 1),
    )
    r = rig(tmp, config)
    inject(r, step, failures, code)  # a full disk counts against the budget like EIO
    for _ in range(8):
        latch = r.journal.no_space
        if latch is not None:  # the housekeeping tick saw space return (issue 8)
            r.journal.clear_no_space(latch.seq)
        if via_rotate:
            try:
                r.journal.rotate(RotationKind.DISCRETIONARY)
            except AppendError:
                pass
        r.commit()
    state = r.journal.rotation_state
    # Each failing attempt consumes one unit; the parent-fsync step fails once in the
    # rotation and then once per discharge, so both count the same way.
    if failures is None or failures >= budget:
        assert isinstance(state, RotationExhausted)
        assert state.attempts == budget
        with pytest.raises(RotationTerminal):
            r.journal.commit("t", payload(0, 10))
    else:
        assert state == RotationHealthy()
        assert r.commit()
    reopen_and_check(r).close()


# -- RFC0052.4: the debris of failed attempts is swept in one capped pass ------------


@pytest.mark.parametrize("step", ["create", "header_write", "header_fsync", "rename"])
def test_rfc0052_4_failed_attempts_debris_is_gone_after_one_pass(tmp_path: Path, step: str) -> None:
    from wal import KnownHorizons

    r = rig(tmp_path)
    inject(r, step, None)
    for _ in range(5):
        r.commit()
    assert isinstance(r.journal.rotation_state, RotationExhausted)
    debris = r.journal.stale_partials
    # create fails before the file exists; every later step leaves one partial per attempt
    assert len(debris) == (0 if step == "create" else 3)
    assert all(p.exists() for p in debris)
    r.fs.clear_faults()
    # max_unlinks_per_pass >= rotation_retry_attempts, so one pass clears one rotation's
    # debris: a persistently retrying node cannot fill its disk with it
    progress = r.journal.maintain(KnownHorizons({}), r.journal.config.rotation_retry_attempts)
    assert progress.removed_partials == len(debris)
    assert not any(p.exists() for p in debris) and r.journal.stale_partials == []
    r.journal.close()

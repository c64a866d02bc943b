"""A model-based property: random sequences of appends, syncs, rotations, injected faults
and crashes (HIGHWATER's writes among the steps they land on). After every reopen, replay
yields every acknowledged frame in order and nothing that was never written — so no
recorded high-water ever claims more than a power loss kept."""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.walkit import Ledger, assert_recovers, payload
from wal import AppendError, Journal, RotationExhausted, RotationKind, WalConfig
from wal.commit import Pending
from wal.testing import FaultyFs, SimulatedCrash

# HIGHWATER is recorded every 8 KiB of a segment, so its writes are among the steps the
# faults and the crashes land on (issue 22 item 5).
CONFIG = WalConfig(
    segment_max_bytes=64 * 1024,
    max_frame_bytes=32 * 1024,
    rotation_retry_attempts=3,
    high_water_bytes=8 * 1024,
)
FAULT_OPS = [
    ("pwrite", "HIGHWATER"),
    ("fsync", "HIGHWATER"),
    ("write", "*.wal"),
    ("fsync", "*.wal"),
    ("fsync_dir", None),
    ("open", "*.wal.partial"),
    ("write", "*.wal.partial"),
    ("fsync", "*.wal.partial"),
    ("rename", "*.wal"),
]


class WalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="walprop-"))
        self.root = self.tmp / "wal"
        self.fs = FaultyFs(self.tmp / ".shadow")
        self.ledger = Ledger()
        self.journal: Journal | None = Journal.open(self.root, CONFIG, fs=self.fs)
        self.pending: list[tuple[Pending, bytes]] = []
        self.n = 0

    def teardown(self) -> None:
        try:
            if self.journal is not None and not self.fs.crashed:
                self.fs.clear_faults()
                self._drain()
                self.journal.close()
        except SimulatedCrash:
            pass
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------

    def _crashed(self) -> None:
        """The process died: discard it, apply the power loss, reopen, check."""
        self.journal = None
        self.pending.clear()
        self.fs.apply_crash(power_loss=True)
        self._reopen_and_check()

    def _reopen_and_check(self) -> None:
        assert_recovers(self.root, self.ledger, CONFIG)
        self.journal = Journal.open(self.root, CONFIG, fs=self.fs)

    def _drain(self) -> None:
        assert self.journal is not None
        for p, data in self.pending:
            try:
                out = p.wait()
            except AppendError:
                continue
            self.ledger.acked.append(("t", data, out.offset.lsn))
        self.pending.clear()

    # -- rules -------------------------------------------------------------------------

    @precondition(lambda self: self.journal is not None)
    @rule(count=st.integers(1, 12), size=st.sampled_from([10, 900, 9000, 30_000]))
    def append(self, count: int, size: int) -> None:
        assert self.journal is not None
        try:
            for _ in range(count):
                self.n += 1
                data = payload(self.n, size)
                self.ledger.attempted.add(data)
                try:
                    self.pending.append((self.journal.append_batch(f"t{self.n % 3}", data), data))
                except AppendError:
                    pass
        except SimulatedCrash:
            self._crashed()

    @precondition(lambda self: self.journal is not None)
    @rule()
    def sync(self) -> None:
        try:
            self._drain()
        except SimulatedCrash:
            self._crashed()

    @precondition(lambda self: self.journal is not None)
    @rule(kind=st.sampled_from(list(RotationKind)))
    def rotate(self, kind: RotationKind) -> None:
        assert self.journal is not None
        try:
            self.journal.rotate(kind)
        except AppendError:
            pass
        except SimulatedCrash:
            self._crashed()

    @rule(
        where=st.sampled_from(FAULT_OPS),
        nth=st.integers(1, 4),
        count=st.sampled_from([1, 2, None]),
        err=st.sampled_from([errno.EIO, errno.ENOSPC]),
    )
    def fault(self, where: tuple[str, str | None], nth: int, count: int | None, err: int) -> None:
        self.fs.fail(where[0], where[1], nth=nth, count=count, errno=err)

    @rule(where=st.sampled_from(FAULT_OPS), nth=st.integers(1, 6), torn=st.sampled_from([None, 5]))
    def arm_crash(self, where: tuple[str, str | None], nth: int, torn: int | None) -> None:
        self.fs.crash_at(
            where[0], where[1], nth=nth, torn_bytes=torn if where[0] == "write" else None
        )

    @precondition(lambda self: self.journal is not None)
    @rule(power_loss=st.booleans())
    def crash_now(self, power_loss: bool) -> None:
        """Kill the process between operations (SIGKILL keeps the page cache)."""
        self.fs.crash_now()
        self.journal = None
        self.pending.clear()
        self.fs.apply_crash(power_loss=power_loss)
        self._reopen_and_check()

    @precondition(lambda self: self.journal is not None)
    @rule()
    def restart_cleanly(self) -> None:
        assert self.journal is not None
        try:
            self._drain()
            self.fs.clear_faults()
            self.journal.close()
        except SimulatedCrash:
            self._crashed()
            return
        self._reopen_and_check()

    @invariant()
    def terminal_refuses_everything(self) -> None:
        if self.journal is None or self.fs.crashed:
            return
        if isinstance(self.journal.rotation_state, RotationExhausted):
            try:
                self.journal.append_batch("t", b"x")
            except AppendError:
                return
            raise AssertionError("an append was accepted in the terminal state")


WalMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=25, deadline=None, derandomize=True
)
test_wal_property = WalMachine.TestCase

"""Rotation: when the writer moves to a new segment, how a segment is created, the
directory-fsync obligation and the bounded retry budget (RFC 0052 §3.3).

* **The creation protocol.** Five steps — create ``<uuid>.wal.partial``, write the
  header, fsync it, rename it to ``<base_lsn>.wal``, fsync the parent — in that order;
  the segment is installed before the parent fsync. A failure before the rename leaves
  only a ``.partial`` (never selectable; housekeeping sweeps it) and fails the append, so
  no ``.wal`` name ever holds an unreadable header.
* **The obligation.** A failed parent fsync keeps the installed segment and leaves
  ``dir_pending`` with origin ROTATION; every sync round discharges a pending obligation
  before it acknowledges anything (``commit``), and a waiter whose segment's directory
  generation is not yet durable is not acknowledged. Every open owes one too (origin
  OPEN, outside the budget).
* **The budget.** Each failed step, and each failed discharge, consumes one unit of
  ``rotation_retry_attempts``; only the obligation itself succeeding resets it; an
  exhausted budget is ``RotationExhausted`` and every append is refused with the first
  error.
* **The old segment.** Before a rotation the old segment's unsynced frames are fsynced;
  a failure seals it through the group commit (its unacknowledged frames fail) and the
  successor's header records that its predecessor was sealed.
* **The high-water.** The successor's header records the old segment's ``synced_lsn``
  (``wal/segment.py``): after a clean rotation its end, after a seal the end the last
  completed fsync covered (a failed write or fsync never raises it). Recovery refuses
  damage below it as corruption and accepts damage above it as a torn tail. No fsync is
  added for it: the header is fsynced by step 3 anyway. Crash cases: before the rename
  only a ``.partial`` exists and the old segment is the newest (its torn tail, if any,
  is open's); after it the header is whole (fsynced before the rename) and every byte
  of the old segment below the high-water was durable before the header was written,
  so a power loss that persists pages out of order cannot make the claim false.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from .errors import AppendError, RotationRetrying, RotationTerminal, WalNoSpace, is_no_space
from .log import Log, Segment
from .segment import (
    FLAG_HAS_PREDECESSOR,
    FLAG_PREDECESSOR_SEALED,
    HEADER_SIZE,
    SegmentHeader,
    partial_name,
    segment_name,
    uuid7,
    uuid7_time,
)
from .types import (
    DirFsyncOrigin,
    RotationExhausted,
    RotationFailing,
    RotationHealthy,
    RotationState,
)


class StepError(Exception):
    """A step of the creation protocol failed; ``step`` names it for the message."""

    def __init__(self, step: str, path: Path, cause: OSError) -> None:
        super().__init__(f"{step} {path}: {cause}")
        self.step = step
        self.path = path
        self.cause = cause


def create_segment(log: Log, header: SegmentHeader) -> Segment:
    """Steps 1–4 of the creation protocol; raises ``StepError`` naming the step."""
    fs = log.fs
    partial = log.root / partial_name(header.uuid)
    final = log.root / segment_name(header.base_lsn)
    step = "create"
    fd: int | None = None
    try:
        fd = fs.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        log.segments_created += 1
        log.partials.append(partial)
        step = "write the header of"
        fs.write(fd, header.encode())
        step = "fsync the header of"
        fs.fsync(fd)
        step = "rename"
        try:
            fs.stat(final)
        except FileNotFoundError:
            pass
        else:
            raise FileExistsError(17, "a segment with this base already exists", str(final))
        fs.rename(partial, final)
    except OSError as exc:
        if fd is not None:
            try:
                fs.close(fd)
            except OSError:
                pass
        raise StepError(step, partial, exc) from exc
    log.partials.remove(partial)
    # Reopen on the final path so every later message names the real file.
    try:
        final_fd = fs.open(final, os.O_WRONLY | os.O_APPEND)
    except OSError:
        final_fd = None
    if final_fd is not None:
        try:
            fs.close(fd)
        except OSError:
            pass
        fd = final_fd
    seg = Segment(header, final, fd, uuid7_time(header.uuid))
    seg.scanned = True
    return seg


class Waiters(Protocol):
    """What a rotation needs from the group commit (``commit.Commit``)."""

    @property
    def leading(self) -> bool:
        """A sync round may hold segment descriptors now."""
        ...

    def seal_locked(self, seg: Segment, op: str, exc: OSError) -> None:
        """Seal ``seg``: its unacknowledged frames fail, nothing more lands in it."""
        ...


class Rotation:
    """The rotation state machine and the directory-fsync obligation of one journal.

    State (under the journal mutex): ``state`` (RotationHealthy, RotationFailing,
    RotationExhausted), the directory generation counter ``dir_gen``, the highest
    generation a directory fsync made durable ``dir_durable_gen``, and the pending
    obligation's origin ``dir_pending``.
    """

    def __init__(self, log: Log) -> None:
        self._log = log
        self.state: RotationState = RotationHealthy()
        self.dir_gen = 0
        self.dir_durable_gen = 0
        self.dir_pending: DirFsyncOrigin | None = None

    def owe_open(self) -> None:
        """Every open owes a directory fsync; the first sync discharges it (origin OPEN
        is outside the rotation budget)."""
        self.dir_gen = 1
        for seg in self._log.segments():
            seg.dir_gen = 1
        self.dir_pending = DirFsyncOrigin.OPEN

    def check_locked(self) -> None:
        """Refuse when the budget is exhausted (``RotationTerminal``)."""
        if isinstance(self.state, RotationExhausted):
            raise RotationTerminal(self.state.attempts, self.state.first_error)

    def due_locked(self, size: int) -> bool:
        """The next ``size``-byte frame must go to a new segment: the current one is
        sealed, or holds a frame and would outgrow its size or has reached its age."""
        cur = self._log.current
        config = self._log.config
        return cur.sealed or bool(
            cur.frames
            and (
                HEADER_SIZE + cur.data_len + size > config.segment_max_bytes
                or self._log.current_age() >= config.segment_age_secs
            )
        )

    def rotate_now_locked(self, waiters: Waiters) -> bool:
        """``Journal.rotate``'s body: discharge a pending obligation, then rotate unless
        the current segment holds no frame and is not sealed (False)."""
        cur = self._log.current
        if self.dir_pending is DirFsyncOrigin.ROTATION:
            self.discharge_locked()
        if not cur.sealed and cur.frames == 0:
            return False
        self.rotate_locked(waiters)
        return True

    def discharge_locked(self) -> None:
        root = self._log.root
        try:
            self._log.fs.fsync_dir(root)
        except OSError as exc:
            raise self.failed_locked("discharge the pending directory fsync", root, exc) from exc
        self.dir_outcome_locked(DirFsyncOrigin.ROTATION, self.dir_gen, None)

    def rotate_locked(self, waiters: Waiters) -> None:
        log = self._log
        if self.dir_pending is DirFsyncOrigin.ROTATION:
            # One rotation obligation at a time (RFC 0052 §3.3).
            self.discharge_locked()
        old = log.current
        if not old.sealed and old.fd is not None and old.synced_lsn < old.end_lsn:
            try:
                log.fs.fsync(old.fd)
            except OSError as exc:
                waiters.seal_locked(old, "fsync", exc)
                if is_no_space(exc):
                    raise WalNoSpace("fsync", old.path, exc) from exc
            else:
                old.synced_lsn = old.end_lsn
        flags = FLAG_HAS_PREDECESSOR | (FLAG_PREDECESSOR_SEALED if old.sealed else 0)
        # The high-water is what a completed fsync covered (above, or an earlier round):
        # never the written end, which may hold a failed frame or frames whose fsync
        # failed. It is durable with the header, fsynced before the rename.
        header = SegmentHeader(log.end_lsn, uuid7(log.clock()), flags, old.base, old.synced_lsn)
        try:
            seg = create_segment(log, header)
        except StepError as exc:
            raise self.failed_locked(exc.step, exc.path, exc.cause) from exc.cause
        if not log.rebuilt:
            log.rebuild_locked()
        log.install(seg)
        log.disk_bytes += HEADER_SIZE
        log.retired.append(old)
        if not waiters.leading:
            log.close_retired_locked()
        self.dir_gen += 1
        seg.dir_gen = self.dir_gen
        try:
            log.fs.fsync_dir(log.root)
        except OSError as exc:
            self.dir_pending = DirFsyncOrigin.ROTATION
            err = self.failed_locked("fsync the parent directory", log.root, exc)
            if isinstance(err, RotationTerminal):
                raise err from exc
            return  # installed; the next sync discharges the obligation before any ack
        self.dir_durable_gen = self.dir_gen
        self.dir_pending = None
        self.succeeded_locked()

    def dir_outcome_locked(
        self, origin: DirFsyncOrigin, gen: int, err: OSError | None
    ) -> AppendError | None:
        """Fold a directory fsync that covered generation ``gen`` back in; the error every
        waiter it was to cover fails with, or None."""
        if err is None:
            self.dir_durable_gen = max(self.dir_durable_gen, gen)
            if self.dir_gen == gen:
                self.dir_pending = None
            if origin is DirFsyncOrigin.ROTATION:
                self.succeeded_locked()
            return None
        root = self._log.root
        if origin is DirFsyncOrigin.ROTATION:
            return self.failed_locked("discharge the pending directory fsync", root, err)
        return self._log.latch.io_error_locked("directory fsync", root, err)

    def failed_locked(self, step: str, path: Path, exc: OSError) -> AppendError:
        what = f"{step} {path}: {exc}"
        if is_no_space(exc):
            self._log.latch.set_locked(step, path, exc)
        budget = self._log.config.rotation_retry_attempts
        state = self.state
        if isinstance(state, RotationExhausted):
            return RotationTerminal(state.attempts, state.first_error)
        attempts = 1 if isinstance(state, RotationHealthy) else state.attempts + 1
        first = what if isinstance(state, RotationHealthy) else state.first_error
        if attempts >= budget:
            self.state = RotationExhausted(attempts, first)
            self._log.events(
                "wal.rotation.terminal",
                {"attempts": attempts, "first_error": first, "last_error": what},
            )
            return RotationTerminal(attempts, first)
        self.state = RotationFailing(attempts, first)
        if isinstance(state, RotationHealthy):
            self._log.events(
                "wal.rotation.retrying", {"attempts": attempts, "budget": budget, "error": what}
            )
        return RotationRetrying(attempts, budget, first)

    def succeeded_locked(self) -> None:
        state = self.state
        if isinstance(state, RotationFailing):
            self.state = RotationHealthy()
            self._log.events(
                "wal.rotation.recovered",
                {"attempts": state.attempts, "first_error": state.first_error},
            )

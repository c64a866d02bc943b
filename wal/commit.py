"""Appending and group commit: the frame write, the waiters, the leader's sync round,
sealing on failure.

Guarantees:

* **WAL before ack.** ``append_batch`` writes the frame and returns a ``Pending``;
  ``Pending.wait()`` returns only after an fsync that started after the frame was
  written succeeded, and after the directory entry of the frame's segment is durable
  (no rotation obligation pending, ``rotation``). One fsync covers every waiter written
  before it started (group commit); the thread that runs it wakes exactly the waiters it
  covered and hands the next round to the oldest uncovered one.
* **Own-frame marks.** ``wait()`` returns the frame's own end offset beside the EOF the
  fsync reached; only the former is a mark (RFC 0052 §3.1).
* **Nothing behind a torn frame.** A write or fsync failure on the active segment
  seals it: every unacknowledged frame in it fails, and the next append takes an owed
  rotation into a fresh segment. For the client this stays transient.
* **Nothing attempted on a full disk.** ENOSPC/EDQUOT at any step sets the no-space
  latch (``log.NoSpaceLatch``); every later append is refused without touching the disk
  until the owner clears it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from .errors import (
    AppendError,
    JournalClosed,
    RotationRetrying,
    RotationTerminal,
    WalIoError,
    WalNoSpace,
)
from .frame import encode_frame, validate_tenant
from .log import Log, Segment
from .rotation import Rotation
from .types import CommitOutcome, FrameKind, FrameSpan, Timing, WalOffset

_TENANT_CACHE_MAX = 4096
#: A leader whose own frame is acknowledged leads at most this many more rounds while
#: waiters are queued: the next fsync starts without first waking another thread, and the
#: leader's own latency stays bounded (it never leads indefinitely under load).
EXTRA_ROUNDS = 1


class Pending:
    """An appended frame waiting for the fsync that covers it.

    ``offset`` is the frame's own end (the mark a caller may use once ``wait`` returns);
    ``span`` locates the whole frame (settlement's unmined entries record it).
    """

    __slots__ = (
        "seq",
        "offset",
        "size",
        "_commit",
        "_seg",
        "_lock",
        "_leader",
        "_done",
        "_outcome",
        "_error",
    )

    def __init__(
        self, commit: Commit, seq: int, offset: WalOffset, seg: Segment, size: int
    ) -> None:
        self.seq = seq
        self.offset = offset
        self.size = size
        self._commit = commit
        self._seg = seg
        self._lock = threading.Lock()
        self._lock.acquire()
        self._leader = False
        self._done = False
        self._outcome: CommitOutcome | None = None
        self._error: AppendError | None = None

    @property
    def span(self) -> FrameSpan:
        return FrameSpan(self.offset.segment, self.offset.lsn - self.size, self.size)

    def wait(self) -> CommitOutcome:
        """Block until the covering fsync; raise the typed ``AppendError`` on failure."""
        if not self._leader:
            self._lock.acquire()
        if self._leader:
            self._commit.lead(self)
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome


class Commit:
    """The single writer's append path and group commit (module docstring).

    State (under the journal mutex): the next sequence number, the queue of waiters in
    sequence order, the current leader (None: no round pending or running), whether the
    journal is closed or broken, and a cache of validated tenant names.
    """

    def __init__(
        self,
        log: Log,
        rotation: Rotation,
        on_append: Timing | None,
        on_fsync: Timing | None,
        after_rounds: Callable[[], None] | None = None,
    ) -> None:
        self._log = log
        self._rotation = rotation
        #: the leader's call once its rounds are done (``highwater``: record the synced
        #: high-water at its cadence), after every waiter it covered was woken
        self._after_rounds = after_rounds
        #: observers of each frame write's and each fsync's duration (the metrics)
        self._on_append = on_append
        self._on_fsync = on_fsync
        self._idle = threading.Condition(log.lock)  # type: ignore[arg-type]  # a Lock to it
        self._next_seq = 1
        self._waiters: deque[Pending] = deque()
        self._leader: Pending | None = None
        self._closed = False
        self._broken: BaseException | None = None
        self._valid_tenants: dict[str, bytes] = {}

    @property
    def appended(self) -> bool:
        """A frame was appended since open (replay is recovery's, before the first)."""
        return self._next_seq != 1

    @property
    def leading(self) -> bool:
        """A round is pending or running: it may hold segment descriptors."""
        return self._leader is not None

    @property
    def closed(self) -> bool:
        return self._closed

    # -- append ------------------------------------------------------------------------

    def append_batch(self, tenant: str, payload: bytes, kind: FrameKind) -> Pending:
        """``Journal.append_batch``: write one frame, register its waiter."""
        raw = self._valid_tenants.get(tenant)
        if raw is None:
            raw = validate_tenant(tenant) if (tenant or kind is FrameKind.TENANT_BATCH) else b""
            if len(self._valid_tenants) < _TENANT_CACHE_MAX:
                self._valid_tenants[tenant] = raw
        log = self._log
        frame = encode_frame(kind, raw, payload, max_payload=log.config.max_frame_bytes)
        size = len(frame)
        with log.lock:
            self.check_writable_locked()
            if not log.rebuilt:
                log.rebuild_locked()  # once, before the ledger's first live frame
            if self._rotation.due_locked(size):
                self._rotation.rotate_locked(self)
            cur = log.current
            end = log.end_lsn + size
            try:
                assert cur.fd is not None
                started = time.perf_counter()
                log.fs.write(cur.fd, frame)
                if self._on_append is not None:
                    self._on_append(time.perf_counter() - started)
            except OSError as exc:
                # The frame may be partly on disk: reserve its LSN range and seal, so
                # nothing is ever appended behind it.
                log.end_lsn = end
                cur.data_len += size
                log.disk_bytes += size
                self.seal_locked(cur, "write", exc)
                raise log.latch.io_error_locked("write", cur.path, exc) from exc
            log.end_lsn = end
            cur.data_len += size
            log.disk_bytes += size
            log.ledger.on_frame(cur, tenant if kind is FrameKind.TENANT_BATCH else None, end, size)
            pending = Pending(self, self._next_seq, WalOffset(cur.header.uuid, end), cur, size)
            self._next_seq += 1
            self._waiters.append(pending)
            if self._leader is None:
                self._leader = pending
                pending._leader = True
            return pending

    def check_writable_locked(self) -> None:
        if self._closed or self._broken is not None:
            raise JournalClosed()
        self._rotation.check_locked()
        latch = self._log.latch.current
        if latch is not None:
            # Nothing is attempted on a full disk: an owed rotation tried append after
            # append would spend the rotation budget and end terminal (RFC 0052 §3.3).
            raise WalNoSpace(latch.op, latch.path, OSError(latch.error), latched=True)

    # -- group commit ------------------------------------------------------------------

    def lead(self, me: Pending) -> None:
        extra = 0
        while self._sync_round(me, extra < EXTRA_ROUNDS):
            if me._done:
                extra += 1
        if self._after_rounds is not None:
            self._after_rounds()

    def _sync_round(self, me: Pending, may_continue: bool = False) -> bool:
        """One fsync round led by ``me``. True when ``me`` leads the next round too: its
        own frame is not yet covered, or (at most ``EXTRA_ROUNDS`` times) waiters are
        queued, so the next round starts without waking another thread first."""
        log = self._log
        rotation = self._rotation
        fs = log.fs
        with log.lock:
            covered = self._next_seq - 1
            cur = log.current
            fd = cur.fd
            do_data = not cur.sealed and fd is not None
            dir_pending = rotation.dir_pending
            gen = rotation.dir_gen
            eof = WalOffset(cur.header.uuid, log.end_lsn)
            eof_lsn = log.end_lsn
        dir_err: OSError | None = None
        data_err: OSError | None = None
        try:
            if dir_pending is not None:
                try:
                    fs.fsync_dir(log.root)
                except OSError as exc:
                    dir_err = exc
            if dir_err is None and do_data:
                assert fd is not None
                started = time.perf_counter()
                try:
                    fs.fsync(fd)
                except OSError as exc:
                    data_err = exc
                if self._on_fsync is not None:
                    self._on_fsync(time.perf_counter() - started)
        except BaseException as exc:
            self._abandon(exc)
            raise
        with log.lock:
            failure: AppendError | None = None
            if dir_pending is not None:
                failure = rotation.dir_outcome_locked(dir_pending, gen, dir_err)
            if data_err is not None:
                self.seal_locked(cur, "fsync", data_err)
            elif do_data and dir_err is None:
                cur.synced_lsn = max(cur.synced_lsn, eof_lsn)
                log.synced_lsn = max(log.synced_lsn, eof_lsn)
            durable_gen = rotation.dir_durable_gen
            waiters = self._waiters
            while waiters and waiters[0].seq <= covered:
                w = waiters[0]
                if failure is not None:
                    _finish(w, None, _copy_error(failure))
                elif w._seg.dir_gen > durable_gen:
                    break  # its segment's entry is not durable yet: the next round
                else:
                    _finish(w, CommitOutcome(w.seq, w.offset, eof), None)
                waiters.popleft()
            if log.retired:
                log.close_retired_locked()
            if waiters:
                nxt = waiters[0]
                if nxt is me or may_continue:
                    return True
                self._leader = nxt
                me._leader = False
                nxt._leader = True
                nxt._lock.release()
                return False
            self._leader = None
            me._leader = False
            self._idle.notify_all()
            return False

    def seal_locked(self, seg: Segment, op: str, exc: OSError) -> None:
        """Seal ``seg``: every unacknowledged frame in it fails; nothing more lands in it."""
        if seg.sealed:
            return
        seg.sealed = True
        self._log.events(
            "wal.segment.sealed",
            {"segment": seg.path.name, "reason": f"{op} failed: {exc}", "lsn": seg.end_lsn},
        )
        kept: deque[Pending] = deque()
        error = self._log.latch.io_error_locked(op, seg.path, exc)
        for w in self._waiters:
            if w._seg is seg:
                _finish(w, None, _copy_error(error))
            else:
                kept.append(w)
        # A resolved leader keeps running its round and hands off at the round's end.
        self._waiters = kept

    def _abandon(self, exc: BaseException) -> None:
        """An unexpected exception (or a simulated crash) inside a round: fail every
        waiter so no thread is stranded, and refuse further appends."""
        with self._log.lock:
            self._broken = exc
            for w in self._waiters:
                _finish(w, None, JournalClosed())
            self._waiters.clear()
            self._leader = None
            self._idle.notify_all()

    # -- close -------------------------------------------------------------------------

    def close_locked(self) -> None:
        """Refuse new appends and let the in-flight round finish (the caller holds the
        journal mutex; waiting releases it)."""
        self._closed = True
        while self._leader is not None:
            self._idle.wait()
        for w in self._waiters:  # only reachable after an abandoned round
            _finish(w, None, JournalClosed())
        self._waiters.clear()


def _finish(w: Pending, outcome: CommitOutcome | None, error: AppendError | None) -> None:
    if w._done:
        return
    w._outcome = outcome
    w._error = error
    w._done = True
    if not w._leader:
        w._lock.release()


def _copy_error(err: AppendError) -> AppendError:
    """A fresh exception per waiter: one instance raised in many threads would share
    (and race on) its traceback."""
    if isinstance(err, RotationTerminal):
        return RotationTerminal(err.attempts, err.first_error)
    if isinstance(err, RotationRetrying):
        return RotationRetrying(err.attempts, err.budget, err.first_error)
    if isinstance(err, WalNoSpace):
        return WalNoSpace(err.op, err.path, err.cause, latched=err.latched)
    if isinstance(err, WalIoError):
        return WalIoError(err.op, err.path, err.cause)
    return JournalClosed()

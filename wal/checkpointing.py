"""Advancing the checkpoint: the monotonic mark, RECLAIM's arming before the first
CHECKPOINT, and PUBLISHED after it (the file format is ``wal/checkpoint_file.py``).

Order, and the crash each step protects against (RFC 0052 §3.2, RFC 0055 §9.4):

1. the mark is checked (not below the current one, ends a frame of a surviving segment,
   not beyond the durable end);
2. before the first CHECKPOINT can exist, RECLAIM records ``checkpoint_armed`` durably,
   so a crash in between never reads as a lost checkpoint;
3. CHECKPOINT is written (temp, fsync, rename, root fsync); a failure leaves the previous
   mark in force, in memory and on disk;
4. RECLAIM's ``checkpoint_seen`` is set (written at once, or by the next pass);
5. PUBLISHED is written after CHECKPOINT, so a crash between the two leaves a stale
   PUBLISHED, whose entries still govern their tenants.

The file I/O runs without the journal mutex (appends continue); checkpoints are
serialised by their own lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .checkpoint_file import write_checkpoint
from .errors import CheckpointError
from .frontiers import Frontiers
from .log import Log
from .reclamation import Reclamation
from .types import PublishedMarks, WalOffset


class Checkpointer:
    """The checkpoint mark in force and the writes that advance it (module docstring).

    State: the mark (None until the first CHECKPOINT), under the journal mutex; the
    ledger holds the same number for eligibility (a checkpoint advance stores it, O(1)).
    """

    def __init__(self, log: Log, reclamation: Reclamation, frontiers: Frontiers) -> None:
        self._log = log
        self._reclamation = reclamation
        self._frontiers = frontiers
        self._lock = threading.Lock()
        self._mark: WalOffset | None = None

    def adopt(self, mark: WalOffset | None) -> None:
        """At open: the CHECKPOINT read from disk is in force."""
        self._mark = mark
        self._log.ledger.checkpoint = mark

    @property
    def mark(self) -> WalOffset | None:
        """The mark in force (read under the journal mutex)."""
        return self._mark

    def checkpoint(
        self, mark: WalOffset, published: Mapping[str, PublishedMarks] | None = None
    ) -> bool:
        """``Journal.checkpoint``: CHECKPOINT to ``mark``, then PUBLISHED."""
        advanced = self._checkpoint_mark(mark)
        if published:
            self._frontiers.write(published, checkpointed=advanced)
        return advanced

    def _checkpoint_mark(self, mark: WalOffset) -> bool:
        log = self._log
        reclamation = self._reclamation
        with self._lock:
            with log.lock:
                current = self._mark
                if current is not None:
                    if mark.lsn < current.lsn:
                        raise CheckpointError(
                            f"checkpoint mark {mark} is below the current mark {current}"
                        )
                    if mark.lsn == current.lsn:
                        if mark.segment != current.segment:
                            raise CheckpointError(
                                f"checkpoint mark {mark} names another segment than the "
                                f"current mark {current} at the same LSN"
                            )
                        return False
                found = log.ledger.segment(mark.segment)
                seg = None if found is None else Log.seg(found)
                if seg is None or not seg.base < mark.lsn <= seg.end_lsn:
                    raise CheckpointError(
                        f"checkpoint mark {mark} does not end a frame of a surviving segment"
                    )
                if mark.lsn > log.synced_lsn:
                    raise CheckpointError(
                        f"checkpoint mark {mark} is beyond the durable end (LSN {log.synced_lsn})"
                    )
                arm = reclamation.arm_locked()
            if arm:
                # The witness is durable before the first CHECKPOINT can exist, so a
                # crash in between never reads as a lost checkpoint (RFC 0052 §3.2).
                try:
                    reclamation.write_record()
                except OSError as exc:
                    raise CheckpointError(
                        f"arming RECLAIM before the first checkpoint failed: {exc}; no mark "
                        f"was written"
                    ) from exc
            try:
                write_checkpoint(log.fs, log.root, mark)
            except OSError as exc:
                raise CheckpointError(
                    f"writing CHECKPOINT at {mark} failed: {exc}; the previous mark "
                    f"{current} stays in force"
                ) from exc
            with log.lock:
                self._mark = mark
                log.ledger.checkpoint = mark  # O(1): nothing is promoted eagerly
                see = reclamation.see_locked()
            if see:
                try:
                    reclamation.write_record()
                except OSError:
                    pass  # stays dirty: the next pass writes it; open promotes it anyway
            return True

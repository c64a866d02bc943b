"""Each frame's failed attempts at mining or emitting in this process, and which frames
are at the bound and therefore isolated (``wal.frame_mining_attempts``; the settlement's
"failure inside settlement", ``app.ingest.settlement``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from wal import WalOffset


@dataclass
class FrameAttempts:
    """One frame's failed attempts at mining or emitting in this process: the ingest
    turn, each rebuild that failed on it, the start-up replay."""

    failures: int = 0
    error: str = ""
    #: announced as isolated (the event emitted once, the counter moved once)
    announced: bool = False
    #: isolated by a start-up replay because its payload did not decode: a rebuild
    #: skips it without decoding it (it may be what killed a worker)
    undecodable: bool = False


class AttemptBook:
    """tenant -> frame end LSN -> its failed attempts; pruned once the tenant's restorable
    snapshot is past the frame (no rebuild reads it again)."""

    def __init__(self, max_attempts: int) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        #: failed attempts at one frame after which it is isolated (its rows published
        #: without templates)
        self.max_attempts = max_attempts
        #: frames isolated in this process (``ourios_wal_isolated_frames_total``)
        self.isolated_frames = 0
        self._attempts_lock = threading.Lock()
        self._attempts: dict[str, dict[int, FrameAttempts]] = {}

    def note_failure(self, tenant: str, offset: WalOffset, error: str) -> int:
        """Count a failed attempt at mining (or emitting) the frame ending at ``offset``;
        returns its failures so far."""
        with self._attempts_lock:
            attempts = self._attempts.setdefault(tenant, {}).setdefault(offset.lsn, FrameAttempts())
            attempts.failures += 1
            attempts.error = error
            return attempts.failures

    def isolate_undecodable(self, tenant: str, offset: WalOffset, error: str) -> None:
        """A replay isolated the frame ending at ``offset``: its payload did not decode
        (``app.node.recovery``, which announced it)."""
        with self._attempts_lock:
            self._attempts.setdefault(tenant, {})[offset.lsn] = FrameAttempts(
                self.max_attempts, error, announced=True, undecodable=True
            )

    def at_bound(self, failures: int) -> bool:
        """Whether a frame that failed ``failures`` times is isolated."""
        return failures >= self.max_attempts

    def attempts(self, tenant: str, offset: WalOffset) -> int:
        with self._attempts_lock:
            found = self._attempts.get(tenant, {}).get(offset.lsn)
            return 0 if found is None else found.failures

    def isolated(self, tenant: str, horizon: WalOffset | None) -> dict[int, FrameAttempts]:
        """The tenant's frames at the bound (a rebuild does not mine them), forgetting
        those at or below ``horizon``: the restorable snapshot has folded them."""
        with self._attempts_lock:
            frames = self._attempts.get(tenant)
            if frames is None:
                return {}
            if horizon is not None:
                for lsn in [lsn for lsn in frames if lsn <= horizon.lsn]:
                    del frames[lsn]
                if not frames:
                    del self._attempts[tenant]
                    return {}
            return {lsn: a for lsn, a in frames.items() if a.failures >= self.max_attempts}

    def first_announcement(self, attempts: FrameAttempts) -> bool:
        """True once per isolated frame and process (and the counter moves): the caller
        emits its event."""
        with self._attempts_lock:
            if attempts.announced:
                return False
            attempts.announced = True
            self.isolated_frames += 1
            return True

"""The WAL's error tree.

Every error says what refused and carries the numbers an operator needs::

    WalError
    ├── OpenError                   the WAL did not open; nothing was appended
    │   ├── CorruptionError         (path, offset, reason): bytes on disk disagree
    │   ├── InvalidConfig           (knob, value, allowed): a knob outside its range
    │   └── OpenIoError             (path, op): an I/O step of open failed (ENOSPC, EIO…)
    ├── AppendError                 an append or its sync was not made durable
    │   ├── FrameRejected           the frame itself is invalid (tenant, size): never transient
    │   ├── WalIoError              transient: an ordinary write/fsync failure
    │   │   └── WalNoSpace          transient: ENOSPC/EDQUOT; appends refused until space returns
    │   ├── RotationRetrying        transient: a rotation failed, the budget still holds
    │   ├── RotationTerminal        server-terminal: the rotation budget is exhausted
    │   └── JournalClosed           the journal was closed under the caller
    └── CheckpointError             the CHECKPOINT sidecar was not advanced

``ErrorClass`` is what the receivers map onto the wire (DESIGN.md §7): ``TRANSIENT``
and ``TERMINAL`` both become 503 / UNAVAILABLE with no retry hint; the class rides the
message and the ``error_type`` label. The class is a property of the exception type, so
it survives the group-commit path unchanged (RFC 0052 §3.3's FlushOutcome remark).
"""

from __future__ import annotations

import enum
import errno
from pathlib import Path

#: errnos that mean "the filesystem has no room": the WAL latches on them (``WalNoSpace``)
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a full filesystem (ENOSPC, or a quota: EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


class ErrorClass(enum.Enum):
    """How a receiver must report a failed append (RFC 0052 §3.3, RFC0052.15)."""

    INVALID = 1  # the request is at fault; retrying the same bytes cannot succeed
    TRANSIENT = 2  # a later attempt can succeed; no server-side retry is scheduled
    TERMINAL = 3  # server-terminal, client-retryable: the node needs an operator


class WalError(Exception):
    """Base class of every error the WAL raises."""

    error_class: ErrorClass = ErrorClass.TRANSIENT
    #: the ``error_type`` label value for counters
    error_type: str = "wal_error"


class OpenError(WalError):
    """The WAL did not open."""

    error_type = "wal_open"


class CorruptionError(OpenError):
    """Bytes on disk disagree with the format; names the file and the offset.

    Raised by open (structure, newest segment) and by replay (older segments).
    ``high_water`` is set when the damage lies below a segment's synced high-water
    (``wal/segment.py``): frames there were acknowledged, so it is no torn tail.
    """

    error_type = "wal_corrupt"

    def __init__(
        self, path: Path | str, offset: int | None, reason: str, *, high_water: int | None = None
    ) -> None:
        self.path = Path(path)
        self.offset = offset
        self.reason = reason
        self.high_water = high_water
        where = f"{self.path}" if offset is None else f"{self.path} at byte {offset}"
        super().__init__(f"WAL corruption in {where}: {reason}")


class InvalidConfig(OpenError):
    """A knob is outside its range, or two knobs disagree; nothing is clamped."""

    error_class = ErrorClass.INVALID
    error_type = "wal_config"

    def __init__(self, knob: str, value: object, allowed: str) -> None:
        self.knob = knob
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid WAL setting {knob}={value!r}: must be {allowed}")


class OpenIoError(OpenError):
    """An I/O step of open failed; names the file and the step."""

    error_type = "wal_open_io"

    def __init__(self, path: Path | str, op: str, cause: OSError) -> None:
        self.path = Path(path)
        self.op = op
        self.cause = cause
        super().__init__(f"WAL open failed: {op} {self.path}: {cause}")


class AppendError(WalError):
    """An append was not made durable; the batch must not be acknowledged."""

    error_type = "wal_append"


class FrameRejected(AppendError):
    """The frame is invalid (tenant grammar, size); nothing was written."""

    error_class = ErrorClass.INVALID
    error_type = "wal_frame_rejected"


class FrameTooLarge(FrameRejected):
    """The encoded frame exceeds ``max_frame_bytes``."""

    error_type = "wal_frame_too_large"

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds max_frame_bytes={limit}")


class InvalidTenant(FrameRejected):
    """A tenant id outside the grammar (1–128 ASCII graphic bytes, no ``:#/``)."""

    error_type = "wal_invalid_tenant"


class WalIoError(AppendError):
    """An ordinary write or fsync failure: transient for the client."""

    error_type = "wal_io"

    def __init__(self, op: str, path: Path | str, cause: BaseException) -> None:
        self.op = op
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"WAL {op} failed on {self.path}: {cause}; the batch was not acknowledged")


class WalNoSpace(WalIoError):
    """The filesystem is full (ENOSPC/EDQUOT): transient for the client.

    Raised for the write or fsync that hit it (``latched`` False) and, until the owner
    reports free space again (``Journal.clear_no_space``), for every append refused
    without touching the disk (``latched`` True) — so a full disk never burns the
    rotation budget one append at a time.
    """

    error_type = "wal_no_space"

    def __init__(
        self, op: str, path: Path | str, cause: BaseException, *, latched: bool = False
    ) -> None:
        AppendError.__init__(
            self,
            (
                f"WAL refused the batch without writing it: {op} on {Path(path)} hit a full "
                f"filesystem ({cause}) and no free space has been reported since"
            )
            if latched
            else (
                f"WAL {op} failed on {Path(path)}: {cause}; the filesystem is full, the batch "
                f"was not acknowledged and appends are refused until free space returns"
            ),
        )
        self.op = op
        self.path = Path(path)
        self.cause = cause
        self.latched = latched


class RotationRetrying(AppendError):
    """A rotation step failed and the retry budget still holds: transient."""

    error_type = "wal_rotation_retrying"

    def __init__(self, attempts: int, budget: int, first_error: str) -> None:
        self.attempts = attempts
        self.budget = budget
        self.first_error = first_error
        super().__init__(
            f"WAL rotation failed ({attempts} of {budget} attempts), retrying on the next "
            f"append or sync; first error: {first_error}"
        )


class RotationTerminal(AppendError):
    """The rotation budget is exhausted: server-terminal, client-retryable."""

    error_class = ErrorClass.TERMINAL
    error_type = "wal_rotation_terminal"

    def __init__(self, attempts: int, first_error: str) -> None:
        self.attempts = attempts
        self.first_error = first_error
        super().__init__(
            f"WAL is in the terminal rotation state after {attempts} consecutive failed "
            f"attempts and refuses every append until an operator restarts it; "
            f"first error: {first_error}"
        )


class JournalClosed(AppendError):
    """The journal was closed; the batch was not acknowledged."""

    error_type = "wal_closed"

    def __init__(self) -> None:
        super().__init__("WAL is closed; the batch was not acknowledged")


class CheckpointError(WalError):
    """The CHECKPOINT sidecar was not advanced; the previous mark stays in force."""

    error_type = "wal_checkpoint"

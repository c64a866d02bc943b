"""Value types shared by the WAL's modules: offsets, states and outcomes, and the
callback types a journal is given (``EventSink``, ``Clock``, ``Timing``).

A ``WalOffset`` is (segment UUIDv7, LSN). The LSN is a global byte position in the
logical stream of frames (segment headers and torn bytes excluded), so offsets order
by LSN and subtract to byte counts; the UUID names the segment the frame ends in and
is cross-checked wherever an offset is read back. A mark is always a *post-frame*
position: the LSN just after a frame. On disk an offset is 24 bytes: the UUID's 16
bytes in RFC 4122 order, then the LSN as u64 little-endian.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

_OFFSET = struct.Struct("<16sQ")
OFFSET_SIZE: Final = _OFFSET.size  # 24

#: Where the journal reports what it did (``wal.segment.sealed``, ``wal.rotation.*``…):
#: an event name and its fields. The owner logs them; the WAL never logs by itself.
EventSink = Callable[[str, Mapping[str, object]], None]
#: Seconds from an injected clock: the wall clock (``time.time``) names segments, the
#: monotonic one (``time.monotonic``) times their age, so tests control both.
Clock = Callable[[], float]
#: An observer of one operation's duration in seconds (a frame write, an fsync).
Timing = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class WalOffset:
    """A post-frame position: the frame ends at ``lsn`` inside segment ``segment``."""

    segment: uuid.UUID
    lsn: int

    def __lt__(self, other: WalOffset) -> bool:
        return self.lsn < other.lsn

    def __le__(self, other: WalOffset) -> bool:
        return self.lsn <= other.lsn

    def __gt__(self, other: WalOffset) -> bool:
        return self.lsn > other.lsn

    def __ge__(self, other: WalOffset) -> bool:
        return self.lsn >= other.lsn

    def encode(self) -> bytes:
        return _OFFSET.pack(self.segment.bytes, self.lsn)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> WalOffset:
        raw, lsn = _OFFSET.unpack(data)
        return cls(uuid.UUID(bytes=bytes(raw)), lsn)

    def __str__(self) -> str:
        return f"{self.lsn}@{self.segment}"


class FrameKind(enum.IntEnum):
    """Frame kinds; they start at 1 so zeroed bytes never decode as a valid kind."""

    TENANT_BATCH = 1  # payload: an ExportLogsServiceRequest as received (decompressed)
    AUDIT_EVENT = 2  # reserved: nothing writes it, recovery ignores it (RFC 0052 §3.7)


class RotationKind(enum.Enum):
    """Why a rotation is requested (RFC 0052 §3.7)."""

    DISCRETIONARY = 1  # the barrier's idle path: segment old enough and holding a frame
    OWED = 2  # a sealed segment must not be appended to: always proceeds


class DirFsyncOrigin(enum.Enum):
    """Where a pending parent-directory fsync came from (RFC 0052 §3.3)."""

    OPEN = 1  # an ordinary retryable sync failure outside the rotation budget
    ROTATION = 2  # draws on the rotation retry budget


@dataclass(frozen=True, slots=True)
class RotationHealthy:
    """No rotation obligation is failing."""

    name: str = "healthy"


@dataclass(frozen=True, slots=True)
class RotationFailing:
    """Consecutive rotation attempts failed; the budget still holds (``name`` "retrying":
    appends are refused with ``wal.errors.RotationRetrying``, transient)."""

    attempts: int
    first_error: str
    name: str = "retrying"


@dataclass(frozen=True, slots=True)
class RotationExhausted:
    """The budget is exhausted: the terminal state (``name`` "terminal"). Every append
    is refused with ``wal.errors.RotationTerminal`` until a restart."""

    attempts: int
    first_error: str
    name: str = "terminal"


RotationState = RotationHealthy | RotationFailing | RotationExhausted


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What an acknowledged append gets back.

    ``offset`` is the frame's own end — the only value a caller may use as a mark.
    ``durable_eof`` is how far the covering fsync reached, which can include later
    frames that are not yet acknowledged or mined (RFC 0052 §3.1); never a mark.
    """

    seq: int
    offset: WalOffset
    durable_eof: WalOffset


@dataclass(frozen=True, slots=True)
class Frame:
    """A validated frame read back from a segment."""

    kind: FrameKind
    tenant: str
    payload: bytes
    start_lsn: int
    offset: WalOffset  # the post-frame position

    @property
    def size(self) -> int:
        return self.offset.lsn - self.start_lsn


@dataclass(frozen=True, slots=True)
class NoSpace:
    """The WAL's no-space latch: an append, fsync or rotation step hit ENOSPC/EDQUOT.

    While it is set every append is refused without touching the disk; only the owner,
    having seen free space again (``Journal.clear_no_space(seq)``), clears it. ``seq``
    numbers the latchings so a clear decided on an older observation never clears a
    newer one.
    """

    seq: int
    op: str
    path: str
    error: str
    at: float  # the injected clock's time of the failure


@dataclass(frozen=True, slots=True)
class FrameSpan:
    """Where one frame lies: it starts at ``start`` (a global LSN) inside ``segment`` and
    is ``length`` bytes long, so its mark is ``start + length``. The caller computes it
    from the offset ``append_batch`` returned and the frame's size (RFC 0055 §9.4)."""

    segment: uuid.UUID
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def offset(self) -> WalOffset:
        """The frame's mark (its post-frame position)."""
        return WalOffset(self.segment, self.end)

    @classmethod
    def of(cls, frame: Frame) -> FrameSpan:
        return cls(frame.offset.segment, frame.start_lsn, frame.size)


@dataclass(frozen=True, slots=True)
class FrameCursor:
    """An owned read position for ``Journal.read_frames_from``: the next frame to read
    starts at or after ``lsn`` inside ``segment``. It holds no journal state, so a reader
    can drop the journal mutex between calls."""

    segment: uuid.UUID
    lsn: int

    @classmethod
    def after(cls, mark: WalOffset) -> FrameCursor:
        """The first frame after the one ending at ``mark`` (a post-frame offset)."""
        return cls(mark.segment, mark.lsn)


@dataclass(frozen=True, slots=True)
class PublishedMarks:
    """A tenant's publication frontiers (RFC 0055, PUBLISHED): every record of its frames
    ending at or below ``records`` is durable in the store, and every template event of
    its frames ending at or below ``audit``. None: no frontier on that side (recovery
    falls back to the checkpoint for it). ``terminal``: the tenant was refused as
    unrecoverable — a clear side then means "nothing of it was published", never
    "consult the checkpoint".

    ``intent`` (RFC 0055 §9.4, "intent then confirm"; the entry's ``publishing`` bit): a
    settlement is publishing the tenant's rows of its frames in (frontier, ``intent``] —
    some of them may be in the store, none is known to be. ``records`` and ``audit`` are
    then the frontier in force before it (one position, both sides: what recovery gates
    on), and the span is republished under the names its rows derive, so nothing of it
    is suppressed and nothing of it lands twice. A write whose marks reach ``intent`` on
    both sides confirms it (``wal/frontiers.py``)."""

    records: WalOffset | None = None
    audit: WalOffset | None = None
    terminal: bool = False
    intent: WalOffset | None = None

    @property
    def publishing(self) -> bool:
        """A settlement's publish of (frontier, ``intent``] is not confirmed."""
        return self.intent is not None


@dataclass(frozen=True, slots=True)
class HighWaterState:
    """The current segment's recorded high-water (``wal/highwater.py``) and the torn tail
    open found in the newest segment, for the metrics."""

    recorded_lsn: int
    writes: int
    failures: int
    #: bytes after the valid frames of the newest segment at open (kept, never replayed)
    torn_tail_bytes: int
    #: frames that still verify after that damage (dropped with it)
    torn_tail_frames: int

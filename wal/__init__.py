"""The durable log: frames, segments, CHECKPOINT, group commit, rotation, replay.

This is what ``app`` imports (``sink`` imports nothing of ours), and nothing else:
tests import the test doubles from ``wal.testing`` and internals from their modules.
"""

from .commit import Pending
from .config import MAX_TENANT_BYTES, WalConfig
from .errors import (
    AppendError,
    CheckpointError,
    CorruptionError,
    ErrorClass,
    FrameRejected,
    FrameTooLarge,
    InvalidConfig,
    WalError,
    is_no_space,
)
from .frontiers import PublishedWriteError
from .fs import Fs, OsFs
from .intents import IntentEntry, IntentKind, IntentLog, IntentRecord, IntentWriteError
from .journal import Journal
from .quarantine import QuarantineError, QuarantineRecord
from .reading import Replay
from .reclaim_file import ConsumerMode
from .reclamation import ArchiveRequest, ReclaimError
from .segment_ledger import (
    FloorMin,
    FloorNone,
    FloorPinned,
    FloorUnknown,
    KnownHorizons,
    ReclamationProgress,
)
from .types import (
    Frame,
    FrameCursor,
    FrameKind,
    FrameSpan,
    NoSpace,
    PublishedMarks,
    RotationExhausted,
    RotationFailing,
    RotationKind,
    WalOffset,
)

__all__ = [
    "MAX_TENANT_BYTES",
    "AppendError",
    "ArchiveRequest",
    "CheckpointError",
    "ConsumerMode",
    "CorruptionError",
    "ErrorClass",
    "FloorMin",
    "FloorNone",
    "FloorPinned",
    "FloorUnknown",
    "Frame",
    "FrameCursor",
    "FrameKind",
    "FrameRejected",
    "FrameSpan",
    "FrameTooLarge",
    "Fs",
    "IntentEntry",
    "IntentKind",
    "IntentLog",
    "IntentRecord",
    "IntentWriteError",
    "InvalidConfig",
    "Journal",
    "KnownHorizons",
    "NoSpace",
    "OsFs",
    "Pending",
    "PublishedMarks",
    "PublishedWriteError",
    "QuarantineError",
    "QuarantineRecord",
    "ReclaimError",
    "ReclamationProgress",
    "Replay",
    "RotationExhausted",
    "RotationFailing",
    "RotationKind",
    "WalConfig",
    "WalError",
    "WalOffset",
    "is_no_space",
]

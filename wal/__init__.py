"""The durable log: frames, segments, CHECKPOINT, group commit, rotation, replay.

``app`` and ``sink`` import only what this module exports.
"""

from .config import MAX_TENANT_BYTES, WalConfig
from .errors import (
    AppendError,
    CheckpointError,
    CorruptionError,
    ErrorClass,
    FrameRejected,
    FrameTooLarge,
    InvalidConfig,
    InvalidTenant,
    JournalClosed,
    OpenError,
    OpenIoError,
    RotationRetrying,
    RotationTerminal,
    WalError,
    WalIoError,
)
from .fs import FaultyFs, Fs, Hold, OsFs, SimulatedCrash
from .journal import Journal, OpenReport, Pending, Replay, ReplayReport, SegmentReport
from .types import (
    CommitOutcome,
    DirFsyncOrigin,
    Frame,
    FrameKind,
    Healthy,
    Retrying,
    RotationKind,
    RotationState,
    Terminal,
    WalOffset,
)

__all__ = [
    "MAX_TENANT_BYTES",
    "AppendError",
    "CheckpointError",
    "CommitOutcome",
    "CorruptionError",
    "DirFsyncOrigin",
    "ErrorClass",
    "FaultyFs",
    "Frame",
    "FrameKind",
    "FrameRejected",
    "FrameTooLarge",
    "Fs",
    "Healthy",
    "Hold",
    "InvalidConfig",
    "InvalidTenant",
    "Journal",
    "JournalClosed",
    "OpenError",
    "OpenIoError",
    "OpenReport",
    "OsFs",
    "Pending",
    "Replay",
    "ReplayReport",
    "Retrying",
    "RotationKind",
    "RotationRetrying",
    "RotationState",
    "RotationTerminal",
    "SegmentReport",
    "SimulatedCrash",
    "Terminal",
    "WalConfig",
    "WalError",
    "WalIoError",
    "WalOffset",
]

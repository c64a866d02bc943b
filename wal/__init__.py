"""The durable log: frames, segments, CHECKPOINT, group commit, rotation, replay.

This is what ``app`` imports (``sink`` only the tenant rule, ``wal.tenant``, and
``ObjectKind``): the names other packages use are exported here; tests import the test
doubles from ``wal.testing`` and internals from their modules. The modules, from the bytes up:

* ``fs`` — the filesystem seam every open, write, fsync, rename and unlink goes through.
* ``errors``, ``types``, ``config`` — the error tree, the shared value types, the knobs;
  ``tenant`` — the tenant name's grammar and bound, the one home of that rule.
* ``frame`` — the frame codec; ``segment`` — naming, the header, joining the set.
* ``slots`` — two-slot files; ``two_slot_file`` — the lifecycle RECLAIM and PUBLISHED share.
* ``checkpoint_file``, ``reclaim_file``, ``published_file``, ``highwater_file`` — the
  sidecars' formats (CHECKPOINT, RECLAIM, PUBLISHED, HIGHWATER).
* ``intents`` — the publish intents (PUBLISHING); ``quarantine`` — moving an unreadable
  segment aside with a record of its loss.
* ``scan`` — reading a root without changing it; ``opening`` — what ``Journal.open``
  checks and does; ``log`` — the log's shared state and the journal mutex.
* ``commit`` — appending and group commit; ``rotation`` — moving to a new segment;
  ``highwater`` — recording the current segment's synced high-water.
* ``checkpointing`` — advancing the checkpoint; ``frontiers`` — the PUBLISHED side;
  ``segment_ledger`` — which segments may be unlinked; ``reclamation`` — the pass that
  unlinks them.
* ``reading`` — replay and the bounded per-tenant reads; ``inspection`` — the
  read-only operator views behind ``ourios wal``.
* ``journal`` — the single writer, one facade over the parts above.
* ``testing`` — the test doubles (``FaultyFs``).
"""

from .commit import Pending
from .config import WalConfig, in_range, range_text
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
from .inspection import (
    RootReport,
    SegmentVerdict,
    inspect_root,
    verify_root,
    verify_segment_bytes,
)
from .intents import IntentEntry, IntentLog, IntentRecord, IntentWriteError, ObjectKind
from .journal import Journal
from .quarantine import QuarantineError, QuarantineRecord, quarantine_segment
from .reading import Replay
from .reclaim_file import ConsumerMode
from .reclamation import ArchiveRequest, ReclaimError, ReclaimState
from .segment import HEADER_SIZE, SEGMENT_RE, uuid7_time
from .segment_ledger import (
    FloorMin,
    FloorNone,
    FloorPinned,
    FloorUnknown,
    KnownHorizons,
    ReclamationProgress,
)
from .tenant import MAX_TENANT_BYTES, TENANT_RULE, bad_tenant_char, is_valid_tenant
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
    "TENANT_RULE",
    "bad_tenant_char",
    "is_valid_tenant",
    "in_range",
    "range_text",
    "HEADER_SIZE",
    "SEGMENT_RE",
    "RootReport",
    "SegmentVerdict",
    "inspect_root",
    "quarantine_segment",
    "uuid7_time",
    "verify_root",
    "verify_segment_bytes",
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
    "ObjectKind",
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
    "ReclaimState",
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

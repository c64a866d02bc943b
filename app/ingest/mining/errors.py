"""The errors mining raises, one family so a caller can catch them all.

::

    MinerError
    ├── SnapshotDecodeError       a snapshot's bytes are not a valid miner snapshot
    ├── MinerFailedError          a miner raised mid-batch and its state is unknown
    └── TemplateIdError           an id could not be reserved (I/O), names the file
        ├── TemplateIdStateError  the allocator file is corrupt or for another node
        └── TemplateIdExhaustedError  the node's 48-bit counter is used up
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "MinerError",
    "MinerFailedError",
    "SnapshotDecodeError",
    "TemplateIdError",
    "TemplateIdExhaustedError",
    "TemplateIdStateError",
]


class MinerError(Exception):
    """Base class of every error the mining package raises."""


class SnapshotDecodeError(MinerError):
    """The bytes are not a miner snapshot this version can read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"miner snapshot refused: {reason}")
        self.reason = reason


class MinerFailedError(MinerError):
    """A miner raised in the middle of a batch; its tree is in an unknown state."""


class TemplateIdError(MinerError):
    """Template ids could not be reserved; names the allocator file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"template id allocator {path}: {reason}")
        self.path = path
        self.reason = reason


class TemplateIdStateError(TemplateIdError):
    """The allocator file is corrupt or belongs to another node ordinal."""


class TemplateIdExhaustedError(TemplateIdError):
    """The node has handed out every one of its 2**48 - 1 counters."""

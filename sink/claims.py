"""What an object holds, stated before its PUT: the publish intent's content.

A records object holds rows of one tenant and one UTC day. Its claim is the exact set
of frames (their ``wal_lsn``, a frame's end offset) whose rows it holds — every row of
that tenant and day from each of them, since a frame's rows of one day are appended to
one partition together, moved only with it, and published or suppressed as a whole. An
audit object's claim is one ``(wal_lsn, template_id, template_version)`` per template
event it holds. Claims are read off the rows being written, never derived from bounds:
a partition merged after a failed publish can skip frames that another object holds,
and a range would then state more than the object has (docs/ARCHITECTURE.md "Exactly
once in the store").

The publisher hands each claim, with the object's key, to its intent hook before the
PUT; ``app`` makes it durable (``wal.IntentLog``) and, after a crash, suppresses what a
present object holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.compute as pc

from sink.buffers import Partition
from wal import ObjectKind


@dataclass(frozen=True, slots=True)
class Claim:
    """One object's key and exactly what it holds (module docstring)."""

    key: str
    kind: ObjectKind
    tenant: str
    day: int
    #: records: the frames whose rows of ``day`` it holds, increasing
    frames: tuple[int, ...] = ()
    #: audit: (wal_lsn, template_id, template_version) per event, in row order
    events: tuple[tuple[int, int, int], ...] = ()


#: Makes a claim durable before its PUT; raises when it could not.
IntentHook = Callable[[Claim], None]


def claim_of(key: str, part: Partition) -> Claim:
    """The claim of ``part``'s rows written under ``key``."""
    if part.kind is ObjectKind.RECORDS:
        assert part.records is not None
        frames: set[int] = set()
        for batch in part.records.batches:
            frames.update(pc.unique(batch.column("wal_lsn")).to_pylist())
        return Claim(key, part.kind, part.tenant, part.day, frames=tuple(sorted(frames)))
    assert part.audit is not None
    cols = part.audit
    events = tuple(zip(cols.wal_lsn, cols.template_id, cols.template_version, strict=True))
    return Claim(key, part.kind, part.tenant, part.day, events=events)

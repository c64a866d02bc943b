"""A cut: what the barrier publishes and stamps at one mark (DESIGN.md §5.4–5.6).

A cut is captured under the barrier exclusion (held exclusively by the barrier thread,
or shared by the ingest turn that observed a rotation) and flushed outside it: its
``batches`` are the partitions drained at the capture, registered in flight at its
``epoch``; ``prior_upto`` separates the publishes registered before the capture, which
must settle before the cut may stamp; ``snaps`` and ``frozen`` hold the tenants'
miner states at their folded horizons. The pipeline captures cuts and the barrier runs
them; this module is what both share, so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.ingest.snapshot_store import SnapshotState
from sink.buffers import Detached
from wal import WalOffset

__all__ = ["Cut"]


@dataclass
class Cut:
    epoch: int
    mark: WalOffset | None
    batches: list[Detached]
    #: publishes registered up to this id were registered before the capture
    prior_upto: int
    reason: str
    snaps: dict[str, SnapshotState] = field(default_factory=dict)
    #: tenants frozen for this cut whose state is not serialised yet
    frozen: set[str] = field(default_factory=set)
    captured_at: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(d.partition.nbytes for d in self.batches)

    @property
    def own_ids(self) -> set[int]:
        return {d.id for d in self.batches}

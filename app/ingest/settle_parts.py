"""What a settlement works with (``app.ingest.settlement``), handed to the settler when it
is built: the WAL, the miners, the buffers, the publisher, the snapshot ledger, the tenant
table, the unmined entries, the two locks, the clock, the events, the barrier's schedule,
and the few steps only the pipeline takes (``PipelineSide``). The settler and its rooms
(``rebuild``, ``unrecoverable``, ``frame_attempts``) call these directly; none of them
reaches through the pipeline for a collaborator of its."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from app.base.batch import FlatBatch
from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.tenant_miner import MineResult, TenantMiner
from app.ingest.snapshot_store import SnapshotLedger
from app.ingest.tenants import TenantTable
from app.ingest.unmined import UnminedSet
from sink import Buffers, Detached, Publisher
from wal import Journal, WalOffset


class Exclusion(Protocol):
    """The barrier exclusion (the pipeline's reader–writer lock)."""

    def shared(self) -> AbstractContextManager[None]: ...

    def exclusive(self) -> AbstractContextManager[None]: ...


class InFlightRows(Protocol):
    """The buffers' partitions in flight: what of a tenant is not durable yet."""

    def pending_for(self, tenant: str) -> Sequence[object]: ...


class PipelineSide(Protocol):
    """The steps of a settlement only the pipeline can take: its tree table, its mark, its
    buffering of a mined batch, and its set of refused tenants (named here so this
    package's settlement needs no import of the pipeline, which builds the settler)."""

    def recompute_durable(self) -> None: ...

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> None: ...

    def refuse_tenant(self, tenant: str, detail: str) -> None: ...

    def buffer_audit(
        self,
        tenant: str,
        batch: FlatBatch,
        result: MineResult,
        offset: WalOffset,
        staged: Callable[[int], bool] | None = None,
    ) -> list[Detached]: ...

    def buffer_records(
        self,
        tenant: str,
        batch: FlatBatch,
        result: MineResult,
        offset: WalOffset,
        nbytes: int,
        staged: bool = False,
    ) -> list[Detached]: ...


class SettleSchedule:
    """When the barrier settles refused tenants next: (its cadence in seconds, the time
    its timer fires), the settling hint's countdown; None before a barrier is followed
    (the hint is then one second). Built before the pipeline and the barrier, which
    need each other (the barrier is built on the pipeline, the settler's hint reads the
    barrier's timer): the one who builds both makes it follow the barrier."""

    def __init__(self) -> None:
        self._source: Callable[[], tuple[float, float]] | None = None

    def follow(self, source: Callable[[], tuple[float, float]]) -> None:
        self._source = source

    def __call__(self) -> tuple[float, float] | None:
        source = self._source
        return None if source is None else source()


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    """Events go nowhere (a settler built without an event sink)."""


@dataclass(frozen=True)
class SettleParts:
    """Everything a settler is given when it is built (module docstring)."""

    journal: Journal
    miners: MinerCluster
    buffers: Buffers
    #: the buffers' partitions in flight (a tenant's rows not yet durable)
    in_flight: InFlightRows
    publisher: Publisher
    ledger: SnapshotLedger
    tenants: TenantTable
    unmined: UnminedSet
    exclusion: Exclusion
    miner_lock: threading.Lock
    #: tenant -> the end of the last frame its tree folded (written under the miner lock)
    folded: dict[str, WalOffset]
    pipeline: PipelineSide
    #: monotonic: the settling hint's countdown
    clock: Callable[[], float]
    schedule: SettleSchedule
    events: Callable[[str, Mapping[str, object]], None] = _no_events

"""Each tenant's share of the ingest turn (DESIGN.md §5.14): one tenant cannot stall the
others.

Every tenant's records are mined on the one turn thread, in commit order. What a batch
costs there is its mining work (``MineResult.work``: a unit per record and per template
compared, more for a template created or widened), a deterministic function of the
frames and the tree. Each tenant has a bucket of work units, ``miner.tenant_work_per_sec``
a second up to ``miner.tenant_work_burst_secs`` of it; a turn subtracts its batch's
work. The bucket decides **admission only**: a tenant in debt has its new batches
refused (``TenantOverShare``: 503 ``tenant_turn_share`` naming the tenant, Retry-After
the seconds the refill needs), nothing of them is written, and nothing about what the
miner produces depends on the bucket — recovery and settlement re-mine the WAL's frames
exactly as the turn did.

A batch's cost is known only after its turn, and frames wait in the backlog before it,
so admission also reserves an estimate (the batch's records at the tenant's recent
work per record) until its turn settles it: a tenant whose admitted-and-waiting batches
would already spend its bucket is refused before they pile up. A tenant with nothing
waiting and no debt is always admitted one batch, however large, so no batch size is
refused forever.

Refusals are reported per transition: ``tenant.share.exceeded`` when a tenant is first
refused (for its turn share, or by ``app.ingest.stages`` for its share of the backlog),
``tenant.share.recovered`` when it is admitted again, with how many batches were refused
and for how long.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from app.receive.otlp import Unavailable

__all__ = ["TenantOverShare", "TurnShares"]

#: the work a record is assumed to cost before a tenant's first turn (the benchmark's
#: service logs cost about two units a record)
INITIAL_WORK_PER_RECORD: Final = 4.0
#: how much of each turn's work per record moves a tenant's estimate
_EWMA: Final = 0.25


class TenantOverShare(Unavailable):
    """503 / UNAVAILABLE: the tenant spent its share of the ingest turn."""

    def __init__(self, tenant: str, debt: int, per_sec: int, burst_secs: int, retry: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its share of the ingest turn: its batches waiting "
            f"and mined cost {debt} work units more than its bucket holds "
            f"(miner.tenant_work_per_sec={per_sec}, miner.tenant_work_burst_secs="
            f"{burst_secs}); other tenants are not affected; retry after {retry} s",
            retry_after=retry,
            error_type="tenant_turn_share",
        )


@dataclass(slots=True)
class _Bucket:
    balance: float
    at: float
    #: estimates of batches admitted and not yet turned
    pending: float = 0.0
    per_record: float = INITIAL_WORK_PER_RECORD
    #: refused since (monotonic seconds), and how many, while over its share
    refused_since: float | None = None
    refused: int = 0
    reason: str = ""


class TurnShares:
    """The tenants' buckets of turn work (thread-safe: admission and the turn thread)."""

    def __init__(
        self,
        per_sec: int,
        burst_secs: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> None:
        if per_sec < 1 or burst_secs < 1:
            raise ValueError(f"per_sec={per_sec} and burst_secs={burst_secs} must be >= 1")
        self.per_sec = per_sec
        self.burst_secs = burst_secs
        self.capacity = float(per_sec * burst_secs)
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        #: work units charged in all (``ourios_miner_work_units_total``)
        self.charged = 0

    def _bucket(self, tenant: str, now: float) -> _Bucket:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(self.capacity, now)
        elif now > bucket.at:
            bucket.balance = min(self.capacity, bucket.balance + (now - bucket.at) * self.per_sec)
            bucket.at = now
        return bucket

    def admit(self, tenant: str, records: int) -> float:
        """Reserve a batch of ``records`` against the tenant's bucket and return the
        estimate to settle at its turn; raise ``TenantOverShare`` (nothing reserved)
        when the tenant is in debt or its waiting batches would spend the bucket."""
        with self._lock:
            now = self._clock()
            bucket = self._bucket(tenant, now)
            estimate = records * bucket.per_record
            short = bucket.pending + estimate - bucket.balance
            if bucket.balance < 0 or (bucket.pending > 0 and short > 0):
                need = -bucket.balance if bucket.balance < 0 else short
                retry = max(1, min(self.burst_secs, math.ceil(need / self.per_sec)))
                refusal = TenantOverShare(
                    tenant, math.ceil(need), self.per_sec, self.burst_secs, retry
                )
                entered = self._refused_locked(bucket, now, "turn_share")
                recovered = None
            else:
                bucket.pending += estimate
                recovered = self._admitted_locked(tenant, bucket, now)
                refusal = None
                entered = False
        if refusal is not None:
            if entered:
                self._exceeded(tenant, "turn_share", refusal.retry_after, bucket)
            raise refusal
        if recovered is not None:
            self._events("tenant.share.recovered", recovered)
        return estimate

    def release(self, tenant: str, estimate: float) -> None:
        """An admitted batch that was not written (its append failed)."""
        with self._lock:
            bucket = self._buckets.get(tenant)
            if bucket is not None:
                bucket.pending = max(0.0, bucket.pending - estimate)

    def charge(self, tenant: str, estimate: float, work: int, records: int) -> None:
        """A batch's turn ran: settle its estimate with the ``work`` it cost."""
        with self._lock:
            bucket = self._bucket(tenant, self._clock())
            bucket.pending = max(0.0, bucket.pending - estimate)
            bucket.balance -= work
            self.charged += work
            if records:
                bucket.per_record += _EWMA * (work / records - bucket.per_record)

    def refused(self, tenant: str, reason: str, retry_after: int | None) -> None:
        """Another share refused the tenant (``app.ingest.stages``: its backlog)."""
        with self._lock:
            now = self._clock()
            bucket = self._bucket(tenant, now)
            entered = self._refused_locked(bucket, now, reason)
        if entered:
            self._exceeded(tenant, reason, retry_after, bucket)

    @property
    def over_share(self) -> int:
        """Tenants refused for a share since they were last admitted."""
        with self._lock:
            return sum(1 for b in self._buckets.values() if b.refused_since is not None)

    def balance(self, tenant: str) -> float:
        with self._lock:
            return self._bucket(tenant, self._clock()).balance

    # -- transitions ---------------------------------------------------------------------

    def _refused_locked(self, bucket: _Bucket, now: float, reason: str) -> bool:
        bucket.refused += 1
        if bucket.refused_since is None:
            bucket.refused_since = now
            bucket.reason = reason
            return True
        return False

    def _admitted_locked(
        self, tenant: str, bucket: _Bucket, now: float
    ) -> dict[str, object] | None:
        since = bucket.refused_since
        if since is None:
            return None
        fields: dict[str, object] = {
            "tenant": tenant,
            "reason": bucket.reason,
            "refused_batches": bucket.refused,
            "seconds": round(now - since, 3),
            "action": "admitting the tenant's batches again",
        }
        bucket.refused_since = None
        bucket.refused = 0
        return fields

    def _exceeded(self, tenant: str, reason: str, retry: int | None, bucket: _Bucket) -> None:
        self._events(
            "tenant.share.exceeded",
            {
                "tenant": tenant,
                "reason": reason,
                "balance": round(bucket.balance),
                "waiting": round(bucket.pending),
                "work_per_sec": self.per_sec,
                "burst_secs": self.burst_secs,
                "retry_after_secs": retry,
                "action": "refusing this tenant's new batches (503, Retry-After) until its "
                "share allows; other tenants are admitted as before",
            },
        )

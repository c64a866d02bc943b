"""Each tenant's share of the ingest turn (DESIGN.md §5.14): one tenant cannot stall the
others.

Every tenant's records are mined on the one turn thread, in commit order, and while it
mines the core's other threads wait for the GIL. What a batch costs there is its mining
work (``MineResult.work``: a unit per record and per template compared, more for a
template created or widened), a deterministic function of the frames and the tree, and
the seconds that work takes on this node, which the turn measures: the seconds a unit
of the tenant's takes (over the last ``COST_WINDOW_S`` of its mining, weighed against
the node's, so one descheduled turn of a small tenant moves it little) converts the one
into the other. A tenant's share is a fraction of the turn's time, ``miner.tenant_turn_percent``,
so it means the same on a fast node, a slow one and a loaded one: each tenant has a
bucket of turn seconds, refilled at that fraction of the clock up to
``miner.tenant_turn_burst_secs`` of it; a turn subtracts its batch's work at the
measured cost. The bucket decides **admission only**: a tenant in debt has its new
batches refused (``TenantOverShare``: 503 ``tenant_turn_share`` naming the tenant,
Retry-After the seconds the refill needs), nothing of them is written, and nothing about
what the miner produces depends on the bucket — recovery and settlement re-mine the
WAL's frames exactly as the turn did.

The share is work-conserving: it is enforced while another tenant has been turned in
the last ``CONTENDED_S``; a tenant alone on the node may take the whole turn (its debt
then held to one burst, so it is not refused for long once others arrive).

A batch's cost is known only after its turn, and frames wait in the backlog before it,
so admission also reserves an estimate (the batch's records at the tenant's recent
work per record) until its turn settles it: a tenant whose admitted-and-waiting batches
would already spend its bucket is refused before they pile up. A tenant with nothing
waiting and no debt is always admitted one batch, however large, so no batch size is
refused forever.

Refusals are reported per transition: ``tenant.share.exceeded`` when a tenant is first
refused (for its turn share, or by ``app.ingest.stages`` for its share of the backlog),
``tenant.share.recovered`` when it is admitted again, with how many batches were refused
and for how long. ``share_max`` is the largest share of the turn's time one tenant's
mining actually took (over the last ``USED_WINDOW_S``), ``ourios_ingest_tenant_turn_share_max``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from app.base.rejections import Unavailable

__all__ = ["TenantOverShare", "TurnShares"]

#: the work a record is assumed to cost before a tenant's first turn unless the node
#: says (``first_per_record``: the most a record can cost under the miner's bounds, so a
#: new tenant cannot queue many costly batches before its first is turned)
INITIAL_WORK_PER_RECORD: Final = 4.0
#: batches a tenant never turned may have waiting whatever their estimate (a client's
#: first concurrent requests), so the pessimistic first estimate refuses only a pile-up
FIRST_BATCHES: Final = 4
#: how much of each turn's work per record moves a tenant's estimate
_EWMA: Final = 0.25
#: the seconds a work unit is assumed to take before the turn has measured it (about a
#: microsecond on the machines of docs/BENCHMARKS.md), weighing as this many units
INITIAL_UNIT_SECS: Final = 1e-6
_PRIOR_UNITS: Final = 10_000.0
#: a tenant's own cost is weighed against this many units at the node's
_TENANT_PRIOR_UNITS: Final = 2_000.0
#: the measured cost follows the last this many seconds of mining (exponential decay)
COST_WINDOW_S: Final = 10.0
#: bounds on the measured cost, so one descheduled turn cannot make the share absurd
_MIN_UNIT_SECS: Final = 1e-8
_MAX_UNIT_SECS: Final = 1e-3
#: the share is enforced while another tenant has been turned within this many seconds
CONTENDED_S: Final = 10.0
#: ``share_max`` is each tenant's mining seconds over about this many seconds
USED_WINDOW_S: Final = 10.0


class TenantOverShare(Unavailable):
    """503 / UNAVAILABLE: the tenant spent its share of the ingest turn."""

    def __init__(
        self, tenant: str, debt_secs: float, percent: int, burst_secs: int, retry: int
    ) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its share of the ingest turn: its batches waiting "
            f"and mined took {debt_secs * 1000:.1f} ms of the turn more than its share holds "
            f"(miner.tenant_turn_percent={percent} of the turn's time, "
            f"miner.tenant_turn_burst_secs={burst_secs}); other tenants are not affected; "
            f"retry after {retry} s",
            retry_after=retry,
            error_type="tenant_turn_share",
        )


@dataclass(slots=True)
class _Bucket:
    #: seconds of the turn the tenant may still take
    balance: float
    at: float
    #: estimates (work units) of batches admitted and not yet turned
    pending: float = 0.0
    per_record: float = INITIAL_WORK_PER_RECORD
    #: whether a turn of it has been charged (its first sets ``per_record``)
    turned: bool = False
    #: batches admitted and not yet turned
    waiting: int = 0
    #: refused since (monotonic seconds), and how many, while over its share
    refused_since: float | None = None
    refused: int = 0
    reason: str = ""
    #: the measured seconds of its mining, decaying over ``USED_WINDOW_S``
    used: float = 0.0
    used_at: float = 0.0
    #: its own mining seconds and units, decaying over ``COST_WINDOW_S``
    cost_secs: float = 0.0
    cost_units: float = 0.0
    cost_at: float = 0.0


class TurnShares:
    """The tenants' buckets of turn time (thread-safe: admission and the turn thread)."""

    def __init__(
        self,
        percent: int,
        burst_secs: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        first_per_record: float = INITIAL_WORK_PER_RECORD,
    ) -> None:
        self.first_per_record = first_per_record
        if not 1 <= percent <= 100 or burst_secs < 1:
            raise ValueError(
                f"percent={percent} must be in [1, 100] and burst_secs={burst_secs} >= 1"
            )
        self.percent = percent
        #: the fraction of the turn's time each tenant may take
        self.share = percent / 100
        self.burst_secs = burst_secs
        #: seconds of the turn a full bucket holds
        self.capacity = self.share * burst_secs
        self._clock = clock
        self._events = events or (lambda name, fields: None)
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        #: work units charged in all (``ourios_miner_work_units_total``)
        self.charged = 0
        #: the measured cost: mining seconds and units, decaying over ``COST_WINDOW_S``
        self._cost_secs = INITIAL_UNIT_SECS * _PRIOR_UNITS
        self._cost_units = _PRIOR_UNITS
        self._cost_at = clock()
        #: the last two distinct tenants turned, newest first, and when
        self._recent: list[tuple[str, float]] = []

    def _bucket(self, tenant: str, now: float) -> _Bucket:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(
                self.capacity, now, per_record=self.first_per_record, used_at=now
            )
        elif now > bucket.at:
            bucket.balance = min(self.capacity, bucket.balance + (now - bucket.at) * self.share)
            bucket.at = now
        return bucket

    @property
    def unit_secs(self) -> float:
        """The seconds one work unit takes on this node's turn, as measured."""
        with self._lock:
            return self._unit_secs_locked()

    def _unit_secs_locked(self) -> float:
        return min(_MAX_UNIT_SECS, max(_MIN_UNIT_SECS, self._cost_secs / self._cost_units))

    def _tenant_unit_secs_locked(self, bucket: _Bucket) -> float:
        """The tenant's own measured cost of a unit, weighed against ``_TENANT_PRIOR_UNITS``
        of the node's: a tenant whose units take longer (a slow tree) is charged what they
        take, and one turn of a small tenant that was descheduled moves its cost little."""
        node = self._unit_secs_locked()
        secs = bucket.cost_secs + _TENANT_PRIOR_UNITS * node
        cost = secs / (bucket.cost_units + _TENANT_PRIOR_UNITS)
        return min(_MAX_UNIT_SECS, max(_MIN_UNIT_SECS, cost))

    def _contended_locked(self, tenant: str, now: float) -> bool:
        return any(t != tenant and now - at <= CONTENDED_S for t, at in self._recent)

    def admit(self, tenant: str, records: int) -> float:
        """Reserve a batch of ``records`` against the tenant's bucket and return the
        estimate (work units) to settle at its turn; raise ``TenantOverShare`` (nothing
        reserved) when another tenant is being served and this one is in debt or its
        waiting batches would spend the bucket."""
        with self._lock:
            now = self._clock()
            bucket = self._bucket(tenant, now)
            unit = self._tenant_unit_secs_locked(bucket)
            estimate = records * bucket.per_record
            short = (bucket.pending + estimate) * unit - bucket.balance
            first = not bucket.turned and bucket.waiting < FIRST_BATCHES
            over = bucket.balance < 0 or (bucket.pending > 0 and short > 0 and not first)
            if over and self._contended_locked(tenant, now):
                need = -bucket.balance if bucket.balance < 0 else short
                retry = max(1, min(self.burst_secs, math.ceil(need / self.share)))
                refusal: TenantOverShare | None = TenantOverShare(
                    tenant, need, self.percent, self.burst_secs, retry
                )
                entered = self._refused_locked(bucket, now, "turn_share")
                recovered = None
            else:
                bucket.pending += estimate
                bucket.waiting += 1
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
                bucket.waiting = max(0, bucket.waiting - 1)

    def charge(
        self, tenant: str, estimate: float, work: int, records: int, seconds: float = 0.0
    ) -> None:
        """A batch's turn ran: settle its estimate with the ``work`` it cost; its mining
        took ``seconds`` (measured), which moves the node's cost of a unit."""
        with self._lock:
            now = self._clock()
            if work > 0 and seconds > 0:
                decay = math.exp(-max(0.0, now - self._cost_at) / COST_WINDOW_S)
                self._cost_secs = self._cost_secs * decay + seconds
                self._cost_units = self._cost_units * decay + work
                self._cost_at = now
            bucket = self._bucket(tenant, now)
            if work > 0 and seconds > 0:
                decay = math.exp(-max(0.0, now - bucket.cost_at) / COST_WINDOW_S)
                bucket.cost_secs = bucket.cost_secs * decay + seconds
                bucket.cost_units = bucket.cost_units * decay + work
                bucket.cost_at = now
            bucket.pending = max(0.0, bucket.pending - estimate)
            bucket.waiting = max(0, bucket.waiting - 1)
            bucket.balance -= work * self._tenant_unit_secs_locked(bucket)
            if not self._contended_locked(tenant, now):
                # alone on the node: not refused, and its debt held to one burst
                bucket.balance = max(bucket.balance, -self.capacity)
            self.charged += work
            if records and not bucket.turned:
                bucket.per_record = work / records
                bucket.turned = True
            elif records:
                bucket.per_record += _EWMA * (work / records - bucket.per_record)
            bucket.used = bucket.used * self._used_decay(bucket, now) + seconds
            bucket.used_at = now
            if self._recent and self._recent[0][0] == tenant:
                self._recent[0] = (tenant, now)
            else:
                self._recent = [(tenant, now), *self._recent[:1]]

    @staticmethod
    def _used_decay(bucket: _Bucket, now: float) -> float:
        return math.exp(-max(0.0, now - bucket.used_at) / USED_WINDOW_S)

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

    @property
    def share_max(self) -> float:
        """The largest share of the turn's time one tenant's mining took over about the
        last ``USED_WINDOW_S`` (a fraction; the bound is ``share``, plus one batch)."""
        with self._lock:
            now = self._clock()
            used = (b.used * self._used_decay(b, now) for b in self._buckets.values())
            return max(used, default=0.0) / USED_WINDOW_S

    def balance(self, tenant: str) -> float:
        """Seconds of the turn the tenant may still take."""
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
                "balance_secs": round(bucket.balance, 4),
                "waiting_units": round(bucket.pending),
                "turn_percent": self.percent,
                "turn_us_per_unit": round(self.unit_secs * 1e6, 3),
                "burst_secs": self.burst_secs,
                "retry_after_secs": retry,
                "action": "refusing this tenant's new batches (503, Retry-After) until its "
                "share allows; other tenants are admitted as before",
            },
        )

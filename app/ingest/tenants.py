"""Tenant admission: slots (``max_tenants``) and each tenant's admission state, under the
admission mutex (RFC 0055 §9.1, DESIGN.md §5.3 and §7).

The admission mutex is this table's lock. It sits at the top of the lock order and is
taken with nothing else held: by a request before its append (``admit``), and by the
turn after it released the miner lock and the exclusion (``finish``), and by a settler
publishing or ending its claim — never while holding the exclusion, the miner lock or
the journal mutex.

Slots. A tenant the table does not hold takes a *Reserved* slot before its append,
refused as ``TenantCapacity`` when held + reserved is at the limit, so concurrent first
writes for different new ids can never overshoot it; concurrent first writes for one id
share the slot (a reference count). The slot becomes *Held* when any of them was
acknowledged and mined (the tenant is installed in the miner). It is released only
when the last of them ended with no frame left behind (the append itself failed) and
the tenant has no unmined entry: a failed sync leaves a frame that a restart would
replay and seed as held, and a failed mining leaves an entry whose settlement installs
the tenant, so both keep the reservation (``frame_pending``, ``pending_settlement``).
A tenant with no snapshot pins the segment holding such a frame, so nothing reclaims
it before a restart; the reservation therefore lasts until a later write for the
tenant succeeds or the process restarts. No slot is ever evicted.

The table is seeded from the tenants recovery restored and replayed before any
listener starts (``seed``), so a restarted node neither admits past the limit nor
refuses a tenant it already serves.

Open mode (no tokens: any client names any tenant) bounds how fast slots are taken:
``limit_new_tenants(per_minute)`` gives the table a token bucket of ``per_minute``
new tenants, refilled evenly over a minute. A first write for a tenant without a slot
takes a token before its reservation; with none left it is refused ``NewTenantRate``
(503, Retry-After until the next token) and nothing is reserved. So a hostile client
cannot take every slot at once: filling ``max_tenants`` takes at least
``max_tenants / per_minute`` minutes, which the slot gauges and the
``tenant.open_rate_limited`` event show meanwhile (DESIGN.md §3). Token mode has no
bucket: its tenants are the ones the tokens file names.

Admission states, checked before the slot: *settling* (the tenant has an unmined entry:
503 with a bounded Retry-After, ``wal_settling``) and *unrecoverable* (its restorable
horizon is below what was reclaimed: 503, server-terminal, no hint,
``wal_tenant_unrecoverable``). Each refusal names the tenant.

The usage gauges read held and reserved from the table under the same hold that
changes it, so a reader never sees a total that disagrees with the table.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from app.base.rejections import Unavailable


class NewTenantRate(Unavailable):
    """Open mode: a new tenant beyond ``server.open_new_tenants_per_minute``. Retryable
    once the rate allows another, which the Retry-After says; nothing is reserved."""

    error_type = "open_new_tenant_rate"

    def __init__(self, tenant: str, per_minute: int, retry_after: int) -> None:
        super().__init__(
            f"tenant {tenant!r} refused: in open mode the node takes at most "
            f"server.open_new_tenants_per_minute={per_minute} new tenants a minute; "
            f"retry in {retry_after} s (configure auth.tokens_file to name the tenants)",
            retry_after=retry_after,
        )
        self.tenant = tenant


class TenantCapacity(Unavailable):
    """A new tenant at the ``max_tenants`` limit. Capacity, not backpressure: no slot is
    freed by waiting, so there is no Retry-After and no RetryInfo (the client backs off
    exponentially), and no latch is set."""

    error_type = "wal_tenant_cap"

    def __init__(self, tenant: str, count: int, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} refused: {count} of max_tenants={limit} tenant slots are "
            f"held or reserved; no slot is freed by waiting (raise max_tenants)"
        )
        self.tenant = tenant
        self.count = count
        self.limit = limit


class SettlementInProgress(Unavailable):
    """The tenant's tree is being rebuilt after a mining failure (RFC 0055 settlement):
    short and self-clearing, so a bounded Retry-After rides along."""

    error_type = "wal_settling"

    def __init__(self, tenant: str, retry_after: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is settling after a mining failure (its template state is "
            f"being rebuilt from its last snapshot); retry in {retry_after} s",
            retry_after=retry_after,
        )
        self.tenant = tenant


class TenantUnrecoverable(Unavailable):
    """Server-terminal, client-retryable: the tenant's state cannot be rebuilt in this
    process. Every other tenant continues; a restart halts naming it."""

    error_type = "wal_tenant_unrecoverable"

    def __init__(self, tenant: str, detail: str) -> None:
        super().__init__(
            f"tenant {tenant!r} is unrecoverable in this process (server-terminal): {detail}"
        )
        self.tenant = tenant


class TenantCountExceeded(Exception):
    """Recovery restored more tenants than ``max_tenants``: the node refuses to start."""


class SlotState(enum.Enum):
    RESERVED = 1
    HELD = 2


class TurnResult(enum.Enum):
    """How a first write ended, as ``finish`` needs it."""

    MINED = 1  # acknowledged and installed in the miner: Held
    NO_FRAME = 2  # the append failed (or admission refused after reserving): nothing left
    FRAME_LEFT = 3  # the frame is in the WAL but was not acknowledged (a failed sync)
    UNMINED = 4  # acknowledged, mining failed: an unmined entry holds the slot


class AdmissionState(enum.Enum):
    SETTLING = 1
    UNRECOVERABLE = 2


@dataclass
class _Slot:
    state: SlotState
    inflight: int = 0
    frame_pending: bool = False
    pending_settlement: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    held: int
    reserved: int
    limit: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.held - self.reserved)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``admit`` took: ``first`` when the tenant was not held (a reference on its
    Reserved slot that ``finish`` must return)."""

    tenant: str
    first: bool


class TenantTable:
    """The admission mutex and what it guards (module docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_tenants must be >= 1, got {limit}")
        self.limit = limit
        self.lock = threading.Lock()  # the admission mutex
        self._slots: dict[str, _Slot] = {}
        self._held = 0
        self._reserved = 0
        self._states: dict[str, AdmissionState] = {}
        self._details: dict[str, str] = {}
        self._rate: _NewTenantBucket | None = None

    def limit_new_tenants(
        self,
        per_minute: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> None:
        """Open mode's bound on new tenants (module docstring); before any listener."""
        self._rate = _NewTenantBucket(per_minute, clock, events)

    # -- start-up ------------------------------------------------------------------------

    def seed(self, tenants: Iterable[str]) -> int:
        """Enter every recovered tenant as Held, before any listener exists. More than
        ``limit`` refuses the start, naming the count and the limit."""
        names = sorted(set(tenants))
        if len(names) > self.limit:
            raise TenantCountExceeded(
                f"recovery restored {len(names)} tenants but max_tenants={self.limit}; "
                f"raise max_tenants to at least {len(names)}"
            )
        with self.lock:
            for tenant in names:
                slot = self._slots.get(tenant)
                if slot is None:
                    self._slots[tenant] = _Slot(SlotState.HELD)
                    self._held += 1
                elif slot.state is SlotState.RESERVED:
                    slot.state = SlotState.HELD
                    self._reserved -= 1
                    self._held += 1
        return len(names)

    # -- a request -----------------------------------------------------------------------

    def admit(self, tenant: str, settling_hint: int) -> Reservation:
        """Under the admission mutex: refuse a settling or unrecoverable tenant, then take
        (or share) a slot. Nothing is written when this raises."""
        with self.lock:
            state = self._states.get(tenant)
            if state is AdmissionState.UNRECOVERABLE:
                raise TenantUnrecoverable(tenant, self._details.get(tenant, ""))
            if state is AdmissionState.SETTLING:
                raise SettlementInProgress(tenant, settling_hint)
            slot = self._slots.get(tenant)
            if slot is not None and slot.state is SlotState.HELD:
                return Reservation(tenant, False)
            if slot is None:
                count = self._held + self._reserved
                if count >= self.limit:
                    raise TenantCapacity(tenant, count, self.limit)
                if self._rate is not None:
                    self._rate.take(tenant)
                slot = self._slots[tenant] = _Slot(SlotState.RESERVED)
                self._reserved += 1
            slot.inflight += 1
            return Reservation(tenant, True)

    def finish(self, reservation: Reservation, result: TurnResult) -> None:
        """After the turn (miner lock and exclusion released): record the transition."""
        if not reservation.first:
            return
        with self.lock:
            slot = self._slots.get(reservation.tenant)
            if slot is None or slot.state is SlotState.HELD:
                return
            slot.inflight -= 1
            if result is TurnResult.MINED:
                self._hold_locked(reservation.tenant, slot)
                return
            if result is TurnResult.FRAME_LEFT:
                slot.frame_pending = True
            elif result is TurnResult.UNMINED:
                slot.pending_settlement = True
            self._maybe_release_locked(reservation.tenant, slot)

    def settled(self, tenant: str, installed: bool) -> None:
        """A settlement ended: it installed the tenant (Held), or resolved without one."""
        with self.lock:
            slot = self._slots.get(tenant)
            if slot is None or slot.state is SlotState.HELD:
                return
            slot.pending_settlement = False
            if installed:
                self._hold_locked(tenant, slot)
            else:
                self._maybe_release_locked(tenant, slot)

    def _hold_locked(self, tenant: str, slot: _Slot) -> None:
        slot.state = SlotState.HELD
        slot.frame_pending = slot.pending_settlement = False
        self._reserved -= 1
        self._held += 1

    def _maybe_release_locked(self, tenant: str, slot: _Slot) -> None:
        if slot.inflight == 0 and not slot.frame_pending and not slot.pending_settlement:
            del self._slots[tenant]
            self._reserved -= 1

    # -- admission states -------------------------------------------------------------------

    def set_settling(
        self, tenant: str, settling: bool, *, still: Callable[[], bool] | None = None
    ) -> None:
        """A tenant with an unmined entry is refused at admission until it is settled.
        ``still`` (evaluated under the admission mutex) guards a late ``True`` against a
        settlement that cleared the state first."""
        with self.lock:
            current = self._states.get(tenant)
            if current is AdmissionState.UNRECOVERABLE:
                return  # one refusal reason per tenant: the terminal one
            if settling and still is not None and not still():
                return
            if settling:
                self._states[tenant] = AdmissionState.SETTLING
            elif current is AdmissionState.SETTLING:
                del self._states[tenant]

    def set_unrecoverable(self, tenant: str, detail: str) -> bool:
        """True on the transition (the caller emits the event once)."""
        with self.lock:
            if self._states.get(tenant) is AdmissionState.UNRECOVERABLE:
                return False
            self._states[tenant] = AdmissionState.UNRECOVERABLE
            self._details[tenant] = detail
            return True

    def state(self, tenant: str) -> AdmissionState | None:
        with self.lock:
            return self._states.get(tenant)

    def in_state(self, state: AdmissionState) -> set[str]:
        with self.lock:
            return {t for t, s in self._states.items() if s is state}

    # -- reading ---------------------------------------------------------------------------

    def usage(self) -> Usage:
        with self.lock:
            return Usage(self._held, self._reserved, self.limit)

    def slot(self, tenant: str) -> SlotState | None:
        with self.lock:
            slot = self._slots.get(tenant)
            return None if slot is None else slot.state


class _NewTenantBucket:
    """A token bucket of new tenants: ``per_minute`` at most at once, refilled evenly.
    Used under the admission mutex only."""

    #: at most one ``tenant.open_rate_limited`` event per this many seconds
    EVENT_EVERY_S = 60.0

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float],
        events: Callable[[str, Mapping[str, object]], None] | None,
    ) -> None:
        if per_minute < 1:
            raise ValueError(f"open_new_tenants_per_minute must be >= 1, got {per_minute}")
        self.per_minute = per_minute
        self._clock = clock
        self._events = events
        self._tokens = float(per_minute)
        self._at = clock()
        self._refused = 0
        self._last_event: float | None = None

    def take(self, tenant: str) -> None:
        now = self._clock()
        rate = self.per_minute / 60.0
        self._tokens = min(float(self.per_minute), self._tokens + (now - self._at) * rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return
        retry_after = max(1, math.ceil((1.0 - self._tokens) / rate))
        self._refused += 1
        if self._events is not None and (
            self._last_event is None or now - self._last_event >= self.EVENT_EVERY_S
        ):
            self._last_event = now
            self._events(
                "tenant.open_rate_limited",
                {
                    "tenant": tenant,
                    "per_minute": self.per_minute,
                    "refused_since_last_event": self._refused,
                    "action": "refusing new tenants with 503 and a Retry-After until the "
                    "rate allows another; held tenants are unaffected",
                },
            )
            self._refused = 0
        raise NewTenantRate(tenant, self.per_minute, retry_after)

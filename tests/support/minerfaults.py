"""Mining failures on demand, for settlement tests (RFC 0055).

``FaultyMiners(allocator, plan)`` is a ``MinerCluster`` whose miners are a
``TenantMiner`` subclass bound to ``plan``. A trigger raises at the record whose body
contains its marker: ``before`` mines the records ahead of it first (templates they
create or widen are in the tree, their events lost with the exception), ``after`` mines
that record too (so a template it widens is widened while its event is lost) — the
"unknown tree" a settlement exists to repair. The plan can also fail the next snapshot
restores (``restore_failures``) and the next ``replace_tenant`` calls.

The hook is ``MinerCluster(miner_type=...)``, the production seam (as ``wal.testing.FaultyFs``
is for I/O): no production type carries a test field, and a real ``ourios serve`` gets
the same plan through a ``sitecustomize`` probe that only the test's process loads
(``tests/crash/test_mining_failures_sigkill.py``), which calls ``install_in_serve``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import TemplateIdAllocator
from app.ingest.mining.tenant_miner import MineResult, TenantMiner


class InjectedMiningFailure(RuntimeError):
    """Raised by a faulty miner at the record a trigger names."""


@dataclass
class Trigger:
    #: a substring of the record's body, or a predicate over the body
    marker: str | Callable[[str], bool]
    when: Literal["before", "after"] = "before"
    times: int = 1
    fired: int = 0

    def matches(self, body: str) -> bool:
        if self.fired >= self.times:
            return False
        return self.marker(body) if callable(self.marker) else self.marker in body


@dataclass
class FaultPlan:
    triggers: list[Trigger] = field(default_factory=list)
    restore_failures: int = 0
    replace_failures: int = 0
    #: False: the triggers do not fire (a real process arms them once it is ready, so
    #: recovery's replay is never the one that fails)
    armed: bool = True
    #: what fired, in order (for assertions)
    log: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail_at(
        self,
        marker: str | Callable[[str], bool],
        when: Literal["before", "after"] = "before",
        times: int = 1,
    ) -> Trigger:
        trigger = Trigger(marker, when, times)
        with self._lock:
            self.triggers.append(trigger)
        return trigger

    def take(self, body: str) -> Trigger | None:
        with self._lock:
            if not self.armed:
                return None
            for t in self.triggers:
                if t.matches(body):
                    t.fired += 1
                    self.log.append(f"mine:{t.when}:{body}")
                    return t
        return None

    def take_restore(self) -> bool:
        with self._lock:
            if self.restore_failures <= 0:
                return False
            self.restore_failures -= 1
            self.log.append("restore")
            return True

    def take_replace(self) -> bool:
        with self._lock:
            if self.replace_failures <= 0:
                return False
            self.replace_failures -= 1
            self.log.append("replace_tenant")
            return True


def faulty_miner_type(plan: FaultPlan) -> type[TenantMiner]:
    """A ``TenantMiner`` subclass consulting ``plan`` (one class per plan: no global)."""

    class FaultyTenantMiner(TenantMiner):
        def _mine(self, bodies: Sequence[str]) -> MineResult:
            for index, body in enumerate(bodies):
                trigger = plan.take(body)
                if trigger is None:
                    continue
                upto = index if trigger.when == "before" else index + 1
                if upto:
                    super()._mine(bodies[:upto])  # mutates the tree; results discarded
                raise InjectedMiningFailure(
                    f"injected mining failure {trigger.when} record {index} of {len(bodies)}"
                )
            return super()._mine(bodies)

        @classmethod
        def from_snapshot(
            cls,
            data: bytes,
            allocator: TemplateIdAllocator,
            bounds: MinerConfig | None = None,
        ) -> TenantMiner:
            if plan.take_restore():
                raise InjectedMiningFailure("injected snapshot restore failure")
            return super().from_snapshot(data, allocator, bounds)

    return FaultyTenantMiner


class FaultyMiners(MinerCluster):
    """A ``MinerCluster`` of faulty miners; ``replace_tenant`` fails per the plan."""

    def __init__(
        self,
        allocator: TemplateIdAllocator,
        plan: FaultPlan | None = None,
        default_config: MinerConfig | None = None,
    ) -> None:
        self.plan = plan if plan is not None else FaultPlan()
        super().__init__(allocator, default_config, miner_type=faulty_miner_type(self.plan))

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> TenantMiner | None:
        if self.plan.take_replace():
            raise InjectedMiningFailure(f"injected replace_tenant failure for {tenant!r}")
        return super().replace_tenant(tenant, miner)


def install_in_serve(plan: FaultPlan, *, arm_after_recovery: bool) -> None:
    """Make the ``ourios serve`` this runs in (from a test's ``sitecustomize`` probe)
    build ``FaultyMiners`` bound to ``plan``. With ``arm_after_recovery`` the plan arms
    when the barrier starts, which is after the start-up's replay: the replay never
    fails, the turns after it do."""
    from app.cadence import barrier
    from app.node import server

    def cluster(allocator: TemplateIdAllocator, config: MinerConfig | None) -> FaultyMiners:
        return FaultyMiners(allocator, plan, config)

    server.MinerCluster = cluster  # type: ignore[attr-defined,assignment]
    if not arm_after_recovery:
        return
    start = barrier.Barrier.start

    def armed_after_recovery(self: barrier.Barrier) -> None:
        plan.armed = True
        start(self)

    barrier.Barrier.start = armed_after_recovery  # type: ignore[method-assign]

"""``MinerCluster``: every tenant's miner on this node, created on first use, all drawing
template ids from the node's one allocator.

It is the pipeline's, settlement's and recovery's handle on the miners: recovery
restores each tenant from its snapshot, settlement builds a replacement off to the side
and swaps it in, and nothing here rewinds the allocator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import TemplateIdAllocator
from app.ingest.mining.tenant_miner import MineResult, TenantMiner

__all__ = ["MinerCluster", "MinerStats"]


class MinerCluster:
    """Every tenant's miner on this node, created on first use, one shared allocator.

    ``miner_type`` is the class every miner is built from (``TenantMiner`` or a
    subclass): the seam through which a test injects a mining failure at a chosen
    record, in process and in a real ``ourios serve`` (``tests/support/minerfaults.py``),
    without a field in the production types."""

    def __init__(
        self,
        allocator: TemplateIdAllocator,
        default_config: MinerConfig | None = None,
        tenant_configs: Mapping[str, MinerConfig] | None = None,
        *,
        miner_type: type[TenantMiner] = TenantMiner,
    ) -> None:
        self._allocator = allocator
        self._default = default_config if default_config is not None else MinerConfig()
        self._configs = dict(tenant_configs or {})
        self._miners: dict[str, TenantMiner] = {}
        self._type = miner_type
        #: counts of miners replaced since (a settlement's swap, a restore), so the
        #: exported counters never go down
        self.evictions_retired = 0
        self.truncated_retired = 0

    @property
    def allocator(self) -> TemplateIdAllocator:
        return self._allocator

    @property
    def default_config(self) -> MinerConfig:
        """The configuration (and bounds) of every tenant without one of its own."""
        return self._default

    def config_for(self, tenant: str) -> MinerConfig:
        return self._configs.get(tenant, self._default)

    def tenants(self) -> list[str]:
        """Tenants with a miner, sorted."""
        return sorted(self._miners)

    def get(self, tenant: str) -> TenantMiner | None:
        return self._miners.get(tenant)

    def miner(self, tenant: str) -> TenantMiner:
        """The tenant's miner, created empty with its configuration on first use."""
        miner = self._miners.get(tenant)
        if miner is None:
            miner = self._type(self._allocator, self.config_for(tenant))
            self._miners[tenant] = miner
        return miner

    def mine(self, tenant: str, bodies: Sequence[str]) -> MineResult:
        return self.miner(tenant).mine(bodies)

    def restore(self, tenant: str, data: bytes) -> TenantMiner:
        """Install the tenant's miner from a snapshot, replacing any it had.

        The snapshot's own configuration is used (its tree was built under it) with the
        tenant's bounds, which the restore brings the tree under (``from_snapshot``).
        """
        miner = self._type.from_snapshot(data, self._allocator, self.config_for(tenant))
        self._retire(self._miners.get(tenant))
        self._miners[tenant] = miner
        return miner

    def build(self, tenant: str, snapshot: bytes | None) -> TenantMiner:
        """A miner for ``tenant`` that is *not* installed: restored from ``snapshot`` or
        empty with the tenant's configuration (settlement rebuilds into it off to the
        side, then swaps it in with ``replace_tenant``)."""
        if snapshot is None:
            return self._type(self._allocator, self.config_for(tenant))
        return self._type.from_snapshot(snapshot, self._allocator, self.config_for(tenant))

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> TenantMiner | None:
        """Drop the tenant's live miner and install ``miner`` as one operation (callers
        hold the miner lock, so no one observes the tenant absent); no other tenant and
        no allocator state is touched — template ids are never rewound. Returns the
        discarded miner."""
        old = self._miners.get(tenant)
        self._miners[tenant] = miner
        self._retire(old)
        return old

    def _retire(self, old: TenantMiner | None) -> None:
        if old is not None:
            self.evictions_retired += old.evictions
            self.truncated_retired += old.truncated_bodies

    def discard(self, tenant: str) -> None:
        """Forget the tenant's miner."""
        self._miners.pop(tenant, None)

    def stats(self) -> MinerStats:
        """The miners' figures summed, and the largest tenant's, for the metrics (read
        without the miner lock: each figure is one int read, and a scrape may see a
        batch half-counted)."""
        miners = list(self._miners.values())
        templates = [m.template_count for m in miners]
        held = [m.state_bytes for m in miners]
        return MinerStats(
            templates=sum(templates),
            tenant_templates_max=max(templates, default=0),
            state_bytes=sum(held),
            tenant_state_bytes_max=max(held, default=0),
            evictions=sum(m.evictions for m in miners) + self.evictions_retired,
            truncated_bodies=sum(m.truncated_bodies for m in miners) + self.truncated_retired,
        )


@dataclass(frozen=True, slots=True)
class MinerStats:
    """``MinerCluster.stats``: node-wide sums and the largest tenant's figures."""

    templates: int
    tenant_templates_max: int
    state_bytes: int
    tenant_state_bytes_max: int
    evictions: int
    truncated_bodies: int

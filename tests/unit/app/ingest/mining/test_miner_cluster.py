"""Tests for app.ingest.mining.miner_cluster: tenants' miners share one allocator, never an id."""

from __future__ import annotations

from pathlib import Path

from app.ingest.mining.miner_cluster import MinerCluster
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import (
    CountingAllocator,
    FileTemplateIdAllocator,
)
from tests.support.mining import corpus, mine_all


def test_tenants_share_one_allocator_and_never_share_ids() -> None:
    cluster = MinerCluster(CountingAllocator())
    lines = corpus(3, 800)
    a = mine_all(cluster.miner("tenant-a"), lines)
    b = mine_all(cluster.miner("tenant-b"), lines)
    assert cluster.tenants() == ["tenant-a", "tenant-b"]
    assert not set(a.template_ids) & set(b.template_ids)
    # Same input, same trees: the templates differ only in their ids.
    assert [(e.version, e.template, e.change, e.index) for e in a.events] == [
        (e.version, e.template, e.change, e.index) for e in b.events
    ]


def test_per_tenant_config_and_restore() -> None:
    special = MinerConfig(sim_th=0.9, max_clusters=10)
    cluster = MinerCluster(CountingAllocator(), tenant_configs={"special": special})
    cluster.mine("special", ["x 1"])
    cluster.mine("plain", ["x 1"])
    assert cluster.miner("special").config == special
    assert cluster.miner("plain").config == MinerConfig()
    data = cluster.miner("special").to_snapshot()
    cluster.discard("special")
    assert cluster.get("special") is None
    restored = cluster.restore("special", data)
    assert cluster.get("special") is restored
    assert restored.config == special


def test_ids_never_reused_across_restarts_with_file_allocator(tmp_path: Path) -> None:
    path = tmp_path / "template_ids"
    first = MinerCluster(FileTemplateIdAllocator(path, node_ordinal=3, block=8))
    seen: set[int] = set()
    for tenant in ("a", "b"):
        seen.update(mine_all(first.miner(tenant), corpus(1, 400)).template_ids)
    snapshots = {t: first.miner(t).to_snapshot() for t in first.tenants()}
    # Restart: a new allocator on the same file, miners restored from their snapshots.
    second = MinerCluster(FileTemplateIdAllocator(path, node_ordinal=3, block=8))
    for tenant, data in snapshots.items():
        second.restore(tenant, data)
    new_ids: set[int] = set()
    for tenant in ("a", "b", "c"):
        result = mine_all(second.miner(tenant), corpus(2, 400) + ["never seen before"])
        new_ids.update(e.template_id for e in result.events if e.change == "created")
    assert new_ids and not new_ids & seen
    assert min(new_ids) > max(seen)
    assert all(i >> 48 == 3 for i in seen | new_ids)

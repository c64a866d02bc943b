"""Shared by the mining tests (``tests/unit/app/ingest/mining/``): a seeded corpus of realistic
log lines, batch-wise mining, Drain's state read from drain3's own objects, and the
configurations the tests sweep."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from drain3.drain import Drain
from hypothesis import settings
from hypothesis import strategies as st

from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.tenant_miner import MineResult, TemplateEvent, TenantMiner
from app.ingest.mining.tokens import PARAM

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None)

# -- a corpus of realistic log lines ----------------------------------------------------

_USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]
_PATHS = ["/api/v1/users", "/api/v1/orders", "/healthz", "/metrics", "/api/v2/items/search"]
_SERVICES = ["scheduler", "api", "ingester", "compactor", "querier"]


def _ip(r: random.Random) -> str:
    return f"10.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(256)}"


def _uuid(r: random.Random) -> str:
    return str(uuid.UUID(int=r.getrandbits(128), version=4))


_TEMPLATES: list[Callable[[random.Random], str]] = [
    lambda r: f"Accepted connection from {_ip(r)}:{r.randrange(1024, 65535)} to {_ip(r)}:443",
    lambda r: (
        f"GET {r.choice(_PATHS)}/{r.randrange(100000)} HTTP/1.1 "
        f"{r.choice([200, 200, 404, 500])} {r.randrange(1, 900)}ms"
    ),
    lambda r: f"user {r.choice(_USERS)} logged in from {_ip(r)} session={_uuid(r)}",
    lambda r: f"Connection timeout after {r.randrange(1000, 5000)} ms to db-{r.randrange(5)}:5432",
    lambda r: (
        f"INFO [worker-{r.randrange(16)}] Processed {r.randrange(10000)} records "
        f"in {r.random() * 100:.2f} s"
    ),
    lambda r: (
        f"request_id={_uuid(r)} method=POST path={r.choice(_PATHS)} "
        f"status={r.choice([201, 400, 409])} duration={r.random():.4f}"
    ),
    lambda r: (
        f"Failed to send batch to kafka topic {r.choice(['logs', 'events'])}: broker "
        f"{_ip(r)} not available, retry {r.randrange(10)}"
    ),
    lambda r: f"GC pause {r.randrange(300)}ms heap {r.randrange(4000)}MB -> {r.randrange(2000)}MB",
    lambda r: f"Starting {r.choice(_SERVICES)} version v1.{r.randrange(30)}.{r.randrange(10)}",
    lambda r: f"pod web-{_uuid(r)[:8]} in namespace {r.choice(['prod', 'dev'])} restarted",
    # whitespace runs, tabs and a trailing newline, as real bodies have them
    lambda r: f"  cache\tmiss  for key\tk{r.randrange(50)}   shard={r.randrange(4)}\n",
    lambda r: f"{r.choice(_SERVICES)} heartbeat ok",
    lambda r: f"checksum 0x{r.getrandbits(32):08x} mismatch on block {r.randrange(1 << 20)}",
    lambda r: f"literal wildcard {PARAM} in body {r.randrange(9)}",
    lambda r: r.choice(["", "   ", "\t"]),
]


def corpus(seed: int, n: int) -> list[str]:
    r = random.Random(seed)
    return [r.choice(_TEMPLATES)(r) for _ in range(n)]


def batches(lines: Sequence[str], size: int) -> list[list[str]]:
    return [list(lines[i : i + size]) for i in range(0, len(lines), size)]


def mine_all(miner: TenantMiner, lines: Sequence[str], batch: int = 37) -> MineResult:
    """Mine in batches and concatenate; event indices are made global."""
    ids: list[int] = []
    params: list[tuple[str, ...]] = []
    events: list[TemplateEvent] = []
    versions: list[int] = []
    for chunk in batches(lines, batch):
        base = len(ids)
        result = miner.mine(chunk)
        ids.extend(result.template_ids)
        params.extend(result.template_params)
        versions.extend(result.template_versions)
        events.extend(
            TemplateEvent(e.template_id, e.version, e.template, e.change, e.index + base)
            for e in result.events
        )
    return MineResult(ids, params, events, versions)


DrainState = tuple[list[Any], list[tuple[int, tuple[str, ...], int]], int, str]


def drain_state(miner: TenantMiner) -> DrainState:
    """Drain's full state read from drain3's own objects, independent of our codec."""
    return state_of(miner.drain)  # the point is to look past our encoder


def state_of(drain: Any) -> DrainState:
    nodes: list[Any] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        children = node.key_to_child_node
        nodes.append((path, tuple(node.cluster_ids), tuple(children)))
        for key, child in children.items():
            walk(child, (*path, key))

    walk(drain.root_node, ())
    cache = drain.id_to_cluster
    if isinstance(cache, dict):
        order = list(cache)
    else:
        order = list(cache._LRUCache__order)  # cachetools' LRU order, oldest first
    clusters = []
    for drain_id in order:
        cluster = cache.get(drain_id)
        assert cluster is not None
        clusters.append((drain_id, cluster.log_template_tokens, cluster.size))
    return nodes, clusters, drain.clusters_counter, type(cache).__name__


CONFIGS = [
    pytest.param(MinerConfig(), id="default"),
    pytest.param(MinerConfig(max_clusters=6), id="lru"),
    pytest.param(MinerConfig(sim_th=0.7, depth=5, max_children=3), id="narrow"),
    pytest.param(MinerConfig(extra_delimiters=("=", ",", ":")), id="delimiters"),
    pytest.param(MinerConfig(parametrize_numeric_tokens=False, max_clusters=4), id="lru-literal"),
]
config_strategy = st.sampled_from(
    [
        MinerConfig(),
        MinerConfig(max_clusters=6),
        MinerConfig(sim_th=0.7, depth=5, max_children=3),
        MinerConfig(extra_delimiters=("=", ",", ":")),
        MinerConfig(parametrize_numeric_tokens=False, max_clusters=4),
    ]
)


class PruningDrain(Drain):  # type: ignore[misc]  # drain3 is untyped
    """drain3's Drain plus what our miner does at an LRU eviction: the evicted id leaves
    its leaf at once (Drain drops it lazily) and the nodes it leaves with neither
    clusters nor children are removed, so the tree stays bounded with the templates.
    The reference the equivalence tests hold ``TenantMiner`` to."""

    def add_log_message(self, content: str) -> tuple[Any, str]:
        before = set(self.id_to_cluster.keys()) if self.max_clusters is not None else set()
        cluster, change = super().add_log_message(content)
        if self.max_clusters is not None:
            for gone in before - set(self.id_to_cluster.keys()):
                _prune(self.root_node, gone)
        return cluster, change


def _prune(root: Any, drain_id: int) -> None:
    path: list[tuple[Any, str, Any]] = []

    def find(node: Any) -> bool:
        if drain_id in node.cluster_ids:
            return True
        for key, child in node.key_to_child_node.items():
            path.append((node, key, child))
            if find(child):
                return True
            path.pop()
        return False

    if not find(root):
        return  # the insert's own clean-up already dropped it from the leaf
    leaf = path[-1][2] if path else root
    leaf.cluster_ids.remove(drain_id)
    for parent, key, node in reversed(path):
        if node.cluster_ids or node.key_to_child_node:
            break
        del parent.key_to_child_node[key]


def raw_drain(config: MinerConfig) -> Drain:
    return PruningDrain(
        depth=config.depth,
        sim_th=config.sim_th,
        max_children=config.max_children,
        max_clusters=config.max_clusters,
        extra_delimiters=config.extra_delimiters,
        parametrize_numeric_tokens=config.parametrize_numeric_tokens,
    )


def flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]

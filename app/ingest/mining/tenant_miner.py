"""``TenantMiner``: one tenant's Drain tree, the ids and versions of its templates, and
the search that matches a body to a template.

Invariants:

* ``TenantMiner.mine`` emits exactly one ``TemplateEvent`` per cluster Drain creates
  ("created", version 1) and one per template Drain widens ("changed", version + 1).
* Restoring a snapshot neither consumes nor rewinds ids: restored templates keep theirs
  and only templates created afterwards draw from the allocator.
* A restored miner mines every later input exactly as the uninterrupted miner would:
  same template ids, parameters and events.
* A miner that raised in the middle of a batch has absorbed part of it without its
  caller seeing the results, so it refuses further mining and snapshots
  (``MinerFailedError``); the pipeline rebuilds the tenant (RFC 0055 settlement).

How Drain is used: ``mine`` performs the steps of drain3 0.9's ``add_log_message``
itself, in its order, with Drain's own methods (``tree_search``, a new ``LogCluster``,
``create_template``) and ``drain_tree.insert_cluster`` for its ``add_seq_to_prefix_tree``
(the same walk, without re-filtering the leaf), so a body is tokenised once for
Drain and for its parameters, and a body that leaves its template unchanged costs one
tuple comparison. The tests hold the result to ``add_log_message``, body for body and
tree for tree. Drain's objects are reached through narrow typed protocols; its LRU map
is read only with ``get`` and ``in``, and ``[]``, which moves a cluster to the recent
end, is called exactly where ``add_log_message`` calls it.

The bodies that match a template exactly are mined by the native fast path
(``native_miner``, C) when the process has it, with the same results and side effects;
this module's loop is the reference and mines the rest (test_native_miner.py holds the
two equal). Drain's tree and our side of it are in ``drain_tree``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, cast

from app.ingest.mining import native_miner
from app.ingest.mining.drain_tree import (
    NODE_BYTES,
    TEMPLATE_OVERHEAD_BYTES,
    TOKEN_OVERHEAD_BYTES,
    DrainCluster,
    Template,
    Touchable,
    insert_cluster,
    kept_rows,
    last_use,
    new_cluster,
    new_drain,
    rebuild_tree,
    template_bytes,
    tree_rows,
)
from app.ingest.mining.errors import MinerError, MinerFailedError
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.miner_snapshot import (
    ClusterRow,
    MinerSnapshot,
    decode_miner_snapshot,
    encode_miner_snapshot,
)
from app.ingest.mining.rematch import rematch_batch
from app.ingest.mining.template_ids import TemplateIdAllocator
from app.ingest.mining.tokens import PARAM, mined_head, mined_tokens

__all__ = [
    "MineResult",
    "TemplateEvent",
    "TemplateInfo",
    "TenantMiner",
    "snapshot_bytes_bound",
    "state_bytes_bound",
    "template_bytes",
]


@dataclass(frozen=True, slots=True)
class TemplateEvent:
    """A template came into being or was widened by the batch that returned it."""

    template_id: int
    version: int
    template: str
    change: Literal["created", "changed"]
    #: position in the mined batch of the body that caused the event
    index: int


@dataclass(frozen=True, slots=True)
class MineResult:
    """One batch's mining, in columns: entry ``i`` belongs to body ``i``."""

    template_ids: list[int]
    #: tuples, not lists: a tuple of strings leaves the cyclic collector's care after
    #: its first young collection, so buffered rows never burden a full collection
    template_params: list[tuple[str, ...]]
    #: in the order the bodies caused them
    events: list[TemplateEvent]
    #: the version of its template each record's parameters fill (app/ingest/mining/rematch.py)
    template_versions: list[int] = field(default_factory=list)
    #: the batch's mining work units (``CREATE_WORK``): what the turn share charges
    work: int = 0

    def __len__(self) -> int:
        return len(self.template_ids)


@dataclass(frozen=True, slots=True)
class TemplateInfo:
    """A template as the miner currently holds it (for inspection and tests)."""

    template_id: int
    version: int
    template: str
    size: int


# Mining work units, the deterministic cost of a batch (``MineResult.work``) that the
# turn share charges a tenant (``app.ingest.shares``): a record costs one unit and one
# per template its search compared; creating a template (the id, the tree insert, the
# getters, the event) and widening one (drain3's create_template walk) cost what about
# that many comparisons do (docs/BENCHMARKS.md, "Miner bounds").
CREATE_WORK: Final = 32
WIDEN_WORK: Final = 8


def state_bytes_bound(config: MinerConfig) -> int | None:
    """The most ``state_bytes`` a miner under ``config`` can reach (None: unbounded).

    A template is made of the mined part of one body: at most ``max_body_tokens``
    tokens holding at most ``max_body_chars`` characters (four bytes each at worst, plus
    a string's own overhead per token), and its path has at most ``depth - 1`` nodes."""
    limit, chars, tokens = config.max_clusters, config.max_body_chars, config.max_body_tokens
    if limit is None or chars is None or tokens is None:
        return None
    tokens = min(tokens, chars)
    per_token = sys.getsizeof("") + 4 + TOKEN_OVERHEAD_BYTES
    per = TEMPLATE_OVERHEAD_BYTES + per_token * tokens + 4 * chars + NODE_BYTES * (config.depth - 1)
    return limit * per


def snapshot_bytes_bound(config: MinerConfig) -> int | None:
    """The largest ``to_snapshot`` a miner under ``config`` can write (None: unbounded).

    Per template: its cluster row (five integers and its tokens) and, in the tree, at
    most ``depth - 1`` node rows whose keys are tokens of the same mined prefix and a
    token-count key. A character is at most 12 bytes of ASCII JSON (a character outside
    the Basic Multilingual Plane is two ``\\uXXXX`` escapes); a token adds its quotes
    and a comma; an integer is at most 20 characters."""
    limit, chars, tokens = config.max_clusters, config.max_body_chars, config.max_body_tokens
    if limit is None or chars is None or tokens is None:
        return None
    tokens = min(tokens, chars)
    text = 12 * chars + 3 * tokens
    row = 5 * 21 + 4 + text
    nodes = (config.depth - 1) * (21 + 8 + 21 + 21 + 8) + text + 21
    head = (
        16
        + 512
        + 30 * len(config.extra_delimiters)
        + 12 * sum(len(d) for d in config.extra_delimiters)
    )
    return head + 64 + limit * (row + nodes)


class TenantMiner:
    """One tenant's Drain tree and the template ids and versions of its clusters."""

    def __init__(self, allocator: TemplateIdAllocator, config: MinerConfig | None = None) -> None:
        self._config = config if config is not None else MinerConfig()
        self._allocator = allocator
        self._drain = new_drain(self._config)
        # Drain cluster id -> template. With a bound set (max_clusters,
        # max_leaf_clusters) its order is the LRU order (Drain's too: both are touched
        # once per body, for the cluster the body landed in), which says which cluster
        # Drain evicted and gives the snapshot its LRU order without reading
        # cachetools' private fields.
        self._templates: dict[int, Template] = {}
        self._failed: BaseException | None = None
        #: the use counter ``Template.touched`` is stamped from
        self._tick = 0
        #: templates evicted by the bounds (``max_clusters``, ``max_leaf_clusters``), at
        #: a creation or at a restore; bodies mined only in part (``max_body_*``); the
        #: work units of every batch mined; ``state_bytes``
        self.evictions = 0
        self.truncated_bodies = 0
        self.work = 0
        self._bytes = 0
        #: template id -> (version, tokens) of every widened template (version 2 on):
        #: what ``versions`` hands out. Copied before a change once handed out, so a map
        #: handed out never changes (its holders read it on other threads).
        self._widened: dict[int, tuple[int, tuple[str, ...]]] = {}
        self._widened_shared = False
        #: mine on the native fast path when the process has it (native_miner); False
        #: keeps this miner on the Python loop, the reference (the differential tests)
        self.native = True

    @property
    def config(self) -> MinerConfig:
        return self._config

    @property
    def failed(self) -> bool:
        """A failure mid-batch left the tree in an unknown state (``mine`` refuses)."""
        return self._failed is not None

    def versions(self) -> Mapping[int, tuple[int, tuple[str, ...]]]:
        """Every widened template's version and tokens now (a template at version 1 has
        no record mined under an earlier one): a read-only map that later mining never
        changes, taken in O(1) — the next change copies it first (copy on write), so a
        map costs a copy of the widened templates only when one is taken and the tree
        widens or evicts after it. The caller holds the miner lock."""
        self._widened_shared = True
        return MappingProxyType(self._widened)

    def _own_widened(self) -> dict[int, tuple[int, tuple[str, ...]]]:
        if self._widened_shared:
            self._widened = dict(self._widened)
            self._widened_shared = False
        return self._widened

    def mined_tokens(self, body: str) -> list[str]:
        """The tokens this miner mines of ``body`` (only the head of a long one)."""
        config = self._config
        return mined_tokens(
            body, config.extra_delimiters, config.max_body_chars, config.max_body_tokens
        )

    @property
    def template_count(self) -> int:
        return len(self._templates)

    @property
    def state_bytes(self) -> int:
        """The heap the templates and their tree hold, an upper bound kept as they come
        and go (``template_bytes``); at most ``state_bytes_bound(config)``."""
        return self._bytes

    @property
    def cluster_ids(self) -> list[int]:
        """Drain's cluster ids of the live templates, least recently used first (the
        order eviction follows and the snapshot keeps)."""
        return list(self._templates)

    @property
    def drain(self) -> object:
        """The drain3 tree itself, read-only by convention: for a reader that must look
        past this module's codec (a test comparing it with a reference tree)."""
        return self._drain

    def templates(self) -> list[TemplateInfo]:
        """The live templates, in the snapshot's cluster order."""
        out: list[TemplateInfo] = []
        for drain_id, template in self._templates.items():
            cluster = self._cluster(drain_id)
            out.append(
                TemplateInfo(
                    template.template_id,
                    template.version,
                    " ".join(cluster.log_template_tokens),
                    cluster.size,
                )
            )
        return out

    def mine(self, bodies: Sequence[str]) -> MineResult:
        """Mine a batch of bodies in order; see the module docstring for the results."""
        if self._failed is not None:
            raise MinerFailedError(
                f"miner failed earlier ({self._failed!r}); rebuild it before mining"
            ) from self._failed
        try:
            return self._mine(bodies)
        except BaseException as exc:
            self._failed = exc
            if isinstance(exc, Exception):
                raise MinerFailedError(f"mining failed mid-batch: {exc!r}") from exc
            raise

    def _mine(self, bodies: Sequence[str]) -> MineResult:
        # Drain.add_log_message (drain3 0.9) from Drain's steps, in its order, a body
        # tokenised once (module docstring); the search is ``_search``. The native fast
        # path (native_miner) mines the bodies that match exactly, this loop the rest.
        drain = self._drain
        search = self._search
        config = self._config
        bounded = config.max_clusters is not None or config.max_leaf_clusters is not None
        templates = self._templates
        # On the LRU cache, [] is the touch add_log_message does on a match.
        touch = cast(Touchable, drain.id_to_cluster).__getitem__
        lru = config.max_clusters is not None
        delimiters = config.extra_delimiters
        max_chars = config.max_body_chars
        max_tokens = config.max_body_tokens
        ids: list[int] = []
        params: list[tuple[str, ...]] = []
        events: list[TemplateEvent] = []
        versions: list[int] = []
        append_id = ids.append
        append_params = params.append
        work = 0
        truncated = 0
        tick = self._tick
        fast = native_miner.bind(
            self.native, drain, templates, config, bodies, ids, params, versions
        )
        index = 0
        count = len(bodies)
        found = -1
        while index < count:
            if fast is not None:
                index, tick, fast_work, found, best_id, compared = fast(index, tick)
                work += fast_work
                if index == count:
                    break
            # Only the head is mined (the record keeps its whole body): one body's share
            # of the tree, the snapshot and the search is bounded.
            tokens, cut = mined_head(bodies[index], delimiters, max_chars, max_tokens)
            truncated += cut
            if found < 0:
                template, exact, compared = search(tokens)
            else:
                # the fast path searched this body (uncut) and found none or one to widen
                template = None if best_id is None else templates[best_id]
                exact = False
                found = -1
            tick += 1
            work += 1 + compared
            if template is None:
                self._tick = tick
                template = self._create(tokens, index, events)
                work += CREATE_WORK
            else:
                cluster = template.cluster
                if not exact:
                    self._widen(cluster, tokens, template, index, events)
                    work += WIDEN_WORK
                cluster.size += 1
                if bounded:
                    drain_id = cluster.cluster_id
                    if lru:
                        touch(drain_id)
                    template.touch(tick)
                    del templates[drain_id]
                    templates[drain_id] = template
            append_id(template.template_id)
            pick = template.params
            append_params(pick(tokens) if pick is not None else ())
            versions.append(template.version)
            index += 1
        if events:
            changes = [(e.template_id, e.version, e.template, e.index) for e in events]
            rematch_batch(bodies, ids, params, versions, changes, self.mined_tokens)
        self._tick = tick
        self.work += work
        self.truncated_bodies += truncated
        return MineResult(ids, params, events, versions, work)

    def _search(self, tokens: list[str]) -> tuple[Template | None, bool, int]:
        """``Drain.tree_search(root, tokens, sim_th, include_params=False)`` computed on
        our templates, whether the match has every one of its constant tokens (so no
        widening), and how many templates it compared (the work). The same leaf (first
        level by token count, then at most ``max_node_depth - 1`` tokens, a missing
        token taking the wildcard child), the same candidates in the leaf's order (a
        cluster the LRU evicted is skipped: our map mirrors Drain's), the same
        similarity ``float(same) / len`` and the same rule (the best similarity, ties to
        more wildcards, the first of equals; none below ``sim_th``). Drain's version
        walks every token pair in Python, the largest part of mining's time; here the
        constants are compared in C (docs/BENCHMARKS.md, "Miner")."""
        drain = self._drain
        count = len(tokens)
        node = drain.root_node.key_to_child_node.get(str(count))
        if node is None:
            return None, False, 0
        templates = self._templates
        if count == 0:
            # Drain returns the group's first cluster without a similarity test.
            return templates.get(node.cluster_ids[0]), True, 1
        depth = 1
        limit = drain.max_node_depth
        for token in tokens:
            if depth >= limit or depth == count:
                break
            children = node.key_to_child_node
            child = children.get(token)
            if child is None:
                child = children.get(PARAM)
                if child is None:
                    return None, False, 0
            node = child
            depth += 1
        best: Template | None = None
        best_same = 0
        max_sim = -1.0
        max_params = -1
        candidates = node.cluster_ids
        for drain_id in candidates:
            template = templates.get(drain_id)
            if template is None:
                continue
            same = template.same(tokens)
            sim = float(same) / count
            wildcards = len(template.positions)
            if sim > max_sim or (sim == max_sim and wildcards > max_params):
                max_sim, max_params, best, best_same = sim, wildcards, template, same
        if best is None or max_sim < drain.sim_th:
            return None, False, len(candidates)
        return best, best_same == best.fixed, len(candidates)

    def _create(self, tokens: list[str], index: int, events: list[TemplateEvent]) -> Template:
        drain = self._drain
        # The id first: if the allocator fails, Drain's tree has not changed.
        template_id = self._allocator.allocate()
        drain.clusters_counter += 1
        drain_id = drain.clusters_counter
        cluster = new_cluster(tokens, drain_id, 1)
        # Inserting may evict Drain's least recently used cluster; the prefix-tree
        # insert after it drops evicted ids from the leaf it lands in, as in drain3.
        drain.id_to_cluster[drain_id] = cluster
        config = self._config
        path = insert_cluster(
            drain, cluster, config.max_children, config.parametrize_numeric_tokens
        )
        template = Template(template_id, 1, cluster, cluster.log_template_tokens, path, self._tick)
        self._templates[drain_id] = template
        self._bytes += template.nbytes
        limit = self._config.max_clusters
        if limit is not None and len(self._templates) > limit:
            evicted = next(iter(self._templates))
            if evicted in drain.id_to_cluster:
                raise MinerError(f"LRU mirror disagrees with Drain: cluster {evicted} is live")
            self._evict(evicted)
        leaf_limit = self._config.max_leaf_clusters
        if leaf_limit is not None:
            leaf = path[-1][2]
            oldest = native_miner.leaf_oldest(self.native)
            while len(leaf.cluster_ids) > leaf_limit:
                # The leaf's least recently used (never the new one: it is the newest);
                # in C when the miner is native (a full leaf is compared per creation).
                if oldest is not None:
                    victim_id = oldest(leaf.cluster_ids, self._templates)
                else:
                    victim = min(map(self._templates.__getitem__, leaf.cluster_ids), key=last_use)
                    victim_id = victim.cluster.cluster_id
                del drain.id_to_cluster[victim_id]
                self._evict(victim_id)
        events.append(TemplateEvent(template_id, 1, " ".join(tokens), "created", index))
        return template

    def _evict(self, drain_id: int) -> None:
        """Forget a cluster Drain no longer holds: our template, its id in its leaf (Drain
        would drop it lazily), and every node of its path it leaves with neither
        clusters nor children — so the tree, like the templates, stays bounded. Its
        template id is never handed out again: a body like it makes a new cluster with
        a new id and a ``created`` event."""
        template = self._templates.pop(drain_id)
        self._bytes -= template.nbytes
        self.evictions += 1
        if template.version > 1:
            self._own_widened().pop(template.template_id, None)
        leaf = template.path[-1][2]
        if drain_id in leaf.cluster_ids:
            leaf.cluster_ids.remove(drain_id)
        for parent, key, node in reversed(template.path):
            if node.cluster_ids or node.key_to_child_node:
                break
            del parent.key_to_child_node[key]

    def _widen(
        self,
        cluster: DrainCluster,
        tokens: list[str],
        template: Template,
        index: int,
        events: list[TemplateEvent],
    ) -> None:
        widened = tuple(self._drain.create_template(tokens, cluster.log_template_tokens))
        if widened == cluster.log_template_tokens:
            raise MinerError(
                f"cluster {cluster.cluster_id}: constants differ but Drain did not widen"
            )
        cluster.log_template_tokens = widened
        template.widen(widened)
        self._own_widened()[template.template_id] = (template.version, widened)
        events.append(
            TemplateEvent(
                template.template_id, template.version, " ".join(widened), "changed", index
            )
        )

    def _cluster(self, drain_id: int) -> DrainCluster:
        cluster = self._drain.id_to_cluster.get(drain_id)
        if cluster is None:
            raise MinerError(f"template map names cluster {drain_id}, which Drain lacks")
        return cluster

    # -- snapshots -------------------------------------------------------------------

    def to_snapshot(self) -> bytes:
        """The miner's complete state in the versioned format of ``snapshot``."""
        if self._failed is not None:
            raise MinerFailedError(
                f"miner failed earlier ({self._failed!r}); its state is not snapshotted"
            ) from self._failed
        drain = self._drain
        if len(drain.id_to_cluster) != len(self._templates):
            raise MinerError(
                f"Drain holds {len(drain.id_to_cluster)} clusters, "
                f"the template map {len(self._templates)}"
            )
        clusters: list[ClusterRow] = []
        for drain_id, template in self._templates.items():
            cluster = self._cluster(drain_id)
            clusters.append(
                (
                    drain_id,
                    template.template_id,
                    template.version,
                    cluster.size,
                    list(cluster.log_template_tokens),
                )
            )
        nodes = tree_rows(drain.root_node)
        return encode_miner_snapshot(
            MinerSnapshot(self._config, drain.clusters_counter, clusters, nodes)
        )

    @classmethod
    def from_snapshot(
        cls, data: bytes, allocator: TemplateIdAllocator, bounds: MinerConfig | None = None
    ) -> TenantMiner:
        """Rebuild a miner from ``to_snapshot`` bytes; consumes no ids of ``allocator``.

        ``bounds``: the node's bounds replace the snapshot's (``MinerConfig.with_bounds``)
        and the restored tree is brought under them — a template no mined body could
        match any more (more tokens, or more constant characters, than is mined) and,
        least recently used first, the templates over a full leaf and over
        ``max_clusters`` are evicted. A pure function of the bytes and the bounds, so
        every restore of the same snapshot (recovery's, settlement's) is the same tree."""
        state = decode_miner_snapshot(data)
        config = state.config if bounds is None else state.config.with_bounds(bounds)
        miner = cls(allocator, config)
        rows = kept_rows(state.clusters, state.nodes, config)
        kept = {row[0] for row in rows}
        miner.evictions = len(state.clusters) - len(rows)
        drain = miner._drain
        for drain_id, _template_id, _version, size, tokens in rows:
            # Insertion order is the LRU order (oldest first) that was captured.
            drain.id_to_cluster[drain_id] = new_cluster(tokens, drain_id, size)
        paths = rebuild_tree(drain.root_node, state.nodes, kept)
        for stamp, (drain_id, template_id, version, _size, tokens) in enumerate(rows):
            cluster = drain.id_to_cluster.get(drain_id)
            assert cluster is not None
            path = paths[drain_id]
            template = Template(template_id, version, cluster, tuple(tokens), path, stamp)
            miner._templates[drain_id] = template
            miner._bytes += template.nbytes
            if version > 1:
                miner._widened[template_id] = (version, tuple(tokens))
        miner._tick = len(rows)
        drain.clusters_counter = state.clusters_counter
        return miner

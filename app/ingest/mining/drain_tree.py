"""Drain's tree as the miner holds it: typed views of drain3's objects, ``Template`` (our
side of one Drain cluster: its id, version, how a body is read against it and where it
sits in the tree), what a template costs the heap, and the tree's rows as a snapshot
saves them and a restore rebuilds them.

``TenantMiner`` (``tenant_miner``) drives these; nothing here mines.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from operator import eq, itemgetter
from typing import Final, Protocol, cast

from drain3.drain import Drain, LogCluster, Node

from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.miner_snapshot import ClusterRow, NodeRow
from app.ingest.mining.tokens import PARAM

__all__ = [
    "NODE_BYTES",
    "TEMPLATE_OVERHEAD_BYTES",
    "TOKEN_OVERHEAD_BYTES",
    "ClusterMap",
    "DrainCluster",
    "DrainNode",
    "DrainTree",
    "Step",
    "Template",
    "Touchable",
    "kept_rows",
    "new_cluster",
    "new_drain",
    "insert_cluster",
    "rebuild_tree",
    "template_bytes",
    "last_use",
    "tree_rows",
]


class DrainCluster(Protocol):
    cluster_id: int
    log_template_tokens: tuple[str, ...]
    size: int


class DrainNode(Protocol):
    key_to_child_node: dict[str, DrainNode]
    cluster_ids: list[int]


class ClusterMap(Protocol):
    """What we use of ``Drain.id_to_cluster`` (a dict, or drain3's LRU cache).

    Deliberately no ``__getitem__``/``values``: on the LRU cache they reorder it; the
    one deliberate reorder goes through ``Touchable``.
    """

    def get(self, key: int) -> DrainCluster | None: ...
    def __setitem__(self, key: int, value: DrainCluster) -> None: ...
    def __delitem__(self, key: int) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...


class Touchable(Protocol):
    """The LRU cache's ``[]``, which moves a key to the most recently used end."""

    def __getitem__(self, key: int) -> object: ...


class DrainTree(Protocol):
    root_node: DrainNode
    id_to_cluster: ClusterMap
    clusters_counter: int
    sim_th: float
    max_node_depth: int

    def tree_search(
        self, root_node: DrainNode, tokens: list[str], sim_th: float, include_params: bool
    ) -> DrainCluster | None: ...
    def create_template(self, seq1: list[str], seq2: tuple[str, ...]) -> list[str]: ...


def new_drain(config: MinerConfig) -> DrainTree:
    drain = Drain(
        depth=config.depth,
        sim_th=config.sim_th,
        max_children=config.max_children,
        max_clusters=config.max_clusters,
        extra_delimiters=config.extra_delimiters,
        # Drain guards every profiler call with ``if self.profiler``: None skips them
        # all, where its truthy NullProfiler default costs time (docs/BENCHMARKS.md,
        # "Miner").
        profiler=None,
        param_str=PARAM,
        parametrize_numeric_tokens=config.parametrize_numeric_tokens,
    )
    return cast(DrainTree, drain)


def new_node() -> DrainNode:
    return cast(DrainNode, Node())


def new_cluster(tokens: list[str], drain_id: int, size: int) -> DrainCluster:
    cluster = cast(DrainCluster, LogCluster(tokens, drain_id))
    cluster.size = size
    return cluster


class Template:
    """Our side of one Drain cluster: id, version, and how to read a body against it.

    ``positions`` are the template's wildcard indices and ``params`` picks a body's
    tokens there as a tuple (None when there are none). ``constants`` picks a body's
    tokens at the other indices and ``expected`` is what the template has there
    (``fixed`` of them): the count of equal pairs is Drain's similarity numerator, and
    when they are all equal Drain's widening would change nothing — one C-level
    comparison instead of ``get_seq_distance``'s and ``create_template``'s Python
    loops. ``constants`` is None when every token is a wildcard (nothing can widen).

    ``path`` is where the cluster sits in Drain's prefix tree, (parent, key, node) from
    the token-count node down to its leaf, so an eviction removes it from its leaf and
    drops the nodes it leaves empty. ``touched`` orders templates by their last use
    (the LRU a full leaf evicts in); ``nbytes`` is its share of ``state_bytes``.
    """

    __slots__ = (
        "template_id",
        "version",
        "cluster",
        "positions",
        "params",
        "constants",
        "expected",
        "fixed",
        "shape",
        "path",
        "touched",
        "nbytes",
    )

    def __init__(
        self,
        template_id: int,
        version: int,
        cluster: DrainCluster,
        tokens: tuple[str, ...],
        path: tuple[Step, ...],
        touched: int,
    ) -> None:
        self.template_id = template_id
        self.version = version
        #: the Drain cluster this template mirrors (Drain widens it in place)
        self.cluster = cluster
        self.positions: tuple[int, ...] = ()
        self.params: Callable[[list[str]], tuple[str, ...]] | None = None
        self.constants: Callable[[list[str]], object] | None = None
        self.expected: object = None
        self.fixed = 0
        self.shape: tuple[bytes, object, bytes] = (b"", None, b"")
        self.path = path
        self.touched = touched
        self.nbytes = template_bytes(tokens, len(path))
        self.reshape(tokens)

    def widen(self, tokens: tuple[str, ...]) -> None:
        """The cluster's template widened to ``tokens``: the next version, read anew."""
        self.version += 1
        self.reshape(tokens)

    def touch(self, tick: int) -> None:
        """Used at ``tick`` (the bounded miner's order of last use)."""
        self.touched = tick

    def reshape(self, tokens: tuple[str, ...]) -> None:
        self.positions = tuple(i for i, token in enumerate(tokens) if token == PARAM)
        fixed = [i for i, token in enumerate(tokens) if token != PARAM]
        self.fixed = len(fixed)
        if len(self.positions) > 1:
            # itemgetter of several indices returns their items as a tuple, in C
            self.params = cast(Callable[[list[str]], tuple[str, ...]], itemgetter(*self.positions))
        elif self.positions:
            only = self.positions[0]
            self.params = lambda tokens: (tokens[only],)
        else:
            self.params = None
        if fixed:
            # itemgetter of one index returns the item, of several a tuple; both sides
            # of the comparison come from the same getter, so either shape compares.
            getter = cast(Callable[[Sequence[str]], object], itemgetter(*fixed))
            self.constants = getter
            self.expected = getter(tokens)
        else:
            self.constants = None
            self.expected = None
        # What the native fast path reads (app/ingest/mining/_minefast.c): the constant
        # indices, ``expected``, the wildcard indices; indices as native uint32.
        self.shape = (
            array("I", fixed).tobytes(),
            self.expected,
            array("I", self.positions).tobytes(),
        )

    def same(self, tokens: list[str]) -> int:
        """How many of the template's constant tokens ``tokens`` has at their places:
        ``get_seq_distance``'s ``sim_tokens`` (wildcards are not counted)."""
        constants = self.constants
        if constants is None:
            return 0
        got = constants(tokens)
        expected = self.expected
        if got == expected:
            return self.fixed
        if self.fixed == 1:
            return 0
        return sum(map(eq, cast(tuple[str, ...], got), cast(tuple[str, ...], expected)))


#: one step of a template's place in the tree: (parent, key under the parent, node)
Step = tuple[DrainNode, str, DrainNode]

# What a template costs the heap, an upper bound the tests hold to tracemalloc
# (tests/unit/app/ingest/mining/test_tenant_miner.py): our Template with its getters
# and tuples, Drain's LogCluster and its LRU entry, each token's string and its slots in
# the template's tuples, and each tree node of its path (a Node, its dict and list).
TEMPLATE_OVERHEAD_BYTES: Final = 800
TOKEN_OVERHEAD_BYTES: Final = 24
NODE_BYTES: Final = 400


def template_bytes(tokens: Sequence[str], nodes: int) -> int:
    """The heap bytes ``state_bytes`` counts for one template of ``tokens`` whose path
    has ``nodes`` tree nodes (shared nodes are counted once per template: errs high)."""
    return (
        TEMPLATE_OVERHEAD_BYTES
        + sum(map(sys.getsizeof, tokens))
        + TOKEN_OVERHEAD_BYTES * len(tokens)
        + NODE_BYTES * nodes
    )


def last_use(template: Template) -> int:
    return template.touched


def kept_rows(
    rows: Sequence[ClusterRow], nodes: Sequence[NodeRow], config: MinerConfig
) -> list[ClusterRow]:
    """The rows a restore under ``config``'s bounds keeps, in their LRU order: none that
    no mined body can match (more than ``max_body_tokens`` tokens, or more than
    ``max_body_chars`` characters of constants), then at most ``max_leaf_clusters`` per
    leaf and ``max_clusters`` in all, the most recently used kept."""
    tokens_limit, chars_limit = config.max_body_tokens, config.max_body_chars
    out = [
        row
        for row in rows
        if (tokens_limit is None or len(row[4]) <= tokens_limit)
        and (chars_limit is None or sum(len(t) for t in row[4] if t != PARAM) <= chars_limit)
    ]
    leaf_limit = config.max_leaf_clusters
    if leaf_limit is not None:
        leaf_of = {drain_id: n for n, (_, _, ids) in enumerate(nodes) for drain_id in ids}
        per_leaf: dict[int, int] = {}
        newest_first: list[ClusterRow] = []
        for row in reversed(out):
            leaf = leaf_of.get(row[0], -1)
            per_leaf[leaf] = per_leaf.get(leaf, 0) + 1
            if per_leaf[leaf] <= leaf_limit:
                newest_first.append(row)
        out = newest_first[::-1]
    limit = config.max_clusters
    if limit is not None and len(out) > limit:
        out = out[len(out) - limit :]
    return out


def tree_rows(root: DrainNode) -> list[NodeRow]:
    """The tree's nodes in pre-order, each as (parent row, key under it, cluster ids)."""
    nodes: list[NodeRow] = []
    stack: list[tuple[int, str, DrainNode]] = [(-1, "", root)]
    while stack:
        parent, key, node = stack.pop()
        index = len(nodes)
        nodes.append((parent, key, list(node.cluster_ids)))
        # Reversed onto the stack so children come out, and are rebuilt, in order.
        for child_key, child in reversed(node.key_to_child_node.items()):
            stack.append((index, child_key, child))
    return nodes


def rebuild_tree(
    root: DrainNode, rows: Sequence[NodeRow], kept: set[int]
) -> dict[int, tuple[Step, ...]]:
    """Rebuild ``tree_rows``' nodes under ``root`` with only the ``kept`` cluster ids,
    dropping the nodes left with neither clusters nor children; returns each kept
    cluster's path (``Template.path``)."""
    built: list[DrainNode] = []
    steps: list[Step | None] = []
    parents: list[int] = []
    for parent, key, cluster_ids in rows:
        node = root if parent < 0 else new_node()
        # Only live ids: an older build left the LRU's evicted ones for Drain to drop.
        node.cluster_ids = [i for i in cluster_ids if i in kept]
        if parent >= 0:
            built[parent].key_to_child_node[key] = node
            steps.append((built[parent], key, node))
        else:
            steps.append(None)
        built.append(node)
        parents.append(parent)
    # Nodes left with neither clusters nor children (what an eviction leaves): pre-
    # order puts children after their parent, so one backward pass drops them all.
    for index in range(len(built) - 1, 0, -1):
        node = built[index]
        step = steps[index]
        if step is not None and not node.cluster_ids and not node.key_to_child_node:
            del step[0].key_to_child_node[step[1]]
    paths: dict[int, tuple[Step, ...]] = {}
    for leaf, node in enumerate(built):
        for drain_id in node.cluster_ids:
            path: list[Step] = []
            index = leaf
            while parents[index] >= 0:
                step = steps[index]
                assert step is not None
                path.append(step)
                index = parents[index]
            paths[drain_id] = tuple(reversed(path))
    return paths


def insert_cluster(
    drain: DrainTree, cluster: DrainCluster, max_children: int, parametrize_numeric: bool
) -> tuple[Step, ...]:
    """Put a new cluster in Drain's prefix tree where drain3 0.9's
    ``add_seq_to_prefix_tree`` puts it, and return its path (``Template.path``).

    The same walk: the token-count node, then at most ``max_node_depth - 1`` tokens; a
    token with no child of its own takes a new child while the node has room
    (``max_children``, one place kept for the wildcard), the wildcard child otherwise,
    and always when it has a digit (``parametrize_numeric``). One difference, in cost
    only: drain3 filters the leaf's every id through its LRU map before appending; our
    miner drops an evicted cluster's id from its leaf itself (``TenantMiner._evict``,
    right after the insert that evicted it), so the leaf holds no stale id and the new
    one is appended. test_tenant_miner.py holds the trees equal to drain3's."""
    tokens = cluster.log_template_tokens
    count = len(tokens)
    root = drain.root_node
    key = str(count)
    children = root.key_to_child_node
    node = children.get(key)
    if node is None:
        node = children[key] = new_node()
    steps: list[Step] = [(root, key, node)]
    if count == 0:
        node.cluster_ids = [cluster.cluster_id]
        return tuple(steps)
    depth = 1
    limit = drain.max_node_depth
    for token in tokens:
        if depth >= limit or depth >= count:
            break
        children = node.key_to_child_node
        child = children.get(token)
        key = token
        if child is None:
            if parametrize_numeric and any(map(str.isdigit, token)):
                key = PARAM
            elif len(children) + (PARAM not in children) >= max_children:
                key = PARAM  # full: the wildcard child (made with the last place)
            child = children.get(key)
            if child is None:
                child = children[key] = new_node()
        steps.append((node, key, child))
        node = child
        depth += 1
    node.cluster_ids.append(cluster.cluster_id)
    return tuple(steps)

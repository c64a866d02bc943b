"""Per-tenant template mining with drain3's Drain, the node's template ids, and the
miner snapshot.

Each module is one concern, imported where it lives:

* ``tokens`` — how a body is split into Drain's tokens, and the wildcard ``PARAM``.
* ``miner_config`` — ``MinerConfig``, Drain's knobs for one tenant.
* ``tenant_miner`` — ``TenantMiner``: one tenant's Drain tree, its search and its events.
* ``drain_tree`` — Drain's tree as the miner holds it: typed views of drain3, ``Template``,
  what a template costs, the tree's snapshot rows.
* ``native_miner`` — the miner's fast path in C (``_minefast.c``) for exact matches,
  and which miner a process runs.
* ``template_ids`` — template ids and their allocators (``FileTemplateIdAllocator``).
* ``miner_snapshot`` — the bytes of a miner snapshot (``OMNR``), encoded and decoded.
* ``rematch`` — re-matching records to a later version of their template.
* ``miner_cluster`` — ``MinerCluster``: every tenant's miner on the node.
* ``errors`` — the ``MinerError`` family all of the above raise.

Nothing here is thread-safe except the allocators: callers serialise mining per node
under the pipeline's miner lock (DESIGN.md §5.3).
"""

"""The core's ingest (DESIGN.md §5). The modules:

* ``pipeline`` — the pipeline: admission, WAL append, the ingest turn, acknowledgement.
* ``stages`` — the committer and turn stages that take every request without a thread
  per request.
* ``admission`` — whether a new batch may be appended at all; ``tenants`` — tenant
  slots and each tenant's admission state; ``shares`` — each tenant's share of the turn.
* ``cuts`` — what the barrier publishes and stamps at one mark, and its owner (capture,
  pending slot, frontiers); ``mark`` — the mark a cut captures, clamped by unmined
  entries; ``emit`` — a mined batch into the sink's buffers; ``replay_feed`` — recovery's
  replayed frames into the miners.
* ``landed`` — publish intents, and what a restart finds already in the store.
* ``settlement`` — settlement after a mining failure (RFC 0055 §9.4): the settler,
  which claims a tenant's ``unmined`` entries (the frames, their clamp, the outcomes)
  and works with the ``settle_parts`` it is built with; its rooms: ``rebuild`` (the
  tenant's tree rebuilt and swapped in), ``frame_attempts`` (failures counted per frame,
  isolation at the bound) and ``unrecoverable`` (a tenant refused for good).
* ``snapshot_store`` — the per-tenant miner snapshot files (with their horizons).
* ``mining`` — per-tenant template mining (a package; its docstring lists its modules).
"""

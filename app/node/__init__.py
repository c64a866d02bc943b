"""The process (DESIGN.md §5, §6, §8, §9). The modules:

* ``server`` — ``ourios serve``: assembly, start-up order and shutdown.
* ``recovery`` — recovery's start-up order, before any listener starts.
* ``config`` — every setting: one table, three sources, validated once.
* ``metrics`` — the Prometheus exposition; ``events`` — the structured log events.
* ``workers`` — the core's side of the worker processes: listeners and supervision.
* ``datalock`` — one writer per WAL (the data directory's lock).
* ``diskspace`` — free space on the data volume and the emergency reserve.
* ``frame_quarantine`` — frames a replay isolated because they did not decode.
* ``gc_policy`` — the garbage collector's part in ingest latency.
* ``malloc_arenas`` — the C allocator's arenas, part of the memory bound.
* ``storeprobe`` — the store's start-up probe and its health since.
"""

"""The process: the assembly at the top of ``app`` (DESIGN.md §5, §6, §8, §9). The
modules:

* ``server`` — ``ourios serve``: assembly, start-up order and shutdown.
* ``recovery`` — recovery's start-up order, before any listener starts.
* ``metrics`` — the Prometheus exposition.
* ``worker_pool`` — the core's side of the worker processes: listeners and supervision.
* ``encode_dispatch`` — the publisher's records encodes on the workers, a bounded number
  at once.
* ``datalock`` — one writer per WAL (the data directory's lock).
* ``frame_quarantine`` — frames a replay isolated because they did not decode.
* ``storeprobe`` — the store's start-up probe and its health since.
"""

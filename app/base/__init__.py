"""The ground floor: the vocabulary every floor of ``app`` speaks, importing none of them
(DESIGN.md §2). Named ``base``, not ``core``: "the core" here is the core process, and
this floor is imported as much by the worker processes' receivers. The modules:

* ``batch`` — ``FlatBatch``, one request's records as Arrow columns.
* ``rejections`` — the ``IngestRejection`` family: a request refused with a status.
* ``config`` — every setting: one table, three sources, validated once.
* ``events`` — the structured log events.
* ``diskspace`` — free space on the data volume and the emergency reserve.
* ``gc_policy`` — the garbage collector's part in ingest latency.
* ``malloc_arenas`` — the C allocator's arenas, part of the memory bound.
"""

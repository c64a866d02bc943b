"""The garbage-collector policy: the cyclic collector's part in ingest latency.

A full collection holds the GIL while it scans every tracked container, so it stalls
every thread; its cost is the size of the tracked heap. Two measures keep it off the
ingest path (soak/bench/barrier.py measures both):

* ``freeze_long_lived_heap`` — once recovery is done, everything start-up built
  (modules, configuration, restored miners, the replay's state) is moved out of the
  collector's generations, so a full collection scans only what ingest allocated
  since, which makes a full collection an order of magnitude shorter
  (docs/BENCHMARKS.md, the ingest stall a cut causes).
* ``collection_deferred`` — a cut's capture holds the barrier exclusion exclusively,
  so a collection landing inside it would stall every waiting turn for the capture
  plus the collection. The capture runs with automatic collection off; a collection
  it would have triggered runs at the next allocation after it, outside the
  exclusion. Only the capture uses it, and captures never overlap (the exclusion).

A large buffer does not grow the scan either: buffered records are Arrow record
batches (one Python object per frame, not per row), which the collector never walks.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_long_lived_heap() -> None:
    """Collect, then freeze everything alive: it lives as long as the process."""
    gc.collect()
    gc.freeze()


@contextmanager
def collection_deferred() -> Iterator[None]:
    """Automatic collection off for the block (left as found if already off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

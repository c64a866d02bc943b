"""The background cadences (DESIGN.md §5, §12). The modules:

* ``barrier`` — the publication barrier, the only place the checkpoint advances: its
  schedule (when to cut); ``cut_runner`` — its work (running a cut: flush, stamp, retry).
* ``housekeeping`` — the timer of the capped reclamation passes and the disk samples.
* ``sweep`` — the age sweep that publishes buffered partitions past their age.
* ``archive`` — WAL archival: a segment copied to the store before it is unlinked.
"""

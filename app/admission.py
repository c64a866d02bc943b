"""Admission: whether a new batch may be appended at all (DESIGN.md §7, §12).

The pipeline asks ``Admission.check`` before every append; a refusal raises an
``IngestRejection`` (503 / UNAVAILABLE with its error type and Retry-After) and nothing
is written. The state it decides on is sampled off the append path (the housekeeping
tick) — ``check`` only reads it.

This is the seam; the disk thresholds and the unreclaimed-bytes bound fill it in.
"""

from __future__ import annotations


class Admission:
    """Admits everything (no threshold configured yet)."""

    def check(self, tenant: str) -> None:
        """Raise an ``IngestRejection`` naming the bound when ``tenant``'s batch must be
        refused; return when it may be appended."""
        return None

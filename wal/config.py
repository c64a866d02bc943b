"""WAL configuration: every knob of DESIGN.md §8's ``wal`` section, with its range.

The ranges live here once. ``app.base.config`` reads them from the field metadata to build
the ``OURIOS_WAL_*`` settings, the chart's schema mirrors them, and ``Journal.open``
validates them again (an ``InvalidConfig`` names the knob, the value and the range;
nothing is ever clamped).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidConfig

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: u16 slot ids in RECLAIM and PUBLISHED.
MAX_TENANTS_LIMIT = 65_536
#: RECLAIM is preallocated; refuse geometries that would make it absurdly large.
MAX_RECLAIM_FILE_BYTES = 1 * GiB


def knob(
    default: Any,
    doc: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    unit: str = "",
) -> Any:
    """A dataclass field carrying the knob's range and documentation."""
    return field(
        default=default,
        metadata={"doc": doc, "minimum": minimum, "maximum": maximum, "unit": unit},
    )


@dataclass(frozen=True)
class WalConfig:
    """The ``wal`` section (environment ``OURIOS_WAL_<NAME>``)."""

    segment_max_bytes: int = knob(
        64 * MiB,
        "Size at which the active segment rotates (a frame is never split; a single "
        "larger frame still lands).",
        minimum=64 * KiB,
        maximum=16 * GiB,
        unit="bytes",
    )
    segment_age_secs: int = knob(
        600,
        "Age at which a segment holding a frame rotates (on an append, or on the "
        "barrier tick when idle).",
        minimum=1,
        maximum=7 * 86_400,
        unit="seconds",
    )
    barrier_secs: int = knob(
        300,
        "Cadence of the publication barrier that flushes the sinks, installs snapshots "
        "and advances the checkpoint.",
        minimum=1,
        maximum=86_400,
        unit="seconds",
    )
    housekeeping_secs: int = knob(
        60,
        "Cadence of the capped housekeeping pass that reclaims segments.",
        minimum=1,
        maximum=86_400,
        unit="seconds",
    )
    max_unlinks_per_pass: int = knob(
        128,
        "Cap on unlinks (and horizon applications) per housekeeping pass; at least "
        "rotation_retry_attempts so one rotation's debris clears in one pass.",
        minimum=1,
        maximum=4096,
    )
    rotation_retry_attempts: int = knob(
        3,
        "Consecutive failed rotation attempts before the WAL enters the terminal state.",
        minimum=1,
        maximum=1000,
    )
    max_tenants: int = knob(
        1024,
        "Tenant slots in RECLAIM and PUBLISHED (a new tenant beyond it is refused).",
        minimum=1,
        maximum=MAX_TENANTS_LIMIT,
    )
    max_frame_bytes: int = knob(
        8 * MiB,
        "Largest accepted batch after decompression (HTTP 413 / RESOURCE_EXHAUSTED above).",
        minimum=1 * KiB,
        maximum=256 * MiB,
        unit="bytes",
    )
    unreclaimed_bytes_limit: int = knob(
        0,
        "Refuse new batches while unreclaimed WAL bytes exceed this (0 = off).",
        minimum=0,
        maximum=2**62,
        unit="bytes",
    )
    high_water_bytes: int = knob(
        1 * MiB,
        "Acknowledged bytes of the current segment after which its synced high-water is "
        "recorded again in HIGHWATER (one small write and fsync by the commit that "
        "crossed it): damage below that high-water is refused as corruption, so only "
        "fewer than this many of the newest acknowledged bytes can read as a torn tail.",
        minimum=1,
        maximum=1 * GiB,
        unit="bytes",
    )
    archive: bool = knob(
        False,
        "Copy each segment to the object store under wal-archive/ before unlinking it.",
    )

    def validate(self) -> None:
        """Raise ``InvalidConfig`` for the first knob outside its range."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            lo, hi = f.metadata["minimum"], f.metadata["maximum"]
            if isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise InvalidConfig(f.name, value, "true or false")
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidConfig(f.name, value, f"an integer in {range_text(lo, hi)}")
            if not in_range(value, lo, hi):
                raise InvalidConfig(f.name, value, range_text(lo, hi))
        if self.max_unlinks_per_pass < self.rotation_retry_attempts:
            raise InvalidConfig(
                "max_unlinks_per_pass",
                self.max_unlinks_per_pass,
                f">= rotation_retry_attempts ({self.rotation_retry_attempts})",
            )
        size = reclaim_file_bytes(self.max_tenants, self.max_unlinks_per_pass)
        if size > MAX_RECLAIM_FILE_BYTES:
            raise InvalidConfig(
                "max_unlinks_per_pass",
                self.max_unlinks_per_pass,
                f"small enough that RECLAIM (max_tenants={self.max_tenants}) stays under "
                f"{MAX_RECLAIM_FILE_BYTES} bytes; it would be {size}",
            )


def reclaim_file_bytes(max_tenants: int, max_unlinks: int) -> int:
    """RFC 0052 §3.2's normative geometry: 32 + 2·slot_len."""
    t, u = max_tenants, max_unlinks
    slot_len = 32 + 164 * t + 24 * u + 32 * t * u
    return 32 + 2 * slot_len


def in_range(value: int, lo: int | None, hi: int | None) -> bool:
    """Whether ``value`` lies within the optional bounds ``lo`` and ``hi`` (inclusive)."""
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def range_text(
    lo: int | None,
    hi: int | None,
    bound: Callable[[int], str] = str,
    unbounded: str = "any value",
) -> str:
    """The bounds in words ("between 1 and 9", ">= 1", "<= 9"), each shown by ``bound``.

    The node's settings (app/base/config.py) share it with the WAL's knobs, passing
    their own ``bound`` (bytes shown human-readably too) and ``unbounded`` text.
    """
    if lo is not None and hi is not None:
        return f"between {bound(lo)} and {bound(hi)}"
    if lo is not None:
        return f">= {bound(lo)}"
    if hi is not None:
        return f"<= {bound(hi)}"
    return unbounded

"""``ourios wal inspect DIR`` and ``ourios wal verify DIR``: read-only operator views.

``DIR`` is the WAL directory, or a data directory holding one (``DIR/wal``). Both
commands read only; they are safe against a stopped node's volume.

Exit codes: ``verify`` returns 0 when the set is clean (legal torn tails are notes, not
problems), 1 when it found a problem, 2 when ``DIR`` is not a WAL.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TextIO

from wal.tools import RootReport, inspect_root, verify_root


def resolve_wal_dir(directory: Path) -> Path:
    """Accept the WAL directory itself or a data directory that holds ``wal/``."""
    if (directory / "wal").is_dir() and not any(directory.glob("*.wal")):
        return directory / "wal"
    return directory


def _when(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _print_problems(report: RootReport, out: TextIO) -> None:
    for note in report.notes:
        print(f"note: {note}", file=out)
    for problem in report.problems:
        print(f"PROBLEM: {problem}", file=out)


def inspect(directory: Path, out: TextIO) -> int:
    root = resolve_wal_dir(directory)
    if not root.is_dir():
        print(f"ourios wal inspect: {root} is not a directory", file=out)
        return 2
    report = inspect_root(root, horizons=None)
    print(f"WAL {root}", file=out)
    mark = "none (never checkpointed)" if report.checkpoint is None else str(report.checkpoint)
    print(f"checkpoint: {mark}", file=out)
    if report.reclaim is not None:
        r = report.reclaim
        print(
            f"RECLAIM: mode={r.consumer_mode} armed={r.checkpoint_armed} seen={r.checkpoint_seen} "
            f"tenant ids={r.tenant_ids}/{r.max_tenants} cap={r.max_unlinks}",
            file=out,
        )
        for tenant, (mode, through) in sorted(r.entries.items()):
            print(f"  reclaimed through for {tenant}: {through} ({mode})", file=out)
        for planned in r.planned:
            print(f"  planned unlink: {planned}", file=out)
    if report.published is not None:
        pub = report.published
        print(
            f"PUBLISHED: {len(pub.frontiers)} tenant frontiers (max_tenants={pub.max_tenants})",
            file=out,
        )
        for tenant, (records, audit, flags) in sorted(pub.frontiers.items()):
            extra = f" [{flags}]" if flags else ""
            print(
                f"  published through for {tenant}: records {records}, audit {audit}{extra}",
                file=out,
            )
    if report.floor:
        print(f"retain floor: {report.floor}", file=out)
    print(f"segments: {len(report.segments)}", file=out)
    for s in report.segments:
        sealed = " predecessor-sealed" if s.predecessor_sealed else ""
        print(
            f"  {s.name}  base={s.base_lsn} size={s.size} frames={s.frames} "
            f"frame_bytes={s.frame_bytes} end={s.valid_end_lsn} created={_when(s.created_unix)}"
            f"{sealed}",
            file=out,
        )
        for tenant in sorted(s.tenants):
            print(
                f"      tenant {tenant}: {s.tenants[tenant]} frames, last ends at "
                f"{s.tenant_last[tenant]}",
                file=out,
            )
        if s.damage:
            print(f"      damage at byte {s.damage_offset}: {s.damage}", file=out)
        why = report.eligibility.get(s.name)
        if why is not None:
            print(f"      retained: {why}" if why else "      eligible for reclamation", file=out)
    if report.partials:
        print(f"stale partials (swept by housekeeping): {', '.join(report.partials)}", file=out)
    if report.other_files:
        print(f"other files: {', '.join(report.other_files)}", file=out)
    _print_problems(report, out)
    return 0


def verify(directory: Path, out: TextIO) -> int:
    root = resolve_wal_dir(directory)
    if not root.is_dir():
        print(f"ourios wal verify: {root} is not a directory", file=out)
        return 2
    report = verify_root(root)
    frames = sum(s.frames for s in report.segments)
    size = sum(s.size for s in report.segments)
    _print_problems(report, out)
    verdict = "clean" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"verified {len(report.segments)} segments, {frames} frames, {size} bytes in {root}: "
        f"{verdict}",
        file=out,
    )
    return 0 if report.ok else 1

"""``ourios wal inspect|verify|quarantine``: the operator's tools for a WAL volume.

``DIR`` is the WAL directory, or a data directory holding one (``DIR/wal``).

* ``inspect DIR`` — segments with their bases, sizes and frames per tenant, the sidecars
  and their states, quarantined segments, the retain floor and why each segment is
  retained. With the data directory's ``snapshots/`` beside the WAL, the tenants'
  horizons are read from it (decoded, never written) so the reasons are complete.
* ``verify DIR`` — the full CRC walk; every problem with its file and offset. Damage
  below a segment's synced high-water (recorded by its successor's header, or the
  checkpoint mark) is reported as corruption naming the high-water; damage above it
  is a torn tail (a note). ``inspect`` prints each segment's high-water.
  ``verify FILE.wal`` checks one segment file on its own (an archived copy, a
  quarantined file); ``verify --archive [NAME ...]`` fetches this node's archived
  segments from the configured object store (the settings ``serve`` would load) and
  checks each.
* ``quarantine SEGMENT`` — moves one unreadable segment into ``quarantine/`` beside it
  with a record of what it held and what its loss is (``wal.quarantine``), so the node
  can start. Only on this explicit command; it refuses a segment that verifies clean
  (``--force`` overrides, for a segment whose frames verify but whose payloads do not
  decode) and a WAL a running node holds: it takes the data directory's lock
  (``app.node.datalock``) for the move, so it refuses while a node holds it and no node
  starts half-way through it.

``inspect`` and ``verify`` only read and take no lock, so they are safe against a
stopped node's volume (or a copy of it) and a running node's; ``inspect`` says when a
node holds the directory. ``quarantine`` is the one verb that writes, and
only to move that segment and write its record.

Exit codes: 0 clean / done; 1 a problem found (verify) or the command refused
(quarantine); 2 ``DIR`` or the segment is not there.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import TextIO

from app.base.diskspace import RESERVE_NAME
from app.base.rejections import IngestRejection
from app.ingest.snapshot_store import SUFFIX as SNAP_SUFFIX
from app.ingest.snapshot_store import SnapshotError, decode_snapshot
from app.node.datalock import LOCK_NAME, DataDirLock, DataDirLocked, DataDirLockError, read_holder
from app.receive.otlp import count_records, decode_request
from wal import (
    SEGMENT_RE,
    OsFs,
    QuarantineError,
    RootReport,
    SegmentVerdict,
    WalOffset,
    inspect_root,
    quarantine_segment,
    verify_root,
    verify_segment_bytes,
)

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_MISSING = 2


def resolve_wal_dir(directory: Path) -> Path:
    """Accept the WAL directory itself or a data directory that holds ``wal/``."""
    if (directory / "wal").is_dir() and not any(directory.glob("*.wal")):
        return directory / "wal"
    return directory


def _when(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _print_problems(report: RootReport | SegmentVerdict, out: TextIO) -> None:
    for note in report.notes:
        print(f"note: {note}", file=out)
    for problem in report.problems:
        print(f"PROBLEM: {problem}", file=out)


def read_horizons(wal_root: Path) -> tuple[dict[str, WalOffset] | None, dict[str, str]]:
    """Tenant horizons from the ``snapshots/`` beside ``wal_root`` (decoded read-only),
    and the snapshots that did not decode. (None, {}) when there is no such directory."""
    snaps = wal_root.parent / "snapshots"
    if not snaps.is_dir():
        return None, {}
    horizons: dict[str, WalOffset] = {}
    bad: dict[str, str] = {}
    for path in sorted(snaps.glob(f"*{SNAP_SUFFIX}")):
        try:
            state = decode_snapshot(path.read_bytes(), path)
        except (OSError, SnapshotError) as exc:
            bad[path.name] = str(exc)
            continue
        horizons[state.tenant] = state.horizon
    return horizons, bad


def inspect(directory: Path, out: TextIO) -> int:
    root = resolve_wal_dir(directory)
    if not root.is_dir():
        print(f"ourios wal inspect: {root} is not a directory", file=out)
        return EXIT_MISSING
    horizons, bad_snapshots = read_horizons(root)
    report = inspect_root(root, horizons=horizons)
    print(f"WAL {root}", file=out)
    holder = read_holder(root.parent)
    if holder is not None:
        print(
            f"in use by {holder.describe()}: a live node (this is one moment of a log that "
            f"is moving)",
            file=out,
        )
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
    print("sidecars:", file=out)
    for name, state in sorted(report.sidecars.items()):
        print(f"  {name}: {state}", file=out)
    print(f"disk reserve: {_reserve_state(root.parent / RESERVE_NAME)}", file=out)
    if horizons is None:
        print("snapshots: none beside this WAL (tenant horizons unknown)", file=out)
    else:
        print(
            f"snapshots: {len(horizons)} tenant horizon(s) from {root.parent / 'snapshots'}",
            file=out,
        )
        for tenant, horizon in sorted(horizons.items()):
            print(f"  horizon of {tenant}: {horizon}", file=out)
        for snap, error in sorted(bad_snapshots.items()):
            print(f"  UNDECODABLE {snap}: {error} (its tenant is pinned)", file=out)
    _print_published(report, out)
    if report.floor:
        print(f"retain floor: {report.floor}", file=out)
    _print_segments(report, out)
    for q in report.quarantined:
        print(f"quarantined {q.segment} at {_when(q.quarantined_unix)}: {q.summary()}", file=out)
    for name in report.quarantine_pending:
        print(f"quarantine of {name} incomplete: run `ourios wal quarantine` again", file=out)
    if report.partials:
        print(f"stale partials (swept by housekeeping): {', '.join(report.partials)}", file=out)
    if report.other_files:
        print(f"other files: {', '.join(report.other_files)}", file=out)
    _print_problems(report, out)
    return EXIT_OK


def _print_published(report: RootReport, out: TextIO) -> None:
    """PUBLISHED's frontiers per tenant, and a settlement's unconfirmed intent: what the
    next start republishes."""
    if report.published is None:
        return
    pub = report.published
    print(
        f"PUBLISHED: {len(pub.frontiers)} tenant frontiers (max_tenants={pub.max_tenants})",
        file=out,
    )
    for tenant, (records, audit, flags) in sorted(pub.frontiers.items()):
        extra = f" [{flags}]" if flags else ""
        if tenant in pub.intents:
            extra += (
                f" — a settlement's publish through {pub.intents[tenant]} is not confirmed;"
                f" the next start republishes that span under its deterministic names"
            )
        print(
            f"  published through for {tenant}: records {records}, audit {audit}{extra}",
            file=out,
        )


def _print_segments(report: RootReport, out: TextIO) -> None:
    """Each segment's geometry, tenants, high-water, damage and why it is retained."""
    print(f"segments: {len(report.segments)}", file=out)
    for s in report.segments:
        sealed = " predecessor-sealed" if s.predecessor_sealed else ""
        print(
            f"  {s.name}  base={s.base_lsn} size={s.size} frames={s.frames} "
            f"frame_bytes={s.frame_bytes} end={s.valid_end_lsn} created={_when(s.created_unix)}"
            f"{sealed}",
            file=out,
        )
        if s.high_water is not None:
            print(f"      high-water {s.high_water} ({s.high_water_source})", file=out)
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


def _reserve_state(path: Path) -> str:
    """The emergency reserve beside the WAL (``app.base.diskspace``), as an operator needs it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return (
            f"{path} absent (released on a full volume, disabled, or the node never ran "
            f"here; a running node makes it again when there is room)"
        )
    return f"{path} in place, {st.st_size} bytes (released to reclamation if the volume fills)"


def verify(directory: Path, out: TextIO) -> int:
    if directory.is_file():
        return verify_file(directory, out)
    root = resolve_wal_dir(directory)
    if not root.is_dir():
        print(f"ourios wal verify: {root} is not a directory or a segment file", file=out)
        return EXIT_MISSING
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
    return EXIT_OK if report.ok else EXIT_PROBLEM


def verify_file(path: Path, out: TextIO) -> int:
    """One segment file on its own (an archived or quarantined copy)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        print(f"ourios wal verify: cannot read {path}: {exc}", file=out)
        return EXIT_MISSING
    return _report_segment(verify_segment_bytes(data, path.name, where=path), str(path), out)


def _report_segment(verdict: SegmentVerdict, where: str, out: TextIO) -> int:
    _print_problems(verdict, out)
    state = "clean" if verdict.ok else f"{len(verdict.problems)} problem(s)"
    base = "?" if verdict.header is None else str(verdict.header.base_lsn)
    print(
        f"verified {where}: base={base} {verdict.frames} frames, {verdict.size} bytes: {state}",
        file=out,
    )
    return EXIT_OK if verdict.ok else EXIT_PROBLEM


def verify_archive(
    names: list[str], out: TextIO, *, config_file: Path | None = None, node: str | None = None
) -> int:
    """Fetch this node's archived segments from the configured store and verify each."""
    from app.base.config import ConfigError, load_settings
    from sink import ObjectNotFound, StoreError, archive_key, from_url, node_identity

    try:
        settings = load_settings(config_file=config_file)
    except ConfigError as exc:
        print(f"ourios wal verify --archive: configuration error: {exc}", file=out)
        return EXIT_MISSING
    who = node or node_identity(settings.server.node_id)
    store = from_url(settings.store.url, settings.store.endpoint_url, settings.store.region)
    prefix = archive_key(who, "x.wal")[: -len("x.wal")]
    try:
        keys = [prefix + n for n in names] if names else store.list(prefix)
    except StoreError as exc:
        print(f"ourios wal verify --archive: listing {prefix} failed: {exc}", file=out)
        return EXIT_PROBLEM
    keys = [k for k in keys if SEGMENT_RE.match(k.rsplit("/", 1)[-1])]
    if not keys:
        print(f"no archived segment under {prefix} in {store.describe()}", file=out)
        return EXIT_MISSING if names else EXIT_OK
    bad = 0
    for key in keys:
        try:
            data = store.get(key)
        except ObjectNotFound:
            print(f"PROBLEM: {key}: not in the archive", file=out)
            bad += 1
            continue
        except StoreError as exc:
            print(f"PROBLEM: {key}: {exc}", file=out)
            bad += 1
            continue
        name = key.rsplit("/", 1)[-1]
        if _report_segment(verify_segment_bytes(data, name, where=Path(key)), key, out):
            bad += 1
    print(f"verified {len(keys)} archived segment(s) of {who}: {bad} with problems", file=out)
    return EXIT_OK if bad == 0 else EXIT_PROBLEM


# -- quarantine ---------------------------------------------------------------------------


def _records_of(payload: bytes) -> int | None:
    try:
        return count_records(decode_request(payload, "application/x-protobuf"))
    except IngestRejection:
        return None


def holders(root: Path) -> list[int]:
    """Processes (other than this one) holding a file under ``root`` open: a running
    node holds RECLAIM and its current segment. Linux ``/proc``; empty elsewhere."""
    real = os.path.realpath(root).rstrip("/") + "/"
    found: list[int] = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(real):
                found.append(pid)
                break
    return found


def quarantine(
    segment: Path,
    out: TextIO,
    *,
    force: bool = False,
    now: float | None = None,
) -> int:
    """Move ``segment`` aside into ``quarantine/`` with a record of its loss."""
    root = segment.parent.absolute()
    name = segment.name
    if SEGMENT_RE.match(name) is None:
        print(f"ourios wal quarantine: {name!r} is not a segment file (<20 digits>.wal)", file=out)
        return EXIT_MISSING
    if not segment.is_file():
        print(f"ourios wal quarantine: {segment} does not exist; nothing was moved", file=out)
        return EXIT_MISSING
    # The data directory's lock, held for the move: a node cannot start half-way through
    # it, and a running node (the lock's holder) refuses the command.
    try:
        lock = DataDirLock.acquire_existing(root.parent, command="ourios wal quarantine")
    except DataDirLocked as exc:
        print(
            f"ourios wal quarantine: refused, nothing was moved: the data directory "
            f"{exc.directory} is in use by {exc.holder.describe()} (it holds "
            f"{exc.directory / LOCK_NAME}); stop the node first",
            file=out,
        )
        return EXIT_PROBLEM
    except DataDirLockError as exc:
        print(f"ourios wal quarantine: refused, nothing was moved: {exc}", file=out)
        return EXIT_PROBLEM
    try:
        return _quarantine_locked(root, segment, name, out, force=force, now=now)
    finally:
        if lock is not None:
            lock.release()


def _quarantine_locked(
    root: Path, segment: Path, name: str, out: TextIO, *, force: bool, now: float | None
) -> int:
    busy = holders(root)
    if busy:
        print(
            f"ourios wal quarantine: refused, nothing was moved: process(es) "
            f"{', '.join(map(str, busy))} hold files in {root} open (a running node?); "
            f"stop the node first",
            file=out,
        )
        return EXIT_PROBLEM
    report = verify_root(root)
    mine = [p for p in report.problems if p.path.name == name]
    if not mine and not force:
        print(
            f"ourios wal quarantine: refused, nothing was moved: {name} verifies clean "
            f"(`ourios wal verify {root}` finds no problem in it). Quarantine is for a "
            f"segment that stops the node from starting; --force moves it anyway, losing "
            f"its frames above the checkpoint",
            file=out,
        )
        return EXIT_PROBLEM
    reason = "; ".join(str(p) for p in mine) or "forced by the operator (--force)"
    try:
        record = quarantine_segment(
            OsFs(),
            root,
            name,
            reason=reason,
            now=time.time() if now is None else now,
            count_records=_records_of,
        )
    except QuarantineError as exc:
        print(f"ourios wal quarantine: refused: {exc}", file=out)
        return EXIT_PROBLEM
    except OSError as exc:
        print(f"ourios wal quarantine: failed ({exc}); see `ourios wal inspect {root}`", file=out)
        return EXIT_PROBLEM
    print(f"quarantined {name}: moved to {root / 'quarantine' / name}", file=out)
    print(f"record: {root / 'quarantine' / (name + '.json')}", file=out)
    print(f"why: {record.reason}", file=out)
    print(f"LOSS: {record.summary()}", file=out)
    for tenant, loss in sorted(record.tenants.items()):
        records = "?" if loss.records_above_checkpoint is None else loss.records_above_checkpoint
        print(
            f"  tenant {tenant}: {loss.frames_above_checkpoint} frame(s), {records} record(s) "
            f"above the checkpoint (LSN {loss.first_lsn}..{loss.last_lsn})",
            file=out,
        )
    print(
        "the node can start: open honours the record (its LSNs are never reused, and a "
        "snapshot horizon inside it is this recorded loss rather than a stale gap); every "
        "start logs wal.segment.quarantined",
        file=out,
    )
    return EXIT_OK

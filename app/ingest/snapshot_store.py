"""Per-tenant miner snapshots: ``snapshots/<pct-tenant>.snap``, version 2.

Layout (little-endian)::

    offset  size  field
    0       4     magic b"OSNP"
    4       2     u16 version = 2
    6       2     reserved, zero
    8       4     u32 tenant_len
    12      4     u32 miner_len
    16      24    horizon: the WalOffset of the last frame this tenant's miner folded
                  (its OWN horizon, never the node-wide mark; RFC 0052 §3.1)
    40      4     u32 CRC-32C over bytes [0, 40), the tenant and the miner state
    44      4     reserved, zero
    48      …     tenant id (ASCII), then the miner state (``TenantMiner.to_snapshot``)

Writing: ``<pct-tenant>.<lsn>.snap.tmp`` (a name unique to the writer), fsync, rename
over ``<pct-tenant>.snap``, fsync the directory — all under one install lock shared by
every writer (the barrier, the post-recovery write, shutdown), and only when the new
horizon is above the installed one (monotonic per tenant). A writer removes its own temp
on any failure. Creating the directory fsyncs its parent.

A full volume: a write that fails with ENOSPC asks ``app.base.diskspace`` to release the
emergency reserve and, when that freed space, writes once more — snapshots are what
reclamation needs most, and at zero free bytes nothing else would let a horizon advance.
What a snapshot adds to the volume (less the one it replaced) is reported to the same
figure admission uses. A tenant whose installs fail is reported once when they start
failing (``snapshot.install.failed``) and once when one succeeds again
(``snapshot.install.recovered``), not at every cut.

Reading at start-up (``load_all_durable``): fsync the directory and its parent before
trusting a listing (a failed fsync fails start-up: a horizon whose entry may not be
durable must never govern reclamation), remove stale ``*.snap.tmp``, and admit a
horizon only from a snapshot that decodes and restores. After start-up the directory is
never read as authority: the ``SnapshotLedger`` of installs that returned OK is the
only source of horizons for housekeeping.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c

from app.base.diskspace import DiskSpace
from sink import decode_tenant, encode_tenant
from wal import Fs, KnownHorizons, OsFs, WalOffset, is_no_space

MAGIC: Final = b"OSNP"
VERSION: Final = 2
_HEAD: Final = struct.Struct("<4sHHII24sII")
HEADER_SIZE: Final = _HEAD.size  # 48
SUFFIX: Final = ".snap"
TMP_SUFFIX: Final = ".snap.tmp"


class SnapshotError(Exception):
    """A snapshot could not be decoded, or the store could not be trusted."""


class SnapshotStoreError(SnapshotError):
    """The store itself failed (an fsync at start-up): start-up must fail."""


@dataclass(frozen=True, slots=True)
class SnapshotState:
    tenant: str
    horizon: WalOffset
    miner: bytes  # the TenantMiner snapshot bytes


def encode_snapshot(state: SnapshotState) -> bytes:
    tenant = state.tenant.encode("ascii")
    head = _HEAD.pack(
        MAGIC, VERSION, 0, len(tenant), len(state.miner), state.horizon.encode(), 0, 0
    )
    crc = crc32c.crc32c(state.miner, crc32c.crc32c(tenant, crc32c.crc32c(head[:40])))
    return head[:40] + struct.pack("<II", crc, 0) + tenant + state.miner


def decode_snapshot(data: bytes, path: Path) -> SnapshotState:
    if len(data) < HEADER_SIZE:
        raise SnapshotError(
            f"{path}: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    magic, version, reserved, tenant_len, miner_len, horizon, crc, reserved2 = _HEAD.unpack_from(
        data
    )
    if magic != MAGIC:
        raise SnapshotError(f"{path}: bad magic {magic!r}")
    if version != VERSION:
        raise SnapshotError(
            f"{path}: unknown snapshot version {version} (this build reads {VERSION})"
        )
    if reserved or reserved2:
        raise SnapshotError(f"{path}: non-zero reserved bytes")
    if HEADER_SIZE + tenant_len + miner_len != len(data):
        raise SnapshotError(
            f"{path}: header says {HEADER_SIZE + tenant_len + miner_len} bytes, "
            f"the file has {len(data)}"
        )
    tenant_raw = data[HEADER_SIZE : HEADER_SIZE + tenant_len]
    miner = data[HEADER_SIZE + tenant_len :]
    check = crc32c.crc32c(miner, crc32c.crc32c(tenant_raw, crc32c.crc32c(data[:40])))
    if check != crc:
        raise SnapshotError(f"{path}: checksum mismatch")
    try:
        tenant = tenant_raw.decode("ascii")
    except UnicodeDecodeError:
        raise SnapshotError(f"{path}: tenant id is not ASCII") from None
    return SnapshotState(tenant, WalOffset.decode(horizon), miner)


@dataclass
class LoadResult:
    states: dict[str, SnapshotState] = field(default_factory=dict)
    #: listed snapshots that did not decode (or did not restore): tenant -> reason
    undecodable: dict[str, str] = field(default_factory=dict)
    stale_temps_removed: int = 0


@dataclass(frozen=True, slots=True)
class InstallOutcome:
    tenant: str
    installed: bool
    reason: str = ""  # why not: "not above the installed horizon", or the error


class SnapshotStore:
    """The ``snapshots/`` directory, written through the WAL's filesystem seam."""

    def __init__(
        self,
        root: Path,
        fs: Fs | None = None,
        *,
        space: DiskSpace | None = None,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._fs = fs or OsFs()
        self._space = space
        self._events = events or (lambda name, fields: None)
        self._clock = clock
        self._install_lock = threading.Lock()
        self._installed: dict[str, int] = {}  # tenant -> installed horizon LSN
        self._sizes: dict[str, int] = {}  # tenant -> bytes of its installed snapshot
        #: tenant -> (first failure time, failures) while its installs keep failing
        self._failing: dict[str, tuple[float, int]] = {}
        #: the directory's own entry in its parent is durable (a parent fsync succeeded
        #: after it was created or seen at start-up); until then no install is OK
        self._root_durable = False

    def path_of(self, tenant: str) -> Path:
        return self.root / f"{encode_tenant(tenant)}{SUFFIX}"

    # -- start-up ------------------------------------------------------------------------

    def load_all_durable(
        self, restores: Callable[[SnapshotState], object] | None = None
    ) -> LoadResult:
        """fsync the directory and its parent, drop stale temps, decode every snapshot;
        ``restores`` (the miner's restore) decides whether a decoded one is admitted."""
        result = LoadResult()
        fs = self._fs
        if not self.root.exists():
            return result
        try:
            fs.fsync_dir(self.root)
            fs.fsync_dir(self.root.parent)
            self._root_durable = True
        except OSError as exc:
            raise SnapshotStoreError(
                f"fsync of {self.root} or its parent failed at start-up ({exc}): a listed "
                f"snapshot may not be durable, so none can be trusted to govern reclamation"
            ) from exc
        names = sorted(fs.listdir(self.root))
        removed = False
        for name in names:
            if name.endswith(TMP_SUFFIX):
                try:
                    fs.unlink(self.root / name)
                    result.stale_temps_removed += 1
                    removed = True
                except FileNotFoundError:
                    pass
        if removed:
            try:
                fs.fsync_dir(self.root)
            except OSError as exc:
                raise SnapshotStoreError(
                    f"fsync of {self.root} after removing temps: {exc}"
                ) from exc
        for name in names:
            if not name.endswith(SUFFIX) or name.endswith(TMP_SUFFIX):
                continue
            stem = name[: -len(SUFFIX)]
            try:
                tenant = decode_tenant(stem)
            except ValueError:
                result.undecodable[stem] = "the file name is not a percent-encoded tenant id"
                continue
            path = self.root / name
            try:
                state = decode_snapshot(_read(fs, path), path)
                if state.tenant != tenant:
                    raise SnapshotError(f"{path}: holds tenant {state.tenant!r}, not {tenant!r}")
                if restores is not None:
                    restores(state)
            except Exception as exc:  # noqa: BLE001 - an unusable snapshot is reported
                result.undecodable[tenant] = str(exc)
                continue
            result.states[tenant] = state
            self._installed[tenant] = state.horizon.lsn
            self._sizes[tenant] = HEADER_SIZE + len(state.tenant) + len(state.miner)
        return result

    # -- installs ------------------------------------------------------------------------

    def install(self, state: SnapshotState) -> InstallOutcome:
        with self._install_lock:
            current = self._installed.get(state.tenant)
            if current is not None and state.horizon.lsn <= current:
                return InstallOutcome(state.tenant, False, "not above the installed horizon")
            try:
                self._write(state)
            except OSError as exc:
                reason = f"{type(exc).__name__}: {exc}"
                self._install_failed(state.tenant, reason)
                return InstallOutcome(state.tenant, False, reason)
            self._installed[state.tenant] = state.horizon.lsn
            failing = self._failing.pop(state.tenant, None)
        if failing is not None:
            since, failures = failing
            self._events(
                "snapshot.install.recovered",
                {
                    "tenant": state.tenant,
                    "failures": failures,
                    "seconds": round(self._clock() - since, 3),
                    "horizon": str(state.horizon),
                },
            )
        return InstallOutcome(state.tenant, True)

    def _install_failed(self, tenant: str, reason: str) -> None:
        """Count a failed install; the first of a run is one event (the install lock is
        held: events are cheap and never call back)."""
        failing = self._failing.get(tenant)
        if failing is not None:
            self._failing[tenant] = (failing[0], failing[1] + 1)
            return
        self._failing[tenant] = (self._clock(), 1)
        self._events(
            "snapshot.install.failed",
            {
                "tenant": tenant,
                "error": reason,
                "action": "the tenant's horizon stays at its installed snapshot, so the WAL "
                "keeps its segments; every cut retries, and snapshot.install.recovered "
                "follows the first install that succeeds",
            },
        )

    @property
    def failing(self) -> dict[str, int]:
        """Tenants whose installs are failing now, with how many failed in a row."""
        with self._install_lock:
            return {tenant: n for tenant, (_, n) in self._failing.items()}

    def install_all(self, states: Mapping[str, SnapshotState]) -> dict[str, InstallOutcome]:
        """Install each; a failure for one tenant never stops the others."""
        return {tenant: self.install(state) for tenant, state in states.items()}

    def _write(self, state: SnapshotState) -> None:
        fs = self._fs
        self._ensure_root()
        final = self.path_of(state.tenant)
        tmp = self.root / f"{encode_tenant(state.tenant)}.{state.horizon.lsn}{TMP_SUFFIX}"
        data = encode_snapshot(state)
        space = self._space
        try:
            self._write_temp(tmp, data)
        except OSError as exc:
            # A full volume: the reserve exists for exactly this write; once more if it
            # freed space.
            if not is_no_space(exc) or space is None:
                raise
            if not space.no_space(
                f"writing the snapshot of tenant {state.tenant!r} "
                f"({tmp.name}, {len(data)} bytes): {exc}"
            ):
                raise
            self._write_temp(tmp, data)
        try:
            fs.rename(tmp, final)
        except OSError:
            _unlink_quietly(fs, tmp)
            raise
        if space is not None:
            space.wrote(len(data))
            space.freed(self._sizes.get(state.tenant, 0))
        self._sizes[state.tenant] = len(data)
        fs.fsync_dir(self.root)

    def _write_temp(self, tmp: Path, data: bytes) -> None:
        """Write and fsync ``tmp``; on a failure it is removed."""
        fs = self._fs
        fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            try:
                fs.write(fd, data)
                fs.fsync(fd)
            finally:
                fs.close(fd)
        except OSError:
            _unlink_quietly(fs, tmp)
            raise

    def _ensure_root(self) -> None:
        """Create the directory if needed and make its entry durable: a failed parent
        fsync is retried by every later install until one succeeds (RFC 0052 §3.2)."""
        if self._root_durable:
            return
        if not self.root.is_dir():
            self._fs.mkdir(self.root)
        self._fs.fsync_dir(self.root.parent)
        self._root_durable = True


def _unlink_quietly(fs: Fs, path: Path) -> None:
    try:
        fs.unlink(path)
    except OSError:
        pass


def _read(fs: Fs, path: Path) -> bytes:
    fd = fs.open(path, os.O_RDONLY)
    try:
        return fs.pread(fd, fs.fstat(fd).st_size, 0)
    finally:
        fs.close(fd)


class SnapshotLedger:
    """Installs that returned OK (after the directory fsync): the only source of
    ``SnapshotHorizons.KnownHorizons`` for housekeeping, and the state settlement rebuilds from
    (the decoded state each horizon was installed from is retained beside it, so a
    rebuild never reads the directory, RFC 0055 §9.4).

    A tenant refused as unrecoverable is left out of the horizons (the WAL pins its
    frames) and named to housekeeping, which then goes on for everyone else."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, SnapshotState] = {}
        self._refused: set[str] = set()

    def record(self, state: SnapshotState) -> None:
        with self._lock:
            current = self._states.get(state.tenant)
            if current is None or state.horizon.lsn > current.horizon.lsn:
                self._states[state.tenant] = state

    def horizons(self) -> dict[str, WalOffset]:
        with self._lock:
            return {t: s.horizon for t, s in self._states.items() if t not in self._refused}

    def refuse(self, tenant: str) -> None:
        """The tenant is unrecoverable: no horizon for it from now on (it pins)."""
        with self._lock:
            self._refused.add(tenant)

    def known(self) -> KnownHorizons:
        """What housekeeping passes to ``Journal.maintain``."""
        with self._lock:
            horizons = {t: s.horizon for t, s in self._states.items() if t not in self._refused}
            return KnownHorizons(horizons, unrecoverable=frozenset(self._refused))

    def state(self, tenant: str) -> SnapshotState | None:
        with self._lock:
            return self._states.get(tenant)

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

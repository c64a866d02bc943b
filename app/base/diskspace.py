"""Free space on the data volume as of the last write, and the emergency reserve that
keeps a full volume reclaimable (issue 18; DESIGN.md §7, §12; segment-set seed §6).

**The figure.** Free space is sampled (``statvfs``) by the housekeeping tick, never on
the append path (segment-set seed §12.9). Between two samples the node is what fills the
volume, and it knows what it writes, so ``DiskSpace.free_bytes`` is the free space *as
of the last write*::

    the last sample
      − the WAL's growth since: its end LSN moved (frames, a failed write's reserved
        range included), plus one block per segment file created and one for the tail
      − what the other writers reported since, in whole blocks: snapshots (less the ones
        they replaced), the embedded store's objects (and archived segments)
      − the emergency reserve while it is released (it is owed back to the volume)

The sidecars add nothing between samples: RECLAIM and PUBLISHED are preallocated and
rewritten in place, CHECKPOINT cycles its spare, and the template-id file replaces
itself (one block in flight, once per 4096 templates).

Admission refuses at stop water by this figure, so however fast the WAL is written it
cannot run from above stop water to a full volume between two ticks (at 13 MB/s one
tick used to be enough). The counters' baseline is read *before* ``statvfs``: a write
racing the sample is counted twice (the figure errs low, by what was in flight), never
not at all. Segments unlinked by housekeeping are not credited here — the next sample
shows them — and a writer outside the node is seen at the next sample only.

**The reserve** (the "ballast" pattern of CockroachDB's Pebble store). A volume filled to
zero — by the node or by something else on it — must stay reclaimable, and reclamation
writes new files: every tenant's snapshot (temp → rename), the embedded store's objects
when it is on this volume, the template-id file. (CHECKPOINT, RECLAIM and PUBLISHED need
no block: they are preallocated, ``wal/checkpoint_file.py``.) So ``<data_dir>/disk-reserve``,
``disk.reserve_bytes`` long, is allocated at start-up (``posix_fallocate``, fsynced).
The first of the node's writes that fails with ENOSPC *releases* it — the file is
unlinked, its blocks are free — and that writer retries once; the WAL's own ENOSPC (its
no-space latch) releases it at the next tick. While released the reserve is owed: the
figure subtracts it, so admission keeps refusing and the WAL never gets that space. A
tick re-creates it once a sample shows room for it and stop water above it, and only
then can admission resume. Each transition is one event, ``disk.reserve.released``
(with the write that failed) and ``disk.reserve.restored``.

**At start-up** (issue 22 item 2) the reserve is made — or a whole one the previous run
left is adopted — *before* the WAL opens, so a repair at start-up on a volume filled to
zero has space to take: every start-up write is in place where it can be (the intent
log's torn tail is truncated, the sidecars are preallocated), and one that needs a new
block and fails for lack of space releases the reserve and is tried once more
(``from_reserve``). A volume too small for ``disk.reserve_bytes`` and
``disk.stop_water_bytes`` together could never admit a batch (the figure owes the
reserve until it exists, and it is made only with stop water beside it), so the start
is refused naming the volume's size and both settings (``check_volume``) rather than
serving a node that refuses every request for ever. Refused, not sized down: settings
are validated and never clamped (DESIGN.md §8), and a smaller reserve is a smaller
margin the operator should choose knowingly.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from wal import Fs, Journal, OsFs, is_no_space

log = logging.getLogger("ourios.disk")

RESERVE_NAME: Final = "disk-reserve"
#: What a block costs when the filesystem has not been asked yet (tmpfs, ext4, xfs).
DEFAULT_BLOCK: Final = 4096

Events = Callable[[str, Mapping[str, object]], None]
_T = TypeVar("_T")


class VolumeTooSmall(Exception):
    """The data volume cannot hold the reserve and stop water: no batch could ever be
    admitted, so the node refuses to start (module docstring)."""

    error_type = "volume_too_small"


def _no_events(name: str, fields: Mapping[str, object]) -> None:
    pass


class ReserveState(enum.Enum):
    UNALLOCATED = "unallocated"  # before the start-up allocation
    IN_PLACE = "in_place"
    RELEASED = "released"  # unlinked (or never allocated): owed back to the volume


class Reserve:
    """The emergency reserve file: allocated, released on ENOSPC, re-created (module
    docstring). Thread-safe: the barrier, the publisher and housekeeping all reach it."""

    def __init__(
        self,
        path: Path,
        size: int,
        *,
        fs: Fs | None = None,
        events: Events | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_volume: bool = True,
    ) -> None:
        if size < 0:
            raise ValueError(f"reserve size must be at least 0, got {size}")
        self.path = path
        self.size = size
        self._fs = fs or OsFs()
        self._events = events or _no_events
        self._clock = clock
        self._lock = threading.Lock()
        self._state = ReserveState.UNALLOCATED
        #: whether the reserve shares the WAL's volume (releasing it frees space there)
        self.on_volume = on_volume
        self._released_at: float | None = None
        #: how many times the reserve was released (each a disk.reserve.released event)
        self.releases = 0

    @property
    def state(self) -> ReserveState:
        return self._state

    @property
    def owed(self) -> int:
        """Bytes the volume owes the reserve: its size unless it is in place."""
        return 0 if self.size == 0 or self._state is ReserveState.IN_PLACE else self.size

    def ensure(self, free_bytes: int | None = None) -> bool:
        """Allocate the file to ``size`` bytes (a leftover of another size is resized;
        with size 0 a leftover is removed). True when it is in place. A failure (a full
        volume) removes what was half-allocated and leaves it owed; never raises.
        ``free_bytes``: the sample that allowed it, for the event."""
        event: tuple[str, dict[str, object]] | None = None
        with self._lock:
            before = self._state
            if self.size == 0:
                self._remove()
                self._state = ReserveState.IN_PLACE
                return True
            try:
                self._allocate()
            except OSError as exc:
                try:
                    self._remove()
                except OSError as cleanup:  # the tick goes on: the next one retries
                    log.warning(
                        "removing the half-allocated reserve %s failed: %s", self.path, cleanup
                    )
                self._state = ReserveState.RELEASED
                ok = False
                if before is ReserveState.UNALLOCATED:
                    self._released_at = self._clock()
                    self.releases += 1
                    cause = f"allocating it at start-up failed: {exc}"
                    event = ("disk.reserve.released", self._released_fields(cause))
                else:
                    log.warning("re-creating the disk reserve %s failed: %s", self.path, exc)
            else:
                self._state = ReserveState.IN_PLACE
                ok = True
                if before is ReserveState.RELEASED:
                    since, self._released_at = self._released_at, None
                    event = (
                        "disk.reserve.restored",
                        {
                            "path": str(self.path),
                            "bytes": self.size,
                            "free_bytes": free_bytes,
                            "seconds": None if since is None else round(self._clock() - since, 3),
                            "action": "the reserve is allocated again; admission goes by the "
                            "free space left beside it",
                        },
                    )
        if event is not None:
            self._events(*event)
        return ok

    def release(self, cause: str) -> int:
        """Unlink the reserve (a write of the node failed with ENOSPC); returns the bytes
        it freed, 0 when it was not in place."""
        with self._lock:
            if self.size == 0 or self._state is not ReserveState.IN_PLACE:
                return 0
            try:
                self._fs.unlink(self.path)
            except FileNotFoundError:
                pass  # someone removed it by hand: its blocks are free already
            except OSError as exc:
                log.warning("releasing the disk reserve %s failed: %s", self.path, exc)
                return 0
            self._state = ReserveState.RELEASED
            self._released_at = self._clock()
            self.releases += 1
            fields = self._released_fields(cause)
        self._events("disk.reserve.released", fields)
        return self.size

    def verify(self) -> None:
        """The tick's check that the file is still there: one removed from outside the
        node is owed from now on (and made again when there is room)."""
        with self._lock:
            if self.size == 0 or self._state is not ReserveState.IN_PLACE:
                return
            try:
                self._fs.stat(self.path)
            except FileNotFoundError:
                pass
            except OSError:
                return  # unknown: keep believing the last thing known
            else:
                return
            self._state = ReserveState.RELEASED
            self._released_at = self._clock()
            self.releases += 1
            fields = self._released_fields("the file was removed from outside the node")
        self._events("disk.reserve.released", fields)

    def _released_fields(self, cause: str) -> dict[str, object]:
        return {
            "path": str(self.path),
            "bytes": self.size,
            "cause": cause,
            "action": "its space is for what reclamation writes (snapshots, the store's "
            "objects); new batches stay refused until a housekeeping sample shows room "
            "for the reserve and disk.stop_water_bytes above it, when it is allocated again",
        }

    def _allocate(self) -> None:
        fs = self._fs
        try:
            st = fs.stat(self.path)
        except FileNotFoundError:
            pass
        else:
            if st.st_size == self.size and st.st_blocks * 512 >= self.size:
                return  # a whole reserve left by the previous run
            fs.unlink(self.path)  # another size, or sparse: start again
        fd = fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # posix_fallocate reserves real blocks (glibc writes them where the
            # filesystem cannot), so statvfs counts them and no other write takes them.
            fs.fallocate(fd, 0, self.size)
            fs.fsync(fd)
        finally:
            fs.close(fd)

    def _remove(self) -> None:
        try:
            self._fs.unlink(self.path)
        except FileNotFoundError:
            pass


def _free_or_zero(path: Path) -> int:
    try:
        return statvfs_free(path)
    except OSError:
        return 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One statvfs of the volume and the counters read just before it."""

    free: int
    at: float
    wal_end: int
    wal_files: int
    reported: int


def statvfs_free(path: Path) -> int:
    """Free bytes an unprivileged writer may use on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskSpace:
    """The figure admission refuses by (module docstring): ``sample`` at each tick,
    writers report into ``wrote``/``freed``/``no_space``, ``free_bytes`` reads it."""

    def __init__(
        self,
        path: Path,
        journal: Journal | None = None,
        *,
        reserve: Reserve | None = None,
        headroom: int = 0,
        measure: Callable[[Path], int] = statvfs_free,
        block: int = DEFAULT_BLOCK,
        reserve_on_volume: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.reserve = reserve
        #: free space a re-created reserve must leave beside it (stop water)
        self.headroom = headroom
        self.block = block
        #: False when the reserve sits on another filesystem than ``path``: releasing it
        #: frees nothing here, so it is never subtracted from this volume's figure
        self.reserve_on_volume = reserve_on_volume
        self._journal = journal
        self._measure = measure
        self._clock = clock
        self._lock = threading.Lock()
        self._reported = 0
        self._sample: Sample | None = None

    # -- the tick -------------------------------------------------------------------------

    def sample(self) -> int | None:
        """statvfs now (the counters first); re-create a released reserve when the
        sample shows room for it and ``headroom`` beside it. The raw free bytes, or None
        when statvfs failed (the previous sample stays)."""
        reserve = self.reserve
        if reserve is not None:
            reserve.verify()
        taken = self._take()
        if taken is None:
            return None
        if reserve is not None and reserve.size and reserve.state is not ReserveState.IN_PLACE:
            if self.reserve_on_volume:
                room = taken.free >= reserve.size + self.headroom
            else:  # its own volume: room for the file is enough
                room = _free_or_zero(reserve.path.parent) >= reserve.size
            if room and reserve.ensure(taken.free) and self.reserve_on_volume:
                taken = self._take() or taken  # the figure after it: the reserve is a file now
        return taken.free

    def _take(self) -> Sample | None:
        journal = self._journal
        wal_end = journal.end_lsn if journal is not None else 0
        wal_files = journal.segments_created if journal is not None else 0
        reported = self._reported
        try:
            free = self._measure(self.path)
        except OSError as exc:
            log.warning("statvfs of %s failed: %s", self.path, exc)
            return None
        taken = Sample(free, self._clock(), wal_end, wal_files, reported)
        self._sample = taken
        return taken

    @property
    def last_sample(self) -> Sample | None:
        return self._sample

    # -- what writers report --------------------------------------------------------------

    def blocks(self, nbytes: int) -> int:
        """``nbytes`` rounded up to whole blocks (what the volume gives up for them)."""
        return -(-nbytes // self.block) * self.block

    def wrote(self, nbytes: int) -> None:
        """A writer added ``nbytes`` to the volume (a new file or object)."""
        with self._lock:
            self._reported += self.blocks(nbytes)

    def freed(self, nbytes: int) -> None:
        """A writer removed ``nbytes`` (a file its write replaced)."""
        with self._lock:
            self._reported -= self.blocks(nbytes)

    def no_space(self, cause: str) -> bool:
        """A write of the node failed with ENOSPC: release the reserve. True when that
        freed space here, so the writer may try once more."""
        reserve = self.reserve
        return reserve is not None and reserve.release(cause) > 0

    def on_volume(self, path: Path) -> bool:
        """Whether ``path`` (or, before it exists, its nearest existing parent) is on
        this volume: only such a writer's bytes belong in the figure."""
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            return os.stat(probe).st_dev == os.stat(self.path).st_dev
        except OSError:
            return True  # unknown: counting errs low, never high

    # -- the figure -----------------------------------------------------------------------

    def written_since_sample(self) -> int:
        """Bytes the node added to the volume since the last sample (0 before one)."""
        taken = self._sample
        if taken is None:
            return 0
        wal = 0
        journal = self._journal
        if journal is not None:
            grown = journal.end_lsn - taken.wal_end
            files = journal.segments_created - taken.wal_files
            if grown or files:
                wal = grown + (files + 1) * self.block
        return wal + self._reported - taken.reported

    @property
    def owed(self) -> int:
        reserve = self.reserve
        return reserve.owed if reserve is not None and self.reserve_on_volume else 0

    @property
    def free_bytes(self) -> int | None:
        """Free space as of the last write: the last sample less what the node wrote
        since, less the reserve while it is owed (may be negative); None before the
        first sample."""
        taken = self._sample
        if taken is None:
            return None
        return taken.free - self.written_since_sample() - self.owed


def volume_bytes(path: Path) -> int:
    """The size of ``path``'s filesystem that an unprivileged writer may fill (blocks
    kept for root, as ext4 keeps 5 %, are not the node's)."""
    st = os.statvfs(path)
    return (st.f_blocks - (st.f_bfree - st.f_bavail)) * st.f_frsize


def check_volume(
    wal_dir: Path,
    data_dir: Path,
    *,
    reserve_bytes: int,
    stop_water_bytes: int,
    measure: Callable[[Path], int] = volume_bytes,
) -> None:
    """Refuse (``VolumeTooSmall``) a volume that could never admit a batch: one no
    larger than the reserve and stop water together (each on its own volume when the
    reserve's directory is on another filesystem than the WAL's). Module docstring."""
    reserve = f"disk.reserve_bytes={reserve_bytes}"
    stop = f"disk.stop_water_bytes={stop_water_bytes}"
    if _same_volume(data_dir, wal_dir):
        needs = [(wal_dir, reserve_bytes + stop_water_bytes, f"{reserve} plus {stop}")]
    else:  # the reserve's directory is on a volume of its own
        needs = [(wal_dir, stop_water_bytes, stop), (data_dir, reserve_bytes, reserve)]
    for path, need, what in needs:
        size = measure(_existing(path))
        if need and size <= need:
            raise VolumeTooSmall(
                f"the data volume of {path} holds {size} bytes, not more than {what} "
                f"({need} bytes): the node could never admit a batch (the reserve is owed "
                f"until it exists, and it is made only with stop water beside it). Give "
                f"the volume more than {need} bytes and room for the WAL (the chart's "
                f"persistence.size), or lower disk.reserve_bytes "
                f"(OURIOS_DISK_RESERVE_BYTES) or disk.stop_water_bytes "
                f"(OURIOS_DISK_STOP_WATER_BYTES)"
            )


def _existing(path: Path) -> Path:
    """``path``, or before it exists (a first start's WAL directory) its nearest
    existing parent, which is on the volume it will be on."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _same_volume(a: Path, b: Path) -> bool:
    return os.stat(_existing(a)).st_dev == os.stat(_existing(b)).st_dev


def start_reserve(
    wal_dir: Path, data_dir: Path, reserve_bytes: int, events: Events | None = None
) -> Reserve:
    """The reserve in ``data_dir``, made now — before the WAL opens — or adopted whole
    from the previous run (a failure to allocate is an event, never a failed start: the
    figure owes it, so admission refuses until there is room)."""
    reserve = Reserve(
        data_dir / RESERVE_NAME,
        reserve_bytes,
        events=events,
        on_volume=_same_volume(data_dir, wal_dir),
    )
    reserve.ensure()
    return reserve


def from_reserve(reserve: Reserve, what: str, attempt: Callable[[], _T]) -> _T:
    """Run a start-up write; when it fails for lack of space on the reserve's volume,
    release the reserve and run it once more (module docstring). Any other failure, or
    one with no reserve to give, is raised as it was."""
    try:
        return attempt()
    except Exception as exc:
        if not (reserve.on_volume and _no_space_in(exc)):
            raise
        if not reserve.release(f"{what} at start-up failed: {exc}"):
            raise
    return attempt()


def _no_space_in(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is ENOSPC/EDQUOT."""
    seen: BaseException | None = exc
    for _ in range(8):  # chains are short; a cycle must not loop for ever
        if seen is None:
            return False
        if is_no_space(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def open_disk_space(
    wal_dir: Path,
    journal: Journal,
    *,
    reserve: Reserve,
    stop_water_bytes: int,
    measure: Callable[[Path], int] = statvfs_free,
) -> DiskSpace:
    """The node's figure for the WAL's volume, with the reserve ``start_reserve`` made.
    ``measure``: the free-space sample (``statvfs``; a test's figure)."""
    st = os.statvfs(wal_dir)
    return DiskSpace(
        wal_dir,
        journal,
        reserve=reserve,
        headroom=stop_water_bytes,
        measure=measure,
        block=st.f_frsize or DEFAULT_BLOCK,
        reserve_on_volume=reserve.on_volume,
    )

"""WAL archival (``wal.archive``, off by default): before housekeeping unlinks a segment
it is copied to the object store under ``wal-archive/<node>/<segment-file-name>``,
read back and compared, and only then unlinked (DESIGN.md §12; segment-set seed §5.2).

The copy is ``ObjectStore.put_if_absent``: ``LocalStore`` writes a temp name in the
target directory, fsyncs it and links it to the final name, then fsyncs the directory;
S3 creates the key with one conditional PUT. Either way no reader ever sees a partial
object under the final key, and an existing object is never replaced. The copy is then
*verified*: the object is read back and must equal the segment byte for byte.

* created and equal — archived; the hook returns and the WAL unlinks the segment;
* already there and equal — archived by an earlier pass whose unlink a crash
  interrupted (idempotent by name and content);
* created and different — the store returned other bytes than it was given: the bad
  object is deleted (best effort) and the hook raises; the segment stays;
* already there and different — another segment under the same name (a WAL that was
  reset, a node id reused): never overwritten, the hook raises and the segment stays
  until an operator moves that object away.

Every failure keeps the segment on disk (``wal.reclamation``: it stays reclaiming and
the next pass archives it again), is counted (``ourios_wal_archive_failures_total``
by ``error_type``) and is visible: one ``wal.archive.failed`` event when a segment's
archive first fails, one ``wal.archive.recovered`` when that segment is archived.

An archive location that resolves to the WAL directory itself (a ``file://`` store
whose ``wal-archive/<node>`` is, or lies inside, the WAL directory — compared by inode
as well as by path, so a symlink or a bind mount does not slip through) is refused at
start-up (``check_archive_location``) and again before each copy.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import crc32c

from sink import LocalStore, ObjectStore, StoreError, archive_key
from wal import ArchiveRequest


class ArchiveLocationError(ValueError):
    """The archive would land in the WAL directory itself."""


class ArchiveFailed(Exception):
    """One segment was not archived; it stays on disk. ``error_type`` is the label."""

    def __init__(self, segment: str, key: str, error_type: str, detail: str) -> None:
        super().__init__(f"archive of {segment} to {key!r} failed ({error_type}): {detail}")
        self.segment = segment
        self.key = key
        self.error_type = error_type


def archive_dir(store: ObjectStore, node: str) -> Path | None:
    """Where a ``file://`` store puts this node's archive; None for other stores."""
    if not isinstance(store, LocalStore):
        return None
    return store.root.joinpath(*archive_key(node, "x.wal").split("/")[:-1])


def check_archive_location(store: ObjectStore, node: str, wal_dir: Path) -> None:
    """Refuse an archive directory that is the WAL directory or lies inside it."""
    target = archive_dir(store, node)
    if target is None:
        return
    wal_real = os.path.realpath(wal_dir)
    target_real = os.path.realpath(target)
    inside = target_real == wal_real or target_real.startswith(wal_real.rstrip("/") + "/")
    probe = target
    while not inside:
        if probe.exists() and wal_dir.exists() and os.path.samefile(probe, wal_dir):
            inside = True
        if probe == probe.parent:
            break
        probe = probe.parent
    if inside:
        raise ArchiveLocationError(
            f"wal.archive: the archive location {target} resolves to the WAL directory "
            f"{wal_dir} (or lies inside it); archived copies would be the segments "
            f"themselves. Point OURIOS_STORE_URL elsewhere or turn archival off"
        )


class Archiver:
    """The ``wal.reclamation.ArchiveHook`` housekeeping calls before each unlink."""

    def __init__(
        self,
        store: ObjectStore,
        node: str,
        *,
        read: Callable[[Path], bytes] | None = None,
        events: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> None:
        self.store = store
        self.node = node
        self._read = read or (lambda path: path.read_bytes())
        self._events = events or (lambda name, fields: None)
        self._lock = threading.Lock()
        #: segment name -> its latest failure, while it keeps failing
        self._failing: dict[str, ArchiveFailed] = {}
        self.archived = 0
        self.archived_bytes = 0
        self.failures: Counter[str] = Counter()

    def key_of(self, name: str) -> str:
        return archive_key(self.node, name)

    def __call__(self, request: ArchiveRequest) -> None:
        try:
            size = self._archive(request)
        except ArchiveFailed as exc:
            self._failed(exc)
            raise
        except StoreError as exc:
            failure = ArchiveFailed(
                request.name, self.key_of(request.name), exc.error_type, str(exc)
            )
            self._failed(failure)
            raise failure from exc
        except OSError as exc:
            failure = ArchiveFailed(
                request.name, self.key_of(request.name), "archive_read", f"{request.path}: {exc}"
            )
            self._failed(failure)
            raise failure from exc
        with self._lock:
            self.archived += 1
            self.archived_bytes += size
            was = self._failing.pop(request.name, None)
        if was is not None:
            self._events(
                "wal.archive.recovered",
                {"segment": request.name, "key": self.key_of(request.name), "after": str(was)},
            )

    def _archive(self, request: ArchiveRequest) -> int:
        name = request.name
        key = self.key_of(name)
        self._refuse_self(key, request.path)
        data = self._read(request.path)
        created = self.store.put_if_absent(key, data)
        back = self.store.get(key)
        if back == data:
            return len(data)
        detail = (
            f"the object holds {len(back)} bytes (crc32c {crc32c.crc32c(back):08x}), the "
            f"segment {len(data)} bytes (crc32c {crc32c.crc32c(data):08x})"
        )
        if created:
            try:
                self.store.delete(key)
            except StoreError:
                pass  # the next attempt finds it different and refuses: still never lost
            raise ArchiveFailed(name, key, "archive_verify", f"read back differs: {detail}")
        raise ArchiveFailed(
            name,
            key,
            "archive_conflict",
            f"another object already holds this name and differs: {detail}; it is never "
            f"overwritten (move it away to let this segment be archived)",
        )

    def _refuse_self(self, key: str, segment: Path) -> None:
        if not isinstance(self.store, LocalStore):
            return
        target = self.store.root.joinpath(*key.split("/"))
        if target.exists() and os.path.samefile(target, segment):
            raise ArchiveFailed(
                segment.name, key, "archive_self", f"{target} is the segment itself"
            )

    def _failed(self, exc: ArchiveFailed) -> None:
        with self._lock:
            self.failures[exc.error_type] += 1
            first = exc.segment not in self._failing
            self._failing[exc.segment] = exc
        if first:
            self._events(
                "wal.archive.failed",
                {
                    "segment": exc.segment,
                    "key": exc.key,
                    "error_type": exc.error_type,
                    "error": str(exc),
                    "action": "the segment was kept, not unlinked; every housekeeping pass "
                    "archives it again and unlinks it only once a verified copy exists",
                },
            )

    @property
    def failing(self) -> dict[str, ArchiveFailed]:
        """Segments whose latest archive attempt failed (they are still on disk)."""
        with self._lock:
            return dict(self._failing)

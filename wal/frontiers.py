"""The journal's PUBLISHED side (``Frontiers``): open-time matrix, the shared tenant-id
table, and the two write paths (after CHECKPOINT in ``checkpoint``, alone in
``publish_marks``).

One id space, owned by RECLAIM (RFC 0055 §9.4, DESIGN.md §4): the journal keeps one
in-memory dictionary — the RECLAIM record's — seeded at open from the union of both
files' dictionaries, ``next_slot_id`` the larger of the two. An id the two files name
with different tenants, or one tenant the two place at different live ids, would cross
two tenants' marks and is refused at open (``CorruptionError`` naming both files and
the id). A tenant that only one file names is the ordinary case: the other file simply
has nothing for it yet. PUBLISHED is always written from the shared table, so its
dictionary is RECLAIM's, at the same ids.

Open-time rows (this implementation has no earlier deployments, so no root predates
PUBLISHED; DESIGN.md §4):

* PUBLISHED absent, RECLAIM not ``published_seeded_confirmed``: a crash before the first
  PUBLISHED was durable (or a root the first build of this WAL created): PUBLISHED is
  created empty — every tenant falls back to the checkpoint, which is exactly the gate
  a root without frontiers has — then RECLAIM records ``armed | confirmed``. Creating an
  empty file is idempotent, so no separate arming write is needed before it.
* PUBLISHED absent, RECLAIM confirmed: the file was lost; a tenant whose frontier
  lagged the checkpoint would be suppressed on replay, so open refuses.
* PUBLISHED present, not confirmed (armed or not): promoted to confirmed durably.
* no segment at all: entries are dropped (their LSNs belong to no frame of this root).
* either file's ``max_tenants`` below the larger of the two or the configured one
  (a crash between the two renames of a geometry rebuild, or a raised knob): both are
  rebuilt at the larger geometry through their ``.new`` temps, ids unchanged.

Marks are monotonic per tenant: a write never lowers a side that is already valid (a
settlement's forced write may land between a cut's capture and its stamp).

A settlement's intent (RFC 0055 §9.4; ``PublishedMarks.intent``, the entry's
``publishing`` bit) is written by ``publish_marks`` before the settlement publishes
anything of its span, and the merge keeps it until the span is known durable:

* an intent over an ordinary entry records the frontier the settlement starts from —
  one position for both sides, never below either side in force (else the write is
  refused and the settlement publishes without one) — and the end of its span;
* a write whose marks reach the end on both sides (the settlement's confirm, or a cut
  whose flush covered the span) clears it and raises both sides as usual;
* any other write leaves the intent as it is, frontier and end (a terminal flag
  aside): one intent at a time, so the span and its names stay fixed across every
  attempt and every restart until one confirms it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from .errors import CorruptionError, OpenError, OpenIoError, WalError
from .log import Log
from .published_file import (
    PublishedEntry,
    PublishedFile,
    PublishedRecord,
    published_file_bytes,
)
from .reclaim_file import (
    FLAG_PUBLISHED_SEEDED_ARMED,
    FLAG_PUBLISHED_SEEDED_CONFIRMED,
    DictRecord,
    Geometry,
    ReclaimFile,
    TenantCapacityExceeded,
)
from .reclamation import Reclamation
from .types import PublishedMarks, WalOffset

SEEDED: int = FLAG_PUBLISHED_SEEDED_ARMED | FLAG_PUBLISHED_SEEDED_CONFIRMED


class PublishedWriteError(WalError):
    """PUBLISHED could not be written; the previous frontiers stay in force on disk.

    ``checkpointed`` is True when it happened in ``checkpoint`` after the CHECKPOINT
    itself advanced (so the caller knows the mark moved)."""

    error_type = "wal_published_write"

    def __init__(self, message: str, *, checkpointed: bool = False) -> None:
        super().__init__(message)
        self.checkpointed = checkpointed


def _later(old: WalOffset | None, new: WalOffset | None) -> WalOffset | None:
    if old is None:
        return new
    if new is None or new.lsn <= old.lsn:
        return old
    return new


def _below(a: WalOffset | None, b: WalOffset | None) -> bool:
    """Whether frontier ``a`` claims less than ``b`` (None claims nothing of its own)."""
    return b is not None and (a is None or a.lsn < b.lsn)


def _reaches(m: PublishedMarks, end: WalOffset) -> bool:
    return all(side is not None and side.lsn >= end.lsn for side in (m.records, m.audit))


def merge_marks(tenant: str, old: PublishedMarks | None, m: PublishedMarks) -> PublishedMarks:
    """What a tenant's entry says after a write of ``m`` over ``old`` (module docstring);
    ``ValueError`` for an intent that cannot be recorded."""
    if old is not None and old.intent is not None:
        if m.intent is None and _reaches(m, old.intent):
            return PublishedMarks(
                _later(old.records, m.records), _later(old.audit, m.audit), m.terminal
            )
        return PublishedMarks(old.records, old.audit, m.terminal, old.intent)
    if m.intent is not None:
        if m.records != m.audit:
            raise ValueError(
                f"tenant {tenant!r}: an intent's frontier is one position for both sides, "
                f"got records {m.records} and audit {m.audit}"
            )
        if old is not None and (_below(m.records, old.records) or _below(m.records, old.audit)):
            raise ValueError(
                f"tenant {tenant!r}: an intent from frontier {m.records} is below the "
                f"frontiers in force (records {old.records}, audit {old.audit})"
            )
        if m.records is not None and m.intent.lsn < m.records.lsn:
            raise ValueError(
                f"tenant {tenant!r}: an intent ending at {m.intent} is below its frontier "
                f"{m.records}"
            )
        return PublishedMarks(m.records, m.records, m.terminal, m.intent)
    if old is None:
        return m
    return PublishedMarks(_later(old.records, m.records), _later(old.audit, m.audit), m.terminal)


class Frontiers:
    """PUBLISHED for one journal (module docstring).

    State: the PUBLISHED file, the entries by slot id as last merged, the frontiers as
    PUBLISHED last durably recorded them (by tenant), and the lock that serialises the
    writes (each runs its file I/O without the journal mutex). The tenant-id table is
    the RECLAIM record's, reached through ``Reclamation``.
    """

    def __init__(self, log: Log, reclamation: Reclamation) -> None:
        self._log = log
        self._reclamation = reclamation
        self._file: PublishedFile | None = None
        self._entries: dict[int, PublishedEntry] = {}
        self._write_lock = threading.Lock()
        self._durable: dict[str, PublishedMarks] = {}

    def release(self) -> None:
        """Close the file (a refused open, or ``close``)."""
        if self._file is not None and not self._file.closed:
            self._file.close()

    # -- open --------------------------------------------------------------------------

    def create_fresh(self, max_tenants: int) -> None:
        """A fresh root: PUBLISHED (empty) before RECLAIM, which is then created with the
        seeding confirmed. A PUBLISHED left by a crash before RECLAIM existed belongs to
        no frame of this root and is replaced."""
        fs, root = self._log.fs, self._log.root
        path = root / PublishedFile.NAME
        try:
            fs.stat(path)
        except FileNotFoundError:
            pass
        else:
            try:
                fs.unlink(path)
            except OSError as exc:
                raise OpenIoError(path, "remove the PUBLISHED of an empty root", exc) from exc
        try:
            made = PublishedFile.create(fs, root, max_tenants, PublishedRecord())
        except OSError as exc:
            raise OpenIoError(
                path, f"allocate {published_file_bytes(max_tenants)} bytes for", exc
            ) from exc
        self._reclamation.record.flags |= SEEDED
        self._file = made

    def open(self, has_segments: bool, *, reclaim_rebuilt: bool) -> bool:
        """The PUBLISHED rows of the module docstring, after RECLAIM's own matrix; True
        when the RECLAIM record changed (the caller writes it once, durably).
        ``reclaim_rebuilt``: that matrix rebuilt RECLAIM at a larger geometry."""
        fs, root = self._log.fs, self._log.root
        ppath = root / PublishedFile.NAME
        rpath = root / ReclaimFile.NAME
        record = self._reclamation.record
        changed = False
        loaded = PublishedFile.load(fs, root)
        if loaded is None:
            if record.flags & FLAG_PUBLISHED_SEEDED_CONFIRMED:
                raise CorruptionError(
                    ppath,
                    None,
                    f"PUBLISHED is missing but {rpath.name} records that it was written "
                    f"(published_seeded_confirmed): the publication frontiers are lost, and "
                    f"falling back to the checkpoint would suppress frames of a tenant whose "
                    f"frontier lagged it; refusing (restore PUBLISHED from a backup)",
                )
            t = self._reclamation.file.geometry.max_tenants
            try:
                file = PublishedFile.create(fs, root, t, self._record_locked())
            except OSError as exc:
                raise OpenIoError(
                    ppath, f"allocate {published_file_bytes(t)} bytes for", exc
                ) from exc
            record.flags |= SEEDED
            changed = True
        else:
            file, prec = loaded
            file.refuse_newer()
            try:
                changed |= self._union_dictionaries(prec, ppath, rpath)
            except BaseException:
                file.close()
                raise
            if has_segments:
                for slot, entry in prec.entries.items():
                    owner = record.dictionary.get(slot)
                    if owner is not None and not owner.tombstoned:
                        self._entries[slot] = entry
            if record.flags & SEEDED != SEEDED:
                record.flags |= SEEDED  # promoted durably below, never read as a fault
                changed = True
        self._file = file
        wanted = self._log.config.max_tenants
        if wanted < record.next_slot_id:
            raise OpenError(
                f"max_tenants={wanted} is below the {record.next_slot_id} tenant ids "
                f"{rpath} and {ppath} have recorded; raise max_tenants to at least "
                f"{record.next_slot_id}"
            )
        self._rebuild_geometry(file, reclaim_rebuilt)
        for slot in [s for s in self._entries if s not in record.dictionary]:
            del self._entries[slot]
        self._durable = self._marks_by_tenant_locked()
        if loaded is not None and not has_segments and loaded[1].entries:
            # Entries of a root with no frame: their LSNs name nothing here.
            assert self._file is not None
            try:
                self._file.write(self._record_locked())
            except OSError as exc:
                raise OpenIoError(ppath, "clear the entries of an empty root", exc) from exc
        return changed

    def _union_dictionaries(self, prec: PublishedRecord, ppath: Path, rpath: Path) -> bool:
        """Fold PUBLISHED's dictionary into the shared table; True when it grew."""
        record = self._reclamation.record
        grew = False
        live = record.tenant_ids()
        for slot, rec in sorted(prec.dictionary.items()):
            mine = record.dictionary.get(slot)
            if mine is not None:
                if mine.tenant != rec.tenant:
                    raise CorruptionError(
                        ppath,
                        None,
                        f"slot id {slot} names tenant {rec.tenant!r} in {ppath.name} but "
                        f"{mine.tenant!r} in {rpath} ({rpath.name}): the two files would cross "
                        f"two tenants' marks; refusing",
                    )
                if rec.tombstoned and not mine.tombstoned:
                    mine.tombstoned = True  # a retired id stays retired in both
                    grew = True
                continue
            if not rec.tombstoned and rec.tenant in live:
                raise CorruptionError(
                    ppath,
                    None,
                    f"tenant {rec.tenant!r} is at slot id {slot} in {ppath.name} but at id "
                    f"{live[rec.tenant]} in {rpath} ({rpath.name}): one tenant at two ids; "
                    f"refusing",
                )
            record.dictionary[slot] = DictRecord(rec.tenant, rec.tombstoned)
            grew = True
        if prec.next_slot_id > record.next_slot_id:
            record.next_slot_id = prec.next_slot_id
            grew = True
        if grew:
            record._index = None
        return grew

    def _rebuild_geometry(self, published: PublishedFile, reclaim_rebuilt: bool) -> None:
        """Bring both files to the larger ``max_tenants`` (RFC0055.2): a crash between the
        two renames of an earlier rebuild leaves one file wider; ids are unchanged."""
        reclamation = self._reclamation
        root = self._log.root
        reclaim_t = reclamation.file.geometry.max_tenants
        target = max(reclaim_t, published.max_tenants, self._log.config.max_tenants)
        if reclaim_t < target:
            g = reclamation.file.geometry
            try:
                reclamation.regrow(Geometry(target, g.max_unlinks))
            except OSError as exc:
                raise OpenIoError(
                    root / ReclaimFile.NAME, "rebuild at a larger geometry", exc
                ) from exc
        if published.max_tenants < target or reclaim_rebuilt:
            try:
                self._file = published.rebuild(target, self._record_locked())
            except OSError as exc:
                raise OpenIoError(
                    root / PublishedFile.NAME, "rebuild at a larger geometry", exc
                ) from exc

    # -- the table -----------------------------------------------------------------------

    def _record_locked(self) -> PublishedRecord:
        """What PUBLISHED holds now: the shared dictionary and the entries by id."""
        record = self._reclamation.record
        return PublishedRecord(
            0,
            record.next_slot_id,
            {i: DictRecord(r.tenant, r.tombstoned) for i, r in record.dictionary.items()},
            {
                i: PublishedEntry(e.records, e.audit, e.publishing, e.terminal, e.generation)
                for i, e in self._entries.items()
            },
        )

    def _marks_by_tenant_locked(self) -> dict[str, PublishedMarks]:
        dictionary = self._reclamation.record.dictionary
        out: dict[str, PublishedMarks] = {}
        for slot, entry in self._entries.items():
            owner = dictionary.get(slot)
            if owner is not None and not owner.tombstoned:
                out[owner.tenant] = entry.marks
        return out

    def published_marks(self) -> dict[str, PublishedMarks]:
        """Each tenant's frontiers as PUBLISHED last durably recorded them (read at open,
        updated by every successful write): recovery's per-tenant gates."""
        with self._log.lock:
            return dict(self._durable)

    # -- writing -------------------------------------------------------------------------

    def publish_marks(self, marks: Mapping[str, PublishedMarks]) -> None:
        """Write PUBLISHED alone (settlement's forced write, an unrecoverable tenant's
        terminal entry): raises ``PublishedWriteError``, the previous slot staying live.
        Monotonic per tenant; a tenant new to the shared table takes its next slot id
        there (RECLAIM records it at its next write)."""
        self.write(marks)

    def write(
        self, marks: Mapping[str, PublishedMarks], *, checkpointed: bool | None = None
    ) -> bool:
        """Merge ``marks`` into the entries and write them if anything changed.

        ``checkpointed`` is None for ``publish_marks``, where a tenant that cannot take a
        slot id refuses the write; in the checkpoint's write such a tenant is left
        without an entry (it falls back to the checkpoint, which is what its mark is)."""
        file = self._file
        assert file is not None
        lock = self._log.lock
        reclamation = self._reclamation
        with self._write_lock:
            with lock:
                record = reclamation.record
                capacity = reclamation.tenant_capacity()
                generation = file.generation + 1
                dirty = False
                for tenant, m in marks.items():
                    before = record.next_slot_id
                    try:
                        slot = record.assign_slot(tenant, capacity)
                    except TenantCapacityExceeded as exc:
                        if checkpointed is None:
                            raise PublishedWriteError(
                                f"no slot id for tenant {tenant!r} in {file.path}: {exc}"
                            ) from exc
                        continue
                    if record.next_slot_id != before:
                        reclamation.touch_locked()
                    old = self._entries.get(slot)
                    try:
                        merged = merge_marks(tenant, None if old is None else old.marks, m)
                    except ValueError as exc:
                        raise PublishedWriteError(
                            f"{exc}; {file.path} is not written",
                            checkpointed=bool(checkpointed),
                        ) from exc
                    new = PublishedEntry.of(merged, generation)
                    if old is None or not new.same_marks(old):
                        new.generation = generation
                        self._entries[slot] = new
                        dirty = True
                if not dirty:
                    return False
                snapshot = self._record_locked()
            try:
                file.write(snapshot)
            except OSError as exc:
                raise PublishedWriteError(
                    f"writing {file.path} failed: {exc}; the previous frontiers stay in force",
                    checkpointed=bool(checkpointed),
                ) from exc
            with lock:
                self._durable = {
                    r.tenant: e.marks
                    for i, e in snapshot.entries.items()
                    if (r := snapshot.dictionary[i]) and not r.tombstoned
                }
            return True

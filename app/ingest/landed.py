"""Exactly once in the store: publish intents, and what a restart finds already landed.

Every object the publisher writes states its claim first (``sink.claims``: the frames
whose rows a records object holds, the template events an audit object holds), and
``intent_hook`` makes it durable in the WAL root's ``PUBLISHING`` sidecar
(``wal.IntentLog``) before the PUT. After a crash recovery takes the intents whose
claims lie above their tenant's replay gates — everything else it would not publish
anyway — asks the store which of those objects exist (``LandedCheck``: one ``exists``
per distinct key, in parallel, retried while the store does not answer), and builds
``Landed``: per frame, the UTC days whose records are already in the store, and the
template events already there. The replay then forwards nothing ``Landed`` holds.

The cost at start-up is one request per object that may exist above the frontier: the
barrier trims the sidecar after every cut whose PUBLISHED write landed
(``live_intent``), so intents wholly at or below their tenant's frontier are gone; a
publish that failed cleanly takes its intent back (``retract_hook``); and the check
takes back those of the objects it found absent, so a restart loop during an outage
does not pile them up. Where one prefix holds many of the keys asked about (this
node's objects of one tenant and day: a long outage's spooled units), the check lists
that prefix once instead of asking key by key (``LIST_MIN``) and confirms only the keys
the listing holds, so its cost follows the objects there, not the intents.

Why an object that exists may be trusted for exactly its claim: its key is written by
one attempt at one set of rows — a fresh UUIDv7 name, the same name again only for a
retry of the very same rows after an ambiguous failure (written conditionally), or a
settlement's derived name, which its rows determine — and the claim is read off those
rows before the PUT. A clean failure wrote nothing, so the intent of an object that
does not exist suppresses nothing. See docs/ARCHITECTURE.md "Exactly once in the
store" for the crash cases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sink import Claim, IntentHook, ObjectStore, StoreError
from wal import IntentEntry, IntentLog, IntentRecord, ObjectKind, PublishedMarks

log = logging.getLogger("ourios.landed")

#: parallel ``exists`` requests of one check (a HEAD is a round trip; they overlap)
CHECK_THREADS = 16
#: keys under one listing prefix from which the check lists it instead of asking each
LIST_MIN = 64
#: the length of the UUID that ends an object's name (``sink.keys.new_object_name``)
_UUID_CHARS = 36
#: the first and the longest wait between retries of an ``exists`` the store failed
RETRY_FIRST_SECS = 0.25
RETRY_MAX_SECS = 5.0


def intent_hook(intents: IntentLog) -> IntentHook:
    """The publisher's hook: each claim appended and fsynced before its PUT."""

    def record(claim: Claim) -> None:
        intents.append(
            IntentRecord(claim.kind, claim.tenant, claim.key, claim.day, claim.frames, claim.events)
        )

    return record


def retract_hook(intents: IntentLog) -> Callable[[str], None]:
    """The publisher's retraction: a clean failure's object does not exist."""

    def retract(key: str) -> None:
        intents.retract([key])

    return retract


def live_intent(
    marks: Mapping[str, PublishedMarks], checkpoint: int
) -> Callable[[IntentEntry], bool]:
    """Whether an intent is still needed: some claim lies above its tenant's durable
    frontier on its side (the checkpoint for a tenant PUBLISHED has no entry for). A
    side without a frontier keeps it (a terminal tenant, an intent's empty side)."""

    def keep(rec: IntentEntry) -> bool:
        m = marks.get(rec.tenant)
        if m is None:
            return rec.highest_lsn > checkpoint
        side = m.records if rec.kind is ObjectKind.RECORDS else m.audit
        return side is None or rec.highest_lsn > side.lsn

    return keep


@dataclass
class Landed:
    """What the store already holds of the frames a restart replays (module docstring)."""

    #: (tenant, frame end LSN) -> the UTC days whose rows of that frame are in the store
    records: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    #: (tenant, frame end LSN, template_id, template_version) of events in the store
    events: set[tuple[str, int, int, int]] = field(default_factory=set)
    #: objects asked about, and found
    checked: int = 0
    present: int = 0

    def add(self, rec: IntentRecord) -> None:
        if rec.kind is ObjectKind.RECORDS:
            for lsn in rec.frames:
                self.records.setdefault((rec.tenant, lsn), set()).add(rec.day)
        else:
            self.events.update((rec.tenant, *e) for e in rec.events)

    def days(self, tenant: str, lsn: int) -> frozenset[int]:
        """The days of the frame ending at ``lsn`` whose rows are in the store."""
        found = self.records.get((tenant, lsn))
        return frozenset(found) if found else frozenset()

    def has_event(self, tenant: str, lsn: int, template_id: int, version: int) -> bool:
        return (tenant, lsn, template_id, version) in self.events


def _agreed(intents: Iterable[IntentRecord]) -> list[IntentRecord]:
    """One claim per key: what every intent recorded for it agrees on. Attempts at one
    key hold the same rows (module docstring), but should two ever state different
    claims, only what both state is certainly in the object — suppressing less can cost
    a copy, suppressing more could lose a row."""
    by_key: dict[str, IntentRecord] = {}
    for rec in intents:
        seen = by_key.get(rec.key)
        if seen is None:
            by_key[rec.key] = rec
        elif seen != rec:
            frames = tuple(f for f in seen.frames if f in set(rec.frames))
            events = tuple(e for e in seen.events if e in set(rec.events))
            by_key[rec.key] = IntentRecord(
                seen.kind, seen.tenant, seen.key, seen.day, frames, events
            )
    return list(by_key.values())


class LandedCheck:
    """Asks the store which intended objects exist, on threads of its own, so the node
    is ready meanwhile; the replay waits for ``result`` before its first frame."""

    def __init__(
        self,
        store: ObjectStore,
        intents: list[IntentRecord],
        *,
        threads: int = CHECK_THREADS,
        on_unavailable: Callable[[str, StoreError], None] | None = None,
        on_absent: Callable[[list[str]], object] | None = None,
        list_min: int = LIST_MIN,
    ) -> None:
        self._store = store
        self._intents = intents
        self._threads = threads
        self._on_unavailable = on_unavailable
        #: told the keys found absent once the check is complete (their intents go)
        self._on_absent = on_absent
        self._list_min = list_min
        #: prefixes listed instead of asking key by key
        self.listed = 0
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._landed: Landed | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._warned = False
        self._warn_lock = threading.Lock()

    @property
    def keys(self) -> list[str]:
        """The distinct objects the check asks about, in intent order."""
        return list(dict.fromkeys(r.key for r in self._intents))

    def start(self) -> LandedCheck:
        self._thread = threading.Thread(target=self._run, name="ourios-landed", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop waiting for a store that does not answer (shutdown)."""
        self._cancel.set()

    def result(self) -> Landed | None:
        """The check's answer, once every object was asked about; None when cancelled
        first. Re-raises what broke the check itself (never a store's failure: those
        are retried)."""
        while not self._done.wait(0.25):
            if self._cancel.is_set():
                return None
        if self._error is not None:
            raise self._error
        return self._landed

    def run(self) -> Landed | None:
        """The check on the calling thread (tests, tools)."""
        self._run()
        return self.result()

    def _run(self) -> None:
        try:
            keys = self.keys
            present: set[str] = set()
            ask = self._listed(keys)
            if ask:
                with ThreadPoolExecutor(
                    max_workers=min(self._threads, len(ask)), thread_name_prefix="ourios-landed"
                ) as pool:
                    for key, found in zip(ask, pool.map(self._exists, ask), strict=True):
                        if found:
                            present.add(key)
            landed = Landed(checked=len(keys), present=len(present))
            for rec in _agreed(r for r in self._intents if r.key in present):
                landed.add(rec)
            if not self._cancel.is_set():
                self._landed = landed
                if self._on_absent is not None:
                    self._on_absent([k for k in keys if k not in present])
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            self._error = exc
        finally:
            self._done.set()

    def _listed(self, keys: list[str]) -> list[str]:
        """The keys still to ask about one by one: under a prefix holding ``list_min``
        of them or more, that prefix is listed once and only the keys it holds are
        asked about (``exists`` stays the word that an object is durable)."""
        groups: dict[str, list[str]] = {}
        for key in keys:
            groups.setdefault(_list_prefix(key), []).append(key)
        ask: list[str] = []
        for prefix, group in groups.items():
            if len(group) < self._list_min:
                ask.extend(group)
                continue
            stored = self._list(prefix)
            if stored is None:
                ask.extend(group)  # cancelled: the result is discarded anyway
                continue
            self.listed += 1
            ask.extend(k for k in group if k in stored)
        return ask

    def _list(self, prefix: str) -> set[str] | None:
        delay = RETRY_FIRST_SECS
        while not self._cancel.is_set():
            try:
                return set(self._store.list(prefix))
            except StoreError as exc:
                with self._warn_lock:
                    first, self._warned = not self._warned, True
                if first and self._on_unavailable is not None:
                    self._on_unavailable(prefix, exc)
                log.warning("recovery cannot list %s in the store yet: %s", prefix, exc)
                self._cancel.wait(delay)
                delay = min(RETRY_MAX_SECS, delay * 2)
        return None

    def _exists(self, key: str) -> bool:
        delay = RETRY_FIRST_SECS
        while not self._cancel.is_set():
            try:
                return self._store.exists(key)
            except StoreError as exc:
                with self._warn_lock:
                    first, self._warned = not self._warned, True
                if first and self._on_unavailable is not None:
                    self._on_unavailable(key, exc)
                log.warning("recovery cannot ask the store about %s yet: %s", key, exc)
                self._cancel.wait(delay)
                delay = min(RETRY_MAX_SECS, delay * 2)
        return False  # cancelled: the result is discarded


def _list_prefix(key: str) -> str:
    """The listing prefix of an object key: its directory and the node part of its name
    (``<dir>/<node>-``), so a listing holds only this node's objects of that day."""
    directory, _, name = key.rpartition("/")
    stem = name.removesuffix(".parquet")
    node = stem[:-_UUID_CHARS] if len(stem) > _UUID_CHARS else ""
    return f"{directory}/{node}"

"""PUBLISHING: the publish intents — which object is about to hold which rows.

Before the node PUTs an object to the store it appends one record here naming the
object's key and exactly what the object holds, and fsyncs it; only then does the PUT
start. So after any crash every object that may exist above a tenant's publication
frontier has its record here, and recovery can ask the store whether it landed and, if
it did, suppress exactly the rows it holds instead of publishing them a second time
(docs/ARCHITECTURE.md "Exactly once in the store"). The WAL knows nothing of objects:
a record is a key, a tenant, a kind, a UTC day and a list of claims, as ``app`` hands
them in. All integers little-endian::

    file header, 16 B
      0   4  magic b"OWPI"
      4   2  u16 version 1
      6   2  reserved, zero
      8   4  reserved, zero
      12  4  u32 CRC-32C (Castagnoli) over bytes [0, 12)

    then records, appended, each
      0   4  u32 body_len    12 <= body_len <= MAX_BODY
      4   4  u32 crc32c      CRC-32C over the body
      8      body
        u8  kind             1 records, 2 audit (0 and others refused)
        u8  reserved, zero
        u16 tenant_len | tenant (ASCII, 1..128 bytes)
        u16 key_len    | key    (UTF-8, 1..1024 bytes: the object's store key)
        u32 day              the object's UTC day number (its ``date=`` partition)
        u32 count            claims, 1..MAX_CLAIMS
        records: count × u64 frame end LSN, strictly increasing — the object holds
                 every one of the tenant's rows of that day from each of these frames,
                 and no other row
        audit:   count × (u64 frame end LSN, i64 template_id, i32 template_version) —
                 the template events it holds, one claim per event, in row order

A claim is exact, never a range: a partition merged after a failed publish can skip
frames another object holds, so "first to last" would state more than the object has
and recovery would drop rows that are nowhere else.

Crash cases. *A crash while a record is written*: its PUT never started (the fsync
comes first), so a torn or checksum-failing tail means nothing. Reading stops at the
first record that does not verify; open truncates the file there in place and fsyncs
it, so nothing is ever appended behind damage, and reports the bytes it dropped. In
place because a truncation frees blocks and never needs one: a node killed during an
append on a full volume must start on that volume (a rewrite through a temp needed a
new block and failed every start with ENOSPC). A power loss before the fsync may undo
the truncation; the next open finds the same tail and cuts it again. Only a tail can be
torn — every earlier record was fsynced before the next was written — so a bad record
with good ones after it is bit rot; what it hid can only make recovery suppress less (a
duplicate), never more (a loss), because a record only ever *suppresses* rows, and only
those of an object the store confirms. *A crash after the record, before or during the
PUT*: the object may or may not exist; recovery asks the store. *A crash after the
PUT*: it exists.

Version policy: version 1 is the only one written and read; any other version, a bad
header CRC or a non-zero reserved byte in the header refuses the start naming the file
(``CorruptionError``), never parsed around. Golden bytes:
``tests/unit/wal/data/publishing_v1.bin``.

Trimming: a record is needed only while some claim lies above its tenant's publication
frontier. ``trim(keep)`` rewrites the file with the records ``keep`` accepts (temp, fsync,
rename, directory fsync), so the file, and recovery's work, stay bounded by
what was published since the frontier.

Retracting (issue 21): a record is needed only while its object may exist. A publish
that failed cleanly wrote nothing, and an object a restart's check found absent is not
there; ``retract(keys)`` takes their records back in memory at once and compacts the
file (the same rewrite) once the retracted bytes outgrow the live ones. Equal records
are one (an append of a record in force writes nothing), so an object retried under
its own name — a spooled unit, an ambiguous retry — has one record however many
attempts it takes. The file is therefore bounded by the objects that may exist above
the frontiers, not by the attempts, and memory holds one small ``IntentEntry`` per
record (its claims are read back from the file when recovery needs them).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final

import crc32c

from .errors import CorruptionError, WalError
from .fs import Fs, read_file
from .tenant import MAX_TENANT_BYTES

MAGIC: Final = b"OWPI"
VERSION: Final = 1
HEADER_SIZE: Final = 16
MAX_KEY_BYTES: Final = 1024
MAX_CLAIMS: Final = 1 << 20
#: retracted bytes a file may hold before it is compacted, beyond the live ones
COMPACT_FLOOR: Final = 64 << 10
MAX_BODY: Final = 8 + 2 + MAX_TENANT_BYTES + 2 + MAX_KEY_BYTES + 8 + 20 * MAX_CLAIMS

_HEAD: Final = struct.Struct("<4sHHI")  # 12, then the CRC
_REC: Final = struct.Struct("<II")  # body_len, crc
_KIND: Final = struct.Struct("<BBH")  # kind, reserved, tenant_len
_LEN: Final = struct.Struct("<H")
_DAY: Final = struct.Struct("<II")  # day, count
_FRAME: Final = struct.Struct("<Q")
_EVENT: Final = struct.Struct("<Qqi")


class ObjectKind(enum.Enum):
    """What a published object holds, records or audit: the one name for it in the publish
    intents here, the sink's partitions and its object keys (the value is the key's
    top-level directory, ``sink/keys.py``)."""

    RECORDS = "records"
    AUDIT = "audit"


#: An intent's kind byte (from 1: zeroed bytes never decode as a kind).
_KIND_CODES: Final = {ObjectKind.RECORDS: 1, ObjectKind.AUDIT: 2}
_KINDS_BY_CODE: Final = {code: kind for kind, code in _KIND_CODES.items()}


class IntentWriteError(WalError):
    """A publish intent could not be made durable (the caller decides what that costs)."""

    error_type = "wal_intent_write"


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """One object about to be written and exactly what it holds (module docstring)."""

    kind: ObjectKind
    tenant: str
    key: str
    day: int
    #: records: the frames whose rows of ``day`` it holds, increasing
    frames: tuple[int, ...] = ()
    #: audit: (frame end LSN, template_id, template_version) per event it holds
    events: tuple[tuple[int, int, int], ...] = ()

    @property
    def highest_lsn(self) -> int:
        """The newest frame any claim names."""
        if self.kind is ObjectKind.RECORDS:
            return self.frames[-1]
        return max(e[0] for e in self.events)


def encode_header() -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, 0, 0)
    return head + struct.pack("<I", crc32c.crc32c(head))


def decode_header(data: bytes, path: Path) -> None:
    """Refuse (``CorruptionError``) anything but a whole version-1 header."""
    if len(data) < HEADER_SIZE:
        raise CorruptionError(path, 0, f"{len(data)} bytes: shorter than the 16-byte header")
    magic, version, r1, r2 = _HEAD.unpack_from(data)
    (crc,) = struct.unpack_from("<I", data, 12)
    if magic != MAGIC:
        raise CorruptionError(path, 0, f"magic {magic!r}, expected {MAGIC!r}")
    if crc != crc32c.crc32c(data[:12]):
        raise CorruptionError(path, 12, "the header's CRC-32C does not match")
    if version != VERSION:
        raise CorruptionError(path, 4, f"version {version} is not supported (only {VERSION})")
    if r1 or r2:
        raise CorruptionError(path, 6, "a reserved header byte is not zero")


def encode_record(rec: IntentRecord) -> bytes:
    """The record's bytes (length, CRC, body); ``ValueError`` naming what does not fit."""
    tenant = rec.tenant.encode("ascii")
    key = rec.key.encode("utf-8")
    if not 1 <= len(tenant) <= MAX_TENANT_BYTES:
        raise ValueError(
            f"tenant {rec.tenant!r} is {len(tenant)} bytes: must be 1..{MAX_TENANT_BYTES}"
        )
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"key {rec.key!r} is {len(key)} bytes: must be 1..{MAX_KEY_BYTES}")
    if not 0 <= rec.day < 1 << 32:
        raise ValueError(f"day {rec.day} is not a u32")
    parts = [_KIND.pack(_KIND_CODES[rec.kind], 0, len(tenant)), tenant, _LEN.pack(len(key)), key]
    if rec.kind is ObjectKind.RECORDS:
        frames = rec.frames
        if rec.events or not 1 <= len(frames) <= MAX_CLAIMS:
            raise ValueError(f"a records intent claims 1..{MAX_CLAIMS} frames and no events")
        if any(b <= a for a, b in zip(frames, frames[1:], strict=False)):
            raise ValueError(f"a records intent's frames must increase: {frames[:8]}...")
        parts.append(_DAY.pack(rec.day, len(frames)))
        parts.append(struct.pack(f"<{len(frames)}Q", *frames))
    else:
        events = rec.events
        if rec.frames or not 1 <= len(events) <= MAX_CLAIMS:
            raise ValueError(f"an audit intent claims 1..{MAX_CLAIMS} events and no frames")
        parts.append(_DAY.pack(rec.day, len(events)))
        parts.extend(_EVENT.pack(*e) for e in events)
    body = b"".join(parts)
    return _REC.pack(len(body), crc32c.crc32c(body)) + body


def decode_body(body: bytes) -> IntentRecord:
    """A verified body's record; ``ValueError`` naming the first thing that is wrong."""
    kind_raw, reserved, tenant_len = _KIND.unpack_from(body, 0)
    if reserved:
        raise ValueError("a reserved byte is not zero")
    kind = _KINDS_BY_CODE.get(kind_raw)
    if kind is None:
        raise ValueError(f"{kind_raw} is not a valid intent kind")
    at = _KIND.size
    tenant = body[at : at + tenant_len].decode("ascii")
    if not 1 <= tenant_len <= MAX_TENANT_BYTES or len(tenant) != tenant_len:
        raise ValueError(f"tenant length {tenant_len}")
    at += tenant_len
    (key_len,) = _LEN.unpack_from(body, at)
    at += _LEN.size
    key = body[at : at + key_len].decode("utf-8")
    if not 1 <= key_len <= MAX_KEY_BYTES or len(body[at : at + key_len]) != key_len:
        raise ValueError(f"key length {key_len}")
    at += key_len
    day, count = _DAY.unpack_from(body, at)
    at += _DAY.size
    if not 1 <= count <= MAX_CLAIMS:
        raise ValueError(f"{count} claims")
    width = _FRAME.size if kind is ObjectKind.RECORDS else _EVENT.size
    if len(body) != at + count * width:
        raise ValueError(f"{len(body)} bytes for {count} claims of {width} bytes at {at}")
    if kind is ObjectKind.RECORDS:
        frames = struct.unpack_from(f"<{count}Q", body, at)
        if any(b <= a for a, b in zip(frames, frames[1:], strict=False)):
            raise ValueError("frames do not increase")
        return IntentRecord(kind, tenant, key, day, frames=tuple(frames))
    events = tuple(_EVENT.unpack_from(body, at + i * width) for i in range(count))
    return IntentRecord(kind, tenant, key, day, events=events)


@dataclass
class IntentScan:
    """What reading a file found: its records and the bytes after the last good one."""

    records: list[IntentRecord] = field(default_factory=list)
    #: where the valid prefix ends (header included)
    valid_end: int = HEADER_SIZE
    #: bytes at and after the first record that did not verify (dropped at open)
    dropped_bytes: int = 0
    #: why the first dropped record did not verify ("" when nothing was dropped)
    dropped_reason: str = ""


def scan(data: bytes, path: Path) -> IntentScan:
    """Decode a whole file: the header must be whole and version 1; records are read
    until the first that does not verify (module docstring)."""
    decode_header(data, path)
    out = IntentScan()
    at = HEADER_SIZE
    while at < len(data):
        reason = ""
        if len(data) - at < _REC.size:
            reason = f"a torn record header at offset {at}"
        else:
            body_len, crc = _REC.unpack_from(data, at)
            end = at + _REC.size + body_len
            if not 12 <= body_len <= MAX_BODY:
                reason = f"record length {body_len} at offset {at}"
            elif end > len(data):
                reason = f"a torn record at offset {at} ({body_len} bytes, {len(data) - at} left)"
            else:
                body = data[at + _REC.size : end]
                if crc32c.crc32c(body) != crc:
                    reason = f"the record at offset {at} fails its CRC-32C"
                else:
                    try:
                        out.records.append(decode_body(body))
                    except (ValueError, UnicodeDecodeError, struct.error) as exc:
                        reason = f"the record at offset {at} does not decode: {exc}"
        if reason:
            out.dropped_bytes = len(data) - at
            out.dropped_reason = reason
            break
        at = end
    out.valid_end = at
    return out


@dataclass(frozen=True, slots=True)
class IntentEntry:
    """What the log keeps in memory of one record: never its claims (a long outage's
    records name every frame it holds), only what a trim decides by and where its bytes
    are in the file."""

    kind: ObjectKind
    tenant: str
    key: str
    #: the newest frame any claim names (``IntentRecord.highest_lsn``)
    highest_lsn: int
    offset: int
    length: int
    #: CRC-32C of the record's body: equal records are one intent
    crc: int


class IntentLog:
    """The PUBLISHING file of a WAL root, open for appends (module docstring).

    Thread-safe: appends (any publishing thread), retractions and trims take one lock.
    ``OSError`` from the seam is raised as ``IntentWriteError`` naming the file and the
    step; the in-memory entries change only when the file did. Memory holds an
    ``IntentEntry`` per record, never the claims: ``records`` reads them from the file."""

    NAME: ClassVar[str] = "PUBLISHING"
    TEMP: ClassVar[str] = "PUBLISHING.tmp"

    def __init__(self, fs: Fs, root: Path, fd: int, size: int, records: list[IntentRecord]):
        self._fs = fs
        self._root = root
        self._fd: int | None = fd
        self._entries: list[IntentEntry] = []
        self._known: dict[tuple[str, int], IntentEntry] = {}
        at = HEADER_SIZE
        for rec in records:
            entry = _entry(rec, encode_record(rec), at)
            at += entry.length
            self._add(entry)
        self._size = at  # open rewrote the file to exactly these records (``size``)
        #: bytes of retracted records still in the file (``retract``)
        self._dead = 0
        #: retracted bytes the file may hold before it is compacted (beyond the live ones)
        self.compact_floor = COMPACT_FLOOR
        self._lock = threading.Lock()
        self._closed = False
        #: what open found after the last good record (reported once, by the caller)
        self.opened = IntentScan()

    def _add(self, entry: IntentEntry) -> None:
        self._entries.append(entry)
        self._known[(entry.key, entry.crc)] = entry

    @property
    def path(self) -> Path:
        return self._root / self.NAME

    @classmethod
    def open(cls, fs: Fs, root: Path) -> IntentLog:
        """Open (creating it when absent) and read every record; a torn or damaged tail
        is cut off in place (truncated and fsynced: no block needed on a full volume),
        so appends never follow damage."""
        path = root / cls.NAME
        temp = root / cls.TEMP
        try:
            try:
                fs.unlink(temp)  # a trim a crash interrupted: the old file is whole
            except FileNotFoundError:
                pass
            try:
                data = read_file(fs, path)
            except FileNotFoundError:
                data = b""
                found = IntentScan()
                _rewrite(fs, root, [])
                fd = fs.open(path, os.O_WRONLY)
            else:
                found = scan(data, path)
                fd = fs.open(path, os.O_WRONLY)
                if found.dropped_bytes:
                    try:
                        fs.ftruncate(fd, found.valid_end)
                        fs.fsync(fd)
                    except OSError:
                        fs.close(fd)
                        raise
        except OSError as exc:
            raise IntentWriteError(f"{path}: open failed: {exc}") from exc
        size = found.valid_end
        log = cls(fs, root, fd, size, list(found.records))
        log.opened = IntentScan([], found.valid_end, found.dropped_bytes, found.dropped_reason)
        return log

    def records(self) -> list[IntentRecord]:
        """Every record in force, oldest first (read back from the file)."""
        with self._lock:
            entries = list(self._entries)
            if not entries:
                return []
            data = self._read_locked()
        return [_decode_at(data, e) for e in entries]

    def entries(self) -> list[IntentEntry]:
        """What memory holds of every record in force, oldest first."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def size(self) -> int:
        """The file's length in bytes (the header, the records in force and the
        retracted ones not compacted yet)."""
        with self._lock:
            return self._size

    def append(self, rec: IntentRecord) -> None:
        """Make ``rec`` durable (write at the end, fsync) before the caller's PUT. A
        record equal to one in force is already durable: nothing is written."""
        data = encode_record(rec)
        with self._lock:
            entry = _entry(rec, data, self._size)
            if (entry.key, entry.crc) in self._known:
                return
            try:
                fd = self._reopen_locked()
                # At the logical end: a write that failed half-way is overwritten.
                self._fs.pwrite(fd, data, self._size)
                self._fs.fsync(fd)
            except OSError as exc:
                raise IntentWriteError(
                    f"{self.path}: appending the intent for {rec.key} at offset {self._size} "
                    f"failed: {exc}"
                ) from exc
            self._size += len(data)
            self._add(entry)

    def retract(self, keys: Iterable[str]) -> int:
        """Take back the records of ``keys``: objects known not to exist (a clean
        failure wrote nothing; a restart's check found none). Only memory changes — a
        crash before the next rewrite leaves them in the file, which costs a restart
        one question each, never a row — and the file is compacted once the retracted
        bytes outgrow the live ones (``compact_floor`` at least). Returns how many
        records were taken back. A failed compaction is left for the next one."""
        gone = set(keys)
        with self._lock:
            kept = [e for e in self._entries if e.key not in gone]
            dropped = len(self._entries) - len(kept)
            if not dropped:
                return 0
            self._dead += sum(e.length for e in self._entries if e.key in gone)
            self._entries = kept
            self._known = {(e.key, e.crc): e for e in kept}
            live = self._size - HEADER_SIZE - self._dead
            if self._dead > max(self.compact_floor, live) and not self._closed:
                try:
                    self._rewrite_locked(kept)
                except IntentWriteError:
                    pass  # the records stay retracted in memory; the next one compacts
            return dropped

    def trim(self, keep: Callable[[IntentEntry], bool]) -> int:
        """Rewrite the file with the records ``keep`` accepts (retracted ones dropped
        too); returns how many records in force were dropped (0: nothing written). On
        failure the file and the records in force are unchanged (``IntentWriteError``)."""
        with self._lock:
            kept = [e for e in self._entries if keep(e)]
            dropped = len(self._entries) - len(kept)
            if not dropped:
                return 0
            self._rewrite_locked(kept)
            return dropped

    def _rewrite_locked(self, kept: list[IntentEntry]) -> None:
        """Replace the file with ``kept`` (their bytes copied from it) and take them as
        the records in force; ``IntentWriteError`` leaves both as they were."""
        if self._closed:
            raise IntentWriteError(f"{self.path}: closed")
        try:
            data = self._read_locked() if kept else b""
            encoded = [data[e.offset : e.offset + e.length] for e in kept]
            _rewrite(self._fs, self._root, encoded)
        except OSError as exc:
            raise IntentWriteError(f"{self.path}: rewriting failed: {exc}") from exc
        # The new file is in place: appends go to it from now on (reopened lazily
        # should this open fail).
        if self._fd is not None:
            self._fs.close(self._fd)
        self._fd = None
        self._entries = []
        self._known = {}
        at = HEADER_SIZE
        for e, raw in zip(kept, encoded, strict=True):
            self._add(dataclasses.replace(e, offset=at))
            at += len(raw)
        self._size = at
        self._dead = 0
        try:
            self._reopen_locked()
        except OSError:
            pass  # the next append retries the open

    def _read_locked(self) -> bytes:
        """The file's bytes up to its logical end."""
        return read_file(self._fs, self.path)[: self._size]

    def _reopen_locked(self) -> int:
        if self._closed:
            raise IntentWriteError(f"{self.path}: closed")
        if self._fd is None:
            self._fd = self._fs.open(self.path, os.O_WRONLY)
        return self._fd

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                self._fs.close(self._fd)
                self._fd = None

    @property
    def closed(self) -> bool:
        return self._closed


def _entry(rec: IntentRecord, data: bytes, offset: int) -> IntentEntry:
    (crc,) = struct.unpack_from("<I", data, 4)
    return IntentEntry(rec.kind, rec.tenant, rec.key, rec.highest_lsn, offset, len(data), crc)


def _decode_at(data: bytes, e: IntentEntry) -> IntentRecord:
    return decode_body(data[e.offset + _REC.size : e.offset + e.length])


def _rewrite(fs: Fs, root: Path, records: Iterable[bytes]) -> None:
    """Replace PUBLISHING with a header and ``records``: temp, fsync, rename, directory
    fsync — a crash leaves the old file or the new one."""
    temp = root / IntentLog.TEMP
    fd = fs.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, encode_header() + b"".join(records))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(temp, root / IntentLog.NAME)
    fs.fsync_dir(root)

"""Object keys: where each published object lives in the store.

Layout (DESIGN.md §3; the prefix is the store's own, applied by the store)::

    [<prefix>/]records/tenant=<pct-tenant>/date=<YYYY-MM-DD>/<name>.parquet
    [<prefix>/]audit/tenant=<pct-tenant>/date=<YYYY-MM-DD>/<name>.parquet
    [<prefix>/]wal-archive/<node>/<segment-file-name>

    e.g. records/tenant=acme%3Dprod/date=2024-05-01/
             ourios-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192a3.parquet   (one key, wrapped)

``<pct-tenant>`` is the tenant id with every byte outside RFC 3986's unreserved set
(``A-Z a-z 0-9 - . _ ~``) written ``%XX`` (uppercase hex). Tenant ids are 1–128 ASCII
graphic bytes other than ``:`` ``#`` ``/`` (DESIGN.md §3; the rule is ``wal/tenant.py``'s),
so the encoded segment never holds ``/`` or ``=`` and decoding is exact: ``decode_tenant``
accepts only the canonical form ``encode_tenant`` produces, so one tenant has exactly one
spelling in the store.

``<YYYY-MM-DD>`` is the UTC day of the partitioning timestamp (the caller chooses which
of a record's timestamps partitions it).

``<name>`` is ``<node>-<uuid7>``: the writer's node identity (the pod name, e.g.
``ourios-2``, made a safe lowercase DNS label by ``node_identity``) then a fresh
UUIDv7. The UUID alone is unique with overwhelming probability; the node part makes a
collision between replicas impossible by construction (DESIGN.md §10), tells an
operator which replica wrote an object, and keeps later name-based (RFC 4122 v5) names
— derived from WAL offsets, which replicas share — apart per replica. The key builders
take the name as an argument, so a different naming scheme is a different
``name``-producing function, nothing else.

A publish retried after an *ambiguous* failure keeps the name its failed attempt used
(the publish intent recorded it: ``sink.publisher``). The records of a settlement's
intent span are named deterministically instead, by RFC 0055 §9.2's derivation (which
the RFC made for every ambiguous retry): ``<node>-<uuid5>``, the RFC 4122 version-5 UUID (SHA-1) in
the namespace ``6f757269-6f73-5055-424c-000000000001`` (fixed for the life of the
format; its bytes spell "ourios" and "PUBL") of this serialisation, the normative one
the seed's missing table leaves to us — integers little-endian, every variable-length
part preceded by its u16 length, concatenated with no padding or separator::

    u16 tenant_len | tenant (ASCII)           the tenant id
    u16 key_len    | partition key (ASCII)    "date=YYYY-MM-DD", the record partition
    u64 first_lsn                             the first frame of the rows (its wal_lsn,
    u64 last_lsn                              i.e. the frame's end), and the last frame
    u32 first_index                           the lowest record_index among the rows of
    u32 last_index                            the first frame; the highest in the last

Nothing else enters the name (no time, no attempt count, no row contents), so every
attempt at the same rows derives the same name, and different rows never share one:
a frame's rows of one day land in one partition together, so two units of a tenant
and day never hold the same first and last frame. The node part keeps replicas apart
(WAL offsets are per node). The records of a settlement's intent span (RFC 0055 §9.4,
``sink.buffers`` "staged") are named the same way: the span's rows of one day are one
unit, so the settlement and every recovery that republishes the span derive one name.

The template events of an intent span that name templates the tree had before the
rebuild (``changed`` events of known ids) are named by their content instead
(``audit_object_name``): ``<node>-<uuid5>`` in the same namespace over::

    u16 0                                     never a tenant length: no records name
    u16 tenant_len | tenant (ASCII)           aliases an audit one
    u16 key_len    | partition key (ASCII)    "date=YYYY-MM-DD"
    32 B SHA-256 of the rows, in order, each:
        i64 template_id | i32 template_version | u16 change_len | change (ASCII)
        | u32 template_len | template (UTF-8) | u64 wal_lsn | u64 time_unix_nano

The rows are a pure function of the snapshot and the frames, so every attempt at the
span derives them and the name again; rows that differ (a frame mined by one attempt
and isolated by another) get another name, so a retry never skips an event it has and
the stored object lacks — at worst the overlap is stored twice.

Invariant: every key built here is a valid store key (``check_key``): no empty, ``.``
or ``..`` segment, no segment starting with ``.`` (reserved for ``LocalStore``'s temp
files), no leading or trailing ``/``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import string
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import uuid6

from wal import ObjectKind
from wal.tenant import MAX_TENANT_BYTES, bad_tenant_char

__all__ = [
    "ARCHIVE_ROOT",
    "NANOS_PER_DAY",
    "PARQUET_SUFFIX",
    "KeyFormatError",
    "ParsedKey",
    "archive_key",
    "audit_key",
    "audit_object_name",
    "check_key",
    "check_tenant",
    "decode_tenant",
    "encode_tenant",
    "join_prefix",
    "new_object_name",
    "node_identity",
    "normalize_prefix",
    "object_key",
    "parse_object_key",
    "partition_date",
    "records_key",
    "retry_object_name",
]

NANOS_PER_DAY: Final = 86_400 * 1_000_000_000
PARQUET_SUFFIX: Final = ".parquet"
ARCHIVE_ROOT: Final = "wal-archive"

_UNRESERVED: Final = frozenset(string.ascii_letters + string.digits + "-._~")
_ENCODE: Final = tuple(chr(b) if chr(b) in _UNRESERVED else f"%{b:02X}" for b in range(128))
_PCT_SEGMENT: Final = re.compile(r"(?:[A-Za-z0-9._~-]|%[0-9A-F]{2})+")
_NAME: Final = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9._~-]*")
_NODE_LABEL: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_EPOCH: Final = dt.date(1970, 1, 1)


class KeyFormatError(ValueError):
    """A tenant, name, prefix or key does not have the shape this module requires."""


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """The parts of a records or audit key (``name`` without ``.parquet``)."""

    kind: ObjectKind
    tenant: str
    day: dt.date
    name: str


def check_tenant(tenant: str) -> None:
    """Raise ``KeyFormatError`` unless ``tenant`` is in the grammar (``wal/tenant.py``)."""
    if not 1 <= len(tenant) <= MAX_TENANT_BYTES:
        raise KeyFormatError(
            f"tenant {tenant!r} is {len(tenant)} bytes: must be 1..{MAX_TENANT_BYTES}"
        )
    bad = bad_tenant_char(tenant)
    if bad is not None:
        raise KeyFormatError(
            f"tenant {tenant!r} holds {tenant[bad]!r}: must be ASCII graphic characters"
            " other than ':', '#', '/'"
        )


def encode_tenant(tenant: str) -> str:
    """The ``tenant=`` path segment's value: unreserved bytes kept, all others ``%XX``."""
    check_tenant(tenant)
    return "".join([_ENCODE[ord(ch)] for ch in tenant])


def decode_tenant(segment: str) -> str:
    """The inverse of ``encode_tenant``; refuses any spelling it would not produce."""
    if _PCT_SEGMENT.fullmatch(segment) is None:
        raise KeyFormatError(f"tenant segment {segment!r} is not percent-encoded")
    parts = segment.split("%")
    tenant = parts[0] + "".join(chr(int(p[:2], 16)) + p[2:] for p in parts[1:])
    try:
        canonical = encode_tenant(tenant)
    except KeyFormatError as exc:
        raise KeyFormatError(f"tenant segment {segment!r} decodes to an invalid tenant") from exc
    if canonical != segment:
        raise KeyFormatError(
            f"tenant segment {segment!r} is not canonical: the canonical form is {canonical!r}"
        )
    return tenant


def partition_date(time_unix_nano: int) -> dt.date:
    """The UTC day holding ``time_unix_nano`` (the ``date=`` partition)."""
    if time_unix_nano < 0:
        raise KeyFormatError(f"timestamp {time_unix_nano} is negative")
    return _EPOCH + dt.timedelta(days=time_unix_nano // NANOS_PER_DAY)


def node_identity(raw: str) -> str:
    """A node identity safe in keys: a lowercase DNS label (``[a-z0-9-]``, ≤ 63 chars).

    A StatefulSet pod name (``ourios-2``) is already one and is returned unchanged.
    Anything else is lowercased, other characters become ``-``, and a 6-hex-digit hash
    of ``raw`` is appended, so two distinct raw identities never share a result.
    """
    if _NODE_LABEL.fullmatch(raw):
        return raw
    cleaned = re.sub(r"[^a-z0-9-]", "-", raw.lower()).strip("-")[:50].strip("-")
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{cleaned}-{digest}" if cleaned else f"node-{digest}"


def new_object_name(node: str) -> str:
    """A fresh object name ``<node>-<uuid7>``; ``node`` must come from ``node_identity``."""
    if _NODE_LABEL.fullmatch(node) is None:
        raise KeyFormatError(f"node identity {node!r} is not a lowercase DNS label")
    return f"{node}-{uuid6.uuid7()}"


#: (template_id, template_version, template, change, wal_lsn, time_unix_nano)
AuditNameRow = tuple[int, int, str, str, int, int]

#: RFC 0055 §9.2's namespace for deterministic object names (never configuration).
RETRY_NAMESPACE: Final = uuid.UUID("6f757269-6f73-5055-424c-000000000001")


def retry_name_bytes(
    tenant: str, day: dt.date, first_lsn: int, last_lsn: int, first_index: int, last_index: int
) -> bytes:
    """The canonical serialisation the deterministic name hashes (module docstring)."""
    check_tenant(tenant)
    if not 0 <= first_lsn <= last_lsn < 1 << 64:
        raise KeyFormatError(f"frame range {first_lsn}..{last_lsn} is not a u64 range")
    if not (0 <= first_index < 1 << 32 and 0 <= last_index < 1 << 32):
        raise KeyFormatError(f"record index range {first_index}..{last_index} is not u32")
    raw_tenant = tenant.encode("ascii")
    raw_key = f"date={day.isoformat()}".encode("ascii")
    return b"".join(
        (
            struct.pack("<H", len(raw_tenant)),
            raw_tenant,
            struct.pack("<H", len(raw_key)),
            raw_key,
            struct.pack("<QQII", first_lsn, last_lsn, first_index, last_index),
        )
    )


def retry_object_name(
    node: str,
    tenant: str,
    day: dt.date,
    first_lsn: int,
    last_lsn: int,
    first_index: int,
    last_index: int,
) -> str:
    """``<node>-<uuid5>``: the name every attempt at these rows uses (module docstring)."""
    if _NODE_LABEL.fullmatch(node) is None:
        raise KeyFormatError(f"node identity {node!r} is not a lowercase DNS label")
    name = retry_name_bytes(tenant, day, first_lsn, last_lsn, first_index, last_index)
    return f"{node}-{uuid5_bytes(RETRY_NAMESPACE, name)}"


def audit_name_bytes(tenant: str, day: dt.date, rows: Iterable[AuditNameRow]) -> bytes:
    """The canonical serialisation ``audit_object_name`` hashes (module docstring)."""
    check_tenant(tenant)
    digest = hashlib.sha256()
    for template_id, version, template, change, wal_lsn, time_unix_nano in rows:
        raw_change = change.encode("ascii")
        raw_template = template.encode("utf-8")
        digest.update(struct.pack("<qiH", template_id, version, len(raw_change)))
        digest.update(raw_change)
        digest.update(struct.pack("<I", len(raw_template)))
        digest.update(raw_template)
        digest.update(struct.pack("<QQ", wal_lsn, time_unix_nano))
    raw_tenant = tenant.encode("ascii")
    raw_key = f"date={day.isoformat()}".encode("ascii")
    return b"".join(
        (
            struct.pack("<HH", 0, len(raw_tenant)),
            raw_tenant,
            struct.pack("<H", len(raw_key)),
            raw_key,
            digest.digest(),
        )
    )


def audit_object_name(node: str, tenant: str, day: dt.date, rows: Iterable[AuditNameRow]) -> str:
    """``<node>-<uuid5>`` over an intent span's template events of one day (module
    docstring): every attempt at the same events derives the same name."""
    if _NODE_LABEL.fullmatch(node) is None:
        raise KeyFormatError(f"node identity {node!r} is not a lowercase DNS label")
    return f"{node}-{uuid5_bytes(RETRY_NAMESPACE, audit_name_bytes(tenant, day, rows))}"


def uuid5_bytes(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    """RFC 4122 §4.3 version 5 over a *binary* name (the stdlib's ``uuid5`` takes a str
    and UTF-8 encodes it, which would change every byte above 0x7f)."""
    digest = hashlib.sha1(namespace.bytes + name, usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def normalize_prefix(prefix: str) -> str:
    """A store prefix without leading/trailing ``/``; each segment must be a valid key segment."""
    stripped = prefix.strip("/")
    if stripped:
        check_key(stripped)
    return stripped


def join_prefix(prefix: str, key: str) -> str:
    """``key`` under ``prefix`` (already normalized); the empty prefix is the root."""
    return f"{prefix}/{key}" if prefix else key


def check_key(key: str) -> None:
    """Raise ``KeyFormatError`` unless ``key`` is a relative ``/``-separated store key.

    Refused: the empty key, a leading or trailing ``/``, an empty segment, a segment
    ``.`` or ``..`` or starting with ``.``, NUL, backslash and other control characters.
    """
    if not key:
        raise KeyFormatError("empty object key")
    for segment in key.split("/"):
        if not segment:
            raise KeyFormatError(f"object key {key!r} has an empty segment or an outer '/'")
        if segment.startswith("."):
            raise KeyFormatError(f"object key {key!r} has a segment starting with '.'")
    for ch in key:
        if ch < " " or ch == "\x7f" or ch == "\\":
            raise KeyFormatError(f"object key {key!r} holds the character {ch!r}")


def _check_name(name: str) -> None:
    if _NAME.fullmatch(name) is None:
        raise KeyFormatError(
            f"object name {name!r} must be unreserved characters not starting with '.'"
        )


def object_key(kind: ObjectKind, tenant: str, day: dt.date, name: str, *, prefix: str = "") -> str:
    """``[<prefix>/]<kind>/tenant=<pct>/date=<day>/<name>.parquet``."""
    _check_name(name)
    key = (
        f"{kind.value}/tenant={encode_tenant(tenant)}/date={day.isoformat()}/{name}{PARQUET_SUFFIX}"
    )
    return join_prefix(normalize_prefix(prefix), key)


def records_key(tenant: str, day: dt.date, name: str, *, prefix: str = "") -> str:
    """The key of a records object."""
    return object_key(ObjectKind.RECORDS, tenant, day, name, prefix=prefix)


def audit_key(tenant: str, day: dt.date, name: str, *, prefix: str = "") -> str:
    """The key of an audit object."""
    return object_key(ObjectKind.AUDIT, tenant, day, name, prefix=prefix)


def archive_key(node: str, segment_file_name: str, *, prefix: str = "") -> str:
    """``[<prefix>/]wal-archive/<node>/<segment-file-name>`` (DESIGN.md §12, archival)."""
    if _NODE_LABEL.fullmatch(node) is None:
        raise KeyFormatError(f"node identity {node!r} is not a lowercase DNS label")
    if "/" in segment_file_name:
        raise KeyFormatError(f"segment file name {segment_file_name!r} must be a bare name")
    _check_name(segment_file_name)
    return join_prefix(normalize_prefix(prefix), f"{ARCHIVE_ROOT}/{node}/{segment_file_name}")


def parse_object_key(key: str, *, prefix: str = "") -> ParsedKey:
    """The parts of a records or audit key built by ``object_key`` with the same prefix."""
    base = normalize_prefix(prefix)
    rest = key
    if base:
        if not key.startswith(base + "/"):
            raise KeyFormatError(f"object key {key!r} is not under prefix {base!r}")
        rest = key[len(base) + 1 :]
    parts = rest.split("/")
    if len(parts) != 4:
        raise KeyFormatError(f"object key {key!r} does not have 4 segments under the prefix")
    kind_s, tenant_s, date_s, file_s = parts
    try:
        kind = ObjectKind(kind_s)
    except ValueError:
        raise KeyFormatError(f"object key {key!r} has unknown kind {kind_s!r}") from None
    if not tenant_s.startswith("tenant=") or not date_s.startswith("date="):
        raise KeyFormatError(f"object key {key!r} lacks tenant=/date= segments")
    if not file_s.endswith(PARQUET_SUFFIX):
        raise KeyFormatError(f"object key {key!r} does not end in {PARQUET_SUFFIX}")
    date_text = date_s[len("date=") :]
    try:
        day = dt.date.fromisoformat(date_text)
    except ValueError:
        raise KeyFormatError(f"object key {key!r} has an invalid date") from None
    if day.isoformat() != date_text:
        raise KeyFormatError(f"object key {key!r} has a non-canonical date {date_text!r}")
    name = file_s[: -len(PARQUET_SUFFIX)]
    _check_name(name)
    return ParsedKey(kind, decode_tenant(tenant_s[len("tenant=") :]), day, name)

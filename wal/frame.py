"""Frame codec: the unit the WAL appends, fsyncs and replays.

Layout (little-endian)::

    offset  size  field
    0       4     u32 body_len     bytes that follow the 8-byte prefix (>= 2)
    4       4     u32 crc32c       CRC-32C (Castagnoli) over the body
    8       1     u8  kind         FrameKind: 1 tenant OTLP batch, 2 audit event
    9       1     u8  tenant_len   0..128
    10      n     tenant           ASCII graphic bytes except ``:`` ``#`` ``/``
    10+n    …     payload          kind 1: ExportLogsServiceRequest bytes as received

A frame is ``8 + body_len`` bytes. The tenant bound is 128 bytes on encode *and* on
decode (RFC 0048 §3.1, RFC 0052 §3.2): a decoded tenant longer than that is a
``CorruptionError`` naming the frame's offset and length, never truncated or dropped.
Kind-1 frames carry a tenant of 1..128 bytes; kind-2 frames may carry none.

The codec is pure: ``encode_frame`` returns bytes and ``scan_frames`` walks a buffer;
the journal does the I/O through the fs seam.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from .errors import CorruptionError, FrameTooLarge, InvalidTenant
from .tenant import MAX_TENANT_BYTES, bad_tenant_char, is_valid_tenant
from .types import FrameKind

PREFIX: Final = struct.Struct("<II")
PREFIX_SIZE: Final = PREFIX.size  # 8
_KIND_LEN: Final = struct.Struct("<BB")
#: Body bytes besides tenant and payload.
BODY_OVERHEAD: Final = 2
#: Upper bound on a decoded body: anything larger is damage, not a frame.
MAX_BODY_BYTES: Final = (1 << 31) - 1


def validate_tenant(tenant: str) -> bytes:
    """The tenant's bytes, or ``InvalidTenant`` naming how it breaks the grammar
    (``wal/tenant.py``)."""
    if is_valid_tenant(tenant):
        return tenant.encode("ascii")
    try:
        raw = tenant.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidTenant("tenant id must be ASCII graphic characters") from None
    if not 1 <= len(raw) <= MAX_TENANT_BYTES:
        raise InvalidTenant(f"tenant id must be 1 to {MAX_TENANT_BYTES} bytes, got {len(raw)}")
    bad = bad_tenant_char(tenant)
    raise InvalidTenant(
        f"tenant id may hold only ASCII graphic characters except ':', '#', '/'; "
        f"byte 0x{raw[bad or 0]:02x} is not allowed"
    )


def frame_size(tenant_len: int, payload_len: int) -> int:
    return PREFIX_SIZE + BODY_OVERHEAD + tenant_len + payload_len


def encode_frame(
    kind: FrameKind, tenant: bytes, payload: bytes | memoryview, *, max_payload: int
) -> bytes:
    """Encode one frame. ``tenant`` must already be validated (``validate_tenant``)."""
    if len(payload) > max_payload:
        raise FrameTooLarge(len(payload), max_payload)
    if len(tenant) > MAX_TENANT_BYTES:
        raise InvalidTenant(f"tenant id longer than {MAX_TENANT_BYTES} bytes")
    head = _KIND_LEN.pack(kind, len(tenant)) + tenant
    crc = crc32c.crc32c(payload, crc32c.crc32c(head))
    return b"".join((PREFIX.pack(len(head) + len(payload), crc), head, payload))


@dataclass(frozen=True, slots=True)
class RawFrame:
    """A frame found in a buffer: positions are offsets into that buffer."""

    kind: FrameKind
    tenant: str
    start: int  # offset of the prefix
    end: int  # offset just after the frame
    payload_start: int


@dataclass(frozen=True, slots=True)
class ScanStop:
    """Why a scan stopped. ``valid_end`` is the end of the last valid frame."""

    valid_end: int
    damaged: bool  # bytes remain after valid_end that are not a valid frame
    reason: str  # "" when clean


def scan_frames(
    buf: bytes | memoryview, start: int, *, path: Path, file_offset: int = 0
) -> tuple[list[RawFrame], ScanStop]:
    """Walk frames in ``buf`` from ``start`` until the end or the first damage.

    Damage (a short prefix, a length running past the buffer, a CRC mismatch, an
    invalid kind) stops the walk and is reported, not raised: whether it is a legal
    torn tail depends on where the segment sits in the set, which only the caller
    knows. A CRC-valid frame whose tenant breaks the grammar is different — those
    bytes were written by a codec and are refused outright (``CorruptionError``).
    ``file_offset`` is added to positions in error messages.
    """
    view = memoryview(buf)
    n = len(view)
    pos = start
    frames: list[RawFrame] = []
    while pos < n:
        if n - pos < PREFIX_SIZE:
            return frames, ScanStop(pos, True, f"{n - pos} bytes, shorter than a frame prefix")
        body_len, crc = PREFIX.unpack_from(view, pos)
        body_start = pos + PREFIX_SIZE
        if body_len < BODY_OVERHEAD or body_len > MAX_BODY_BYTES:
            return frames, ScanStop(pos, True, f"frame length {body_len} out of range")
        if body_start + body_len > n:
            return frames, ScanStop(
                pos, True, f"frame of {body_len} body bytes runs past the end ({n - body_start})"
            )
        body = view[body_start : body_start + body_len]
        if crc32c.crc32c(body) != crc:
            return frames, ScanStop(pos, True, "frame checksum mismatch")
        kind_raw, tenant_len = _KIND_LEN.unpack_from(body, 0)
        try:
            kind = FrameKind(kind_raw)
        except ValueError:
            return frames, ScanStop(pos, True, f"unknown frame kind {kind_raw}")
        if tenant_len > MAX_TENANT_BYTES:
            raise CorruptionError(
                path,
                file_offset + pos,
                f"frame of {PREFIX_SIZE + body_len} bytes carries a tenant of {tenant_len} "
                f"bytes, over the {MAX_TENANT_BYTES}-byte bound; refusing to truncate or drop it",
            )
        if BODY_OVERHEAD + tenant_len > body_len:
            return frames, ScanStop(pos, True, "tenant runs past the frame body")
        raw_tenant = bytes(body[BODY_OVERHEAD : BODY_OVERHEAD + tenant_len])
        if kind is FrameKind.TENANT_BATCH or tenant_len:
            try:
                tenant = validate_tenant(raw_tenant.decode("ascii")).decode("ascii")
            except (InvalidTenant, UnicodeDecodeError) as exc:
                raise CorruptionError(
                    path, file_offset + pos, f"frame carries an invalid tenant: {exc}"
                ) from None
        else:
            tenant = ""
        end = body_start + body_len
        frames.append(RawFrame(kind, tenant, pos, end, body_start + BODY_OVERHEAD + tenant_len))
        pos = end
    return frames, ScanStop(pos, False, "")


def iter_payloads(buf: bytes, frames: list[RawFrame]) -> Iterator[tuple[RawFrame, bytes]]:
    """Pair each scanned frame with a copy of its payload bytes."""
    for f in frames:
        yield f, buf[f.payload_start : f.end]

"""Template ids: what an id is made of, and the allocators that hand them out.

A template id is an int64 whose bits are ``node_ordinal << 48 | counter`` (the counter
starts at 1, so 0 is never an id). Ordinals 32768-65535 set the sign bit and give
negative ids; the bit pattern is what is unique. One allocator serves every tenant on
the node, and the node ordinal keeps replicas apart, so an id names one template
cluster-wide. ``FileTemplateIdAllocator`` keeps its high-water in a file, integers
little-endian::

    offset  size  field
    0       4     magic b"OTID"
    4       2     u16 version, currently 1
    6       2     u16 reserved, must be 0
    8       2     u16 node ordinal
    10      2     u16 reserved, must be 0
    12      8     u64 high-water: no counter above it was ever handed out
    20      4     u32 CRC-32C of bytes 0..20

An id is handed out only after a high-water at or above it is durable (temp write,
fsync, rename, parent directory fsync, through the ``wal.fs`` seam), so a crash at any
step, mid-block included, restarts above every id ever returned: ids are never reused,
across tenants or restarts. A crash only wastes the unused rest of a block.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import crc32c

from app.ingest.mining.errors import (
    TemplateIdError,
    TemplateIdExhaustedError,
    TemplateIdStateError,
)
from wal import Fs, OsFs

__all__ = [
    "ALLOCATOR_MAGIC",
    "ALLOCATOR_VERSION",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_COUNTER",
    "MAX_NODE_ORDINAL",
    "CountingAllocator",
    "FileTemplateIdAllocator",
    "TemplateIdAllocator",
    "decode_allocator_state",
    "encode_allocator_state",
    "make_template_id",
]

ALLOCATOR_MAGIC = b"OTID"
ALLOCATOR_VERSION = 1
#: the largest counter a node can hand out (48 bits)
MAX_COUNTER = (1 << 48) - 1
MAX_NODE_ORDINAL = (1 << 16) - 1
#: a template id is a Parquet int64
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_ALLOCATOR_STATE = struct.Struct("<4sHHHHQ")
_CRC = struct.Struct("<I")
_ALLOCATOR_FILE_SIZE = _ALLOCATOR_STATE.size + _CRC.size


def make_template_id(node_ordinal: int, counter: int) -> int:
    """The int64 whose bits are ``node_ordinal << 48 | counter``."""
    if not 0 <= node_ordinal <= MAX_NODE_ORDINAL:
        raise ValueError(f"node_ordinal={node_ordinal} is outside [0, {MAX_NODE_ORDINAL}]")
    if not 1 <= counter <= MAX_COUNTER:
        raise ValueError(f"counter={counter} is outside [1, {MAX_COUNTER}]")
    bits = node_ordinal << 48 | counter
    # Parquet's template_id is a signed int64: reinterpret the 64 bits, do not overflow.
    return bits - (1 << 64) if bits > INT64_MAX else bits


class TemplateIdAllocator(Protocol):
    """Hands out template ids that are never handed out again."""

    def allocate(self) -> int: ...


class CountingAllocator:
    """In-memory allocator for tests: ``first``, ``first + 1``, ... Not durable."""

    def __init__(self, first: int = 1) -> None:
        self._next = first
        self._lock = threading.Lock()

    @property
    def next_id(self) -> int:
        return self._next

    def allocate(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
        return value


def encode_allocator_state(node_ordinal: int, high_water: int) -> bytes:
    """The allocator file's 24 bytes (module docstring)."""
    head = _ALLOCATOR_STATE.pack(ALLOCATOR_MAGIC, ALLOCATOR_VERSION, 0, node_ordinal, 0, high_water)
    return head + _CRC.pack(crc32c.crc32c(head))


def decode_allocator_state(data: bytes) -> tuple[int, int]:
    """``(node_ordinal, high_water)`` from the file's bytes; ``ValueError`` says why not."""
    if len(data) != _ALLOCATOR_FILE_SIZE:
        raise ValueError(f"length {len(data)}, expected {_ALLOCATOR_FILE_SIZE}")
    head = data[: _ALLOCATOR_STATE.size]
    magic, version, reserved, ordinal, reserved2, high_water = _ALLOCATOR_STATE.unpack(head)
    if magic != ALLOCATOR_MAGIC:
        raise ValueError(f"bad magic {magic!r}, expected {ALLOCATOR_MAGIC!r}")
    (stored,) = _CRC.unpack_from(data, _ALLOCATOR_STATE.size)
    computed = crc32c.crc32c(head)
    if stored != computed:
        raise ValueError(f"CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")
    if version != ALLOCATOR_VERSION:
        raise ValueError(f"unknown version {version}, this build reads {ALLOCATOR_VERSION}")
    if reserved or reserved2:
        raise ValueError(f"non-zero reserved fields {reserved:#06x}/{reserved2:#06x}")
    if high_water > MAX_COUNTER:
        raise ValueError(f"high-water {high_water} above the 48-bit counter range")
    return ordinal, high_water


class FileTemplateIdAllocator:
    """Durable template ids for one node, shared by all of its tenants (thread-safe).

    Ids are reserved ``block`` at a time: the reserved high-water is made durable before
    the first id of the block is returned, so a restart resumes above every id any
    earlier process returned, whatever step it crashed at.
    """

    def __init__(
        self,
        path: Path,
        node_ordinal: int,
        block: int = 4096,
        *,
        fs: Fs | None = None,
        on_no_space: Callable[[str], bool] | None = None,
    ) -> None:
        if not 0 <= node_ordinal <= MAX_NODE_ORDINAL:
            raise ValueError(f"node_ordinal={node_ordinal} is outside [0, {MAX_NODE_ORDINAL}]")
        if not 1 <= block <= MAX_COUNTER:
            raise ValueError(f"block={block} is outside [1, {MAX_COUNTER}]")
        self._path = Path(path)
        self._tmp = self._path.with_name(self._path.name + ".tmp")
        self._ordinal = node_ordinal
        self._block = block
        self._fs: Fs = fs if fs is not None else OsFs()
        self._lock = threading.Lock()
        self._reserved = self._load()
        self._next = self._reserved + 1
        #: asked when the file's write fails with ENOSPC; True when it freed space (the
        #: node's emergency reserve, ``app.base.diskspace``) and the reservation is tried again
        self.on_no_space = on_no_space

    @property
    def path(self) -> Path:
        return self._path

    @property
    def node_ordinal(self) -> int:
        return self._ordinal

    @property
    def high_water(self) -> int:
        """The durable reserved counter: no id above it has been handed out."""
        return self._reserved

    def allocate(self) -> int:
        with self._lock:
            if self._next > self._reserved:
                self._reserve()
            counter = self._next
            self._next += 1
        return make_template_id(self._ordinal, counter)

    def _load(self) -> int:
        try:
            fd = self._fs.open(self._path, os.O_RDONLY)
        except FileNotFoundError:
            return 0  # a node's first start: nothing was ever handed out
        except OSError as exc:
            raise TemplateIdError(self._path, f"open for reading failed: {exc}") from exc
        try:
            # One byte more than the format so a longer file is seen, not truncated.
            data = self._fs.read(fd, _ALLOCATOR_FILE_SIZE + 1)
        except OSError as exc:
            raise TemplateIdError(self._path, f"read failed: {exc}") from exc
        finally:
            self._fs.close(fd)
        try:
            ordinal, high_water = decode_allocator_state(data)
        except ValueError as exc:
            raise TemplateIdStateError(self._path, f"corrupt: {exc}") from exc
        if ordinal != self._ordinal:
            # Another node's counters: handing out ours from its high-water could
            # collide with ids this node issued under a file that was lost.
            raise TemplateIdStateError(
                self._path,
                f"recorded node ordinal {ordinal}, configured node ordinal {self._ordinal}",
            )
        return high_water

    def _reserve(self) -> None:
        if self._reserved >= MAX_COUNTER:
            raise TemplateIdExhaustedError(
                self._path, f"node ordinal {self._ordinal} used all {MAX_COUNTER} counters"
            )
        target = min(self._reserved + self._block, MAX_COUNTER)
        try:
            self._write_state(target)
        except TemplateIdError as exc:
            cause = exc.__cause__
            ask = self.on_no_space
            if not (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)):
                raise
            if ask is None or not ask(str(exc)):
                raise
            self._write_state(target)
        self._reserved = target

    def _write_state(self, target: int) -> None:
        data = encode_allocator_state(self._ordinal, target)
        step = "open"
        try:
            fd = self._fs.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                step = "write"
                self._fs.write(fd, data)
                step = "fsync"
                self._fs.fsync(fd)
            finally:
                self._fs.close(fd)
            step = "rename"
            self._fs.rename(self._tmp, self._path)
            step = "parent directory fsync"
            self._fs.fsync_dir(self._path.parent)
        except OSError as exc:
            # Nothing of the block is handed out; a durable-but-unconfirmed higher
            # high-water on disk is harmless, it only wastes counters.
            raise TemplateIdError(
                self._path, f"reserving counters up to {target}: {step} failed: {exc}"
            ) from exc

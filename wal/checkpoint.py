"""The CHECKPOINT sidecar: the node-wide mark X behind which everything is published.

Layout, 32 bytes, little-endian::

    offset  size  field
    0       4     magic b"OWCK"
    4       2     u16 version = 2 (1 was the pre-RFC-0052 layout; never written here)
    6       2     reserved flags, zero
    8       24    the mark: segment UUID (16) then u64 LSN (a post-frame position)

Write protocol: ``CHECKPOINT.tmp`` (truncated) → write → fsync → rename over
``CHECKPOINT`` → fsync the WAL root. A visible CHECKPOINT is not necessarily durable
until that last fsync, which is why open fsyncs the root before reading any sidecar.

The mark is monotonic: a lower mark is refused, an equal one is a no-op. A failed
write leaves the previous mark in force in memory and on disk (the rename is the only
step that replaces it), so nothing past the previous mark becomes reclaimable.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

from .errors import CorruptionError
from .fs import Fs, read_file
from .types import OFFSET_SIZE, WalOffset

NAME: Final = "CHECKPOINT"
TMP_NAME: Final = "CHECKPOINT.tmp"
MAGIC: Final = b"OWCK"
VERSION: Final = 2
_HEAD: Final = struct.Struct("<4sHH")
SIZE: Final = _HEAD.size + OFFSET_SIZE  # 32


def encode_checkpoint(mark: WalOffset) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, 0) + mark.encode()


def decode_checkpoint(data: bytes, path: Path) -> WalOffset:
    if len(data) != SIZE:
        raise CorruptionError(path, 0, f"CHECKPOINT is {len(data)} bytes, expected {SIZE}")
    magic, version, flags = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptionError(path, 0, f"bad CHECKPOINT magic {magic!r}")
    if version != VERSION:
        raise CorruptionError(path, 4, f"unknown CHECKPOINT version {version}")
    if flags:
        raise CorruptionError(path, 6, "non-zero reserved bytes in CHECKPOINT")
    return WalOffset.decode(data[_HEAD.size :])


def read_checkpoint(fs: Fs, root: Path) -> WalOffset | None:
    """The durable mark, or None for a root that never checkpointed."""
    path = root / NAME
    try:
        data = read_file(fs, path)
    except FileNotFoundError:
        return None
    return decode_checkpoint(data, path)


def write_checkpoint(fs: Fs, root: Path, mark: WalOffset) -> None:
    """Temp → fsync → rename → parent fsync. Raises ``OSError`` from the failing step."""
    tmp = root / TMP_NAME
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, encode_checkpoint(mark))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, root / NAME)
    fs.fsync_dir(root)

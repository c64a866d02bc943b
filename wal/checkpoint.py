"""The CHECKPOINT sidecar: the node-wide mark X behind which everything is published.

Layout, 32 bytes, little-endian::

    offset  size  field
    0       4     magic b"OWCK"
    4       2     u16 version = 2 (1 was the pre-RFC-0052 layout; never written here)
    6       2     reserved flags, zero
    8       24    the mark: segment UUID (16) then u64 LSN (a post-frame position)

Write protocol: ``CHECKPOINT.tmp`` → write → fsync → rename over ``CHECKPOINT`` →
fsync the WAL root. A visible CHECKPOINT is not necessarily durable until that last
fsync, which is why open fsyncs the root before reading any sidecar.

A full disk must not stop the checkpoint: it is what lets housekeeping reclaim. So the
temp is never allocated on the write path when it can be avoided: ``CHECKPOINT.spare``,
a 32-byte file written and fsynced ahead of need (at open, and after each checkpoint),
is renamed to ``CHECKPOINT.tmp`` and overwritten in place, and the rename over
``CHECKPOINT`` frees the old mark's block for the next spare. Without a spare the temp
is created (and on a full disk that write fails, naming the file). Neither name is ever
read as a mark; a spare lost in a crash is made again.

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
SPARE_NAME: Final = "CHECKPOINT.spare"
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
    """Temp (the spare when there is one) → fsync → rename → parent fsync, then a new
    spare (best effort). Raises ``OSError`` from the failing step of the write."""
    tmp = root / TMP_NAME
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fs.rename(root / SPARE_NAME, tmp)
    except FileNotFoundError:
        pass
    else:
        flags = os.O_WRONLY  # 32 allocated bytes, overwritten in place
    fd = fs.open(tmp, flags)
    if flags == os.O_WRONLY and fs.fstat(fd).st_size != SIZE:
        fs.close(fd)  # not a spare this code made: start from an empty temp
        fd = fs.open(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        fs.write(fd, encode_checkpoint(mark))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, root / NAME)
    fs.fsync_dir(root)
    try:
        make_spare(fs, root)
    except OSError:
        pass  # the next write creates its temp instead (and names it if that fails)


def make_spare(fs: Fs, root: Path) -> bool:
    """Write and fsync ``CHECKPOINT.spare`` unless a 32-byte one exists. True when it
    made one. Raises ``OSError`` (a full disk: the caller decides whether that matters)."""
    spare = root / SPARE_NAME
    try:
        if fs.stat(spare).st_size == SIZE:
            return False
    except FileNotFoundError:
        pass
    fd = fs.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, bytes(SIZE))
        fs.fsync(fd)  # allocated now, not at some later writeback
    finally:
        fs.close(fd)
    return True

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
write path never allocates a block when it can be avoided. ``CHECKPOINT.spare`` is a
32-byte file allocated ahead of need; a write renames it to ``CHECKPOINT.tmp`` and
overwrites it in place, and before the rename over ``CHECKPOINT`` it hard-links the
current ``CHECKPOINT`` as the next spare — so the old mark's block is never freed and
the next write finds its spare without allocating. (Freeing the block and allocating a
new spare after the rename, as an earlier version did, lost the spare whenever another
writer took that block in between: on a volume filling under load the next checkpoint
then had to create its temp and failed with ENOSPC.) A name is only linked, so no
block is needed; where hard links are refused the spare is allocated after the rename
instead, best effort. A spare must never be the live mark's own inode (a crash between
the link and the rename leaves them shared; overwriting it in place would change the
live mark without a rename), so the spare's inode is compared with ``CHECKPOINT``'s
before it is used or kept. Without a spare the temp is created (and on a full disk
that write fails, naming the file). Neither name is ever read as a mark; a spare lost
in a crash is made again at the next open.

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
    """Temp (the spare when there is one) → fsync → link the current mark as the next
    spare → rename → parent fsync. Raises ``OSError`` from the failing step of the
    write; the previous mark stays in force."""
    tmp = root / TMP_NAME
    spare = root / SPARE_NAME
    try:
        fs.rename(spare, tmp)
    except FileNotFoundError:
        fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    else:
        fd = _open_private(fs, root, tmp)
    try:
        fs.write(fd, encode_checkpoint(mark))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    linked = _link_next_spare(fs, root)
    try:
        fs.rename(tmp, root / NAME)
    except OSError:
        if linked:
            _forget(fs, spare)  # never leave the live mark's inode under the spare's name
        raise
    fs.fsync_dir(root)
    if not linked:
        try:
            make_spare(fs, root)
        except OSError:
            pass  # the next write creates its temp instead (and names it if that fails)


def _open_private(fs: Fs, root: Path, tmp: Path) -> int:
    """Open the renamed spare for an in-place overwrite, or — when it is not a 32-byte
    file of its own (a crash left it sharing the live mark's inode, or it is not one
    this code made) — drop that name and start from a new temp."""
    fd = fs.open(tmp, os.O_WRONLY)
    st = fs.fstat(fd)
    if st.st_size == SIZE and not _is_live_mark(fs, root, st):
        return fd  # 32 allocated bytes, overwritten in place
    fs.close(fd)
    fs.unlink(tmp)  # a name only: the live mark keeps its inode
    return fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def _is_live_mark(fs: Fs, root: Path, st: os.stat_result) -> bool:
    try:
        live = fs.stat(root / NAME)
    except FileNotFoundError:
        return False
    return (live.st_dev, live.st_ino) == (st.st_dev, st.st_ino)


def _link_next_spare(fs: Fs, root: Path) -> bool:
    """Hard-link the current CHECKPOINT as ``CHECKPOINT.spare``: after the rename over
    CHECKPOINT the old mark's inode (and its allocated block) lives on as the spare.
    False when there is no CHECKPOINT yet or the filesystem refuses (the caller then
    allocates a spare after the rename)."""
    try:
        fs.link(root / NAME, root / SPARE_NAME)
    except FileExistsError:
        return False  # a leftover name (this write renamed the spare away): keep it
    except OSError:
        return False
    return True


def _forget(fs: Fs, path: Path) -> None:
    try:
        fs.unlink(path)
    except OSError:
        pass  # _open_private refuses a spare that shares the live inode anyway


def make_spare(fs: Fs, root: Path) -> bool:
    """Write and fsync ``CHECKPOINT.spare`` unless a 32-byte one of its own exists
    (one sharing CHECKPOINT's inode is replaced). True when it made one. Raises
    ``OSError`` (a full disk: the caller decides whether that matters)."""
    spare = root / SPARE_NAME
    try:
        st = fs.stat(spare)
    except FileNotFoundError:
        pass
    else:
        if st.st_size == SIZE and not _is_live_mark(fs, root, st):
            return False
        fs.unlink(spare)
    fd = fs.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, bytes(SIZE))
        fs.fsync(fd)  # allocated now, not at some later writeback
    finally:
        fs.close(fd)
    return True

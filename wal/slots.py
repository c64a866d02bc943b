"""Two-slot files: a fixed geometry, preallocated once, rewritten in place.

RECLAIM (``OWRC``) and PUBLISHED (``OWPB``) use it through ``wal/two_slot_file.py``, which
owns their shared lifecycle; each owns its slot format, and this module owns the bytes
around the slots (RFC 0052 §3.2, DESIGN.md §4)::

    file offset        size      what
    0                  32        file header (below)
    32                 slot_len  slot 0
    32 + slot_len      slot_len  slot 1

    file header (little-endian)
    0    4   magic
    4    2   u16 version
    6    2   reserved, zero
    8    8   u64 slot_len
    16   4   u32 first capacity   (RECLAIM: max_tenants)
    20   4   u32 second capacity  (RECLAIM: max_unlinks_per_pass; 0 when unused)
    24   4   u32 CRC-32C over bytes [0, 24)
    28   4   reserved, zero

    slot trailer (the last 8 bytes of every slot)
    slot_len - 8   4   u32 CRC-32C over the slot's bytes [0, slot_len - 8)
    slot_len - 4   4   reserved, zero

A slot starts with its format's u64 generation. The live slot is the valid one with
the greater generation; a slot that fails its checksum or its format is invalid and
the other one wins; both invalid is a ``CorruptionError`` naming the file, never
"missing" (missing means "never written", damaged means "written, contents unknown").

Invariants and the crash each one covers:

* **The size never changes after creation.** ``write_slot`` checks the file is still
  ``32 + 2·slot_len`` and overwrites bytes that already exist, so a steady-state write
  allocates nothing and still works on a full disk. ``create`` preallocates the whole
  file with ``fallocate``, so a full disk fails there, at open.
* **A write touches only the inactive slot.** A crash or a failed write at any byte
  leaves the live slot intact; the torn one fails its CRC or keeps its older
  generation. After a failed write the slot just written is scrubbed (its CRC
  inverted, then fsynced) so bytes that reached the page cache cannot win on reload.
* **A whole file appears only complete.** ``create`` and ``rebuild`` write
  ``<name>.new`` (truncating a leftover), fsync it, rename it over ``<name>``, then
  fsync the parent: a crash leaves the old file or the new one, never part of either.
  Nothing reads ``<name>.new``; a leftover one is the open sequence's to remove.
"""

from __future__ import annotations

import enum
import errno
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, TypeVar

import crc32c

from .errors import CorruptionError
from .fs import Fs

FILE_HEADER_SIZE: Final = 32
TRAILER_SIZE: Final = 8
NEW_SUFFIX: Final = ".new"

_HEAD: Final = struct.Struct("<4sHHQII")  # the 24 bytes the header CRC covers
_HEAD_TAIL: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_U32_MAX: Final = 0xFFFF_FFFF

R = TypeVar("R")


def slot_offset(index: int, slot_len: int) -> int:
    """File offset of slot ``index`` (0 or 1)."""
    if index not in (0, 1):
        raise ValueError(f"slot index must be 0 or 1, got {index}")
    return FILE_HEADER_SIZE + index * slot_len


def file_size(slot_len: int) -> int:
    return FILE_HEADER_SIZE + 2 * slot_len


def temp_path(path: Path) -> Path:
    """``<name>.new``: the only temp a two-slot file uses (create and rebuild)."""
    return path.with_name(path.name + NEW_SUFFIX)


# -- the file header -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileHeader:
    """The 32-byte header: magic, version, slot_len and the two capacities the
    geometry was computed from (a format that needs one stores 0 in the second)."""

    magic: bytes
    version: int
    slot_len: int
    capacities: tuple[int, int]

    def encode(self) -> bytes:
        head = _HEAD.pack(self.magic, self.version, 0, self.slot_len, *self.capacities)
        return head + _HEAD_TAIL.pack(crc32c.crc32c(head), 0)

    @classmethod
    def decode(cls, data: bytes, path: Path, *, magic: bytes, version: int) -> FileHeader:
        """Check magic, version, CRC and reserved bytes; a defect is a
        ``CorruptionError`` naming ``path`` and the byte offset."""
        if len(data) < FILE_HEADER_SIZE:
            raise CorruptionError(
                path,
                0,
                f"file is {len(data)} bytes, shorter than its {FILE_HEADER_SIZE}-byte header",
            )
        got_magic, got_version, reserved, slot_len, cap_a, cap_b = _HEAD.unpack_from(data)
        crc, reserved_tail = _HEAD_TAIL.unpack_from(data, _HEAD.size)
        if got_magic != magic:
            raise CorruptionError(path, 0, f"bad magic {got_magic!r}, expected {magic!r}")
        if got_version != version:
            raise CorruptionError(
                path, 4, f"unknown version {got_version} (this build reads {version})"
            )
        computed = crc32c.crc32c(data[: _HEAD.size])
        if crc != computed:
            raise CorruptionError(
                path,
                _HEAD.size,
                f"file header checksum mismatch: stored 0x{crc:08x}, computed 0x{computed:08x}",
            )
        if reserved:
            raise CorruptionError(path, 6, f"non-zero reserved header bytes 0x{reserved:04x}")
        if reserved_tail:
            raise CorruptionError(path, 28, f"non-zero reserved header bytes 0x{reserved_tail:08x}")
        return cls(got_magic, got_version, slot_len, (cap_a, cap_b))


# -- the slot trailer ----------------------------------------------------------------


def seal_slot(buf: bytearray) -> None:
    """Write the trailer: CRC-32C over everything before it, then 4 zero bytes."""
    end = len(buf) - TRAILER_SIZE
    _HEAD_TAIL.pack_into(buf, end, crc32c.crc32c(memoryview(buf)[:end]), 0)


class SlotDefect(enum.Enum):
    """Why a slot is not a candidate for the live one."""

    EMPTY = 1  # all zero: never written (the second slot of a new or rebuilt file)
    TORN = 2  # checksum mismatch: a write that did not complete, or damage
    FORMAT = 3  # checksum holds but the bytes break the format (reserved, flags, refs)


class InvalidSlot(Exception):
    """A slot that cannot be live; ``offset`` is the file offset of the defect."""

    def __init__(
        self,
        path: Path,
        index: int,
        offset: int,
        defect: SlotDefect,
        reason: str,
        generation: int | None = None,
    ) -> None:
        self.path = path
        self.index = index
        self.offset = offset
        self.defect = defect
        self.reason = reason
        #: readable only when the checksum held (a ``FORMAT`` defect)
        self.generation = generation
        super().__init__(f"slot {index} at byte {offset}: {defect.name.lower()}: {reason}")


def format_defect(
    path: Path, index: int, slot_len: int, generation: int
) -> Callable[[int, str], InvalidSlot]:
    """A maker of ``FORMAT`` defects in slot ``index``: a decoder names a defect by its
    offset in the slot, and the error reports the file offset."""
    base = slot_offset(index, slot_len)

    def defect(at: int, reason: str) -> InvalidSlot:
        return InvalidSlot(path, index, base + at, SlotDefect.FORMAT, reason, generation)

    return defect


#: Granularity of the in-place diff write.
DIFF_CHUNK = 4096


def dirty_runs(new: bytes, old: bytes, chunk: int = DIFF_CHUNK) -> list[tuple[int, int]]:
    """Byte ranges (chunk-aligned, coalesced) where ``new`` differs from ``old``.

    Two levels, so the common case — a multi-MiB slot differing in a few KiB — costs a
    few dozen memcmp-speed block comparisons rather than a Python loop per chunk."""
    block = chunk * 16
    runs: list[tuple[int, int]] = []
    n = len(new)
    for base in range(0, n, block):
        stop = min(n, base + block)
        if new[base:stop] == old[base:stop]:
            continue
        for start in range(base, stop, chunk):
            end = min(stop, start + chunk)
            if new[start:end] != old[start:end]:
                if runs and runs[-1][1] == start:
                    runs[-1] = (runs[-1][0], end)
                else:
                    runs.append((start, end))
    return runs


def check_trailer(data: bytes, path: Path, index: int, slot_len: int) -> None:
    """Raise ``InvalidSlot`` unless the slot's CRC holds and its reserved tail is zero."""
    base = slot_offset(index, slot_len)
    end = slot_len - TRAILER_SIZE
    if len(data) != slot_len:
        raise InvalidSlot(
            path, index, base, SlotDefect.FORMAT, f"slot is {len(data)} bytes, expected {slot_len}"
        )
    stored, reserved = _HEAD_TAIL.unpack_from(data, end)
    computed = crc32c.crc32c(memoryview(data)[:end])
    if stored != computed:
        defect = SlotDefect.EMPTY if data == bytes(slot_len) else SlotDefect.TORN
        raise InvalidSlot(
            path,
            index,
            base + end,
            defect,
            f"checksum mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}",
        )
    if reserved:
        raise InvalidSlot(
            path,
            index,
            base + end + 4,
            SlotDefect.FORMAT,
            f"non-zero reserved trailer bytes 0x{reserved:08x}",
            _U64.unpack_from(data)[0],
        )


@dataclass(frozen=True, slots=True)
class Live(Generic[R]):
    """The slot chosen as live, its decoded record, and the other slot's defect (None
    when both were valid: the lower generation is simply the previous write)."""

    index: int
    record: R
    generation: int
    rejected: InvalidSlot | None


def select_live(
    path: Path,
    slots: Sequence[bytes],
    decode: Callable[[bytes, int], R],
    generation: Callable[[R], int],
) -> Live[R]:
    """Decode both slots (``decode`` raises ``InvalidSlot``) and pick the live one."""
    decoded: list[R | InvalidSlot] = []
    for index, data in enumerate(slots):
        try:
            decoded.append(decode(data, index))
        except InvalidSlot as bad:
            decoded.append(bad)
    first, second = decoded
    if isinstance(first, InvalidSlot) and isinstance(second, InvalidSlot):
        formats = [bad.defect is SlotDefect.FORMAT for bad in (first, second)]
        if not any(formats):
            what = "both slots fail their checksum (torn or damaged, not a format violation)"
        elif all(formats):
            what = "both slots violate the format (their checksums hold)"
        else:
            what = "one slot fails its checksum and the other violates the format"
        raise CorruptionError(path, first.offset, f"{what}: {first}; {second}")
    if isinstance(first, InvalidSlot):
        assert not isinstance(second, InvalidSlot)
        return Live(1, second, generation(second), first)
    if isinstance(second, InvalidSlot):
        return Live(0, first, generation(first), second)
    gen0, gen1 = generation(first), generation(second)
    if gen0 == gen1:
        # The writer always writes live + 1 into the other slot, so a tie is not a state
        # it produces: neither slot can be preferred without guessing.
        raise CorruptionError(
            path,
            FILE_HEADER_SIZE,
            f"both slots are valid and carry the same generation {gen0}",
        )
    return Live(0, first, gen0, None) if gen0 > gen1 else Live(1, second, gen1, None)


# -- the open file -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotFileBytes:
    header: bytes
    slots: tuple[bytes, bytes]


class SlotFile:
    """An open two-slot file. Every I/O goes through ``fs``; ``OSError`` propagates
    from the step that failed (the caller names the artefact in its own error)."""

    def __init__(self, fs: Fs, path: Path, fd: int, header: bytes, slot_len: int) -> None:
        self._fs = fs
        self._path = path
        self._fd: int | None = fd
        self._header = header
        self._slot_len = slot_len

    @property
    def path(self) -> Path:
        return self._path

    @property
    def header(self) -> bytes:
        return self._header

    @property
    def slot_len(self) -> int:
        return self._slot_len

    @property
    def size(self) -> int:
        return file_size(self._slot_len)

    @property
    def closed(self) -> bool:
        return self._fd is None

    @classmethod
    def create(cls, fs: Fs, path: Path, header: bytes, slot0: bytes, slot_len: int) -> SlotFile:
        """Install a new file at ``path`` (which must not exist) through the temp:
        preallocated, header and slot 0 written, slot 1 zeroed, durable."""
        try:
            fs.stat(path)
        except FileNotFoundError:
            pass
        else:
            raise FileExistsError(f"{path} already exists; refusing to replace it")
        _install(fs, path, header, slot0, slot_len)
        return cls._reopen(fs, path, header, slot_len)

    @classmethod
    def open(cls, fs: Fs, path: Path, slot_len_of: Callable[[bytes], int]) -> SlotFile:
        """Open an existing file read-write. ``slot_len_of`` decodes the header (raising
        ``CorruptionError``) and returns its slot_len; the file size must match it.
        ``FileNotFoundError`` propagates when the file is absent."""
        fd = fs.open(path, os.O_RDWR)
        try:
            header = fs.pread(fd, FILE_HEADER_SIZE, 0)
            slot_len = slot_len_of(header)
            size = fs.fstat(fd).st_size
            if size != file_size(slot_len):
                raise CorruptionError(
                    path,
                    min(size, file_size(slot_len)),
                    f"file is {size} bytes; its header's slot_len {slot_len} makes it "
                    f"{file_size(slot_len)}",
                )
        except BaseException:
            fs.close(fd)
            raise
        return cls(fs, path, fd, header, slot_len)

    def read(self) -> SlotFileBytes:
        fd = self._require_open()
        slots = tuple(
            self._fs.pread(fd, self._slot_len, slot_offset(i, self._slot_len)) for i in (0, 1)
        )
        return SlotFileBytes(self._header, (slots[0], slots[1]))

    def write_slot(self, index: int, data: bytes, previous: bytes | None = None) -> None:
        """Overwrite slot ``index`` in place, then fsync. Never extends the file.

        With ``previous`` (the bytes known to be in that slot) only the chunks that differ
        are written: the slot is fixed-geometry and mostly zero, so a pass's write is a
        few KiB instead of the whole slot. Torn-write safety is unchanged — until the
        fsync the slot's CRC does not match and the other slot stays live.

        On ``OSError`` the slot is scrubbed (best effort, noted on the error) so the
        bytes that may have reached the page cache fail their CRC on a later read.
        """
        fd = self._require_open()
        if len(data) != self._slot_len:
            raise ValueError(f"slot data is {len(data)} bytes, slot_len is {self._slot_len}")
        offset = slot_offset(index, self._slot_len)
        size = self._fs.fstat(fd).st_size
        if size != self.size:
            # Writing would allocate or leave a slot short: refuse, nothing written.
            raise OSError(
                errno.EIO,
                f"refusing an in-place write: file is {size} bytes, preallocated {self.size}",
                str(self._path),
            )
        try:
            if previous is None or len(previous) != len(data):
                self._fs.pwrite(fd, data, offset)
            else:
                for start, end in dirty_runs(data, previous):
                    self._fs.pwrite(fd, memoryview(data)[start:end], offset + start)
            self._fs.fsync(fd)
        except OSError as exc:
            self._scrub(fd, index, data, exc)
            raise

    def _scrub(self, fd: int, index: int, data: bytes, exc: OSError) -> None:
        end = self._slot_len - TRAILER_SIZE
        (crc,) = _U32.unpack_from(data, end)
        try:
            self._fs.pwrite(fd, _U32.pack(crc ^ _U32_MAX), slot_offset(index, self._slot_len) + end)
            self._fs.fsync(fd)
        except OSError as scrub_exc:
            exc.add_note(
                f"scrubbing slot {index} of {self._path} after the failure also failed: "
                f"{scrub_exc}; the slot may read as valid until it is rewritten"
            )

    def rebuild(self, header: bytes, slot0: bytes, slot_len: int) -> SlotFile:
        """Replace the file with a new geometry through ``<name>.new``. This object is
        closed once the rename has happened (its fd names the replaced inode), whether
        or not the steps after it succeed; before that it stays usable."""
        self._require_open()
        _install(self._fs, self._path, header, slot0, slot_len, on_renamed=self.close)
        return self._reopen(self._fs, self._path, header, slot_len)

    @classmethod
    def _reopen(cls, fs: Fs, path: Path, header: bytes, slot_len: int) -> SlotFile:
        # Reopened on the final name so errors and fault globs name the file, not the temp.
        fd = fs.open(path, os.O_RDWR)
        return cls(fs, path, fd, header, slot_len)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._fs.close(fd)

    def _require_open(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self._path} is closed")
        return self._fd

    def __enter__(self) -> SlotFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _install(
    fs: Fs,
    path: Path,
    header: bytes,
    slot0: bytes,
    slot_len: int,
    on_renamed: Callable[[], None] | None = None,
) -> None:
    """Temp (truncated) → fallocate → header, slot 0, zeroed slot 1 → fsync → rename →
    parent fsync. A failure before the rename removes the temp (best effort)."""
    if len(header) != FILE_HEADER_SIZE:
        raise ValueError(f"header is {len(header)} bytes, expected {FILE_HEADER_SIZE}")
    if len(slot0) != slot_len:
        raise ValueError(f"slot 0 is {len(slot0)} bytes, slot_len is {slot_len}")
    tmp = temp_path(path)
    try:
        fd = fs.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            fs.fallocate(fd, 0, file_size(slot_len))
            fs.pwrite(fd, header, 0)
            fs.pwrite(fd, slot0, slot_offset(0, slot_len))
            fs.pwrite(fd, bytes(slot_len), slot_offset(1, slot_len))
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.rename(tmp, path)
    except OSError as exc:
        try:
            fs.unlink(tmp)
        except FileNotFoundError:
            pass
        except OSError as unlink_exc:
            exc.add_note(f"removing {tmp} after the failure also failed: {unlink_exc}")
        raise
    if on_renamed is not None:
        on_renamed()
    fs.fsync_dir(path.parent)

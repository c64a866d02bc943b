"""One two-slot record file: the lifecycle RECLAIM and PUBLISHED share (DESIGN.md §4).

``wal/slots.py`` owns the bytes around the slots: the file header, the slot trailer, the
in-place slot write and the ``<name>.new`` install. A format owns what its slots hold
and says it through a ``SlotCodec``: the file's name, magic and version, its geometry
(what the header's two capacities describe), the slot length a geometry makes, and how
a record encodes into a slot at a generation and decodes back. This module owns the
rest, once for every format:

* ``RecordFile.create``: a new file, preallocated, the record in slot 0 at
  generation 1, slot 1 zeroed; durable (file and parent fsynced) when it returns.
* ``RecordFile.load``: open read-write, decode both slots, keep the live one.
* ``RecordFile.read_only``: the same choice from a read-only copy (operator tools).
* ``RecordFile.write``: the inactive slot in place at generation live + 1, fsynced;
  no rename, no temp, no allocation, so a write still succeeds on a full disk.
* ``RecordFile.rebuild``: a covering geometry through ``<name>.new`` (never narrower).
* ``RecordFile.refuse_newer``: a newer slot this build cannot read stops the open.

RECLAIM (``wal/reclaim_file.py``, ``OWRC``) and PUBLISHED (``wal/published_file.py``, ``OWPB``)
are each a codec and a subclass that names it (``codec``); both byte layouts are
theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import Field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from .errors import CorruptionError
from .fs import Fs, read_file
from .slots import (
    FILE_HEADER_SIZE,
    FileHeader,
    InvalidSlot,
    Live,
    SlotDefect,
    SlotFile,
    file_size,
    select_live,
    slot_offset,
    temp_path,
)


class Generational(Protocol):
    """A record whose slot starts with a u64 generation (the file sets it on a write): a
    dataclass, so the file can encode a shallow copy at the generation it writes while
    the caller's record keeps its own until the write has succeeded."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    generation: int


G = TypeVar("G")
R = TypeVar("R", bound=Generational)


class UnencodableRecord(ValueError):
    """A record that the geometry (or the format) cannot represent; nothing is written."""


class SlotCodec(Protocol[G, R]):
    """A format's half of a two-slot record file: a geometry ``G`` and a record ``R``."""

    @property
    def name(self) -> str:
        """The file's name in the WAL root; a rebuild writes ``<name>.new``."""
        ...

    @property
    def magic(self) -> bytes: ...

    @property
    def version(self) -> int:
        """The only version read or written: any other is refused at the header."""
        ...

    def slot_len(self, geometry: G) -> int: ...

    def capacities(self, geometry: G) -> tuple[int, int]:
        """The header's two u32 capacities (0 in the second when the format has one)."""
        ...

    def geometry(self, capacities: tuple[int, int], path: Path) -> G:
        """The geometry a header's capacities record; one outside the format's range is
        a ``CorruptionError`` naming ``path`` and the capacity's byte offset."""
        ...

    def describe(self, geometry: G) -> str:
        """The capacities as the header names them, for an error message."""
        ...

    def covers(self, geometry: G, other: G) -> bool:
        """True when everything ``other`` can hold fits ``geometry`` (a rebuild's test)."""
        ...

    def encode(self, record: R, geometry: G) -> bytes:
        """The sealed slot holding ``record``; a record the geometry cannot hold raises
        ``UnencodableRecord``."""
        ...

    def decode(self, data: bytes, geometry: G, path: Path, index: int) -> R:
        """Check and decode slot ``index``; any defect raises ``InvalidSlot``."""
        ...


def encode_header(codec: SlotCodec[G, R], geometry: G) -> bytes:
    return FileHeader(
        codec.magic, codec.version, codec.slot_len(geometry), codec.capacities(geometry)
    ).encode()


def decode_header(codec: SlotCodec[G, R], data: bytes, path: Path) -> G:
    """The geometry a file header records; any defect is a ``CorruptionError``."""
    header = FileHeader.decode(data, path, magic=codec.magic, version=codec.version)
    geometry = codec.geometry(header.capacities, path)
    expected = codec.slot_len(geometry)
    if header.slot_len != expected:
        raise CorruptionError(
            path,
            8,
            f"slot_len {header.slot_len} disagrees with {codec.describe(geometry)}, "
            f"which make {expected}",
        )
    return geometry


def _encode_at(codec: SlotCodec[G, R], record: R, geometry: G, generation: int) -> bytes:
    # A shallow copy at the generation being written: the caller's record keeps its own
    # until the write has succeeded, so a failed write moves no generation.
    return codec.encode(replace(record, generation=generation), geometry)


def _select(codec: SlotCodec[G, R], geometry: G, path: Path, slots: Sequence[bytes]) -> Live[R]:
    return select_live(
        path,
        slots,
        lambda data, index: codec.decode(data, geometry, path, index),
        lambda record: record.generation,
    )


class RecordFile(Generic[G, R]):
    """A format's file in a WAL root, open read-write for in-place slot writes; a
    subclass names the format (``codec``).

    ``OSError`` from any step propagates unchanged (the open sequence names the file in
    its own error); bytes that disagree with the format raise ``CorruptionError``.
    """

    #: the file's name in the WAL root and its rebuild temp, both from the codec
    NAME: ClassVar[str]
    NEW_NAME: ClassVar[str]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.NAME = cls.codec().name
        cls.NEW_NAME = temp_path(Path(cls.NAME)).name

    def __init__(
        self,
        slots: SlotFile,
        geometry: G,
        live_index: int,
        live_generation: int,
        known: Sequence[bytes | None],
        rejected: InvalidSlot | None = None,
    ) -> None:
        self._codec = self.codec()
        self._slots = slots
        self._geometry = geometry
        self._live_index = live_index
        self._live_generation = live_generation
        #: the bytes known to be in each slot, so a write sends only what changed
        self._known: list[bytes | None] = list(known)
        #: why the other slot was not a candidate at load (None when it was valid and
        #: older). A FORMAT defect carries its generation: one above the live slot's is a
        #: newer record this build could not read, which ``refuse_newer`` refuses.
        self.rejected = rejected

    @classmethod
    def codec(cls) -> SlotCodec[G, R]:
        """The format this class of file holds."""
        raise NotImplementedError(f"{cls.__name__} names no codec")

    @property
    def path(self) -> Path:
        return self._slots.path

    @property
    def geometry(self) -> G:
        return self._geometry

    @property
    def live_index(self) -> int:
        return self._live_index

    @property
    def generation(self) -> int:
        """The live slot's generation."""
        return self._live_generation

    @property
    def closed(self) -> bool:
        return self._slots.closed

    @classmethod
    def create(cls, fs: Fs, root: Path, geometry: G, record: R) -> Self:
        """Create the file (absent) preallocated at ``geometry`` holding ``record`` in
        slot 0 at generation 1; durable (file and parent fsynced) when it returns. A full
        disk fails here with ``OSError`` from ``fallocate``."""
        codec = cls.codec()
        slot0 = _encode_at(codec, record, geometry, 1)
        slot_len = codec.slot_len(geometry)
        slots = SlotFile.create(
            fs, root / codec.name, encode_header(codec, geometry), slot0, slot_len
        )
        record.generation = 1
        return cls(slots, geometry, 0, 1, (slot0, bytes(slot_len)))

    @classmethod
    def load(cls, fs: Fs, root: Path) -> tuple[Self, R] | None:
        """The file and its live record; None when the file is absent."""
        codec = cls.codec()
        path = root / codec.name
        try:
            slots = SlotFile.open(
                fs, path, lambda head: codec.slot_len(decode_header(codec, head, path))
            )
        except FileNotFoundError:
            return None
        try:
            geometry = decode_header(codec, slots.header, path)
            raw = slots.read()
            live = _select(codec, geometry, path, raw.slots)
        except BaseException:
            slots.close()
            raise
        loaded = cls(slots, geometry, live.index, live.generation, raw.slots, live.rejected)
        return loaded, live.record

    @classmethod
    def read_only(cls, fs: Fs, root: Path) -> tuple[G, R] | None:
        """The geometry and live record without opening the file for writing (the
        operator tools must work on a read-only copy of a volume); None when absent."""
        codec = cls.codec()
        path = root / codec.name
        try:
            data = read_file(fs, path)
        except FileNotFoundError:
            return None
        geometry = decode_header(codec, data[:FILE_HEADER_SIZE], path)
        slot_len = codec.slot_len(geometry)
        if len(data) != file_size(slot_len):
            raise CorruptionError(
                path,
                None,
                f"{codec.name} is {len(data)} bytes; its header says {file_size(slot_len)}",
            )
        raw = [data[slot_offset(i, slot_len) : slot_offset(i, slot_len) + slot_len] for i in (0, 1)]
        return geometry, _select(codec, geometry, path, raw).record

    def refuse_newer(self) -> None:
        """Close the file and raise ``CorruptionError`` when the slot not chosen is newer
        than the live one and breaks only the format: its checksum holds, so a writer
        this build does not know wrote it, and acting on the older slot would ignore
        what that writer recorded."""
        rejected = self.rejected
        if (
            rejected is not None
            and rejected.defect is SlotDefect.FORMAT
            and rejected.generation is not None
            and rejected.generation > self._live_generation
        ):
            self.close()
            raise CorruptionError(
                self.path,
                rejected.offset,
                f"newer slot {rejected.index} is unreadable: {rejected.reason}",
            )

    def write(self, record: R) -> None:
        """Write ``record`` durably into the inactive slot at generation live + 1 and set
        ``record.generation``. On ``OSError`` the previous slot stays live and neither
        the file's nor the record's generation moves."""
        generation = self._live_generation + 1
        data = _encode_at(self._codec, record, self._geometry, generation)
        target = 1 - self._live_index
        previous = self._known[target]
        self._known[target] = None  # unknown until the write is durable
        self._slots.write_slot(target, data, previous)
        self._known[target] = data
        self._live_index, self._live_generation = target, generation
        record.generation = generation

    def rebuild(self, geometry: G, record: R) -> Self:
        """Replace the file with one at ``geometry`` (covering the current one) through
        ``<name>.new``: ``record`` re-encoded at the same ids and the live generation
        into slot 0, slot 1 zeroed. Returns the new file; this one is closed once the
        rename happened (before that a failure leaves it usable)."""
        codec = self._codec
        if not codec.covers(geometry, self._geometry):
            raise ValueError(f"a rebuild never shrinks: {geometry} does not cover {self._geometry}")
        generation = self._live_generation
        slot0 = _encode_at(codec, record, geometry, generation)
        slot_len = codec.slot_len(geometry)
        slots = self._slots.rebuild(encode_header(codec, geometry), slot0, slot_len)
        self.close()
        record.generation = generation
        return type(self)(slots, geometry, 0, generation, (slot0, bytes(slot_len)))

    def close(self) -> None:
        self._slots.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

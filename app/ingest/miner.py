"""Per-tenant template mining (drain3's Drain), template ids, and the miner snapshot.

Snapshot format (``TenantMiner.to_snapshot``), integers little-endian::

    offset  size  field
    0       4     magic b"OMNR"
    4       2     u16 version, currently 1
    6       2     u16 reserved, must be 0
    8       4     u32 body length in bytes
    12      4     u32 CRC-32C (Castagnoli) of the body
    16      n     body: compact JSON, ASCII only (non-ASCII and lone surrogates escaped)

The version-1 body is one object with exactly these keys::

    {"config":   {"sim_th": float, "depth": int, "max_children": int,
                  "max_clusters": int | null, "extra_delimiters": [str, ...],
                  "parametrize_numeric_tokens": bool},
     "clusters_counter": int,          # Drain's last issued cluster id
     "clusters": [[drain_id, template_id, version, size, [token, ...]], ...],
     "nodes":    [[parent_index, key, [drain_id, ...]], ...]}

``clusters`` lists every live Drain cluster, least recently used first when
``max_clusters`` is set (the LRU order Drain evicts in) and in creation order otherwise.
``nodes`` is the prefix tree in pre-order: ``nodes[0]`` is the root (parent -1, key
""), every other node names an earlier node as its parent, and a node's children appear
in the order of its ``key_to_child_node`` dict. Node cluster lists are kept verbatim,
including ids of clusters the LRU evicted (Drain drops those lazily), so a restored
tree is equal to the original, node for node.

Version policy: only the current version is written; a reader refuses an unknown
version, a non-zero reserved field, a length or CRC mismatch, and any body that does
not have exactly the shape above (unknown keys included), raising
``SnapshotDecodeError`` with what is wrong. A format change bumps the version and keeps
a reader for every version still on disk.

Template ids: a template id is an int64 whose bits are ``node_ordinal << 48 | counter``
(the counter starts at 1, so 0 is never an id). Ordinals 32768-65535 set the sign bit
and give negative ids; the bit pattern is what is unique. One allocator serves every
tenant on the node, and the node ordinal keeps replicas apart, so an id names one
template cluster-wide. ``FileTemplateIdAllocator`` keeps its high-water in a file::

    offset  size  field
    0       4     magic b"OTID"
    4       2     u16 version, currently 1
    6       2     u16 reserved, must be 0
    8       2     u16 node ordinal
    10      2     u16 reserved, must be 0
    12      8     u64 high-water: no counter above it was ever handed out
    20      4     u32 CRC-32C of bytes 0..20

Invariants:

* An id is handed out only after a high-water at or above it is durable (temp write,
  fsync, rename, parent directory fsync), so a crash at any step, mid-block included,
  restarts above every id ever returned: ids are never reused, across tenants or
  restarts. A crash only wastes the unused rest of a block.
* Restoring a snapshot neither consumes nor rewinds ids: restored templates keep theirs
  and only templates created afterwards draw from the allocator.
* ``TenantMiner.mine`` emits exactly one ``TemplateEvent`` per cluster Drain creates
  ("created", version 1) and one per template Drain widens ("changed", version + 1).
* A restored miner mines every later input exactly as the uninterrupted miner would:
  same template ids, parameters and events.
* A miner that raised in the middle of a batch has absorbed part of it without its
  caller seeing the results, so it refuses further mining and snapshots
  (``MinerFailedError``); the pipeline rebuilds the tenant (RFC 0055 settlement).

Tokenisation: a body is split exactly as ``Drain.get_content_as_tokens`` does it. With
no extra delimiters that is ``body.split()``: runs of any whitespace Python's
``str.split`` knows (space, tab, newline, the Unicode spaces) separate tokens, and
leading or trailing whitespace yields no token. With extra delimiters the body is
stripped, each delimiter is replaced by a space in the configured order, then split.
Whitespace is not kept: "a  b" and "a b" mine to the same template and parameters.
Drain matches a body only to a template with the same token count, so the parameters
of a body are its tokens at the template's ``<*>`` positions, by index. A body token
that is literally ``<*>`` is a parameter like any other wildcard.

Errors::

    MinerError
    ├── SnapshotDecodeError       a snapshot's bytes are not a valid miner snapshot
    ├── MinerFailedError          a miner raised mid-batch and its state is unknown
    └── TemplateIdError           an id could not be reserved (I/O), names the file
        ├── TemplateIdStateError  the allocator file is corrupt or for another node
        └── TemplateIdExhaustedError  the node's 48-bit counter is used up

How Drain is used: ``mine`` performs the steps of drain3 0.9's ``add_log_message``
itself, in its order, with Drain's own methods (``tree_search``, a new ``LogCluster``
plus ``add_seq_to_prefix_tree``, ``create_template``), so a body is tokenised once for
Drain and for its parameters, and a body that leaves its template unchanged costs one
tuple comparison. The tests hold the result to ``add_log_message``, body for body and
tree for tree. Drain's masking lives in ``TemplateMiner`` and is not used. Drain's
objects are reached through narrow typed protocols; its LRU map is read only with
``get`` and ``in``, and ``[]``, which moves a cluster to the recent end, is called
exactly where ``add_log_message`` calls it.

Nothing here is thread-safe except the allocators: callers serialise mining per node
under the pipeline's miner lock (DESIGN.md §5.3).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import eq, itemgetter
from pathlib import Path
from typing import Literal, NoReturn, Protocol, cast

import crc32c
from drain3.drain import Drain, LogCluster, Node

__all__ = [
    "AllocatorFs",
    "CountingAllocator",
    "FileTemplateIdAllocator",
    "MineResult",
    "MinerCluster",
    "MinerConfig",
    "MinerError",
    "MinerFailedError",
    "SnapshotDecodeError",
    "TemplateEvent",
    "TemplateIdAllocator",
    "TemplateIdError",
    "TemplateIdExhaustedError",
    "TemplateIdStateError",
    "TemplateInfo",
    "TenantMiner",
    "decode_allocator_state",
    "encode_allocator_state",
    "make_template_id",
    "tokenize",
]

PARAM = "<*>"
SNAPSHOT_MAGIC = b"OMNR"
SNAPSHOT_VERSION = 1
ALLOCATOR_MAGIC = b"OTID"
ALLOCATOR_VERSION = 1
#: the largest counter a node can hand out (48 bits)
MAX_COUNTER = (1 << 48) - 1
MAX_NODE_ORDINAL = (1 << 16) - 1

_SNAPSHOT_HEADER = struct.Struct("<4sHHII")
_ALLOCATOR_STATE = struct.Struct("<4sHHHHQ")
_CRC = struct.Struct("<I")
_ALLOCATOR_FILE_SIZE = _ALLOCATOR_STATE.size + _CRC.size
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


# -- errors -------------------------------------------------------------------------


class MinerError(Exception):
    """Base class of every error this module raises."""


class SnapshotDecodeError(MinerError):
    """The bytes are not a miner snapshot this version can read; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"miner snapshot refused: {reason}")
        self.reason = reason


class MinerFailedError(MinerError):
    """A miner raised in the middle of a batch; its tree is in an unknown state."""


class TemplateIdError(MinerError):
    """Template ids could not be reserved; names the allocator file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"template id allocator {path}: {reason}")
        self.path = path
        self.reason = reason


class TemplateIdStateError(TemplateIdError):
    """The allocator file is corrupt or belongs to another node ordinal."""


class TemplateIdExhaustedError(TemplateIdError):
    """The node has handed out every one of its 2**48 - 1 counters."""


# -- configuration and results -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MinerConfig:
    """Drain's knobs for one tenant. Invalid values raise ``ValueError`` naming them."""

    sim_th: float = 0.4
    depth: int = 4
    max_children: int = 100
    #: None keeps every cluster; a number bounds them with Drain's LRU eviction
    max_clusters: int | None = None
    extra_delimiters: tuple[str, ...] = ()
    #: Drain's own default: tokens with a digit go down the tree's wildcard branch
    parametrize_numeric_tokens: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def refuse(name: str, value: object, allowed: str) -> NoReturn:
            raise ValueError(f"miner setting {name}={value!r} is outside {allowed}")

        if (
            not isinstance(self.sim_th, int | float)
            or isinstance(self.sim_th, bool)
            or not 0.0 <= self.sim_th <= 1.0
        ):
            refuse("sim_th", self.sim_th, "[0.0, 1.0]")
        # An int threshold would otherwise snapshot as "1" and restore as 1.0.
        object.__setattr__(self, "sim_th", float(self.sim_th))
        if not _is_int(self.depth) or not 3 <= self.depth <= 64:
            # drain3 refuses depth < 3; the upper bound only keeps trees sane
            refuse("depth", self.depth, "[3, 64]")
        if not _is_int(self.max_children) or not 1 <= self.max_children <= 1_000_000:
            # with 0 Drain would look up a wildcard child it never created
            refuse("max_children", self.max_children, "[1, 1000000]")
        if self.max_clusters is not None and (
            not _is_int(self.max_clusters) or not 1 <= self.max_clusters <= 100_000_000
        ):
            refuse("max_clusters", self.max_clusters, "None or [1, 100000000]")
        delimiters: object = self.extra_delimiters
        if isinstance(delimiters, list):
            # YAML gives lists; the frozen config keeps a hashable tuple.
            object.__setattr__(self, "extra_delimiters", tuple(delimiters))
        if not isinstance(self.extra_delimiters, tuple) or not all(
            isinstance(d, str) and d for d in self.extra_delimiters
        ):
            # an empty delimiter would make str.replace put a space between every char
            refuse("extra_delimiters", self.extra_delimiters, "a tuple of non-empty strings")
        # Typed as bool, but configuration arrives from YAML and the environment.
        numeric: object = self.parametrize_numeric_tokens
        if not isinstance(numeric, bool):
            refuse("parametrize_numeric_tokens", numeric, "bool")


@dataclass(frozen=True, slots=True)
class TemplateEvent:
    """A template came into being or was widened by the batch that returned it."""

    template_id: int
    version: int
    template: str
    change: Literal["created", "changed"]
    #: position in the mined batch of the body that caused the event
    index: int


@dataclass(frozen=True, slots=True)
class MineResult:
    """One batch's mining, in columns: entry ``i`` belongs to body ``i``."""

    template_ids: list[int]
    #: tuples, not lists: a tuple of strings leaves the cyclic collector's care after
    #: its first young collection, so buffered rows never burden a full collection
    template_params: list[tuple[str, ...]]
    #: in the order the bodies caused them
    events: list[TemplateEvent]

    def __len__(self) -> int:
        return len(self.template_ids)


@dataclass(frozen=True, slots=True)
class TemplateInfo:
    """A template as the miner currently holds it (for inspection and tests)."""

    template_id: int
    version: int
    template: str
    size: int


# -- tokenisation ---------------------------------------------------------------------


def tokenize(body: str, extra_delimiters: Sequence[str] = ()) -> list[str]:
    """Split a body into Drain's tokens, exactly as ``Drain.get_content_as_tokens``.

    Without delimiters ``str.split()`` already drops leading and trailing whitespace,
    so drain3's ``strip()`` changes nothing; with delimiters the strip comes first,
    because a delimiter may itself contain whitespace.
    """
    if not extra_delimiters:
        return body.split()
    content = body.strip()
    for delimiter in extra_delimiters:
        content = content.replace(delimiter, " ")
    return content.split()


# -- template ids -----------------------------------------------------------------------


def make_template_id(node_ordinal: int, counter: int) -> int:
    """The int64 whose bits are ``node_ordinal << 48 | counter``."""
    if not 0 <= node_ordinal <= MAX_NODE_ORDINAL:
        raise ValueError(f"node_ordinal={node_ordinal} is outside [0, {MAX_NODE_ORDINAL}]")
    if not 1 <= counter <= MAX_COUNTER:
        raise ValueError(f"counter={counter} is outside [1, {MAX_COUNTER}]")
    bits = node_ordinal << 48 | counter
    # Parquet's template_id is a signed int64: reinterpret the 64 bits, do not overflow.
    return bits - (1 << 64) if bits > _INT64_MAX else bits


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


class AllocatorFs(Protocol):
    """The file operations the allocator needs; ``wal.fs.Fs`` satisfies it."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int: ...
    def read(self, fd: int, size: int) -> bytes: ...
    def write(self, fd: int, data: bytes | memoryview) -> None: ...
    def fsync(self, fd: int) -> None: ...
    def close(self, fd: int) -> None: ...
    def rename(self, src: Path, dst: Path) -> None: ...
    def fsync_dir(self, path: Path) -> None: ...


class _OsFs:
    """Plain ``os`` calls, so the miner does not depend on the WAL package."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def read(self, fd: int, size: int) -> bytes:
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.read(fd, size)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        fs: AllocatorFs | None = None,
    ) -> None:
        if not 0 <= node_ordinal <= MAX_NODE_ORDINAL:
            raise ValueError(f"node_ordinal={node_ordinal} is outside [0, {MAX_NODE_ORDINAL}]")
        if not 1 <= block <= MAX_COUNTER:
            raise ValueError(f"block={block} is outside [1, {MAX_COUNTER}]")
        self._path = Path(path)
        self._tmp = self._path.with_name(self._path.name + ".tmp")
        self._ordinal = node_ordinal
        self._block = block
        self._fs: AllocatorFs = fs if fs is not None else _OsFs()
        self._lock = threading.Lock()
        self._reserved = self._load()
        self._next = self._reserved + 1
        #: asked when the file's write fails with ENOSPC; True when it freed space (the
        #: node's emergency reserve, ``app.node.diskspace``) and the reservation is tried again
        self.on_no_space: Callable[[str], bool] | None = None

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


# -- typed views of drain3 --------------------------------------------------------------


class _DrainCluster(Protocol):
    cluster_id: int
    log_template_tokens: tuple[str, ...]
    size: int


class _DrainNode(Protocol):
    key_to_child_node: dict[str, _DrainNode]
    cluster_ids: list[int]


class _ClusterMap(Protocol):
    """What we use of ``Drain.id_to_cluster`` (a dict, or drain3's LRU cache).

    Deliberately no ``__getitem__``/``values``: on the LRU cache they reorder it; the
    one deliberate reorder goes through ``_Touchable``.
    """

    def get(self, key: int) -> _DrainCluster | None: ...
    def __setitem__(self, key: int, value: _DrainCluster) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...


class _Touchable(Protocol):
    """The LRU cache's ``[]``, which moves a key to the most recently used end."""

    def __getitem__(self, key: int) -> object: ...


class _Drain(Protocol):
    root_node: _DrainNode
    id_to_cluster: _ClusterMap
    clusters_counter: int
    sim_th: float
    max_node_depth: int

    def tree_search(
        self, root_node: _DrainNode, tokens: list[str], sim_th: float, include_params: bool
    ) -> _DrainCluster | None: ...
    def add_seq_to_prefix_tree(self, root_node: _DrainNode, cluster: _DrainCluster) -> None: ...
    def create_template(self, seq1: list[str], seq2: tuple[str, ...]) -> list[str]: ...


def _new_drain(config: MinerConfig) -> _Drain:
    drain = Drain(
        depth=config.depth,
        sim_th=config.sim_th,
        max_children=config.max_children,
        max_clusters=config.max_clusters,
        extra_delimiters=config.extra_delimiters,
        # Drain guards every profiler call with ``if self.profiler``; None skips them
        # all (its NullProfiler default is truthy and costs about a third of the time).
        profiler=None,
        param_str=PARAM,
        parametrize_numeric_tokens=config.parametrize_numeric_tokens,
    )
    return cast(_Drain, drain)


def _new_node() -> _DrainNode:
    return cast(_DrainNode, Node())


def _new_cluster(tokens: list[str], drain_id: int, size: int) -> _DrainCluster:
    cluster = cast(_DrainCluster, LogCluster(tokens, drain_id))
    cluster.size = size
    return cluster


# -- the miner ---------------------------------------------------------------------------


class _Template:
    """Our side of one Drain cluster: id, version, and how to read a body against it.

    ``positions`` are the template's wildcard indices and ``params`` picks a body's
    tokens there as a tuple (None when there are none). ``constants`` picks a body's
    tokens at the other indices and ``expected`` is what the template has there
    (``fixed`` of them): the count of equal pairs is Drain's similarity numerator, and
    when they are all equal Drain's widening would change nothing — one C-level
    comparison instead of ``get_seq_distance``'s and ``create_template``'s Python
    loops. ``constants`` is None when every token is a wildcard (nothing can widen).
    """

    __slots__ = (
        "template_id",
        "version",
        "cluster",
        "positions",
        "params",
        "constants",
        "expected",
        "fixed",
    )

    def __init__(
        self, template_id: int, version: int, cluster: _DrainCluster, tokens: tuple[str, ...]
    ) -> None:
        self.template_id = template_id
        self.version = version
        #: the Drain cluster this template mirrors (Drain widens it in place)
        self.cluster = cluster
        self.positions: tuple[int, ...] = ()
        self.params: Callable[[list[str]], tuple[str, ...]] | None = None
        self.constants: Callable[[list[str]], object] | None = None
        self.expected: object = None
        self.fixed = 0
        self.reshape(tokens)

    def reshape(self, tokens: tuple[str, ...]) -> None:
        self.positions = tuple(i for i, token in enumerate(tokens) if token == PARAM)
        fixed = [i for i, token in enumerate(tokens) if token != PARAM]
        self.fixed = len(fixed)
        if len(self.positions) > 1:
            # itemgetter of several indices returns their items as a tuple, in C
            self.params = cast(Callable[[list[str]], tuple[str, ...]], itemgetter(*self.positions))
        elif self.positions:
            only = self.positions[0]
            self.params = lambda tokens: (tokens[only],)
        else:
            self.params = None
        if fixed:
            # itemgetter of one index returns the item, of several a tuple; both sides
            # of the comparison come from the same getter, so either shape compares.
            getter = cast(Callable[[Sequence[str]], object], itemgetter(*fixed))
            self.constants = getter
            self.expected = getter(tokens)
        else:
            self.constants = None
            self.expected = None

    def same(self, tokens: list[str]) -> int:
        """How many of the template's constant tokens ``tokens`` has at their places:
        ``get_seq_distance``'s ``sim_tokens`` (wildcards are not counted)."""
        constants = self.constants
        if constants is None:
            return 0
        got = constants(tokens)
        expected = self.expected
        if got == expected:
            return self.fixed
        if self.fixed == 1:
            return 0
        return sum(map(eq, cast(tuple[str, ...], got), cast(tuple[str, ...], expected)))


class TenantMiner:
    """One tenant's Drain tree and the template ids and versions of its clusters."""

    def __init__(self, allocator: TemplateIdAllocator, config: MinerConfig | None = None) -> None:
        self._config = config if config is not None else MinerConfig()
        self._allocator = allocator
        self._drain = _new_drain(self._config)
        # Drain cluster id -> template. With max_clusters set its order is Drain's LRU
        # order (both are touched once per body, for the cluster the body landed in),
        # which says which cluster Drain evicted and gives the snapshot its LRU order
        # without reading cachetools' private fields.
        self._templates: dict[int, _Template] = {}
        self._failed: BaseException | None = None

    @property
    def config(self) -> MinerConfig:
        return self._config

    @property
    def template_count(self) -> int:
        return len(self._templates)

    def templates(self) -> list[TemplateInfo]:
        """The live templates, in the snapshot's cluster order."""
        out: list[TemplateInfo] = []
        for drain_id, template in self._templates.items():
            cluster = self._cluster(drain_id)
            out.append(
                TemplateInfo(
                    template.template_id,
                    template.version,
                    " ".join(cluster.log_template_tokens),
                    cluster.size,
                )
            )
        return out

    def mine(self, bodies: Sequence[str]) -> MineResult:
        """Mine a batch of bodies in order; see the module docstring for the results."""
        if self._failed is not None:
            raise MinerFailedError(
                f"miner failed earlier ({self._failed!r}); rebuild it before mining"
            ) from self._failed
        try:
            return self._mine(bodies)
        except BaseException as exc:
            self._failed = exc
            if isinstance(exc, Exception):
                raise MinerFailedError(f"mining failed mid-batch: {exc!r}") from exc
            raise

    def _mine(self, bodies: Sequence[str]) -> MineResult:
        # This is Drain.add_log_message (drain3 0.9) built from Drain's steps, in its
        # order, so a body is tokenised once and shared by the search and the
        # parameter extraction, and an unchanged template costs one tuple comparison.
        # The search is ``_search`` (Drain's tree_search and fast_match computed on our
        # templates); the tests hold it all to add_log_message's results and tree,
        # body for body.
        drain = self._drain
        search = self._search
        bounded = self._config.max_clusters is not None
        templates = self._templates
        # On the LRU cache, [] is the touch add_log_message does on a match.
        touch = cast(_Touchable, drain.id_to_cluster).__getitem__
        delimiters = self._config.extra_delimiters
        ids: list[int] = []
        params: list[tuple[str, ...]] = []
        events: list[TemplateEvent] = []
        append_id = ids.append
        append_params = params.append
        for index, body in enumerate(bodies):
            tokens = body.split() if not delimiters else tokenize(body, delimiters)
            template, exact = search(tokens)
            if template is None:
                template = self._create(tokens, index, events)
            else:
                cluster = template.cluster
                if not exact:
                    self._widen(cluster, tokens, template, index, events)
                cluster.size += 1
                if bounded:
                    drain_id = cluster.cluster_id
                    touch(drain_id)
                    del templates[drain_id]
                    templates[drain_id] = template
            append_id(template.template_id)
            pick = template.params
            append_params(pick(tokens) if pick is not None else ())
        return MineResult(ids, params, events)

    def _search(self, tokens: list[str]) -> tuple[_Template | None, bool]:
        """``Drain.tree_search(root, tokens, sim_th, include_params=False)`` computed on
        our templates, and whether the match has every one of its constant tokens (so
        no widening). The same leaf (first level by token count, then at most
        ``max_node_depth - 1`` tokens, a missing token taking the wildcard child), the
        same candidates in the leaf's order (a cluster the LRU evicted is skipped: our
        map mirrors Drain's), the same similarity ``float(same) / len`` and the same
        rule (the best similarity, ties to more wildcards, the first of equals; none
        below ``sim_th``). Drain's version walks every token pair in Python (about a
        third of the turn's mining under load); here the constants are compared in C."""
        drain = self._drain
        count = len(tokens)
        node = drain.root_node.key_to_child_node.get(str(count))
        if node is None:
            return None, False
        templates = self._templates
        if count == 0:
            # Drain returns the group's first cluster without a similarity test.
            return templates.get(node.cluster_ids[0]), True
        depth = 1
        limit = drain.max_node_depth
        for token in tokens:
            if depth >= limit or depth == count:
                break
            children = node.key_to_child_node
            child = children.get(token)
            if child is None:
                child = children.get(PARAM)
                if child is None:
                    return None, False
            node = child
            depth += 1
        best: _Template | None = None
        best_same = 0
        max_sim = -1.0
        max_params = -1
        for drain_id in node.cluster_ids:
            template = templates.get(drain_id)
            if template is None:
                continue
            same = template.same(tokens)
            sim = float(same) / count
            wildcards = len(template.positions)
            if sim > max_sim or (sim == max_sim and wildcards > max_params):
                max_sim, max_params, best, best_same = sim, wildcards, template, same
        if best is None or max_sim < drain.sim_th:
            return None, False
        return best, best_same == best.fixed

    def _create(self, tokens: list[str], index: int, events: list[TemplateEvent]) -> _Template:
        drain = self._drain
        # The id first: if the allocator fails, Drain's tree has not changed.
        template_id = self._allocator.allocate()
        drain.clusters_counter += 1
        drain_id = drain.clusters_counter
        cluster = _new_cluster(tokens, drain_id, 1)
        # Inserting may evict Drain's least recently used cluster; the prefix-tree
        # insert after it drops evicted ids from the leaf it lands in, as in drain3.
        drain.id_to_cluster[drain_id] = cluster
        drain.add_seq_to_prefix_tree(drain.root_node, cluster)
        template = _Template(template_id, 1, cluster, cluster.log_template_tokens)
        self._templates[drain_id] = template
        limit = self._config.max_clusters
        if limit is not None and len(self._templates) > limit:
            evicted = next(iter(self._templates))
            if evicted in drain.id_to_cluster:
                raise MinerError(f"LRU mirror disagrees with Drain: cluster {evicted} is live")
            del self._templates[evicted]
        events.append(TemplateEvent(template_id, 1, " ".join(tokens), "created", index))
        return template

    def _widen(
        self,
        cluster: _DrainCluster,
        tokens: list[str],
        template: _Template,
        index: int,
        events: list[TemplateEvent],
    ) -> None:
        widened = tuple(self._drain.create_template(tokens, cluster.log_template_tokens))
        if widened == cluster.log_template_tokens:
            raise MinerError(
                f"cluster {cluster.cluster_id}: constants differ but Drain did not widen"
            )
        cluster.log_template_tokens = widened
        template.version += 1
        template.reshape(widened)
        events.append(
            TemplateEvent(
                template.template_id, template.version, " ".join(widened), "changed", index
            )
        )

    def _cluster(self, drain_id: int) -> _DrainCluster:
        cluster = self._drain.id_to_cluster.get(drain_id)
        if cluster is None:
            raise MinerError(f"template map names cluster {drain_id}, which Drain lacks")
        return cluster

    # -- snapshots -------------------------------------------------------------------

    def to_snapshot(self) -> bytes:
        """The miner's complete state in the versioned format of the module docstring."""
        if self._failed is not None:
            raise MinerFailedError(
                f"miner failed earlier ({self._failed!r}); its state is not snapshotted"
            ) from self._failed
        drain = self._drain
        if len(drain.id_to_cluster) != len(self._templates):
            raise MinerError(
                f"Drain holds {len(drain.id_to_cluster)} clusters, "
                f"the template map {len(self._templates)}"
            )
        clusters: list[list[object]] = []
        for drain_id, template in self._templates.items():
            cluster = self._cluster(drain_id)
            clusters.append(
                [
                    drain_id,
                    template.template_id,
                    template.version,
                    cluster.size,
                    list(cluster.log_template_tokens),
                ]
            )
        nodes: list[list[object]] = []
        stack: list[tuple[int, str, _DrainNode]] = [(-1, "", drain.root_node)]
        while stack:
            parent, key, node = stack.pop()
            index = len(nodes)
            nodes.append([parent, key, list(node.cluster_ids)])
            # Reversed onto the stack so children come out, and are rebuilt, in order.
            for child_key, child in reversed(node.key_to_child_node.items()):
                stack.append((index, child_key, child))
        config = self._config
        body = {
            "config": {
                "sim_th": config.sim_th,
                "depth": config.depth,
                "max_children": config.max_children,
                "max_clusters": config.max_clusters,
                "extra_delimiters": list(config.extra_delimiters),
                "parametrize_numeric_tokens": config.parametrize_numeric_tokens,
            },
            "clusters_counter": drain.clusters_counter,
            "clusters": clusters,
            "nodes": nodes,
        }
        # ASCII-only JSON escapes lone surrogates too, which UTF-8 could not encode.
        encoded = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii")
        header = _SNAPSHOT_HEADER.pack(
            SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, len(encoded), crc32c.crc32c(encoded)
        )
        return header + encoded

    @classmethod
    def from_snapshot(cls, data: bytes, allocator: TemplateIdAllocator) -> TenantMiner:
        """Rebuild a miner from ``to_snapshot`` bytes; consumes no ids of ``allocator``."""
        body = _decode_snapshot_body(data)
        config, counter, cluster_rows, node_rows = _parse_body(body)
        miner = cls(allocator, config)
        drain = miner._drain
        for drain_id, template_id, version, size, tokens in cluster_rows:
            # Insertion order is the LRU order (oldest first) that was captured.
            cluster = _new_cluster(tokens, drain_id, size)
            drain.id_to_cluster[drain_id] = cluster
            miner._templates[drain_id] = _Template(template_id, version, cluster, tuple(tokens))
        built: list[_DrainNode] = []
        for parent, key, cluster_ids in node_rows:
            node = drain.root_node if parent < 0 else _new_node()
            node.cluster_ids = cluster_ids
            if parent >= 0:
                built[parent].key_to_child_node[key] = node
            built.append(node)
        drain.clusters_counter = counter
        return miner


_Row = tuple[int, int, int, int, list[str]]
_NodeRow = tuple[int, str, list[int]]
_BODY_KEYS = frozenset({"config", "clusters_counter", "clusters", "nodes"})
_CONFIG_KEYS = frozenset(
    {
        "sim_th",
        "depth",
        "max_children",
        "max_clusters",
        "extra_delimiters",
        "parametrize_numeric_tokens",
    }
)


def _decode_snapshot_body(data: bytes) -> object:
    if len(data) < _SNAPSHOT_HEADER.size:
        raise SnapshotDecodeError(
            f"truncated: {len(data)} bytes, the header alone is {_SNAPSHOT_HEADER.size}"
        )
    magic, version, reserved, length, stored = _SNAPSHOT_HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotDecodeError(f"bad magic {bytes(magic)!r}, expected {SNAPSHOT_MAGIC!r}")
    if version != SNAPSHOT_VERSION:
        raise SnapshotDecodeError(f"unknown version {version}, this build reads {SNAPSHOT_VERSION}")
    if reserved != 0:
        raise SnapshotDecodeError(f"non-zero reserved field {reserved:#06x}")
    actual = len(data) - _SNAPSHOT_HEADER.size
    if actual < length:
        raise SnapshotDecodeError(f"truncated: header says {length} body bytes, {actual} present")
    if actual > length:
        raise SnapshotDecodeError(f"{actual - length} trailing bytes after the {length}-byte body")
    encoded = bytes(data[_SNAPSHOT_HEADER.size :])
    computed = crc32c.crc32c(encoded)
    if computed != stored:
        raise SnapshotDecodeError(
            f"body CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )
    try:
        return cast(object, json.loads(encoded.decode("ascii")))
    except (ValueError, RecursionError) as exc:
        raise SnapshotDecodeError(f"malformed body: not ASCII JSON: {exc}") from exc


def _malformed(what: str) -> SnapshotDecodeError:
    return SnapshotDecodeError(f"malformed body: {what}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _malformed(f"{what} is {value!r}, expected an integer in [{low}, {high}]")
    return value


def _list(value: object, what: str, length: int | None = None) -> list[object]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        shape = "a list" if length is None else f"a list of {length}"
        raise _malformed(f"{what} is {type(value).__name__}, expected {shape}")
    return cast(list[object], value)


def _strs(value: object, what: str) -> list[str]:
    items = _list(value, what)
    for item in items:
        if not isinstance(item, str):
            raise _malformed(f"{what} holds {item!r}, expected strings")
    return cast(list[str], items)


def _object(value: object, what: str, keys: frozenset[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _malformed(f"{what} is {type(value).__name__}, expected an object")
    found = frozenset(cast(dict[str, object], value))
    if found != keys:
        raise _malformed(
            f"{what} keys: missing {sorted(keys - found)}, unknown {sorted(found - keys)}"
        )
    return cast(dict[str, object], value)


def _parse_config(value: object) -> MinerConfig:
    raw = _object(value, "config", _CONFIG_KEYS)
    sim_th = raw["sim_th"]
    if not isinstance(sim_th, int | float) or isinstance(sim_th, bool):
        raise _malformed(f"config.sim_th is {sim_th!r}, expected a number")
    max_clusters = raw["max_clusters"]
    numeric = raw["parametrize_numeric_tokens"]
    if not isinstance(numeric, bool):
        raise _malformed(f"config.parametrize_numeric_tokens is {numeric!r}, expected a bool")
    try:
        return MinerConfig(
            sim_th=float(sim_th),
            depth=_int(raw["depth"], "config.depth", 0, 1 << 31),
            max_children=_int(raw["max_children"], "config.max_children", 0, 1 << 31),
            max_clusters=(
                None
                if max_clusters is None
                else _int(max_clusters, "config.max_clusters", 0, 1 << 31)
            ),
            extra_delimiters=tuple(_strs(raw["extra_delimiters"], "config.extra_delimiters")),
            parametrize_numeric_tokens=numeric,
        )
    except (ValueError, OverflowError) as exc:
        raise _malformed(f"config: {exc}") from exc


def _parse_body(body: object) -> tuple[MinerConfig, int, list[_Row], list[_NodeRow]]:
    raw = _object(body, "top level", _BODY_KEYS)
    config = _parse_config(raw["config"])
    counter = _int(raw["clusters_counter"], "clusters_counter", 0, _INT64_MAX)

    rows: list[_Row] = []
    seen_templates: set[int] = set()
    live: dict[int, int] = {}  # drain id -> how many nodes reference it
    for n, item in enumerate(_list(raw["clusters"], "clusters")):
        what = f"clusters[{n}]"
        fields = _list(item, what, 5)
        drain_id = _int(fields[0], f"{what}.drain_id", 1, counter)
        template_id = _int(fields[1], f"{what}.template_id", _INT64_MIN, _INT64_MAX)
        version = _int(fields[2], f"{what}.version", 1, _INT64_MAX)
        size = _int(fields[3], f"{what}.size", 1, _INT64_MAX)
        tokens = _strs(fields[4], f"{what}.tokens")
        if drain_id in live:
            raise _malformed(f"{what}: drain id {drain_id} appears twice")
        if template_id in seen_templates:
            raise _malformed(f"{what}: template id {template_id} appears twice")
        live[drain_id] = 0
        seen_templates.add(template_id)
        rows.append((drain_id, template_id, version, size, tokens))
    if config.max_clusters is not None and len(rows) > config.max_clusters:
        raise _malformed(f"{len(rows)} clusters exceed max_clusters={config.max_clusters}")

    node_rows: list[_NodeRow] = []
    children: list[set[str]] = []
    for n, item in enumerate(_list(raw["nodes"], "nodes")):
        what = f"nodes[{n}]"
        fields = _list(item, what, 3)
        parent = _int(fields[0], f"{what}.parent", -1, n - 1)
        if (parent < 0) != (n == 0):
            raise _malformed(f"{what}: only nodes[0], the root, has no parent")
        key = fields[1]
        if not isinstance(key, str):
            raise _malformed(f"{what}.key is {key!r}, expected a string")
        if parent >= 0:
            if key in children[parent]:
                raise _malformed(f"{what}: key {key!r} twice under nodes[{parent}]")
            children[parent].add(key)
        raw_ids = _list(fields[2], f"{what}.cluster_ids")
        cluster_ids = [_int(i, f"{what}.cluster_ids", 1, counter) for i in raw_ids]
        if len(set(cluster_ids)) != len(cluster_ids):
            raise _malformed(f"{what}: a cluster id repeats")
        for drain_id in cluster_ids:
            if drain_id in live:
                live[drain_id] += 1
            elif config.max_clusters is None:
                # Only the LRU leaves ids of evicted clusters in the tree.
                raise _malformed(f"{what}: cluster {drain_id} is not a live cluster")
        children.append(set())
        node_rows.append((parent, key, cluster_ids))
    if not node_rows:
        raise _malformed("no root node")
    for drain_id, references in live.items():
        if references != 1:
            raise _malformed(f"cluster {drain_id} is in {references} tree nodes, expected 1")
    return config, counter, rows, node_rows


# -- all tenants -------------------------------------------------------------------------


class MinerCluster:
    """Every tenant's miner on this node, created on first use, one shared allocator.

    ``miner_type`` is the class every miner is built from (``TenantMiner`` or a
    subclass): the seam through which a test injects a mining failure at a chosen
    record, in process and in a real ``ourios serve`` (``tests/support/minerfaults.py``),
    without a field in the production types."""

    def __init__(
        self,
        allocator: TemplateIdAllocator,
        default_config: MinerConfig | None = None,
        tenant_configs: Mapping[str, MinerConfig] | None = None,
        *,
        miner_type: type[TenantMiner] = TenantMiner,
    ) -> None:
        self._allocator = allocator
        self._default = default_config if default_config is not None else MinerConfig()
        self._configs = dict(tenant_configs or {})
        self._miners: dict[str, TenantMiner] = {}
        self._type = miner_type

    @property
    def allocator(self) -> TemplateIdAllocator:
        return self._allocator

    def config_for(self, tenant: str) -> MinerConfig:
        return self._configs.get(tenant, self._default)

    def tenants(self) -> list[str]:
        """Tenants with a miner, sorted."""
        return sorted(self._miners)

    def get(self, tenant: str) -> TenantMiner | None:
        return self._miners.get(tenant)

    def miner(self, tenant: str) -> TenantMiner:
        """The tenant's miner, created empty with its configuration on first use."""
        miner = self._miners.get(tenant)
        if miner is None:
            miner = self._type(self._allocator, self.config_for(tenant))
            self._miners[tenant] = miner
        return miner

    def mine(self, tenant: str, bodies: Sequence[str]) -> MineResult:
        return self.miner(tenant).mine(bodies)

    def restore(self, tenant: str, data: bytes) -> TenantMiner:
        """Install the tenant's miner from a snapshot, replacing any it had.

        The snapshot's own configuration is used: its tree was built under it.
        """
        miner = self._type.from_snapshot(data, self._allocator)
        self._miners[tenant] = miner
        return miner

    def build(self, tenant: str, snapshot: bytes | None) -> TenantMiner:
        """A miner for ``tenant`` that is *not* installed: restored from ``snapshot`` or
        empty with the tenant's configuration (settlement rebuilds into it off to the
        side, then swaps it in with ``replace_tenant``)."""
        if snapshot is None:
            return self._type(self._allocator, self.config_for(tenant))
        return self._type.from_snapshot(snapshot, self._allocator)

    def replace_tenant(self, tenant: str, miner: TenantMiner) -> TenantMiner | None:
        """Drop the tenant's live miner and install ``miner`` as one operation (callers
        hold the miner lock, so no one observes the tenant absent); no other tenant and
        no allocator state is touched — template ids are never rewound. Returns the
        discarded miner."""
        old = self._miners.get(tenant)
        self._miners[tenant] = miner
        return old

    def discard(self, tenant: str) -> None:
        """Forget the tenant's miner."""
        self._miners.pop(tenant, None)

"""The miner snapshot's bytes: one tenant's Drain tree, template ids and configuration.

``TenantMiner.to_snapshot`` gathers its state into a ``MinerSnapshot`` and
``encode_miner_snapshot`` writes it; ``decode_miner_snapshot`` refuses anything that is
not exactly this format, so a restore never builds a tree from damaged bytes. The
snapshot store (``app/ingest/snapshot_store.py``) keeps these bytes with the tenant's horizon.

Format, integers little-endian::

    offset  size  field
    0       4     magic b"OMNR"
    4       2     u16 version, currently 2 (1 is still read)
    6       2     u16 reserved, must be 0
    8       4     u32 body length in bytes
    12      4     u32 CRC-32C (Castagnoli) of the body
    16      n     body: compact JSON, ASCII only (non-ASCII and lone surrogates escaped)

The version-2 body is one object with exactly these keys::

    {"config":   {"sim_th": float, "depth": int, "max_children": int,
                  "max_clusters": int | null, "extra_delimiters": [str, ...],
                  "parametrize_numeric_tokens": bool, "max_body_chars": int | null,
                  "max_body_tokens": int | null, "max_leaf_clusters": int | null},
     "clusters_counter": int,          # Drain's last issued cluster id
     "clusters": [[drain_id, template_id, version, size, [token, ...]], ...],
     "nodes":    [[parent_index, key, [drain_id, ...]], ...]}

Version 1 is the same without the last three config keys (read as null: no bound).

``clusters`` lists every live Drain cluster, least recently used first when
``max_clusters`` is set (the LRU order Drain evicts in) and in creation order otherwise.
``nodes`` is the prefix tree in pre-order: ``nodes[0]`` is the root (parent -1, key
""), every other node names an earlier node as its parent, and a node's children appear
in the order of its ``key_to_child_node`` dict. Node cluster lists are kept verbatim,
including ids of clusters the LRU evicted (Drain drops those lazily; this build's miner
drops them, and the nodes they leave empty, at the eviction), so a restored tree is
equal to the original, node for node.

Version policy: only the current version is written; a reader refuses an unknown
version, a non-zero reserved field, a length or CRC mismatch, and any body that does
not have exactly the shape above (unknown keys included), raising
``SnapshotDecodeError`` with what is wrong. A format change bumps the version and keeps
a reader for every version still on disk.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import cast

import crc32c

from app.ingest.mining.errors import SnapshotDecodeError
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import INT64_MAX, INT64_MIN

__all__ = [
    "SNAPSHOT_MAGIC",
    "SNAPSHOT_VERSION",
    "ClusterRow",
    "MinerSnapshot",
    "NodeRow",
    "decode_miner_snapshot",
    "encode_miner_snapshot",
]

SNAPSHOT_MAGIC = b"OMNR"
SNAPSHOT_VERSION = 2
#: versions a reader accepts (a format change keeps a reader for each still on disk)
_READABLE_VERSIONS = frozenset({1, 2})

_SNAPSHOT_HEADER = struct.Struct("<4sHHII")

#: ``[drain_id, template_id, version, size, tokens]``
ClusterRow = tuple[int, int, int, int, list[str]]
#: ``[parent_index, key, cluster_ids]``
NodeRow = tuple[int, str, list[int]]


@dataclass(frozen=True, slots=True)
class MinerSnapshot:
    """A snapshot's content: the body's four keys, rows in their on-disk order."""

    config: MinerConfig
    clusters_counter: int
    clusters: list[ClusterRow]
    nodes: list[NodeRow]


def encode_miner_snapshot(state: MinerSnapshot) -> bytes:
    """The snapshot's bytes in the format of the module docstring."""
    config = state.config
    body = {
        "config": {
            "sim_th": config.sim_th,
            "depth": config.depth,
            "max_children": config.max_children,
            "max_clusters": config.max_clusters,
            "extra_delimiters": list(config.extra_delimiters),
            "parametrize_numeric_tokens": config.parametrize_numeric_tokens,
            "max_body_chars": config.max_body_chars,
            "max_body_tokens": config.max_body_tokens,
            "max_leaf_clusters": config.max_leaf_clusters,
        },
        "clusters_counter": state.clusters_counter,
        "clusters": state.clusters,
        "nodes": state.nodes,
    }
    # ASCII-only JSON escapes lone surrogates too, which UTF-8 could not encode.
    encoded = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii")
    header = _SNAPSHOT_HEADER.pack(
        SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, len(encoded), crc32c.crc32c(encoded)
    )
    return header + encoded


def decode_miner_snapshot(data: bytes) -> MinerSnapshot:
    """The content of ``encode_miner_snapshot`` bytes; ``SnapshotDecodeError`` says what
    is wrong with anything else."""
    version, body = _decode_snapshot_body(data)
    return _parse_body(body, version)


_BODY_KEYS = frozenset({"config", "clusters_counter", "clusters", "nodes"})
_CONFIG_KEYS_V1 = frozenset(
    {
        "sim_th",
        "depth",
        "max_children",
        "max_clusters",
        "extra_delimiters",
        "parametrize_numeric_tokens",
    }
)
_BOUND_KEYS = ("max_body_chars", "max_body_tokens", "max_leaf_clusters")
_CONFIG_KEYS = {1: _CONFIG_KEYS_V1, 2: _CONFIG_KEYS_V1 | frozenset(_BOUND_KEYS)}


def _decode_snapshot_body(data: bytes) -> tuple[int, object]:
    if len(data) < _SNAPSHOT_HEADER.size:
        raise SnapshotDecodeError(
            f"truncated: {len(data)} bytes, the header alone is {_SNAPSHOT_HEADER.size}"
        )
    magic, version, reserved, length, stored = _SNAPSHOT_HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotDecodeError(f"bad magic {bytes(magic)!r}, expected {SNAPSHOT_MAGIC!r}")
    if version not in _READABLE_VERSIONS:
        raise SnapshotDecodeError(
            f"unknown version {version}, this build reads {sorted(_READABLE_VERSIONS)}"
        )
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
        return version, cast(object, json.loads(encoded.decode("ascii")))
    except (ValueError, RecursionError) as exc:
        raise SnapshotDecodeError(f"malformed body: not ASCII JSON: {exc}") from exc


def _malformed(what: str) -> SnapshotDecodeError:
    return SnapshotDecodeError(f"malformed body: {what}")


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


def _optional_int(raw: dict[str, object], key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else _int(value, f"config.{key}", 0, 1 << 31)


def _parse_config(value: object, version: int) -> MinerConfig:
    raw = _object(value, "config", _CONFIG_KEYS[version])
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
            max_body_chars=_optional_int(raw, "max_body_chars"),
            max_body_tokens=_optional_int(raw, "max_body_tokens"),
            max_leaf_clusters=_optional_int(raw, "max_leaf_clusters"),
        )
    except (ValueError, OverflowError) as exc:
        raise _malformed(f"config: {exc}") from exc


def _parse_body(body: object, version: int) -> MinerSnapshot:
    raw = _object(body, "top level", _BODY_KEYS)
    config = _parse_config(raw["config"], version)
    counter = _int(raw["clusters_counter"], "clusters_counter", 0, INT64_MAX)

    rows: list[ClusterRow] = []
    seen_templates: set[int] = set()
    live: dict[int, int] = {}  # drain id -> how many nodes reference it
    for n, item in enumerate(_list(raw["clusters"], "clusters")):
        what = f"clusters[{n}]"
        fields = _list(item, what, 5)
        drain_id = _int(fields[0], f"{what}.drain_id", 1, counter)
        template_id = _int(fields[1], f"{what}.template_id", INT64_MIN, INT64_MAX)
        version = _int(fields[2], f"{what}.version", 1, INT64_MAX)
        size = _int(fields[3], f"{what}.size", 1, INT64_MAX)
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

    node_rows: list[NodeRow] = []
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
    return MinerSnapshot(config, counter, rows, node_rows)

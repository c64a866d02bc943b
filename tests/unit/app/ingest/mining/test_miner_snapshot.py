"""app.ingest.mining.miner_snapshot: the OMNR bytes, and every damaged snapshot refused."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

import crc32c
import pytest

from app.ingest.mining.errors import (
    SnapshotDecodeError,
)
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import (
    CountingAllocator,
)
from app.ingest.mining.tenant_miner import TenantMiner
from tests.support.mining import corpus, flip, mine_all


def test_snapshot_golden_bytes() -> None:
    # Catches accidental format changes; regenerate only on purpose (bump the version).
    miner = TenantMiner(CountingAllocator(7))
    miner.mine(["open file a.txt", "open file b.txt", "héllo wörld"])
    body = (
        b'{"config":{"sim_th":0.4,"depth":4,"max_children":100,"max_clusters":null,'
        b'"extra_delimiters":[],"parametrize_numeric_tokens":true,"max_body_chars":null,'
        b'"max_body_tokens":null,"max_leaf_clusters":null},"clusters_counter":2,'
        b'"clusters":[[1,7,2,2,["open","file","<*>"]],[2,8,1,1,["h\\u00e9llo","w\\u00f6rld"]]],'
        b'"nodes":[[-1,"",[]],[0,"3",[]],[1,"open",[1]],[0,"2",[]],[3,"h\\u00e9llo",[2]]]}'
    )
    header = b"OMNR" + struct.pack("<HHII", 2, 0, len(body), crc32c.crc32c(body))
    assert miner.to_snapshot() == header + body


def test_version_1_snapshot_is_still_read() -> None:
    # Written before the body bounds: its config has no max_body_* / max_leaf_clusters.
    body = (
        b'{"config":{"sim_th":0.4,"depth":4,"max_children":100,"max_clusters":null,'
        b'"extra_delimiters":[],"parametrize_numeric_tokens":true},"clusters_counter":2,'
        b'"clusters":[[1,7,2,2,["open","file","<*>"]],[2,8,1,1,["h\\u00e9llo","w\\u00f6rld"]]],'
        b'"nodes":[[-1,"",[]],[0,"3",[]],[1,"open",[1]],[0,"2",[]],[3,"h\\u00e9llo",[2]]]}'
    )
    restored = TenantMiner.from_snapshot(_reframe(body, version=1), CountingAllocator(9))
    assert restored.config == MinerConfig()
    assert [t.template_id for t in restored.templates()] == [7, 8]
    assert restored.mine(["open file c.txt"]).template_ids == [7]


def _snapshot() -> bytes:
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_clusters=5))
    mine_all(miner, corpus(5, 200))
    return miner.to_snapshot()


def _reframe(body: bytes, version: int = 2, reserved: int = 0) -> bytes:
    header = struct.pack("<HHII", version, reserved, len(body), crc32c.crc32c(body))
    return b"OMNR" + header + body


def _edit(change: Callable[[Any], object]) -> bytes:
    body = json.loads(_snapshot()[16:])
    change(body)
    return _reframe(json.dumps(body).encode())


def _set(path: Sequence[str | int], value: object) -> Callable[[Any], None]:
    def change(body: Any) -> None:
        target = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


CORRUPT = [
    pytest.param(lambda d: b"XMNR" + d[4:], "bad magic", id="bad_magic"),
    pytest.param(lambda d: _reframe(d[16:], version=3), "unknown version 3", id="bad_version"),
    pytest.param(lambda d: _reframe(d[16:], version=1), "unknown ['max_body", id="v2_body_as_v1"),
    pytest.param(lambda d: _reframe(d[16:], version=0), "unknown version 0", id="version_zero"),
    pytest.param(lambda d: _reframe(d[16:], reserved=1), "reserved", id="nonzero_reserved"),
    pytest.param(lambda d: flip(d, len(d) - 5), "CRC mismatch", id="bad_crc_body"),
    pytest.param(lambda d: flip(d, 12), "CRC mismatch", id="bad_crc_field"),
    pytest.param(lambda d: d[:10], "truncated", id="truncated_header"),
    pytest.param(lambda d: d[:-1], "truncated", id="truncated_body"),
    pytest.param(lambda d: d[:16], "truncated", id="truncated_to_header"),
    pytest.param(lambda d: b"", "truncated", id="empty"),
    pytest.param(lambda d: d + b"\0", "trailing", id="trailing_bytes"),
    pytest.param(lambda d: _reframe(b"{not json"), "not ASCII JSON", id="not_json"),
    pytest.param(lambda d: _reframe(b"{}" + b"\xff"), "not ASCII", id="not_ascii"),
    pytest.param(lambda d: _reframe(b"[1,2]"), "expected an object", id="not_object"),
    pytest.param(lambda d: _edit(lambda b: b.pop("nodes")), "missing ['nodes']", id="no_nodes"),
    pytest.param(lambda d: _edit(_set(["extra"], 1)), "unknown ['extra']", id="unknown_key"),
    pytest.param(lambda d: _edit(_set(["config", "depth"], 2)), "depth", id="bad_depth"),
    pytest.param(lambda d: _edit(_set(["config", "sim_th"], "x")), "sim_th", id="bad_sim_th"),
    pytest.param(lambda d: _edit(_set(["config", "sim_th"], 1e400)), "sim_th", id="inf_sim_th"),
    pytest.param(
        lambda d: _edit(_set(["config", "parametrize_numeric_tokens"], 1)),
        "parametrize_numeric_tokens",
        id="numeric_not_bool",
    ),
    pytest.param(lambda d: _edit(_set(["clusters_counter"], True)), "counter", id="bool_counter"),
    pytest.param(lambda d: _edit(_set(["clusters_counter"], 0)), "drain_id", id="low_counter"),
    pytest.param(lambda d: _edit(_set(["clusters", 0, 4], [1])), "tokens", id="bad_tokens"),
    pytest.param(lambda d: _edit(_set(["clusters", 0, 2], 0)), "version", id="version_0"),
    pytest.param(
        lambda d: _edit(lambda b: b["clusters"].append(b["clusters"][0])),
        "appears twice",
        id="duplicate_cluster",
    ),
    pytest.param(
        lambda d: _edit(_set(["config", "max_clusters"], 1)), "exceed", id="over_max_clusters"
    ),
    pytest.param(lambda d: _edit(_set(["nodes", 1, 0], 5)), "parent", id="forward_parent"),
    pytest.param(lambda d: _edit(_set(["nodes", 0, 0], 0)), "parent", id="root_parent"),
    pytest.param(lambda d: _edit(_set(["nodes"], [])), "root", id="no_root"),
    pytest.param(
        lambda d: _edit(lambda b: b["nodes"].append(b["nodes"][1])),
        "twice under",
        id="duplicate_child_key",
    ),
    pytest.param(
        lambda d: _edit(lambda b: [n[2].clear() for n in b["nodes"]]),
        "tree nodes, expected 1",
        id="cluster_not_in_tree",
    ),
]


@pytest.mark.parametrize(("corrupt", "reason"), CORRUPT)
def test_corrupt_snapshot_is_refused(corrupt: Callable[[bytes], bytes], reason: str) -> None:
    with pytest.raises(SnapshotDecodeError) as info:
        TenantMiner.from_snapshot(corrupt(_snapshot()), CountingAllocator())
    assert reason in info.value.reason


def test_unbounded_snapshot_refuses_dangling_cluster_ids() -> None:
    miner = TenantMiner(CountingAllocator())
    miner.mine(["a b c", "d e f g"])
    body = json.loads(miner.to_snapshot()[16:])
    body["clusters"].pop()
    with pytest.raises(SnapshotDecodeError, match="not a live cluster"):
        TenantMiner.from_snapshot(_reframe(json.dumps(body).encode()), CountingAllocator())


def test_every_single_bit_flip_and_truncation_is_refused() -> None:
    data = _snapshot()
    for offset in range(len(data)):
        with pytest.raises(SnapshotDecodeError):
            TenantMiner.from_snapshot(flip(data, offset), CountingAllocator())
        with pytest.raises(SnapshotDecodeError):
            TenantMiner.from_snapshot(data[:offset], CountingAllocator())

"""Tests for app.ingest.miner: mining, parameters, events, snapshots and template ids."""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import crc32c
import pytest
from drain3.drain import Drain
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.ingest.miner import (
    MAX_COUNTER,
    PARAM,
    CountingAllocator,
    FileTemplateIdAllocator,
    MinerCluster,
    MinerConfig,
    MinerError,
    MineResult,
    MinerFailedError,
    SnapshotDecodeError,
    TemplateEvent,
    TemplateIdError,
    TemplateIdExhaustedError,
    TemplateIdStateError,
    TenantMiner,
    decode_allocator_state,
    encode_allocator_state,
    make_template_id,
    tokenize,
)

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None)

# -- a corpus of realistic log lines ----------------------------------------------------

_USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]
_PATHS = ["/api/v1/users", "/api/v1/orders", "/healthz", "/metrics", "/api/v2/items/search"]
_SERVICES = ["scheduler", "api", "ingester", "compactor", "querier"]


def _ip(r: random.Random) -> str:
    return f"10.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(256)}"


def _uuid(r: random.Random) -> str:
    return str(uuid.UUID(int=r.getrandbits(128), version=4))


_TEMPLATES: list[Callable[[random.Random], str]] = [
    lambda r: f"Accepted connection from {_ip(r)}:{r.randrange(1024, 65535)} to {_ip(r)}:443",
    lambda r: (
        f"GET {r.choice(_PATHS)}/{r.randrange(100000)} HTTP/1.1 "
        f"{r.choice([200, 200, 404, 500])} {r.randrange(1, 900)}ms"
    ),
    lambda r: f"user {r.choice(_USERS)} logged in from {_ip(r)} session={_uuid(r)}",
    lambda r: f"Connection timeout after {r.randrange(1000, 5000)} ms to db-{r.randrange(5)}:5432",
    lambda r: (
        f"INFO [worker-{r.randrange(16)}] Processed {r.randrange(10000)} records "
        f"in {r.random() * 100:.2f} s"
    ),
    lambda r: (
        f"request_id={_uuid(r)} method=POST path={r.choice(_PATHS)} "
        f"status={r.choice([201, 400, 409])} duration={r.random():.4f}"
    ),
    lambda r: (
        f"Failed to send batch to kafka topic {r.choice(['logs', 'events'])}: broker "
        f"{_ip(r)} not available, retry {r.randrange(10)}"
    ),
    lambda r: f"GC pause {r.randrange(300)}ms heap {r.randrange(4000)}MB -> {r.randrange(2000)}MB",
    lambda r: f"Starting {r.choice(_SERVICES)} version v1.{r.randrange(30)}.{r.randrange(10)}",
    lambda r: f"pod web-{_uuid(r)[:8]} in namespace {r.choice(['prod', 'dev'])} restarted",
    # whitespace runs, tabs and a trailing newline, as real bodies have them
    lambda r: f"  cache\tmiss  for key\tk{r.randrange(50)}   shard={r.randrange(4)}\n",
    lambda r: f"{r.choice(_SERVICES)} heartbeat ok",
    lambda r: f"checksum 0x{r.getrandbits(32):08x} mismatch on block {r.randrange(1 << 20)}",
    lambda r: f"literal wildcard {PARAM} in body {r.randrange(9)}",
    lambda r: r.choice(["", "   ", "\t"]),
]


def corpus(seed: int, n: int) -> list[str]:
    r = random.Random(seed)
    return [r.choice(_TEMPLATES)(r) for _ in range(n)]


def batches(lines: Sequence[str], size: int) -> list[list[str]]:
    return [list(lines[i : i + size]) for i in range(0, len(lines), size)]


def mine_all(miner: TenantMiner, lines: Sequence[str], batch: int = 37) -> MineResult:
    """Mine in batches and concatenate; event indices are made global."""
    ids: list[int] = []
    params: list[tuple[str, ...]] = []
    events: list[TemplateEvent] = []
    for chunk in batches(lines, batch):
        base = len(ids)
        result = miner.mine(chunk)
        ids.extend(result.template_ids)
        params.extend(result.template_params)
        events.extend(
            TemplateEvent(e.template_id, e.version, e.template, e.change, e.index + base)
            for e in result.events
        )
    return MineResult(ids, params, events)


DrainState = tuple[list[Any], list[tuple[int, tuple[str, ...], int]], int, str]


def drain_state(miner: TenantMiner) -> DrainState:
    """Drain's full state read from drain3's own objects, independent of our codec."""
    return state_of(miner._drain)  # the point is to look past our encoder


def state_of(drain: Any) -> DrainState:
    nodes: list[Any] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        children = node.key_to_child_node
        nodes.append((path, tuple(node.cluster_ids), tuple(children)))
        for key, child in children.items():
            walk(child, (*path, key))

    walk(drain.root_node, ())
    cache = drain.id_to_cluster
    if isinstance(cache, dict):
        order = list(cache)
    else:
        order = list(cache._LRUCache__order)  # cachetools' LRU order, oldest first
    clusters = []
    for drain_id in order:
        cluster = cache.get(drain_id)
        assert cluster is not None
        clusters.append((drain_id, cluster.log_template_tokens, cluster.size))
    return nodes, clusters, drain.clusters_counter, type(cache).__name__


CONFIGS = [
    pytest.param(MinerConfig(), id="default"),
    pytest.param(MinerConfig(max_clusters=6), id="lru"),
    pytest.param(MinerConfig(sim_th=0.7, depth=5, max_children=3), id="narrow"),
    pytest.param(MinerConfig(extra_delimiters=("=", ",", ":")), id="delimiters"),
    pytest.param(MinerConfig(parametrize_numeric_tokens=False, max_clusters=4), id="lru-literal"),
]
_config_strategy = st.sampled_from(
    [
        MinerConfig(),
        MinerConfig(max_clusters=6),
        MinerConfig(sim_th=0.7, depth=5, max_children=3),
        MinerConfig(extra_delimiters=("=", ",", ":")),
        MinerConfig(parametrize_numeric_tokens=False, max_clusters=4),
    ]
)


def raw_drain(config: MinerConfig) -> Drain:
    return Drain(
        depth=config.depth,
        sim_th=config.sim_th,
        max_children=config.max_children,
        max_clusters=config.max_clusters,
        extra_delimiters=config.extra_delimiters,
        parametrize_numeric_tokens=config.parametrize_numeric_tokens,
    )


# -- tokenisation and parameters ----------------------------------------------------------

_WS_TEXT = st.text(
    alphabet=st.sampled_from(list("ab=,:1<*> \t\n\r\x0b\x0c\xa0\u2003\u3000\x1c\x85")),
    max_size=40,
)


@SETTINGS
@given(body=_WS_TEXT, delimiters=st.sampled_from([(), ("=",), ("=", ","), (" :", ",")]))
@example(body="  :a b", delimiters=(" :", ","))  # drain3 strips before replacing
def test_tokenize_matches_drain3(body: str, delimiters: tuple[str, ...]) -> None:
    drain = Drain(extra_delimiters=delimiters)
    assert tokenize(body, delimiters) == drain.get_content_as_tokens(body)


def test_repeated_whitespace_tokenises_like_single_spaces() -> None:
    miner = TenantMiner(CountingAllocator())
    result = miner.mine(
        [
            "disk sda1 usage 91 percent",
            "  disk\tsda2   usage 42\n percent  ",
            "disk\u3000sdb1\xa0usage 7 percent",
        ]
    )
    assert len(set(result.template_ids)) == 1
    assert result.template_params == [(), ("sda2", "42"), ("sdb1", "7")]
    gc.collect()  # params are tuples: untracked once collected, never a GC burden
    assert not any(gc.is_tracked(params) for params in result.template_params)
    assert [e.template for e in result.events] == [
        "disk sda1 usage 91 percent",
        "disk <*> usage <*> percent",
    ]


def test_params_with_extra_delimiters() -> None:
    miner = TenantMiner(CountingAllocator(), MinerConfig(extra_delimiters=("=", ",")))
    result = miner.mine(["user=alice,status=ok", "user=bob,status=ok", " user=carol,status=fail"])
    assert result.template_params == [(), ("bob",), ("carol", "fail")]
    assert result.events[-1].template == "user <*> status <*>"


def test_body_with_literal_wildcard_token_is_a_parameter() -> None:
    miner = TenantMiner(CountingAllocator())
    result = miner.mine(["value <*> seen", "value 12 seen"])
    assert result.template_params == [("<*>",), ("12",)]
    assert len(result.events) == 1


def test_empty_and_blank_bodies_share_the_zero_token_template() -> None:
    miner = TenantMiner(CountingAllocator())
    result = miner.mine(["", "   ", "\t\n"])
    assert len(set(result.template_ids)) == 1
    assert result.template_params == [(), (), ()]
    assert [(e.change, e.template) for e in result.events] == [("created", "")]


@SETTINGS
@given(seed=st.integers(0, 2**32), config=_config_strategy)
def test_params_fill_the_template_back_into_the_body_tokens(seed: int, config: MinerConfig) -> None:
    lines = corpus(seed, 300)
    result = mine_all(TenantMiner(CountingAllocator(), config), lines)
    # The template as of each body is the last event for its id at or before the body.
    current: dict[int, str] = {}
    events = iter(result.events)
    pending = next(events, None)
    for i, body in enumerate(lines):
        while pending is not None and pending.index <= i:
            current[pending.template_id] = pending.template
            pending = next(events, None)
        template = tokenize(current[result.template_ids[i]], ())
        params = iter(result.template_params[i])
        rebuilt = [next(params) if token == PARAM else token for token in template]
        assert next(params, None) is None
        assert rebuilt == tokenize(body, config.extra_delimiters)
        assert len(result.template_params[i]) == template.count(PARAM)


# -- events against drain's own change types -------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_events_once_per_creation_and_widening(config: MinerConfig, seed: int) -> None:
    lines = corpus(seed, 1500)
    reference = raw_drain(config)
    miner = TenantMiner(CountingAllocator(), config)
    result = mine_all(miner, lines, batch=50)

    by_index: dict[int, list[TemplateEvent]] = {}
    for event in result.events:
        by_index.setdefault(event.index, []).append(event)
    drain_to_template: dict[int, int] = {}
    versions: dict[int, int] = {}
    counts = {"cluster_created": 0, "cluster_template_changed": 0, "none": 0}
    for i, body in enumerate(lines):
        cluster, change = reference.add_log_message(body)
        counts[change] += 1
        events = by_index.pop(i, [])
        template = " ".join(cluster.log_template_tokens)
        if change == "none":
            assert events == []
            assert drain_to_template[cluster.cluster_id] == result.template_ids[i]
            continue
        assert len(events) == 1
        (event,) = events
        assert event.template == template
        assert event.template_id == result.template_ids[i]
        if change == "cluster_created":
            assert cluster.cluster_id not in drain_to_template
            assert event.template_id not in versions  # a fresh id, never one seen before
            assert (event.change, event.version) == ("created", 1)
            drain_to_template[cluster.cluster_id] = event.template_id
        else:
            assert drain_to_template[cluster.cluster_id] == event.template_id
            assert (event.change, event.version) == ("changed", versions[event.template_id] + 1)
        versions[event.template_id] = event.version
    assert by_index == {}
    assert sum(e.change == "created" for e in result.events) == counts["cluster_created"]
    assert sum(e.change == "changed" for e in result.events) == counts["cluster_template_changed"]
    assert counts["cluster_template_changed"] > 0
    assert drain_state(miner) == state_of(reference)
    # Drain's clusters and ours agree, in LRU order when bounded.
    assert [t.template for t in miner.templates()] == [
        " ".join(c[1]) for c in drain_state(miner)[1]
    ]


_small_tokens = st.lists(st.sampled_from(["a", "b", "c", "1", "2", PARAM, "x9"]), max_size=6)


@settings(SETTINGS, max_examples=200)
@given(
    lines=st.lists(_small_tokens.map(" ".join), max_size=120),
    depth=st.integers(3, 5),
    sim_th=st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0]),
    max_children=st.integers(1, 4),
    max_clusters=st.sampled_from([None, 1, 2, 5]),
    numeric=st.booleans(),
    split=st.integers(0, 120),
)
def test_mining_is_drain_add_log_message_body_for_body(
    lines: list[str],
    depth: int,
    sim_th: float,
    max_children: int,
    max_clusters: int | None,
    numeric: bool,
    split: int,
) -> None:
    # Small alphabets force the corners: full leaves, wildcard children, evictions,
    # all-wildcard templates, literal <*> tokens and empty bodies. A snapshot restore
    # at `split` must not show in the results.
    config = MinerConfig(sim_th, depth, max_children, max_clusters, (), numeric)
    reference = raw_drain(config)
    allocator = CountingAllocator()
    miner = TenantMiner(allocator, config)
    head = mine_all(miner, lines[:split], batch=7)
    miner = TenantMiner.from_snapshot(miner.to_snapshot(), allocator)
    tail = mine_all(miner, lines[split:], batch=7)
    result = MineResult(
        head.template_ids + tail.template_ids,
        head.template_params + tail.template_params,
        head.events
        + [
            TemplateEvent(e.template_id, e.version, e.template, e.change, e.index + len(head))
            for e in tail.events
        ],
    )
    changes = [reference.add_log_message(line)[1] for line in lines]
    assert [e.index for e in result.events] == [
        i for i, change in enumerate(changes) if change != "none"
    ]
    assert [e.change for e in result.events] == [
        {"cluster_created": "created", "cluster_template_changed": "changed"}[c]
        for c in changes
        if c != "none"
    ]
    assert drain_state(miner) == state_of(reference)


def test_lru_eviction_mirrors_drain_and_never_reuses_ids() -> None:
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_clusters=2))
    first = miner.mine(["alpha one", "beta two three", "gamma four five six"])
    assert miner.template_count == 2
    assert [c[0] for c in drain_state(miner)[1]] == list(miner._templates)
    again = miner.mine(["alpha one"])  # evicted, so Drain makes a new cluster
    assert again.events[0].change == "created"
    assert again.template_ids[0] not in first.template_ids


# -- snapshots -----------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    config=_config_strategy,
    split=st.integers(0, 600),
    batch=st.integers(1, 97),
)
def test_snapshot_restore_continues_like_an_uninterrupted_miner(
    seed: int, config: MinerConfig, split: int, batch: int
) -> None:
    lines = corpus(seed, 600)
    head, tail = lines[:split], lines[split:]

    uninterrupted = TenantMiner(CountingAllocator(), config)
    mine_all(uninterrupted, head, batch)

    first_life_ids = CountingAllocator()
    interrupted = TenantMiner(first_life_ids, config)
    mine_all(interrupted, head, batch)
    data = interrupted.to_snapshot()

    second_life_ids = CountingAllocator(first_life_ids.next_id)
    restored = TenantMiner.from_snapshot(data, second_life_ids)
    assert second_life_ids.next_id == first_life_ids.next_id  # restore consumed nothing
    assert restored.config == config
    assert drain_state(restored) == drain_state(interrupted)
    assert restored.templates() == interrupted.templates()
    assert restored.to_snapshot() == data

    expected = mine_all(uninterrupted, tail, batch)
    assert mine_all(restored, tail, batch) == expected
    assert drain_state(restored) == drain_state(uninterrupted)


@pytest.mark.parametrize("config", CONFIGS)
def test_snapshot_round_trip_keeps_template_ids(config: MinerConfig) -> None:
    source_ids = CountingAllocator(1000)
    miner = TenantMiner(source_ids, config)
    mine_all(miner, corpus(11, 2000))
    restored = TenantMiner.from_snapshot(miner.to_snapshot(), CountingAllocator(source_ids.next_id))
    assert restored.templates() == miner.templates()
    assert drain_state(restored) == drain_state(miner)
    probe = corpus(12, 500)
    assert mine_all(restored, probe) == mine_all(miner, probe)


def test_new_templates_after_restore_get_fresh_ids() -> None:
    allocator = CountingAllocator(100)
    miner = TenantMiner(allocator)
    before = miner.mine(["service a started", "queue depth 5 items"])
    assert sorted(set(before.template_ids)) == [100, 101]
    restored = TenantMiner.from_snapshot(miner.to_snapshot(), allocator)
    assert allocator.next_id == 102
    after = restored.mine(["queue depth 9 items", "a brand new message"])
    assert after.template_ids == [101, 102]
    assert [(e.template_id, e.version, e.change) for e in after.events] == [
        (101, 2, "changed"),
        (102, 1, "created"),
    ]


def test_snapshot_golden_bytes() -> None:
    # Catches accidental format changes; regenerate only on purpose (bump the version).
    miner = TenantMiner(CountingAllocator(7))
    miner.mine(["open file a.txt", "open file b.txt", "héllo wörld"])
    body = (
        b'{"config":{"sim_th":0.4,"depth":4,"max_children":100,"max_clusters":null,'
        b'"extra_delimiters":[],"parametrize_numeric_tokens":true},"clusters_counter":2,'
        b'"clusters":[[1,7,2,2,["open","file","<*>"]],[2,8,1,1,["h\\u00e9llo","w\\u00f6rld"]]],'
        b'"nodes":[[-1,"",[]],[0,"3",[]],[1,"open",[1]],[0,"2",[]],[3,"h\\u00e9llo",[2]]]}'
    )
    header = b"OMNR" + struct.pack("<HHII", 1, 0, len(body), crc32c.crc32c(body))
    assert miner.to_snapshot() == header + body


def _snapshot() -> bytes:
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_clusters=5))
    mine_all(miner, corpus(5, 200))
    return miner.to_snapshot()


def _reframe(body: bytes, version: int = 1, reserved: int = 0) -> bytes:
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


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


CORRUPT = [
    pytest.param(lambda d: b"XMNR" + d[4:], "bad magic", id="bad_magic"),
    pytest.param(lambda d: _reframe(d[16:], version=2), "unknown version 2", id="bad_version"),
    pytest.param(lambda d: _reframe(d[16:], version=0), "unknown version 0", id="version_zero"),
    pytest.param(lambda d: _reframe(d[16:], reserved=1), "reserved", id="nonzero_reserved"),
    pytest.param(lambda d: _flip(d, len(d) - 5), "CRC mismatch", id="bad_crc_body"),
    pytest.param(lambda d: _flip(d, 12), "CRC mismatch", id="bad_crc_field"),
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
            TenantMiner.from_snapshot(_flip(data, offset), CountingAllocator())
        with pytest.raises(SnapshotDecodeError):
            TenantMiner.from_snapshot(data[:offset], CountingAllocator())


# -- failures -------------------------------------------------------------------------------


class _FailingAllocator:
    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def allocate(self) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            raise TemplateIdError(Path("/nowhere"), "injected")
        return self.calls


def test_failure_mid_batch_poisons_the_miner() -> None:
    miner = TenantMiner(_FailingAllocator(fail_at=2))
    miner.mine(["first template here"])
    with pytest.raises(MinerFailedError) as info:
        miner.mine(["first template there", "second one"])
    assert isinstance(info.value.__cause__, TemplateIdError)
    with pytest.raises(MinerFailedError):
        miner.mine(["first template here"])
    with pytest.raises(MinerFailedError):
        miner.to_snapshot()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sim_th": 1.5}, "sim_th"),
        ({"sim_th": float("nan")}, "sim_th"),
        ({"depth": 2}, "depth"),
        ({"max_children": 0}, "max_children"),
        ({"max_clusters": 0}, "max_clusters"),
        ({"extra_delimiters": ("",)}, "extra_delimiters"),
        ({"extra_delimiters": "="}, "extra_delimiters"),
        ({"parametrize_numeric_tokens": 1}, "parametrize_numeric_tokens"),
    ],
)
def test_invalid_config_names_the_setting(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        MinerConfig(**kwargs)


# -- the cluster of tenants -----------------------------------------------------------------


def test_tenants_share_one_allocator_and_never_share_ids() -> None:
    cluster = MinerCluster(CountingAllocator())
    lines = corpus(3, 800)
    a = mine_all(cluster.miner("tenant-a"), lines)
    b = mine_all(cluster.miner("tenant-b"), lines)
    assert cluster.tenants() == ["tenant-a", "tenant-b"]
    assert not set(a.template_ids) & set(b.template_ids)
    # Same input, same trees: the templates differ only in their ids.
    assert [(e.version, e.template, e.change, e.index) for e in a.events] == [
        (e.version, e.template, e.change, e.index) for e in b.events
    ]


def test_per_tenant_config_and_restore() -> None:
    special = MinerConfig(sim_th=0.9, max_clusters=10)
    cluster = MinerCluster(CountingAllocator(), tenant_configs={"special": special})
    cluster.mine("special", ["x 1"])
    cluster.mine("plain", ["x 1"])
    assert cluster.miner("special").config == special
    assert cluster.miner("plain").config == MinerConfig()
    data = cluster.miner("special").to_snapshot()
    cluster.discard("special")
    assert cluster.get("special") is None
    restored = cluster.restore("special", data)
    assert cluster.get("special") is restored
    assert restored.config == special


def test_config_normalises_yaml_shapes() -> None:
    config = MinerConfig(sim_th=1, extra_delimiters=["="])  # type: ignore[arg-type]
    assert config.extra_delimiters == ("=",)
    assert isinstance(config.sim_th, float)
    miner = TenantMiner(CountingAllocator(), config)
    data = miner.to_snapshot()
    assert TenantMiner.from_snapshot(data, CountingAllocator()).to_snapshot() == data


def test_ids_never_reused_across_restarts_with_file_allocator(tmp_path: Path) -> None:
    path = tmp_path / "template_ids"
    first = MinerCluster(FileTemplateIdAllocator(path, node_ordinal=3, block=8))
    seen: set[int] = set()
    for tenant in ("a", "b"):
        seen.update(mine_all(first.miner(tenant), corpus(1, 400)).template_ids)
    snapshots = {t: first.miner(t).to_snapshot() for t in first.tenants()}
    # Restart: a new allocator on the same file, miners restored from their snapshots.
    second = MinerCluster(FileTemplateIdAllocator(path, node_ordinal=3, block=8))
    for tenant, data in snapshots.items():
        second.restore(tenant, data)
    new_ids: set[int] = set()
    for tenant in ("a", "b", "c"):
        result = mine_all(second.miner(tenant), corpus(2, 400) + ["never seen before"])
        new_ids.update(e.template_id for e in result.events if e.change == "created")
    assert new_ids and not new_ids & seen
    assert min(new_ids) > max(seen)
    assert all(i >> 48 == 3 for i in seen | new_ids)


# -- template ids ---------------------------------------------------------------------------


def test_template_id_layout() -> None:
    assert make_template_id(0, 1) == 1
    assert make_template_id(7, 5) == (7 << 48) | 5
    assert make_template_id(32767, MAX_COUNTER) == (1 << 63) - 1
    assert make_template_id(32768, 1) == -(1 << 63) + 1  # the sign bit is the ordinal's
    assert make_template_id(65535, MAX_COUNTER) == -1
    assert make_template_id(40000, 2) > make_template_id(40000, 1)
    for bad in [(-1, 1), (65536, 1), (0, 0), (0, MAX_COUNTER + 1)]:
        with pytest.raises(ValueError):
            make_template_id(*bad)


def test_file_allocator_hands_out_ordinal_prefixed_ids(tmp_path: Path) -> None:
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=9, block=3)
    ids = [allocator.allocate() for _ in range(7)]
    assert ids == [(9 << 48) | c for c in range(1, 8)]
    assert allocator.high_water == 9
    assert decode_allocator_state((tmp_path / "ids").read_bytes()) == (9, 9)
    assert not (tmp_path / "ids.tmp").exists()


@SETTINGS
@given(
    block=st.integers(1, 6),
    lives=st.lists(st.integers(0, 15), min_size=1, max_size=6),
)
def test_file_allocator_resumes_above_every_id_after_crashes(
    tmp_path_factory: pytest.TempPathFactory, block: int, lives: list[int]
) -> None:
    path = tmp_path_factory.mktemp("alloc") / "ids"
    returned: list[int] = []
    for count in lives:
        # Each life hands out `count` ids and is then abandoned without any shutdown,
        # usually in the middle of a block.
        allocator = FileTemplateIdAllocator(path, node_ordinal=1, block=block)
        for _ in range(count):
            new = allocator.allocate()
            assert not returned or new > max(returned)
            returned.append(new)
    assert len(set(returned)) == len(returned)


def test_file_allocator_survives_sigkill_mid_block(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from app.ingest.miner import FileTemplateIdAllocator\n"
        f"a = FileTemplateIdAllocator(Path({str(path)!r}), node_ordinal=2, block=10)\n"
        "for _ in range(25):\n"
        "    print(a.allocate(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    before = [int(line) for line in done.stdout.split()]
    assert len(before) == 25
    after = FileTemplateIdAllocator(path, node_ordinal=2, block=10).allocate()
    assert after > max(before)


def _faulty_fs(tmp_path: Path) -> Any:
    fs_module = pytest.importorskip("wal.testing")
    if not hasattr(fs_module, "FaultyFs"):
        pytest.skip("wal.testing has no FaultyFs")
    return fs_module.FaultyFs(tmp_path / "shadow")


@pytest.mark.parametrize("op", ["open", "write", "fsync", "close", "rename", "fsync_dir"])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_file_allocator_power_loss_at_every_reservation_step(
    tmp_path: Path, op: str, nth: int
) -> None:
    fs = _faulty_fs(tmp_path)
    fs_module: Any = sys.modules["wal.testing"]
    data = tmp_path / "data"
    data.mkdir()
    path = data / "ids"
    fs.crash_at(op, nth=nth)
    returned: list[int] = []
    with pytest.raises(fs_module.SimulatedCrash):
        allocator = FileTemplateIdAllocator(path, node_ordinal=4, block=2, fs=fs)
        for _ in range(100):
            returned.append(allocator.allocate())
    fs.apply_crash(power_loss=True)
    resumed = FileTemplateIdAllocator(path, node_ordinal=4, block=2)
    fresh = [resumed.allocate() for _ in range(5)]
    assert not returned or min(fresh) > max(returned)


def test_file_allocator_io_failure_hands_out_nothing(tmp_path: Path) -> None:
    fs = _faulty_fs(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    allocator = FileTemplateIdAllocator(data / "ids", node_ordinal=0, block=2, fs=fs)
    first = [allocator.allocate(), allocator.allocate()]
    fs.fail("fsync_dir")
    with pytest.raises(TemplateIdError, match="parent directory fsync failed"):
        allocator.allocate()
    assert allocator.high_water == 2
    third = allocator.allocate()  # the fault was one-shot; the block is reserved again
    assert third == 3 and first == [1, 2]
    assert FileTemplateIdAllocator(data / "ids", node_ordinal=0).allocate() > third


def test_file_allocator_refuses_another_nodes_file(tmp_path: Path) -> None:
    FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=1).allocate()
    with pytest.raises(TemplateIdStateError, match="recorded node ordinal 1"):
        FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=2)


_GOOD_STATE = encode_allocator_state(5, 4096)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"", "length 0", id="empty"),
        pytest.param(_GOOD_STATE[:-1], "length 23", id="truncated"),
        pytest.param(_GOOD_STATE + b"\0", "length 25", id="trailing"),
        pytest.param(b"XTID" + _GOOD_STATE[4:], "bad magic", id="bad_magic"),
        pytest.param(_flip(_GOOD_STATE, 14), "CRC mismatch", id="bad_crc"),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 2, 0, 5, 0, 1)
            ),
            "unknown version 2",
            id="bad_version",
        ),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 1, 0, 5, 1, 1)
            ),
            "reserved",
            id="nonzero_reserved",
        ),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 1, 0, 5, 0, MAX_COUNTER + 1)
            ),
            "48-bit",
            id="high_water_out_of_range",
        ),
    ],
)
def test_file_allocator_refuses_corrupt_state(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "ids").write_bytes(content)
    with pytest.raises(TemplateIdStateError, match=reason) as info:
        FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=5)
    assert str(tmp_path / "ids") in str(info.value)


def test_file_allocator_golden_state() -> None:
    assert _GOOD_STATE.hex() == (
        "4f544944"
        "0100"
        "0000"
        "0500"
        "0000"
        "0010000000000000" + struct.pack("<I", crc32c.crc32c(_GOOD_STATE[:20])).hex()
    )


def test_file_allocator_exhaustion(tmp_path: Path) -> None:
    (tmp_path / "ids").write_bytes(encode_allocator_state(0, MAX_COUNTER - 2))
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=0, block=100)
    assert [allocator.allocate(), allocator.allocate()] == [MAX_COUNTER - 1, MAX_COUNTER]
    with pytest.raises(TemplateIdExhaustedError):
        allocator.allocate()
    assert isinstance(TemplateIdExhaustedError(Path("x"), "y"), MinerError)


def test_file_allocator_is_thread_safe(tmp_path: Path) -> None:
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=0, block=7)
    results: list[list[int]] = [[] for _ in range(4)]

    def work(out: list[int]) -> None:
        for _ in range(500):
            out.append(allocator.allocate())

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for out in results for i in out]
    assert len(set(every)) == 2000
    assert all(out == sorted(out) for out in results)


def test_file_allocator_rejects_bad_arguments(tmp_path: Path) -> None:
    for ordinal, block in [(-1, 1), (65536, 1), (0, 0), (0, MAX_COUNTER + 1)]:
        with pytest.raises(ValueError):
            FileTemplateIdAllocator(tmp_path / "ids", ordinal, block)
    assert not os.path.exists(tmp_path / "ids")

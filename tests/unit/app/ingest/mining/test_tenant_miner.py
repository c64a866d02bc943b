"""Tests for app.ingest.mining.tenant_miner: mining, parameters, events and restores, held
to drain3's own add_log_message."""

from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ingest.mining.errors import (
    MinerFailedError,
    TemplateIdError,
)
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import (
    CountingAllocator,
)
from app.ingest.mining.tenant_miner import (
    CREATE_WORK,
    WIDEN_WORK,
    MineResult,
    TemplateEvent,
    TenantMiner,
    snapshot_bytes_bound,
    state_bytes_bound,
)
from app.ingest.mining.tokens import PARAM, tokenize
from tests.support.mining import (
    CONFIGS,
    SETTINGS,
    batches,
    config_strategy,
    corpus,
    drain_state,
    mine_all,
    raw_drain,
    state_of,
)


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
    assert result.template_params == [("sda1", "91"), ("sda2", "42"), ("sdb1", "7")]
    assert result.template_versions == [2, 2, 2]
    gc.collect()  # params are tuples: untracked once collected, never a GC burden
    assert not any(gc.is_tracked(params) for params in result.template_params)
    assert [e.template for e in result.events] == [
        "disk sda1 usage 91 percent",
        "disk <*> usage <*> percent",
    ]


def test_params_with_extra_delimiters() -> None:
    miner = TenantMiner(CountingAllocator(), MinerConfig(extra_delimiters=("=", ",")))
    result = miner.mine(["user=alice,status=ok", "user=bob,status=ok", " user=carol,status=fail"])
    assert result.template_params == [("alice", "ok"), ("bob", "ok"), ("carol", "fail")]
    assert result.template_versions == [3, 3, 3]
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
@given(seed=st.integers(0, 2**32), config=config_strategy)
def test_params_fill_the_template_back_into_the_body_tokens(seed: int, config: MinerConfig) -> None:
    lines = corpus(seed, 300)
    result = mine_all(TenantMiner(CountingAllocator(), config), lines)
    # Each record names the version its parameters fill; that version was announced by
    # an event at or before the record (its text is in the audit stream first).
    texts: dict[tuple[int, int], tuple[str, int]] = {
        (e.template_id, e.version): (e.template, e.index) for e in result.events
    }
    for i, body in enumerate(lines):
        text, announced = texts[(result.template_ids[i], result.template_versions[i])]
        assert announced <= i or announced // 37 == i // 37  # same batch: same frame
        template = tokenize(text, ())
        params = iter(result.template_params[i])
        rebuilt = [next(params) if token == PARAM else token for token in template]
        assert next(params, None) is None
        assert rebuilt == tokenize(body, config.extra_delimiters)
        assert len(result.template_params[i]) == template.count(PARAM)


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
    assert [c[0] for c in drain_state(miner)[1]] == miner.cluster_ids
    again = miner.mine(["alpha one"])  # evicted, so Drain makes a new cluster
    assert again.events[0].change == "created"
    assert again.template_ids[0] not in first.template_ids


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    config=config_strategy,
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


@pytest.mark.parametrize("seed", [4, 24])
def test_issue24_4_every_record_of_a_batch_fills_its_template_last_version_in_the_batch(
    seed: int,
) -> None:
    lines = corpus(seed, 200)
    result = TenantMiner(CountingAllocator()).mine(lines)
    last = {e.template_id: e.version for e in result.events}
    assert result.template_versions == [last[tid] for tid in result.template_ids]
    texts = {(e.template_id, e.version): e.template for e in result.events}
    for i, body in enumerate(lines):
        values = iter(result.template_params[i])
        text = texts[(result.template_ids[i], result.template_versions[i])]
        tokens = text.split(" ") if text else []  # the zero-token template's text is ""
        assert [next(values) if t == PARAM else t for t in tokens] == body.split()


# -- issue 21 item 2: the bounds of one tenant's miner -----------------------------------

_BOUNDED = MinerConfig(
    max_clusters=40, max_body_chars=64, max_body_tokens=8, max_leaf_clusters=6, max_children=5
)


def _unique_lines(seed: int, n: int, *, alphabet: str = "abcdefghij") -> list[str]:
    r = random.Random(seed)
    return [
        " ".join(
            "".join(r.choice(alphabet) for _ in range(r.randrange(1, 9)))
            for _ in range(r.randrange(0, 14))
        )
        for _ in range(n)
    ]


def _nodes(miner: TenantMiner) -> int:
    return len(drain_state(miner)[0])


def test_bounded_2_unique_lines_keep_templates_tree_heap_and_snapshot_under_their_bounds() -> None:
    # What one tenant of unique lines did to main: every line a template, none evicted,
    # the tree and the snapshot growing with them.
    miner = TenantMiner(CountingAllocator(), _BOUNDED)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for chunk in batches(_unique_lines(1, 3000), 100):
            miner.mine(chunk)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert miner.template_count <= 40
    assert miner.evictions > 2000
    # each template's path is at most depth - 1 nodes, plus the root
    assert _nodes(miner) <= 1 + 40 * (_BOUNDED.depth - 1)
    bound = state_bytes_bound(_BOUNDED)
    assert bound is not None and miner.state_bytes <= bound
    # the estimate errs high against what the heap really holds (tokens, getters, nodes)
    assert held <= miner.state_bytes
    snapshot_bound = snapshot_bytes_bound(_BOUNDED)
    assert snapshot_bound is not None and len(miner.to_snapshot()) <= snapshot_bound


@pytest.mark.parametrize(("templates", "tokens"), [(2000, 10), (500, 100), (2000, 1), (60, 40)])
def test_bounded_2_state_bytes_errs_high_by_at_most_two(templates: int, tokens: int) -> None:
    r = random.Random(templates + tokens)
    lines = [
        " ".join("".join(r.choice("abcdefghij") for _ in range(6)) for _ in range(tokens + i % 7))
        for i in range(templates)
    ]
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_children=100_000))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        miner.mine(lines)
        del lines
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= miner.state_bytes <= 2 * held


@SETTINGS
@given(
    bodies=st.lists(
        st.text(
            alphabet=st.sampled_from(["a", "é", "\U0001f600", " ", '"', "\\", "\x01", "7"]),
            max_size=200,
        ),
        max_size=60,
    )
)
def test_bounded_2_snapshot_bound_holds_for_any_characters(bodies: list[str]) -> None:
    config = MinerConfig(max_clusters=5, max_body_chars=30, max_body_tokens=6, max_children=3)
    miner = TenantMiner(CountingAllocator(), config)
    miner.mine(bodies)
    bound = snapshot_bytes_bound(config)
    assert bound is not None and len(miner.to_snapshot()) <= bound
    memory = state_bytes_bound(config)
    assert memory is not None and miner.state_bytes <= memory


def test_bounded_2_evicted_template_comes_back_with_a_new_id_and_a_created_event() -> None:
    allocator = CountingAllocator()
    miner = TenantMiner(allocator, MinerConfig(max_clusters=2))
    first = miner.mine(["alpha one", "beta two three"]).template_ids
    miner.mine(["gamma four five six", "delta seven eight nine ten"])  # both evicted
    assert miner.evictions == 2
    back = miner.mine(["alpha one"])
    assert back.template_ids[0] not in first
    assert back.template_ids[0] == allocator.next_id - 1  # drawn fresh from the allocator
    assert [(e.change, e.version) for e in back.events] == [("created", 1)]
    # the evicted clusters' leaves and nodes are gone: only the live two remain
    paths = {" ".join(path) for path, _, _ in drain_state(miner)[0]}
    assert paths == {"", "2", "2 alpha", "5", "5 delta"}


def test_bounded_2_only_the_body_head_is_mined() -> None:
    config = MinerConfig(max_body_chars=20, max_body_tokens=3)
    miner = TenantMiner(CountingAllocator(), config)
    long_token = "x" * 10_000
    result = miner.mine(
        [
            "disk sda1 full at 99 percent on host a",  # 3 tokens mined
            "disk sda2 full at 98 percent",
            long_token,  # one 20-character token
            "short",  # untouched
        ]
    )
    assert miner.truncated_bodies == 3
    assert [t.template for t in miner.templates()] == ["disk <*> full", "x" * 20, "short"]
    assert result.template_params[1] == ("sda2",)
    assert all(len(t.template) <= 20 + 2 * 3 for t in miner.templates())


def test_bounded_2_a_full_leaf_caps_what_one_search_compares() -> None:
    # Unique lines all land in one leaf (same length, numeric first token): without the
    # leaf bound each record compares every template there.
    config = MinerConfig(max_leaf_clusters=4)
    miner = TenantMiner(CountingAllocator(), config)
    r = random.Random(3)
    words = ["".join(r.choice("abcdefghij") for _ in range(8)) for _ in range(500)]
    lines = [f"{i} {w} {w}{w} tail{w}" for i, w in enumerate(words)]
    result = miner.mine(lines)
    leaves = [ids for _, ids, _ in drain_state(miner)[0] if ids]
    assert max(map(len, leaves)) <= 4
    assert result.work <= len(lines) * (1 + 4 + CREATE_WORK + WIDEN_WORK)
    unbounded = TenantMiner(CountingAllocator())
    assert unbounded.mine(lines).work > 3 * result.work


def test_bounded_2_a_full_leaf_evicts_its_least_recently_used() -> None:
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_leaf_clusters=2, sim_th=0.9))
    a, b = miner.mine(["x a1 b1 c1", "x a2 b2 c2"]).template_ids
    miner.mine(["x a1 b1 c1"])  # a is now the more recently used
    c = miner.mine(["x a3 b3 c3"]).template_ids[0]
    assert {t.template_id for t in miner.templates()} == {a, c}
    assert b not in (a, c) and miner.evictions == 1


def test_bounded_2_restore_brings_a_snapshot_under_the_nodes_bounds() -> None:
    # A snapshot written under larger bounds (or none) is trimmed at restore, the same
    # way every time, so recovery and settlement rebuild the same tree from it.
    big = TenantMiner(CountingAllocator(), MinerConfig())
    mine_all(big, _unique_lines(4, 400) + corpus(4, 400) + ["y " * 50])
    data = big.to_snapshot()
    one = TenantMiner.from_snapshot(data, CountingAllocator(10_000), _BOUNDED)
    two = TenantMiner.from_snapshot(data, CountingAllocator(10_000), _BOUNDED)
    assert one.config == MinerConfig().with_bounds(_BOUNDED)
    assert one.template_count <= 40 and one.evictions == big.template_count - one.template_count
    assert all(len(t.template.split()) <= 8 for t in one.templates())
    assert drain_state(one) == drain_state(two)
    assert one.to_snapshot() == two.to_snapshot()
    # the kept templates are the most recently used, their ids unchanged
    kept = {t.template_id for t in one.templates()}
    assert kept <= {t.template_id for t in big.templates()[-200:]}
    probe = corpus(5, 300) + _unique_lines(6, 300)
    assert mine_all(one, probe) == mine_all(two, probe)
    assert one.template_count <= 40


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    split=st.integers(0, 400),
    batch=st.integers(1, 50),
    unique=st.booleans(),
)
def test_bounded_2_a_bounded_miner_restored_mines_like_an_uninterrupted_one(
    seed: int, split: int, batch: int, unique: bool
) -> None:
    # Eviction, pruning and the body head are deterministic over the frames: a replay
    # from a snapshot reaches the same ids, events and tree as the miner that ran on.
    lines = _unique_lines(seed, 400) if unique else corpus(seed, 400)
    config = MinerConfig(
        max_clusters=12, max_body_chars=40, max_body_tokens=6, max_leaf_clusters=3, max_children=4
    )
    ids = CountingAllocator()
    uninterrupted = TenantMiner(ids, config)
    mine_all(uninterrupted, lines[:split], batch)
    snapshot = uninterrupted.to_snapshot()
    restored = TenantMiner.from_snapshot(snapshot, CountingAllocator(ids.next_id), config)
    assert drain_state(restored) == drain_state(uninterrupted)
    expected = mine_all(uninterrupted, lines[split:], batch)
    assert mine_all(restored, lines[split:], batch) == expected
    assert drain_state(restored) == drain_state(uninterrupted)
    assert restored.to_snapshot() == uninterrupted.to_snapshot()

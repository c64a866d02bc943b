"""Tests for app.ingest.mining.tenant_miner: mining, parameters, events and restores, held
to drain3's own add_log_message."""

from __future__ import annotations

import gc
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
from app.ingest.mining.tenant_miner import MineResult, TemplateEvent, TenantMiner
from app.ingest.mining.tokens import PARAM, tokenize
from tests.support.mining import (
    CONFIGS,
    SETTINGS,
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

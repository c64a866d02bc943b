"""Tests for app/ingest/mining/native_miner.py and its extension _minefast.c: the native
fast path against the Python loop (``TenantMiner.native = False``), differentially.

Every stream of bodies is mined batch by batch by two miners of one configuration, one
on the fast path and one forced onto the Python loop (the reference), and after every
batch the two must agree on everything: the ``MineResult`` (ids, parameters, events,
versions, work), the snapshot bytes, Drain's own state (tree, clusters, sizes, its LRU
order), the template map's order and use stamps, and the counters. The bodies come from
a small vocabulary, so templates are created, widened, matched exactly and evicted by
``max_clusters`` and ``max_leaf_clusters``; streams are cut by snapshot restores too.
``FUZZ_EXAMPLES`` scales the properties (``make fuzz``), which also runs this file
against a build with AddressSanitizer and UndefinedBehaviorSanitizer
(scripts/sanitize_native.py).
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.ingest.mining import native_miner
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import MineResult, TenantMiner
from app.ingest.mining.tokens import PARAM
from tests.support.mining import corpus, drain_state

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or None
#: streams compared, bodies mined, and bodies the fast path took (``make fuzz`` prints it)
CASES = {"streams": 0, "bodies": 0, "native": 0}
#: words no digit in them (Drain takes a token with a digit for a parameter)
WORDS: Final = [
    "".join(p) for p in zip(string.ascii_lowercase, reversed(string.ascii_lowercase), strict=True)
] * 2
ROOT: Final = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
)


def _settings(examples: int) -> settings:
    return settings(
        derandomize=EXAMPLES is None,
        database=None,
        max_examples=EXAMPLES or examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True, scope="module")
def _count_native() -> Iterator[None]:
    """Counts the bodies the fast path mines (so a fast path that always stopped would
    show), and writes ``CASES`` for ``make fuzz``."""
    real = native_miner.fast_path()
    assert real is not None, native_miner.unavailable()  # `pip install -e .` builds it

    def counted(*args: Any) -> native_miner.Stop:
        answer = real(*args)
        CASES["native"] += answer[0] - args[13]
        return answer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_miner, "fast_path", lambda: counted)
        yield
    path = os.environ.get("FUZZ_CASES_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(CASES, out)


# -- the corpus -----------------------------------------------------------------------

_WORDS = ["a", "b", "c", "GET", "/x", "42", "7", "é", "日本", PARAM, "a=b", "<*", "x1"]
_SPACES = [" ", " ", " ", "  ", "\t", "\n", "\u3000", "\x1c", " \r\n "]


@st.composite
def _bodies(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 19)) == 0:
        return draw(st.text(max_size=16))  # anything at all, now and then
    words = draw(
        st.lists(st.sampled_from(_WORDS), min_size=draw(st.sampled_from([0, 1, 1, 2])), max_size=7)
    )
    spaces = draw(
        st.lists(st.sampled_from(_SPACES), min_size=len(words) + 1, max_size=len(words) + 1)
    )
    body = spaces[0] if draw(st.booleans()) else ""
    for word, space in zip(words, spaces[1:], strict=True):
        body += word + space
    return body if draw(st.booleans()) else body.rstrip()


_configs = st.builds(
    MinerConfig,
    sim_th=st.sampled_from([0.0, 0.3, 0.4, 0.5, 2 / 3, 1.0]),
    depth=st.sampled_from([3, 4, 5]),
    max_children=st.sampled_from([1, 2, 100]),
    max_clusters=st.sampled_from([None, None, 2, 5]),
    extra_delimiters=st.sampled_from([(), (), (), ("=",)]),
    parametrize_numeric_tokens=st.booleans(),
    max_body_chars=st.sampled_from([None, None, None, 8, 24]),
    max_body_tokens=st.sampled_from([None, None, None, 3, 5]),
    max_leaf_clusters=st.sampled_from([None, None, 1, 3]),
)


@st.composite
def _steps(draw: st.DrawFn) -> list[list[str] | str]:
    """Batches of bodies, and now and then "restore" (both miners rebuilt from their
    snapshots). Most bodies repeat a few of the stream's own (as log lines do), so exact
    matches — the fast path's case — are common among the creations and widenings."""
    pool = draw(st.lists(_bodies(), min_size=1, max_size=6))
    body = st.one_of(st.sampled_from(pool), st.sampled_from(pool), _bodies())
    step = st.one_of(st.lists(body, max_size=12), st.just("restore"))
    return draw(st.lists(step, min_size=1, max_size=8))


# -- the comparison -------------------------------------------------------------------


def _state(miner: TenantMiner) -> tuple[object, ...]:
    """Everything a miner holds that later mining or a snapshot can see."""
    stamps = [t.touched for t in miner._templates.values()]  # the leaf LRU's order
    return (
        miner.to_snapshot(),
        drain_state(miner),
        miner.cluster_ids,
        stamps,
        miner._tick,
        miner.templates(),
        dict(miner.versions()),
        miner.evictions,
        miner.truncated_bodies,
        miner.work,
        miner.state_bytes,
    )


def _pair(config: MinerConfig) -> tuple[TenantMiner, TenantMiner]:
    native = TenantMiner(CountingAllocator(), config)
    reference = TenantMiner(CountingAllocator(), config)
    reference.native = False
    return native, reference


def _restored(native: TenantMiner, reference: TenantMiner) -> tuple[TenantMiner, TenantMiner]:
    config = native.config
    # each side keeps its allocator, as a node does: restores consume no ids
    again = TenantMiner.from_snapshot(native.to_snapshot(), native._allocator, config)
    ref = TenantMiner.from_snapshot(reference.to_snapshot(), reference._allocator, config)
    ref.native = False
    return again, ref


def _mine_both(native: TenantMiner, reference: TenantMiner, batch: list[str]) -> MineResult:
    got = native.mine(batch)
    want = reference.mine(batch)
    assert got == want
    assert _state(native) == _state(reference)
    CASES["bodies"] += len(batch)
    return got


def _run(config: MinerConfig, steps: list[list[str] | str]) -> None:
    native, reference = _pair(config)
    for step in steps:
        if isinstance(step, str):
            native, reference = _restored(native, reference)
            assert _state(native) == _state(reference)
        else:
            _mine_both(native, reference, step)
    CASES["streams"] += 1


@_settings(1000)
@given(config=_configs, steps=_steps())
def test_native_miner_equals_the_python_path_batch_for_batch(
    config: MinerConfig, steps: list[list[str] | str]
) -> None:
    _run(config, steps)


@_settings(200)
@given(
    config=_configs,
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6),
)
def test_native_miner_equals_the_python_path_on_realistic_lines(
    config: MinerConfig, seed: int, sizes: list[int]
) -> None:
    lines = corpus(seed, sum(sizes))
    steps: list[list[str] | str] = []
    for size in sizes:
        steps.append(lines[:size])
        lines = lines[size:]
    _run(config, steps)


def test_native_miner_of_equal_exact_templates_takes_the_first() -> None:
    # _search's tie rule where the fast path can see it: two templates of one leaf (depth
    # 3: the leaf is the token count's) that both hold every constant of "a b c", with
    # as many wildcards — the first of equals is the match. (A tie to *more* wildcards
    # never reaches an exact match: an exact template has the most wildcards of its
    # ties, so that half of the rule cannot change what the fast path records.)
    native, reference = _pair(MinerConfig(depth=3, sim_th=0.5))
    created = _mine_both(native, reference, [f"a {PARAM} c", f"{PARAM} b c"])
    assert len(set(created.template_ids)) == 2
    before = CASES["native"]
    got = _mine_both(native, reference, ["a b c", "x b c", "a y c"])
    assert got.template_ids[0] == created.template_ids[0]
    assert CASES["native"] - before == 3


def test_native_miner_takes_the_exact_matches_of_a_warm_tree() -> None:
    # The point of the fast path: once the templates are learnt, (nearly) every body
    # is mined in C; only creations and widenings come back to Python.
    before = CASES["native"]
    native, reference = _pair(MinerConfig(max_clusters=4096, max_leaf_clusters=128))
    lines = corpus(7, 3000)
    for start in range(0, len(lines), 100):
        _mine_both(native, reference, lines[start : start + 100])
    taken = CASES["native"] - before
    assert taken > 0.9 * len(lines), taken


def test_native_miner_hands_its_search_to_python_for_creations_and_widenings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A body the fast path searched and found no template for (a creation: none above
    # sim_th, or no leaf at all) or a template to widen is mined by Python with the fast
    # path's answer: Python does not search it again (a full leaf compared twice was most
    # of a creation's cost), and the leaf's least recently used is picked in C. Unique
    # lines in one leaf: every one a creation after a full leaf's search, then an eviction.
    config = MinerConfig(max_clusters=64, max_leaf_clusters=8)
    native, reference = _pair(config)
    rng = random.Random(3)
    batches = [
        [" ".join(["noisy", "line", *rng.sample(WORDS, 6)]) for _ in range(20)] for _ in range(4)
    ]
    # widenings: the same words but one
    batches.append([line.rsplit(" ", 1)[0] + " other" for line in batches[-1][-8:]])
    searched = []
    real = TenantMiner._search

    def counted(self: TenantMiner, tokens: list[str]) -> Any:
        searched.append(self.native)
        return real(self, tokens)

    monkeypatch.setattr(TenantMiner, "_search", counted)
    oldest = native_miner.leaf_oldest(True)
    assert oldest is not None
    picked: list[int] = []

    def counted_oldest(ids: list[int], templates: dict[int, Any]) -> int:
        picked.append(len(ids))
        return oldest(ids, templates)

    monkeypatch.setattr(
        native_miner, "leaf_oldest", lambda wanted: counted_oldest if wanted else None
    )
    results = [_mine_both(native, reference, batch) for batch in batches]
    assert sum(len(r.events) for r in results) >= 80  # created and changed
    assert any(e.change == "changed" for e in results[-1].events)
    assert native.evictions == reference.evictions > 0
    assert searched and not any(searched), "the native miner searched in Python"
    assert len(picked) == native.evictions


def test_native_miner_oldest_refuses_what_min_refuses() -> None:
    oldest = native_miner.leaf_oldest(True)
    assert oldest is not None
    with pytest.raises(KeyError):
        oldest([1], {})
    with pytest.raises(ValueError):
        oldest([], {})
    with pytest.raises(TypeError):
        oldest((1,), {})  # type: ignore[arg-type]


def test_native_miner_leaves_extra_delimiters_and_tuples_of_bodies_to_python() -> None:
    before = CASES["native"]
    native, reference = _pair(MinerConfig(extra_delimiters=("=",)))
    for _ in range(3):
        _mine_both(native, reference, ["k=v one", "k=w one", "k=v one"])
    plain, plain_ref = _pair(MinerConfig())
    assert plain.mine(("a b", "a b")) == plain_ref.mine(("a b", "a b"))
    assert CASES["native"] == before


def test_native_miner_start_says_which_miner_runs() -> None:
    seen: list[tuple[str, dict[str, object], str]] = []
    assert native_miner.start(lambda name, fields, level: seen.append((name, dict(fields), level)))
    assert seen == [("ingest.miner", {"miner": "native"}, "info")]
    assert native_miner.active() == "native"


#: Run in a child interpreter whose import of the extension fails (as a missing or
#: broken build's does): it mines the corpus and prints what it got and what it said.
_WITHOUT_EXTENSION = """
import json, sys

class _NoNativeMiner:
    def find_spec(self, name, path=None, target=None):
        if name == "app.ingest.mining._minefast":
            raise ImportError("blocked by the test")
        return None

sys.meta_path.insert(0, _NoNativeMiner())
from app.ingest.mining import native_miner
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import TenantMiner
from tests.support.mining import corpus

said = []
native_miner.start(lambda name, fields, level: said.append([name, dict(fields), level]))
miner = TenantMiner(CountingAllocator(), MinerConfig(max_clusters=50, max_leaf_clusters=8))
lines = corpus(3, 400)
results = [miner.mine(lines[i : i + 50]) for i in range(0, len(lines), 50)]
print(json.dumps({
    "active": native_miner.active(),
    "said": said,
    "ids": [r.template_ids for r in results],
    "params": [[list(p) for p in r.template_params] for r in results],
    "work": [r.work for r in results],
    "snapshot": miner.to_snapshot().hex(),
}))
"""


def test_native_miner_absent_mines_on_the_python_path_and_says_so() -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTENSION],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = json.loads(out)
    assert got["active"] == "python"
    ((name, fields, level),) = got["said"]
    assert (name, level, fields["miner"]) == ("ingest.miner", "warning", "python")
    assert "blocked by the test" in fields["reason"]
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_clusters=50, max_leaf_clusters=8))
    lines = corpus(3, 400)
    results = [miner.mine(lines[i : i + 50]) for i in range(0, len(lines), 50)]
    assert got["ids"] == [r.template_ids for r in results]
    assert got["params"] == [[list(p) for p in r.template_params] for r in results]
    assert got["work"] == [r.work for r in results]
    assert bytes.fromhex(got["snapshot"]) == miner.to_snapshot()

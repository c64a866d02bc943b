"""``rematch``: a record re-matched to a widening of its template fills it back — in
its batch when mined, and at the versions pinned to its partition when encoded."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.rematch import VersionMap, params_under, rematch_batch
from app.ingest.mining.template_ids import CountingAllocator
from app.ingest.mining.tenant_miner import TenantMiner
from app.ingest.mining.tokens import PARAM
from app.receive.otlp import flatten
from sink.parquet import FLAT_SCHEMA, RECORDS_SCHEMA, assemble_records
from tests.support.noderig import bodies_request

_token = st.text(alphabet="abcxyz019<*>", min_size=1, max_size=4)


@seed(20261205)
@settings(max_examples=200, database=None, deadline=None)
@given(tokens=st.lists(_token, max_size=8), data=st.data())
def test_issue24_4_params_under_a_widening_substitute_back_into_the_body(
    tokens: list[str], data: st.DataObject
) -> None:
    # Drain widens by turning constants into PARAM: any such mask is a later version.
    mask = data.draw(st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens)))
    template = [PARAM if wild else token for token, wild in zip(tokens, mask, strict=True)]
    params = params_under(tokens, template)
    assert len(params) == template.count(PARAM)
    values = iter(params)
    assert [next(values) if slot == PARAM else slot for slot in template] == tokens


def test_issue24_4_a_body_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="tokens do not fit"):
        params_under(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="does not fit the constant"):
        params_under(["a", "b"], ["a", "c"])


def test_issue24_4_rematch_batch_moves_earlier_records_to_the_last_version() -> None:
    rng = random.Random(24)
    users = [f"u{rng.randrange(100)}" for _ in range(3)]
    bodies = [f"login {u} ok" for u in users] + ["other line"]
    ids = [7, 7, 7, 8]
    params: list[tuple[str, ...]] = [(), (users[1],), (users[2],), ()]
    versions = [1, 2, 2, 1]
    changes = [
        (7, 1, bodies[0], 0),
        (7, 2, "login <*> ok", 1),
        (8, 1, "other line", 3),
    ]
    rematch_batch(bodies, ids, params, versions, changes, str.split)
    assert params == [(users[0],), (users[1],), (users[2],), ()]
    assert versions == [2, 2, 2, 1]


def test_issue24_4_rematch_batch_is_deterministic() -> None:
    bodies = ["a 1", "a 2", "a 3"]
    changes = [(1, 1, "a 1", 0), (1, 2, "a <*>", 1)]
    runs = []
    for _ in range(2):
        params: list[tuple[str, ...]] = [(), ("2",), ("3",)]
        versions = [1, 2, 2]
        rematch_batch(bodies, [1, 1, 1], params, versions, changes, str.split)
        runs.append((params, versions))
    assert runs[0] == runs[1] == ([("1",), ("2",), ("3",)], [2, 2, 2])


# -- the encode-time re-match: a partition's rows at the versions pinned when detached --


def _frame(miner: TenantMiner, bodies: list[str], lsn: int) -> pa.RecordBatch:
    """One frame's rows as the turn buffers them (``assemble_records``)."""
    flat = flatten(bodies_request(f"f{lsn}", bodies), "t")
    mined = miner.mine(flat.bodies)
    return assemble_records(
        "t",
        flat.columns,
        mined.template_ids,
        mined.template_params,
        lsn,
        mined.template_versions,
    )


def _rows(batch: pa.RecordBatch) -> list[tuple[int, int, list[str]]]:
    return list(
        zip(
            batch.column("template_id").to_pylist(),
            batch.column("template_version").to_pylist(),
            batch.column("template_params").to_pylist(),
            strict=True,
        )
    )


def test_issue24_4_a_version_map_rematches_rows_of_an_earlier_frame_to_its_version() -> None:
    miner = TenantMiner(CountingAllocator())
    first = _frame(miner, ["user alice logged in from 10.0.0.1"], 1)
    second = _frame(miner, ["user bob logged in from 10.0.0.2"], 2)
    ((tid, version, params),) = _rows(first)
    assert (version, params) == (1, [])  # mined when the template was its own text
    pinned = VersionMap(miner.versions(), miner.mined_tokens)
    assert _rows(pinned(first)) == [(tid, 2, ["alice", "10.0.0.1"])]
    assert pinned(second) is second  # nothing stale: the batch itself, untouched
    assert pinned(first).schema.equals(RECORDS_SCHEMA)
    # substituting the parameters into version 2's text gives the body back
    tokens = miner.versions()[tid][1]
    values = iter(_rows(pinned(first))[0][2])
    rebuilt = " ".join(next(values) if t == PARAM else t for t in tokens)
    assert rebuilt == first.column("body")[0].as_py()


def test_issue24_4_a_pinned_map_keeps_the_versions_of_its_instant() -> None:
    # The cut's mark: a map taken before the live miner widens again stays as it was,
    # so every attempt at the cut's partition encodes the same rows.
    miner = TenantMiner(CountingAllocator())
    first = _frame(miner, ["user alice logged in from 10.0.0.1"], 1)
    _frame(miner, ["user bob logged in from 10.0.0.2"], 2)
    at_mark = VersionMap(miner.versions(), miner.mined_tokens)
    _frame(miner, ["user carol logged out from 10.0.0.3"], 3)  # version 3, past the mark
    (tid,) = set(first.column("template_id").to_pylist())
    assert miner.versions()[tid][0] == 3
    assert _rows(at_mark(first)) == [(tid, 2, ["alice", "10.0.0.1"])]
    assert _rows(at_mark(first)) == _rows(at_mark(first))
    later = VersionMap(miner.versions(), miner.mined_tokens)
    assert _rows(later(first)) == [(tid, 3, ["alice", "in", "10.0.0.1"])]


def test_issue24_4_a_truncated_body_is_rematched_on_the_head_the_miner_mined() -> None:
    miner = TenantMiner(CountingAllocator(), MinerConfig(max_body_chars=40, max_body_tokens=3))
    first = _frame(miner, ["disk sda1 full at 99 percent on host a"], 1)
    _frame(miner, ["disk sda2 full at 98 percent"], 2)
    (tid,) = set(first.column("template_id").to_pylist())
    assert miner.versions()[tid] == (2, ("disk", PARAM, "full"))
    pinned = VersionMap(miner.versions(), miner.mined_tokens)
    assert _rows(pinned(first)) == [(tid, 2, ["sda1"])]


def test_issue24_4_only_stale_rows_are_split_again_and_isolated_rows_are_left_alone() -> None:
    miner = TenantMiner(CountingAllocator())
    first = _frame(miner, ["job 7 done", "other line here"], 1)
    _frame(miner, [f"job {i} done" for i in range(8, 40)], 2)
    busy = _frame(miner, [f"job {i} done" for i in range(40, 100)], 3)
    splits: list[str] = []

    def split(body: str) -> list[str]:
        splits.append(body)
        return miner.mined_tokens(body)

    pinned = VersionMap(miner.versions(), split)
    assert pinned(busy) is busy and splits == []  # every row already at version 2
    out = _rows(pinned(first))
    assert splits == ["job 7 done"]  # the one stale row, not the other template's
    assert out[0][1:] == (2, ["7"]) and out[1][1:] == (1, [])
    # an isolated frame's rows (template 0, version 0) are never touched
    isolated = assemble_records("t", first.select(list(FLAT_SCHEMA.names)), [0, 0], [(), ()], 9)
    assert pinned(isolated) is isolated


@seed(20261206)
@settings(max_examples=300, database=None, deadline=None)
@given(
    widened=st.dictionaries(st.integers(-(2**62), 2**62), st.integers(1, 9), max_size=12),
    rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 10)), max_size=40),
)
def test_issue24_4_stale_rows_are_the_rows_older_than_their_templates_version(
    widened: dict[int, int], rows: list[tuple[int, int]]
) -> None:
    # The binary search over the map's sorted ids against the rule read row by row: a
    # row is stale when its template is in the map at a later version than the row's.
    ids = list(widened)
    rows = [(ids[i % len(ids)] if ids and i >= 0 else i, v) for i, v in rows]
    batch = pa.record_batch(
        {
            "template_id": pa.array([r[0] for r in rows], pa.int64()),
            "template_version": pa.array([r[1] for r in rows], pa.int32()),
        }
    )
    pinned = VersionMap({t: (v, ()) for t, v in widened.items()}, str.split)
    expected = [i for i, (t, v) in enumerate(rows) if t in widened and v < widened[t]]
    assert pinned.stale_rows(batch).tolist() == expected
    assert pinned.stale_rows(batch).tolist() == expected  # the index, built once, reused

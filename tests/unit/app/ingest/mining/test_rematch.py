"""``rematch``: a record re-matched to a widening of its template fills it back."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from app.ingest.mining.rematch import params_under, rematch_batch
from app.ingest.mining.tokens import PARAM

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

"""``WalConfig`` validation at ``Journal.open``: a knob outside its range, or two knobs
that disagree, refuse to open with ``InvalidConfig`` naming the knob, the value and the
range — nothing is clamped and nothing is created on disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wal import InvalidConfig, Journal, WalConfig
from wal.config import MAX_TENANTS_LIMIT

BAD = [
    pytest.param(
        {"segment_max_bytes": 64 * 1024 - 1},
        "segment_max_bytes",
        "between 65536 and 17179869184",
        id="seg_small",
    ),
    pytest.param(
        {"segment_age_secs": 0}, "segment_age_secs", "between 1 and 604800", id="age_zero"
    ),
    pytest.param({"barrier_secs": 0}, "barrier_secs", "between 1 and 86400", id="barrier_zero"),
    pytest.param(
        {"housekeeping_secs": 0}, "housekeeping_secs", "between 1 and 86400", id="housekeeping_zero"
    ),
    pytest.param(
        {"rotation_retry_attempts": 0},
        "rotation_retry_attempts",
        "between 1 and 1000",
        id="attempts_zero",
    ),
    pytest.param(
        {"max_tenants": MAX_TENANTS_LIMIT + 1},
        "max_tenants",
        str(MAX_TENANTS_LIMIT),
        id="tenants_over",
    ),
    pytest.param(
        {"max_unlinks_per_pass": 2, "rotation_retry_attempts": 3},
        "max_unlinks_per_pass",
        ">= rotation_retry_attempts (3)",
        id="unlinks_below_attempts",
    ),
    pytest.param(
        {"max_tenants": MAX_TENANTS_LIMIT, "max_unlinks_per_pass": 4096},
        "max_unlinks_per_pass",
        "stays under",
        id="reclaim_too_large",
    ),
    pytest.param({"segment_max_bytes": "64MiB"}, "segment_max_bytes", "an integer", id="not_int"),
    pytest.param({"archive": 1}, "archive", "true or false", id="archive_not_bool"),
]


@pytest.mark.parametrize(("changes", "knob", "allowed"), BAD)
def test_open_refuses_a_knob_outside_its_range_naming_knob_value_and_range(
    tmp_path: Path, changes: dict[str, object], knob: str, allowed: str
) -> None:
    config = dataclasses.replace(WalConfig(), **changes)  # type: ignore[arg-type]
    root = tmp_path / "wal"

    with pytest.raises(InvalidConfig) as info:
        Journal.open(root, config)

    err = info.value
    assert err.knob == knob and err.value == changes[knob]
    assert allowed in err.allowed
    assert knob in str(err) and repr(changes[knob]) in str(err) and allowed in str(err)
    assert not root.exists() or list(root.iterdir()) == []  # nothing created


def test_every_default_is_valid_and_every_knob_has_a_documented_range() -> None:
    WalConfig().validate()
    for f in dataclasses.fields(WalConfig):
        assert f.metadata["doc"], f.name
        if not isinstance(f.default, bool):
            assert f.metadata["minimum"] is not None, f"{f.name} has no lower bound"


@pytest.mark.parametrize(
    ("value", "lo", "hi", "inside", "words"),
    [
        (5, 1, 9, True, "between 1 and 9"),
        (0, 1, None, False, ">= 1"),
        (10, None, 9, False, "<= 9"),
        (-(2**70), None, None, True, "any value"),
    ],
)
def test_the_integer_range_check_has_one_home_the_node_settings_share(
    value: int, lo: int | None, hi: int | None, inside: bool, words: str
) -> None:
    # The node's settings check and word their ranges with the WAL's helpers, so the
    # two cannot drift; only the unbounded text and the shown bound differ.
    from app.base import config as node_config
    from wal import in_range, range_text

    assert in_range(value, lo, hi) is inside
    assert range_text(lo, hi) == words
    assert node_config._range_text(lo, hi, "") == words.replace("any value", "(any)")

"""Tests for app.ingest.mining.miner_config: settings are checked and normalised."""

from __future__ import annotations

from typing import Any

import pytest

from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.template_ids import (
    CountingAllocator,
)
from app.ingest.mining.tenant_miner import TenantMiner


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


def test_config_normalises_yaml_shapes() -> None:
    config = MinerConfig(sim_th=1, extra_delimiters=["="])  # type: ignore[arg-type]
    assert config.extra_delimiters == ("=",)
    assert isinstance(config.sim_th, float)
    miner = TenantMiner(CountingAllocator(), config)
    data = miner.to_snapshot()
    assert TenantMiner.from_snapshot(data, CountingAllocator()).to_snapshot() == data

"""Tenant names that break the one tenant rule (``wal/tenant.py``), one of each way, for
every test of a part that checks it (the WAL's frames, the object keys)."""

from __future__ import annotations

import pytest

INVALID_TENANTS = [
    pytest.param("", id="empty"),
    pytest.param("x" * 129, id="129_bytes"),
    pytest.param("a b", id="space"),
    pytest.param("a:b", id="colon"),
    pytest.param("a#b", id="hash"),
    pytest.param("a/b", id="slash"),
    pytest.param("é", id="non_ascii"),
    pytest.param("a\tb", id="control"),
    pytest.param("a\x7fb", id="del"),
]

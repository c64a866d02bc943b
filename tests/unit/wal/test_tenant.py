"""``wal/tenant.py``: the tenant name's grammar and bound, written once and checked the
same way by every part of the node that takes a tenant (issue 25 item 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.base.rejections import BadRequest
from app.receive.otlp import parse_tenant
from sink.keys import KeyFormatError, check_tenant
from wal.errors import InvalidTenant
from wal.frame import validate_tenant
from wal.tenant import MAX_TENANT_BYTES, bad_tenant_char, is_valid_tenant

ROOT = Path(__file__).resolve().parents[3]
HOME = ROOT / "wal" / "tenant.py"


@pytest.mark.parametrize(
    ("tenant", "ok"),
    [
        ("default", True),
        ("a", True),
        ("x" * 128, True),
        ("!~%.-_", True),
        ("x" * 129, False),
        ("", False),
        ("a:b", False),
        ("a#b", False),
        ("a/b", False),
        ("a b", False),
        ("a\x7f", False),
        ("é", False),
    ],
)
def test_tenant_grammar(tenant: str, ok: bool) -> None:
    assert is_valid_tenant(tenant) is ok


def _others_agree(tenant: str) -> list[bool]:
    """What the WAL, the object keys and the receivers each say of ``tenant``."""
    verdicts = []
    for check, refusal in (
        (validate_tenant, InvalidTenant),
        (check_tenant, KeyFormatError),
        (lambda t: parse_tenant(t, open_mode=False), BadRequest),
    ):
        try:
            check(tenant)
            verdicts.append(True)
        except refusal:
            verdicts.append(False)
    return verdicts


@pytest.mark.parametrize("length", [0, 1, MAX_TENANT_BYTES, MAX_TENANT_BYTES + 1])
def test_every_check_of_a_tenant_agrees_with_the_one_rule(length: int) -> None:
    for code in range(256):
        tenant = ("a" * length)[:-1] + chr(code) if length else ""
        ok = is_valid_tenant(tenant)
        assert _others_agree(tenant) == [ok, ok, ok], (tenant, ok)
        assert (bad_tenant_char(tenant) is None) == all(is_valid_tenant(c) for c in tenant)


def _tenant_constants(path: Path) -> list[str]:
    """Module-level names about tenants bound to the bound (128) or the forbidden set."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign) and node.value is not None
            else []
        )
        value = (
            ast.unparse(node.value)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value
            else ""
        )
        for target in targets:
            name = ast.unparse(target)
            if "TENANT" in name.upper() and ("128" in value or ":#/" in value or "x3b" in value):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def test_the_tenant_rule_and_its_bound_are_written_once() -> None:
    found = [
        hit
        for top in ("app", "wal", "sink")
        for path in sorted((ROOT / top).rglob("*.py"))
        for hit in _tenant_constants(path)
    ]
    assert found == ["wal/tenant.py: MAX_TENANT_BYTES", "wal/tenant.py: TENANT_CHARS"]

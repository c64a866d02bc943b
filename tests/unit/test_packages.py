"""Each package says what it holds and exports what other packages use; test doubles live
in ``testing`` modules beside what they fake, never in the production modules
(issue 25 items 4 and 5).

Read from the source, the way ``tests/unit/test_references.py`` reads citations: a
package's ``__init__`` docstring names each of its modules; every name ``app``
imports from one of ``wal``'s or ``sink``'s modules is also exported by the package
(tests, benchmarks and scripts may read internals from their modules); no production
module imports a ``testing`` module.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(
    p.parent for top in ("app", "wal", "sink") for p in (ROOT / top).rglob("__init__.py")
)
#: The library packages ``app`` builds on; what it imports of them, they export.
LIBRARIES = ("wal", "sink")
#: The production trees (``testing`` modules aside).
PRODUCTION = ("app", "wal", "sink")


def _modules(package: Path) -> list[str]:
    names = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(names)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_docstring_names_each_of_its_modules(package: Path) -> None:
    doc = ast.get_docstring(_tree(package / "__init__.py")) or ""
    missing = [m for m in _modules(package) if not re.search(rf"\b{re.escape(m)}\b", doc)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not name {missing}"


def _imports_from(paths: Iterator[Path], prefix: str) -> Iterator[tuple[str, str, str]]:
    """Every ``from <prefix>.<module> import name`` in ``paths``: (file, module, name)."""
    for path in paths:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix + "."):
                for alias in node.names:
                    yield str(path.relative_to(ROOT)), node.module or "", alias.name


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_library_exports_every_name_the_other_packages_import(library: str) -> None:
    exported = set(importlib.import_module(library).__all__)
    users = (p for p in (ROOT / "app").rglob("*.py"))
    missing = sorted(
        f"{file}: {module}.{name}"
        for file, module, name in _imports_from(users, library)
        if name not in exported and not module.endswith(".testing")
    )
    assert not missing, f"{library}/__init__.py does not export {missing}"


def test_no_production_module_imports_a_testing_module() -> None:
    production = (
        p for top in PRODUCTION for p in (ROOT / top).rglob("*.py") if p.stem != "testing"
    )
    found = []
    for path in production:
        for node in ast.walk(_tree(path)):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.endswith("testing")]
    assert not found, found


@pytest.mark.parametrize(
    ("production", "testing", "doubles"),
    [
        ("sink.store", "sink.testing", ("MemoryStore", "FailingStore", "StoreFault")),
        ("app.receive.api", "app.receive.testing", ("StubPort", "IngestCall")),
    ],
)
def test_the_test_doubles_live_beside_what_they_fake(
    production: str, testing: str, doubles: tuple[str, ...]
) -> None:
    real, fakes = importlib.import_module(production), importlib.import_module(testing)
    assert [d for d in doubles if hasattr(real, d)] == []
    assert [d for d in doubles if not hasattr(fakes, d)] == []


def _enum_members(cls: ast.ClassDef) -> frozenset[str]:
    return frozenset(
        t.id
        for node in cls.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    )


def test_records_or_audit_is_one_enum_the_wal_and_the_sink_share() -> None:
    homes = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for top in PRODUCTION
        for path in sorted((ROOT / top).rglob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ClassDef) and _enum_members(node) == {"RECORDS", "AUDIT"}
    ]
    assert homes == ["wal/intents.py: ObjectKind"]
    import time

    from sink.buffers import Buffers
    from sink.claims import claim_of
    from tests.support.sinkrows import frame_rows
    from wal.intents import IntentRecord, decode_body, encode_record

    buffers = Buffers(flush_bytes=1 << 30, clock=time.monotonic, epoch=lambda: 1)
    buffers.add_records("t", 20_000, frame_rows("t", 20_000, 100), wal_lsn=100, nbytes=1)
    (detached,) = buffers.drain_all("test")
    claim = claim_of("records/k.parquet", detached.partition)
    record = IntentRecord(claim.kind, claim.tenant, claim.key, claim.day, claim.frames)
    assert decode_body(encode_record(record)[8:]).kind is claim.kind

"""``app/`` is a stack of floors: every import points down or sideways, never up, and the
packages import one another without a cycle (DESIGN.md §2; issue 25 item 1).

Read from the source, the way ``tests/unit/test_references.py`` reads citations: every
``import`` and ``from … import`` of every module in ``app/`` — at the top of a module,
inside a function, under ``TYPE_CHECKING`` alike, since each one is a dependency of the
code — is resolved to the ``app`` module it names, and that module's package gives its
floor. A failure prints each offending import with its file and line.

The floors, bottom up (what each package is for: its ``__init__`` docstring):

0. the ground: ``app/base/`` (the vocabulary every floor speaks) and the modules at
   ``app/``'s root (``points``, ``threads``);
1. ``app/receive/`` — the receivers and the worker side, which define the port the core
   implements (``api``) and the decoder recovery reuses (``otlp``);
2. ``app/ingest/`` — the core's pipeline, which implements that port;
3. ``app/cadence/`` — the background cadences that drive the pipeline;
4. ``app/node/`` — the assembly at the top: the process, recovery, metrics, workers;
5. ``app/cli/`` — the ``ourios`` command.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

#: Each package of ``app`` and its floor; ``app`` itself stands for the root modules.
FLOORS = {
    "app": 0,
    "app.base": 0,
    "app.receive": 1,
    "app.ingest": 2,
    "app.cadence": 3,
    "app.node": 4,
    "app.cli": 5,
}

#: Imports that run up a floor and stay, each with why: (importing module, imported
#: module). None today; an entry needs a redesign named beside it, not a move.
EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.source} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _known(name: str) -> bool:
    """Whether ``name`` is a module or package of ``app`` (a submodule imported by
    ``from package import module`` is named so)."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[Import]:
    """Every ``app`` module ``path`` imports, resolved to its full name."""
    source = _module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(up + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            targets = [m for m in submodules if _known(m)] or [module]
        else:
            continue
        for target in targets:
            if target == "app" or target.startswith("app."):
                yield Import(path, node.lineno, source, target)


def _package(module: str) -> str:
    """The package of ``app`` a module belongs to: ``app.<package>``, or ``app`` for the
    modules at its root."""
    parts = module.split(".")
    if len(parts) >= 2 and (APP / parts[1] / "__init__.py").is_file():
        return ".".join(parts[:2])
    return "app"


def _all_imports() -> list[Import]:
    return [i for path in sorted(APP.rglob("*.py")) for i in _imports(path)]


def test_every_package_of_app_has_a_floor() -> None:
    packages = {"app"} | {
        f"app.{p.parent.name}" for p in APP.glob("*/__init__.py") if p.parent.is_dir()
    }
    assert packages == set(FLOORS), "declare each package's floor in FLOORS"


def test_no_import_in_app_runs_up_a_floor() -> None:
    up = [
        str(i)
        for i in _all_imports()
        if FLOORS[_package(i.target)] > FLOORS[_package(i.source)]
        and (i.source, i.target) not in EXCEPTIONS
    ]
    assert not up, "imports that run up a floor:\n" + "\n".join(up)


def test_every_exception_is_still_an_import() -> None:
    pairs = {(i.source, i.target) for i in _all_imports()}
    assert EXCEPTIONS <= pairs, sorted(EXCEPTIONS - pairs)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its nodes in order, the first repeated at the end), or
    None. A depth-first walk: a node met again while still on the path closes one."""
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = walk(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = walk(start)
        if found:
            return found
    return None


def test_the_packages_of_app_import_one_another_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for i in _all_imports():
        source, target = _package(i.source), _package(i.target)
        if source != target:
            graph.setdefault(source, set()).add(target)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_floor_check_sees_an_import_that_runs_up() -> None:
    # The reader itself: a cycle is found, and an import inside a function is read, so a
    # clean run above means the tree is clean, not the reader blind.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None
    targets = {i.target for i in _imports(APP / "cli" / "__init__.py")}
    assert "app.node.server" in targets  # imported inside a function
    assert FLOORS[_package("app.node.server")] > FLOORS[_package("app.receive.otlp")]


def test_the_modules_of_app_import_one_another_without_a_cycle() -> None:
    # Finer than the packages: a cycle inside one package is a floor hidden in a room.
    graph: dict[str, set[str]] = {}
    for i in _all_imports():
        if i.source != i.target:
            graph.setdefault(i.source, set()).add(i.target)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])

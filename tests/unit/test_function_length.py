"""No function in ``app/`` is longer than ``LIMIT`` lines (issue 25, item 6), and no
class longer than ``CLASS_LIMIT`` (issue 25, "Done when").

A long function hides its steps; splitting it into named helpers lets each step say
why it exists in its docstring. The check reads every module under ``app/`` with
``ast`` and measures each function (methods and nested functions included) from its
``def`` line to its last line. A failure lists each function over the limit with its
file, line and length.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

#: The most lines a function may span, its ``def`` line and docstring included.
LIMIT = 80

#: The most lines a class may span: a class past it is doing more than one room's work.
CLASS_LIMIT = 400

#: Functions allowed over the limit, as ``(path relative to the root, name)``: none now
#: (``flatten``, the last, was split into its walk and its columns).
EXCEPTIONS: set[tuple[str, str]] = set()


def _long_functions() -> list[str]:
    """Every function under ``app/`` over ``LIMIT`` lines and not an exception."""
    found: list[str] = []
    for path in sorted(APP.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > LIMIT and (rel, node.name) not in EXCEPTIONS:
                found.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_function_in_app_is_over_the_limit() -> None:
    long = _long_functions()
    assert not long, f"functions over {LIMIT} lines:\n" + "\n".join(long)


def test_every_exception_still_names_a_long_function() -> None:
    """An exception that no longer applies is removed, so the list stays honest."""
    for rel, name in EXCEPTIONS:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        spans = [
            n.end_lineno - n.lineno + 1
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name == name
            and n.end_lineno is not None
        ]
        assert any(span > LIMIT for span in spans), f"{rel} {name} is no longer long"


def test_house_no_class_in_app_is_over_the_class_limit() -> None:
    """Every class under ``app/`` spans at most ``CLASS_LIMIT`` lines, no exceptions."""
    long: list[str] = []
    for path in sorted(APP.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > CLASS_LIMIT:
                    long.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"classes over {CLASS_LIMIT} lines:\n" + "\n".join(long)

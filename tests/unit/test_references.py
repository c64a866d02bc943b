"""Every reference in the tree points at something that exists in the repository.

The design and the safety rules live in ``docs/DESIGN.md`` and ``docs/RULES.md``. Code,
tests and documents cite them by section (``DESIGN.md §5.8``, an RFC's section such as
``RFC 0052 §3.2``, the segment-set seed's ``§4.4``) and by rule id (``RFC0052.10``, the
project's ``NOWEDGE.3``); tests are named after the rule they prove
(``test_rfc0052_13_…``, ``test_seg12_…``, ``test_nowedge_4_…``). This module checks that
each of those resolves to a heading of one of the two documents, and that everything
the documents name in turn — test node ids, sabotage entries, paths — exists. A failure
prints each reference that resolves nowhere with its file and line.

How a section citation is read: every ``§N[.M]`` (and each end of a range ``§5.4–5.6``)
belongs to the nearest document name before it in the same paragraph, at most
``_LOOKBACK`` characters back, comment markers and line breaks ignored (so ``RFC 0052
§3.2, §3.7`` and a citation wrapped across two comment lines both resolve). Inside
``docs/DESIGN.md`` a bare ``§N`` is the page itself. Public standards (an IETF RFC, a
four-digit number not starting with 0) are outside the repository by nature and are
not checked.

Headings are keyed by what precedes `` — `` in them (``### RFC0052.1 — …``), or by a
leading ``§N`` (``## §5 …``), compared without regard to case.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DESIGN = DOCS / "DESIGN.md"
RULES = DOCS / "RULES.md"

#: What is scanned for citations, relative to the repository root.
SCANNED = ("app", "wal", "sink", "soak", "scripts", "tests", "docs", "charts", "README.md")
#: Text files among them (golden binaries and the like are skipped).
TEXT_SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".tpl", ".txt", ".toml", ".json"})
#: How far back (in flattened characters) a bare ``§`` looks for its document's name.
_LOOKBACK = 250

_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
_SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)(?:\s?[–-]\s?§?(\d+(?:\.\d+)*))?")
_DOCUMENT = re.compile(
    r"(?P<design>\bDESIGN(?:\.md)?\b)"
    r"|\bRFC\s?(?P<rfc>\d{4})\b(?!\.\d)"
    r"|\bseed\s+(?P<seed>\d{3})\b"
    r"|(?P<segset>\b[Ss]egment-set\s+seed)"
    r"|(?P<md>\b[A-Za-z][\w-]*\.md)\b"
)
_RULE_ID = re.compile(r"\bRFC(\d{4})\.(\d+)\b")
_TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test_\w+)", re.M)
_NODE_ID = re.compile(r"\b(tests/[\w/.-]+\.py)::(\w+)(?:\[[^\]\s`]*\])?")
_PATH = re.compile(r"`((?:app|wal|sink|soak|scripts|tests|charts|docs|k8s)/[\w./-]*)`")
_SABOTAGE_DEF = re.compile(r"Sabotage\(\s*\"([a-z0-9_]+)\"")
_SABOTAGE_LINE = re.compile(r"^\*\*Sabotage:\*\*(.*?)(?:\n\n|\Z)", re.M | re.S)
#: The seeds by number: RFC 0052, RFC 0055, and the segment-set design.
_SEEDS = {"000": "rfc 0052", "002": "rfc 0055", "004": "segment-set seed"}


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.what}"


class Flat:
    """A file's text with comment markers and line breaks folded into spaces (a blank
    line stays a paragraph break), mapping each position back to its line."""

    _MARKER = re.compile(r"^\s*(?:#:?|//|/\*|\*(?!\*)|\{\{-?\s*/\*)?\s*")

    def __init__(self, text: str) -> None:
        parts: list[str] = []
        self._starts: list[int] = []
        pos = 0
        for raw in text.splitlines():
            line = self._MARKER.sub("", raw, count=1).rstrip()
            self._starts.append(pos)
            piece = (line + " ") if line else "\n"
            parts.append(piece)
            pos += len(piece)
        self.text = "".join(parts)

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self._starts, pos)


def anchors(path: Path) -> set[str]:
    """The heading keys of one document, lower-cased."""
    keys: set[str] = set()
    for match in _HEADING.finditer(path.read_text(encoding="utf-8")):
        heading = " ".join(match.group(1).split())
        if " — " in heading:
            keys.add(heading.split(" — ", 1)[0].lower())
        elif leading := re.match(r"§\d+(?:\.\d+)*", heading):
            keys.add(leading.group(0))
    return keys


def _document(match: re.Match[str]) -> str | None:
    """The key prefix a document name's sections are filed under; None: not checked."""
    if match.group("design"):
        return "design"
    if rfc := match.group("rfc"):
        return f"rfc {rfc}" if rfc.startswith("0") else None  # IETF RFCs are public
    if seed := match.group("seed"):
        return _SEEDS.get(seed, f"seed {seed}")
    if match.group("segset"):
        return "segment-set seed"
    return f"file {match.group('md')}"


@dataclass
class Index:
    design: set[str]
    specs: set[str]  # RULES.md and DESIGN.md keys, lower-cased
    families: set[str]  # the project's own rule-id prefixes (``NOWEDGE``, ...)

    @classmethod
    def load(cls, design: Path = DESIGN, rules: Path = RULES) -> Index:
        design_keys = anchors(design)
        specs = anchors(rules) | design_keys
        families = {
            key.split(".", 1)[0]
            for key in specs
            if re.fullmatch(r"[a-z][a-z0-9]*\.\d+", key) and not key.startswith("rfc")
        }
        return cls(design_keys, specs, families)

    def section(self, document: str, number: str) -> str | None:
        """Why ``document §number`` does not resolve; None when it does."""
        if document == "design":
            if f"§{number}" in self.design:
                return None
            return f"DESIGN.md §{number} has no heading in docs/DESIGN.md"
        if document.startswith("file "):
            name = document.removeprefix("file ")
            found = [p for p in (DOCS / name, ROOT / name) if p.is_file()]
            if not found:
                return f"{name} §{number}: {name} is not in the repository"
            if f"§{number}" in anchors(found[0]):
                return None
            return f"{name} §{number} has no heading in {found[0].relative_to(ROOT)}"
        if f"{document} §{number}" in self.specs:
            return None
        shown = document.upper() if document.startswith("rfc") else document
        return f"{shown} §{number} has no heading in docs/RULES.md or docs/DESIGN.md"

    def rule(self, key: str) -> bool:
        return key.lower() in self.specs


def citations(
    path: Path, text: str, index: Index, *, self_document: str | None
) -> Iterator[Problem]:
    """Every section citation and rule id in ``text`` that resolves nowhere."""
    flat = Flat(text)
    documents = list(_DOCUMENT.finditer(flat.text))
    ends = [m.end() for m in documents]
    for match in _SECTION.finditer(flat.text):
        start = match.start()
        paragraph = flat.text.rfind("\n", 0, start) + 1
        at = bisect.bisect_right(ends, start) - 1
        owner = documents[at] if at >= 0 else None
        if owner is None or owner.end() < max(paragraph, start - _LOOKBACK):
            if self_document is None:
                yield Problem(path, flat.line(start), f"{match.group(0)} names no document")
                continue
            document: str | None = self_document
        else:
            document = _document(owner)
        if document is None:
            continue
        for number in filter(None, (match.group(1), match.group(2))):
            if (why := index.section(document, number)) is not None:
                yield Problem(path, flat.line(start), why)
    for match in _RULE_ID.finditer(flat.text):
        if not index.rule(match.group(0)):
            yield Problem(path, flat.line(match.start()), f"{match.group(0)} has no heading")
    if index.families:
        names = "|".join(sorted(f.upper() for f in index.families))
        family = re.compile(rf"\b(?:{names})\.\d+\b")  # the ids are written upper-case
        for match in family.finditer(flat.text):
            if not index.rule(match.group(0)):
                yield Problem(path, flat.line(match.start()), f"{match.group(0)} has no heading")


def _test_rule(name: str, index: Index) -> str | None:
    """Why the rule a test is named after does not resolve; None when it does (or the
    name cites no rule)."""
    if m := re.match(r"test_rfc(\d{4})_(\d+)(?:_(\d+))?_", name):
        rfc, first, second = m.groups()
        keys = [f"rfc{rfc}.{first}"] + ([f"rfc {rfc} §{first}.{second}"] if second else [])
        if any(index.rule(key) for key in keys):
            return None
        return f"{name} is named after {' or '.join(k.upper() for k in keys)}, which has no heading"
    if m := re.match(r"test_seg(\d+)_", name):
        key = f"segment-set deliverable {m.group(1)}"
        return None if index.rule(key) else f"{name} is named after {key}, which has no heading"
    if m := re.match(r"test_nowedge_(\d+)_", name):
        key = f"nowedge.{m.group(1)}"
        return None if index.rule(key) else f"{name} is named after {key}, which has no heading"
    if m := re.match(r"test_issue(\d+)_", name):
        prefix = f"issue{m.group(1)}."
        if any(key.startswith(prefix) for key in index.specs):
            return None
        return f"{name} is named after issue {m.group(1)}, which has no rule heading"
    return None


def scanned_files() -> Iterator[Path]:
    this = Path(__file__).resolve()
    for entry in SCANNED:
        top = ROOT / entry
        candidates: Iterable[Path] = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in candidates:
            if path.suffix in TEXT_SUFFIXES and path.is_file() and path.resolve() != this:
                if "__pycache__" not in path.parts:
                    yield path


def reference_problems(index: Index) -> list[Problem]:
    problems: list[Problem] = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        own = "design" if path == DESIGN else None
        problems.extend(citations(path, text, index, self_document=own))
        if path.suffix == ".py" and "tests" in path.relative_to(ROOT).parts[:1]:
            for match in _TEST_DEF.finditer(text):
                if (why := _test_rule(match.group(1), index)) is not None:
                    line = text.count("\n", 0, match.start()) + 1
                    problems.append(Problem(path, line, why))
    return problems


def _sabotages() -> set[str]:
    return set(_SABOTAGE_DEF.findall((ROOT / "soak" / "sabotage.py").read_text("utf-8")))


def document_problems(path: Path) -> list[Problem]:
    """What a document names that does not exist: test node ids, paths, sabotages."""
    text = path.read_text(encoding="utf-8")
    problems: list[Problem] = []

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for match in _NODE_ID.finditer(text):
        file, name = ROOT / match.group(1), match.group(2)
        if not file.is_file():
            problems.append(Problem(path, line(match.start()), f"{match.group(1)} does not exist"))
        elif not re.search(rf"^\s*(?:async\s+)?def {name}\(", file.read_text("utf-8"), re.M):
            problems.append(
                Problem(path, line(match.start()), f"{match.group(1)} has no test {name}")
            )
    for match in _PATH.finditer(text):
        if not (ROOT / match.group(1)).exists():
            problems.append(Problem(path, line(match.start()), f"{match.group(1)} does not exist"))
    known = _sabotages()
    for block in _SABOTAGE_LINE.finditer(text):
        for name in re.findall(r"`([a-z0-9_]+)`", block.group(1)):
            if name not in known:
                problems.append(
                    Problem(
                        path, line(block.start()), f"sabotage {name} is not in soak/sabotage.py"
                    )
                )
    return problems


def _report(problems: list[Problem]) -> str:
    return "\n".join(["references that resolve nowhere:", *map(str, problems)])


def test_every_section_and_rule_cited_in_the_tree_has_a_heading() -> None:
    problems = reference_problems(Index.load())
    if problems:
        pytest.fail(_report(problems), pytrace=False)


def test_everything_the_design_and_the_rules_name_exists() -> None:
    problems = document_problems(DESIGN) + document_problems(RULES)
    if problems:
        pytest.fail(_report(problems), pytrace=False)


def test_every_sabotage_is_named_under_a_rule() -> None:
    named = {
        name
        for block in _SABOTAGE_LINE.finditer(RULES.read_text("utf-8"))
        for name in re.findall(r"`([a-z0-9_]+)`", block.group(1))
    }
    missing = sorted(_sabotages() - named)
    if missing:
        pytest.fail(f"soak/sabotage.py entries docs/RULES.md names under no rule: {missing}")


def test_every_sabotage_still_applies_to_the_tree() -> None:
    """A sabotage whose text has gone from its file breaks nothing and proves nothing:
    each entry's edits apply, in order, to the file as it is today."""
    from soak.sabotage import SABOTAGES

    stale = []
    for sabotage in SABOTAGES:
        text = (ROOT / sabotage.file).read_text("utf-8")
        for old, new in ((sabotage.old, sabotage.new), *sabotage.more):
            if old not in text:
                stale.append(f"{sabotage.name}: {old!r} is not in {sabotage.file}")
                break
            text = text.replace(old, new, 1)
    assert not stale, "\n".join(stale)


def test_a_reference_that_points_nowhere_is_reported_with_its_line(tmp_path: Path) -> None:
    """The checker itself: every kind of dangling reference is caught, and what resolves
    (a wrapped citation, a list after one document name, a public RFC) is not."""
    index = Index.load()
    source = tmp_path / "module.py"
    text = "\n".join(
        [
            '"""Resolves: DESIGN.md §5.8, §13; RFC 0052 §3.2, §3.7; RFC 9110 §5.3; RFC0052.10;',
            "the segment-set seed §4.4 and a wrapped RFC",
            '0055 §9.4."""',
            "# Dangling: DESIGN.md §99 and RFC 0052 §3.99",
            "# RFC0052.99 and NOWEDGE.99",
            "",
            "# §7 with no document before it",
            "def test_rfc0052_98_a_rule_that_is_not_there() -> None: ...",
        ]
    )
    problems = list(citations(source, text, index, self_document=None))
    problems += [
        Problem(source, 8, why)
        for why in [_test_rule("test_rfc0052_98_a_rule_that_is_not_there", index)]
        if why
    ]
    found = sorted((p.line, p.what.split()[0]) for p in problems)
    assert found == [
        (4, "DESIGN.md"),
        (4, "RFC"),
        (5, "NOWEDGE.99"),
        (5, "RFC0052.99"),
        (7, "§7"),
        (8, "test_rfc0052_98_a_rule_that_is_not_there"),
    ], "\n".join(map(str, problems))

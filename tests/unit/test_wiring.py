"""``app/`` is wired by constructors: no attribute of another module's object is assigned
after it is built; each collaborator and hook is passed in when the object is made
(issue 25 item 3).

Read from the source with ``ast``, the way ``tests/unit/test_floors.py`` reads imports.
Every assignment (``=``, ``+=``, annotated) whose target is an attribute ``x.a`` is
looked at, except ``self.a`` / ``cls.a`` (an object setting its own state). The object
``x`` is given a class where the source says which:

* a parameter annotated with an ``app`` class (``pipeline: Pipeline``);
* a local bound in the same function by calling an ``app`` class (``m = NodeMetrics()``);
* otherwise every ``app`` class that declares an attribute named ``a`` (a field in its
  body, or ``self.a = …`` in one of its methods).

The assignment offends when that class is (or, for a name only, every class declaring
``a`` is) a *collaborator*: a class of ``app`` that is not a *record* and is defined in
another module than the assignment. Records are what a function may fill after building
them: dataclasses, ``NamedTuple``s and exceptions (a refusal whose count the raiser
fills). Allowed therefore: an object setting its own attributes, a module filling
objects of its own classes (a miner's restore), records (``report.x``, ``run.x``,
``bucket.x``, ``e.state``), and objects of other libraries (``should_exit`` of uvicorn,
``argtypes`` of ctypes) — ``app`` declares no attribute of that name.

A failure lists each offending assignment with its file, line and the class it reaches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

_RECORD_BASES = {
    "NamedTuple",
    "TypedDict",
    "Exception",
    "BaseException",
    "ValueError",
    "RuntimeError",
    "OSError",
}


@dataclass
class Klass:
    module: str
    name: str
    record: bool
    bases: list[str]
    #: attribute -> the class it holds, where the source says ("" when it does not)
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Offence:
    path: str
    line: int
    target: str
    reaches: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.target} = … (an attribute of {self.reaches})"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _modules(*packages: str) -> Iterator[tuple[str, ast.Module]]:
    for package in packages or ("app",):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield _rel(path), ast.parse(path.read_text(), filename=str(path))


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _base_name(base: ast.expr) -> str:
    """The class an annotation or a base names (``Foo | None``, ``m.Foo``, ``"Foo"``)."""
    text = ast.unparse(base).strip("'\"").split("|", 1)[0].strip()
    return text.rsplit(".", 1)[-1].split("[", 1)[0]


def _declare(klass: Klass, node: ast.ClassDef) -> None:
    """The attributes ``node`` declares and, where stated, their classes."""
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            klass.attrs[item.target.id] = _base_name(item.annotation)
        elif isinstance(item, ast.Assign):
            klass.attrs.update((t.id, "") for t in item.targets if isinstance(t, ast.Name))
    for func in node.body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {
            a.arg: _base_name(a.annotation)
            for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
            if a.annotation is not None
        }
        for sub in ast.walk(func):
            for target in _targets(sub):
                if not (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    continue
                kind = klass.attrs.get(target.attr, "")
                if isinstance(sub, ast.AnnAssign):
                    kind = _base_name(sub.annotation)
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name):
                    kind = kind or params.get(sub.value.id, "")
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
                    kind = kind or _base_name(sub.value.func)
                klass.attrs[target.attr] = kind


def _classes() -> dict[str, list[Klass]]:
    """Every class of ``app``, ``sink`` and ``wal`` by name (Protocols left out: the object
    behind one is another class), whether it is a record, and what it declares."""
    found: dict[str, list[Klass]] = {}
    for path, module in _modules("app", "sink", "wal"):
        for node in ast.walk(module):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [_base_name(b) for b in node.bases]
            if "Protocol" in bases:
                continue
            klass = Klass(path, node.name, _is_dataclass(node), bases)
            _declare(klass, node)
            found.setdefault(node.name, []).append(klass)
    # exceptions and records by inheritance, to a fixed point
    changed = True
    while changed:
        changed = False
        for klasses in found.values():
            for k in klasses:
                if k.record:
                    continue
                if any(
                    b in _RECORD_BASES
                    or b.endswith(("Error", "Exception"))
                    or any(p.record for p in found.get(b, []))
                    for b in k.bases
                ):
                    k.record = changed = True
    return found


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _local_types(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
    classes: dict[str, list[Klass]],
    owner: str | None = None,
) -> dict[str, str]:
    """Names of ``func`` whose class the source states: ``self`` in a method of
    ``owner``, annotated parameters, and locals bound by calling a class or to an
    expression of a stated class (``node = self._node``)."""
    known: dict[str, str] = {} if owner is None else {"self": owner}
    args = func.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.annotation is not None and _base_name(arg.annotation) in classes:
            known[arg.arg] = _base_name(arg.annotation)
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _base_name(node.value.func) in classes
        ):
            known[node.targets[0].id] = _base_name(node.value.func)
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            kind = _type_of(node.value, known, classes)
            if kind is not None:
                known[node.targets[0].id] = kind
    return known


def _type_of(expr: ast.expr, known: dict[str, str], classes: dict[str, list[Klass]]) -> str | None:
    """The class of ``expr`` where the source states it: a known name, or an attribute a
    known class declares with its class (``node.metrics``: ``Node.metrics: Metrics``)."""
    if isinstance(expr, ast.Name):
        return known.get(expr.id)
    if isinstance(expr, ast.Attribute):
        owner = _type_of(expr.value, known, classes)
        for k in classes.get(owner or "", []):
            kind = k.attrs.get(expr.attr, "")
            if kind in classes:
                return kind
    return None


def offences() -> list[Offence]:
    classes = _classes()
    found: list[Offence] = []
    for path, module in _modules():
        owners = {
            id(f): c.name
            for c in ast.walk(module)
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for func in ast.walk(module):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            known = _local_types(func, classes, owners.get(id(func)))
            for node in ast.walk(func):
                for target in _targets(node):
                    for sub in ast.walk(target):
                        if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)):
                            continue
                        if isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                            continue  # an object's own state
                        offence = _judge(path, sub, known, classes)
                        if offence is not None:
                            found.append(offence)
    return sorted(set(found), key=lambda o: (o.path, o.line))


def _judge(
    path: str, target: ast.Attribute, known: dict[str, str], classes: dict[str, list[Klass]]
) -> Offence | None:
    """The offence ``target`` commits, or None (module docstring)."""
    typed = _type_of(target.value, known, classes)
    if typed is not None:
        # a name two modules define: the assigning module's own class, if it has one
        reached = [k for k in classes[typed] if k.module == path] or classes[typed]
    else:
        reached = [k for ks in classes.values() for k in ks if target.attr in k.attrs]
        if not reached or any(k.record or k.module == path for k in reached):
            return None
    bad = [k for k in reached if not k.record and k.module != path]
    if not bad:
        return None
    names = ", ".join(sorted({f"{k.name} ({k.module})" for k in bad}))
    return Offence(path, target.lineno, ast.unparse(target), names)


def test_house_3_no_attribute_of_another_modules_object_is_assigned_after_construction() -> None:
    found = "\n".join(str(o) for o in offences())
    assert not found, f"wired after construction (pass it to the constructor instead):\n{found}"


def test_house_3_the_rule_sees_a_hook_and_spares_records_own_state_and_own_classes() -> None:
    """The rule on a source of its own: what it catches and what it allows."""
    classes = {
        "Hooked": [Klass("app/a.py", "Hooked", False, [], {"on_done": "", "part": "Hooked"})],
        "Report": [Klass("app/a.py", "Report", True, [], {"count": ""})],
    }
    source = (
        "def wire(h: Hooked, r: Report):\n"
        "    h.on_done = print\n"
        "    r.count = 1\n"
        "    x = Hooked()\n"
        "    x.on_done = print\n"
        "    x.part.on_done = print\n"
        "    self.own = 1\n"
        "    other.should_exit = True\n"
    )
    func = ast.parse(source).body[0]
    assert isinstance(func, ast.FunctionDef)
    known = _local_types(func, classes)
    targets = [
        t
        for node in ast.walk(func)
        for t in _targets(node)
        if isinstance(t, ast.Attribute)
        and not (isinstance(t.value, ast.Name) and t.value.id == "self")
    ]
    judged = [_judge("app/b.py", t, known, classes) for t in targets]
    assert [None if o is None else o.target for o in judged] == [
        "h.on_done",  # a hook of a collaborator passed in
        None,  # a record's field
        "x.on_done",  # a hook of a collaborator built here
        "x.part.on_done",  # a hook of a collaborator's collaborator
        None,  # no class of ours declares it (another library's object)
    ]
    # the same assignments inside the class's own module are its own business
    assert [_judge("app/a.py", t, known, classes) for t in targets] == [None] * 5


#: The settlement's modules: the settler and its rooms (``app/ingest/settlement.py``).
SETTLEMENT = (
    "app/ingest/settlement.py",
    "app/ingest/rebuild.py",
    "app/ingest/unrecoverable.py",
    "app/ingest/frame_attempts.py",
    "app/ingest/settle_parts.py",
)


def _chains(path: Path) -> list[str]:
    """Reaches through a collaborator in ``path``: ``self.a.b.c`` (a collaborator's
    collaborator, then its member) and ``n.b.c`` where ``n = self.a`` in the function."""
    module = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for func in ast.walk(module):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        aliases = {
            node.targets[0].id
            for node in ast.walk(func)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        }
        for node in ast.walk(func):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
                continue
            inner = node.value.value
            deep = (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id == "self"
            )
            aliased = isinstance(inner, ast.Name) and inner.id in aliases
            if deep or aliased:
                found.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_house_3_the_settler_reaches_no_collaborator_through_another() -> None:
    """The settler and its rooms call what they were given, never ``p.journal.x``."""
    found = [c for name in SETTLEMENT if (ROOT / name).exists() for c in _chains(ROOT / name)]
    assert not found, "reached through another object:\n" + "\n".join(found)

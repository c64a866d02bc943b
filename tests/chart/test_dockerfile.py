"""The Dockerfile and .dockerignore, checked without building (no Docker engine here).

The Dockerfile is parsed into stages and instructions (``parse_dockerfile``); the tests
pin what the chart and operators rely on: a multi-stage build whose final stage installs
the wheel built from this tree (``--no-index``, so never a PyPI release of the same
name), runs as the fixed non-root uid/gid the chart's securityContext names, writes only
to the data volume and /tmp, and starts ``ourios serve`` with SIGTERM as its stop signal.
``.dockerignore`` is evaluated with Docker's rules (``is_ignored``): last matching
pattern wins, ``!`` re-includes, a pattern matching a directory excludes what is in it.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from app.base.config import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DATA_DIR = "/var/lib/ourios"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the logical line, continuations joined
    line: int

    def exec_form(self) -> list[str]:
        """The JSON (exec) form of ENTRYPOINT/CMD; fails the test on shell form."""
        value = json.loads(self.args)
        assert isinstance(value, list), f"line {self.line}: {self.keyword} is not exec form"
        return [str(v) for v in value]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """ENV in ``key=value`` form (the only form this Dockerfile uses)."""
        out: dict[str, str] = {}
        for inst in self.all("ENV"):
            for m in re.finditer(r'(\w+)=("[^"]*"|\S+)', inst.args):
                out[m.group(1)] = m.group(2).strip('"')
        return out


@dataclass
class Dockerfile:
    args: dict[str, str]  # global ARGs (before the first FROM) with their defaults
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args[m.group(1) or m.group(2)], text)


def parse_dockerfile(text: str) -> Dockerfile:
    """Stages and instructions; comments dropped, ``\\`` continuations joined."""
    logical: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        logical.append((start, " ".join(p for p in pending if p)))
        pending = []
    assert not pending, "the Dockerfile ends inside a continued line"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"line {number}: cannot parse FROM {rest!r}"
            stages.append(Stage(base=m.group(1), name=m.group(2)))
        elif not stages:
            assert keyword == "ARG", f"line {number}: {keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest.strip(), number))
    return Dockerfile(global_args, stages)


@cache
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


# --- .dockerignore ---------------------------------------------------------------------


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) per pattern, in order, with Docker's syntax (``**``, ``!``)."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = pattern.strip("/")
        out.append((not negated, re.compile(_glob_regex(pattern))))
    return out


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def is_ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for excludes, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = excludes
    return ignored


@cache
def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    return dockerignore_patterns(DOCKERIGNORE.read_text(encoding="utf-8"))


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def package_dirs() -> list[str]:
    """The top-level packages ``pip install .`` installs (tool.setuptools.packages.find)."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*").rstrip(".") for p in include})


# --- the tests -------------------------------------------------------------------------


def test_the_build_is_multi_stage_on_slim_python_311() -> None:
    df = dockerfile()
    assert len(df.stages) >= 2
    bases = {df.resolve(s.base) for s in df.stages}
    assert len(bases) == 1, f"builder and runtime should share one base, got {bases}"
    (base,) = bases
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base
    assert df.stages[0].name == "builder"


def test_the_builder_makes_a_wheel_of_this_tree() -> None:
    builder = dockerfile().stage("builder")
    copied = {
        src.rstrip("/")
        for inst in builder.all("COPY")
        if "--from" not in inst.args
        for src in inst.args.split()[:-1]
    }
    # readme: pyproject's `readme`; setup.py: the native decoder's build
    needed = {"pyproject.toml", "setup.py", "README.md", *package_dirs()}
    assert needed <= copied, f"the builder does not copy {sorted(needed - copied)}"
    runs = " ".join(i.args for i in builder.all("RUN"))
    assert re.search(r"pip wheel\b.*--wheel-dir\s+/wheels\s+\.(\s|$)", runs), runs


def test_native_2_the_builder_compiles_the_native_decoder_into_the_wheel() -> None:
    builder = dockerfile().stage("builder")
    runs = [i.args for i in builder.all("RUN")]
    compiler = next(i for i, run in enumerate(runs) if "apt-get install" in run)
    assert re.search(r"apt-get install\b.*\bgcc\b.*\blibc6-dev\b", runs[compiler])
    wheel = next(i for i, run in enumerate(runs) if "pip wheel" in run)
    assert compiler < wheel, "gcc must be there before the wheel is built"
    # the build fails when the wheel lacks the extension, never a silent upb-only image
    assert re.search(r"zipfile -l /wheels/ourios-\*\.whl \| grep -q .*_otlpdecode", runs[wheel])
    assert "gcc" not in " ".join(i.args for i in dockerfile().final.all("RUN"))


def test_native_2_the_runtime_image_imports_the_native_decoder() -> None:
    install = next(i for i in dockerfile().final.all("RUN") if " install " in i.args)
    assert '/opt/venv/bin/python -c "import app.receive._otlpdecode"' in install.args


def test_the_runtime_installs_only_that_wheel_into_a_venv() -> None:
    df = dockerfile()
    runtime = df.final
    install = next(i for i in runtime.all("RUN") if "pip" in i.args and " install " in i.args)
    name = pyproject()["project"]["name"]
    assert "from=builder" in install.args, "the wheels must come from the builder stage"
    assert "--no-index" in install.args, "without --no-index pip may take ourios from an index"
    assert f"/wheels/{name}-*.whl" in install.args
    assert re.search(r"python -m venv\b.*\s/opt/venv\b", install.args)
    assert "/opt/venv/bin/python" in install.args
    assert runtime.env()["PATH"].startswith("/opt/venv/bin:")


def test_the_final_stage_runs_as_the_fixed_non_root_user() -> None:
    runtime = dockerfile().final
    user = runtime.last("USER").args
    m = re.fullmatch(r"(\d+):(\d+)", user)
    assert m, f"USER must be a numeric uid:gid (runAsNonRoot can only check numbers), got {user}"
    uid, gid = int(m.group(1)), int(m.group(2))
    assert uid == gid == 10001
    # The user is created with exactly that uid/gid and owns the data directory.
    setup = " ".join(i.args for i in runtime.all("RUN"))
    assert f"--uid {uid}" in setup and f"--gid {gid}" in setup
    assert f"chown {uid}:{gid} {DATA_DIR}" in setup


def test_entrypoint_cmd_stopsignal_and_ports() -> None:
    runtime = dockerfile().final
    assert runtime.last("ENTRYPOINT").exec_form() == ["ourios"]
    assert runtime.last("CMD").exec_form() == ["serve"]
    assert runtime.last("STOPSIGNAL").args == "SIGTERM"
    exposed = {int(p.split("/")[0]) for i in runtime.all("EXPOSE") for p in i.args.split()}
    defaults = {r.name: r.default for r in SETTINGS if r.section == "server"}
    assert exposed == {defaults["grpc_port"], defaults["http_port"]} == {4317, 4318}


def test_the_environment_suits_a_read_only_root_filesystem() -> None:
    env = dockerfile().final.env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    assert env["OURIOS_SERVER_DATA_DIR"] == DATA_DIR
    runtime = dockerfile().final
    assert runtime.last("WORKDIR").args == DATA_DIR
    assert json.loads(runtime.last("VOLUME").args) == [DATA_DIR]


def test_every_ourios_variable_of_the_image_is_a_setting() -> None:
    # The app refuses unknown OURIOS_* variables: a typo here would stop every pod.
    known = {row.env_var for row in SETTINGS}
    image = {k for k in dockerfile().final.env() if k.startswith("OURIOS_")}
    assert image and image <= known, sorted(image - known)


@pytest.mark.parametrize(
    "path",
    [".venv/bin/python", ".cache/tools/bin/helm", ".git/HEAD", "tests/conftest.py",
     "tests/chart/test_chart.py", "data/wal/x.wal", ".mypy_cache/x", "app/__pycache__/cli.pyc",
     "wal/frame.pyc", "ourios.egg-info/PKG-INFO", "soak/sabotage.py", "charts/ourios/Chart.yaml",
     "docs/CONFIG.md", "app/receive/_otlpdecode.cpython-311-x86_64-linux-gnu.so"],
)  # fmt: skip
def test_dockerignore_keeps_out(path: str) -> None:
    assert is_ignored(path, ignore_patterns())


def test_dockerignore_lets_every_copied_source_in() -> None:
    patterns = ignore_patterns()
    for stage in dockerfile().stages:
        for inst in stage.all("COPY"):
            if "--from" in inst.args:
                continue
            for src in inst.args.split()[:-1]:
                assert not is_ignored(src, patterns), f"COPY {src} is excluded by .dockerignore"
    for package in package_dirs():
        modules = sorted((ROOT / package).glob("*.py"))
        assert modules, package
        for module in modules:
            assert not is_ignored(str(module.relative_to(ROOT)), patterns), module
    for source in ("setup.py", "app/receive/_otlpdecode.c"):  # the native decoder's build
        assert not is_ignored(source, patterns), source


def test_the_console_script_exists_in_the_installed_metadata() -> None:
    (entry,) = metadata.entry_points(group="console_scripts", name="ourios")
    scripts = pyproject()["project"]["scripts"]
    assert entry.value == scripts["ourios"] == "app.cli:main"
    assert callable(entry.load())

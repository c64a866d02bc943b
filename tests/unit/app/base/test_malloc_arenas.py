"""The allocator's arena limit of ``ourios serve`` (DESIGN.md §5.12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.base.malloc_arenas import DEFAULT_ARENAS, ENV, bound_malloc_arenas


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in a process of its own (what ``ourios serve``
    sets for itself happens there, not in the test runner); its output as text."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_bounded_1_arenas_default_to_two_and_the_workers_inherit_the_limit() -> None:
    environ: dict[str, str] = {}
    assert bound_malloc_arenas(environ) == DEFAULT_ARENAS == 2
    assert environ == {ENV: "2"}  # what a worker process started from here reads


def test_bounded_1_an_operators_malloc_arena_max_wins() -> None:
    environ = {ENV: "4"}
    assert bound_malloc_arenas(environ) == 4
    assert environ == {ENV: "4"}


def test_bounded_1_zero_or_nonsense_leaves_glibc_its_default() -> None:
    assert bound_malloc_arenas({ENV: "0"}) is None
    assert bound_malloc_arenas({ENV: "many"}) is None


def test_bounded_1_serve_bounds_the_arenas_before_it_loads_the_settings() -> None:
    """A start that is refused at its settings has already set the limit it passes on."""
    code = (
        "import os, sys\n"
        "from app.cli import main\n"
        "os.environ.pop('MALLOC_ARENA_MAX', None)\n"
        "os.environ['OURIOS_SERVER_WORKERS'] = 'not-a-number'\n"
        "rc = main(['serve'])\n"
        "print(os.environ.get('MALLOC_ARENA_MAX'), rc)\n"
    )
    done = run_python(code)
    assert done.stdout.split() == ["2", "2"], (done.stdout, done.stderr)


def test_bounded_3_release_freed_memory_runs_on_this_c_library() -> None:
    from app.base import malloc_arenas

    assert malloc_arenas._MALLOC_TRIM is not None  # glibc, as the image's base
    malloc_arenas.release_freed_memory()


def _thp_enabled(status: str) -> str:
    return next(line.split()[1] for line in status.splitlines() if line.startswith("THP_enabled:"))


THP_KNOB = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def no_huge_pages_reason(knob: Path | None = None) -> str | None:
    """Why the huge-page test cannot run here: the kernel has no transparent huge pages
    (``knob`` absent), so there is nothing to turn off; ``None`` where it can run."""
    knob = THP_KNOB if knob is None else knob
    if knob.exists():
        return None
    return f"{knob} is absent: this kernel has no transparent huge pages to turn off"


def test_the_huge_page_test_skips_only_where_the_kernel_has_no_huge_pages(
    tmp_path: Path,
) -> None:
    knob = tmp_path / "enabled"
    assert no_huge_pages_reason(knob) == (
        f"{knob} is absent: this kernel has no transparent huge pages to turn off"
    )
    knob.write_text("always [madvise] never\n")
    assert no_huge_pages_reason(knob) is None


def test_serve_turns_huge_pages_off_for_itself_and_its_workers() -> None:
    """Arrow's allocator faulting 2 MiB pages in per batch cost the core a third of its
    CPU (docs/BENCHMARKS.md); a worker process inherits the setting."""
    reason = no_huge_pages_reason()
    if reason is not None:
        pytest.skip(reason)
    code = (
        "import os, subprocess, sys\n"
        "from app.cli import main\n"
        "os.environ['OURIOS_SERVER_WORKERS'] = 'not-a-number'\n"
        "rc = main(['serve'])\n"
        "child = subprocess.run([sys.executable, '-c', "
        "'print(open(\"/proc/self/status\").read())'], capture_output=True, text=True)\n"
        "print(open('/proc/self/status').read())\n"
        "print('--child--')\n"
        "print(child.stdout)\n"
    )
    done = run_python(code)
    assert "THP_enabled:" in done.stdout, (done.stdout, done.stderr)  # Linux >= 6.x reports it
    own, child = done.stdout.split("--child--")
    assert _thp_enabled(own) == "0", done.stderr
    assert _thp_enabled(child) == "0", done.stderr

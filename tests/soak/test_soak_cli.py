"""``python -m soak`` and the Makefile targets that run it (docs/SOAK.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from soak.__main__ import parser
from soak.durations import parse_duration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("500ms", 0.5), ("1.5m", 90)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10 minutes", "-5s", "1d"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_the_documented_command_parses() -> None:
    args = parser().parse_args(["run", "--duration", "10m", "--kill-every", "60s"])
    assert (args.duration, args.kill_every, args.local_store) == (600.0, 60.0, False)
    args = parser().parse_args(
        ["run", "--duration", "2m", "--local-store", "--set", "OURIOS_WAL_BARRIER_SECS=2"]
    )
    assert args.local_store and args.set == ["OURIOS_WAL_BARRIER_SECS=2"]


def _soak(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "soak", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_refuses_a_used_output_directory_and_a_bad_setting(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "run.json").write_text("{}")
    proc = _soak("run", "--duration", "1s", "--local-store", "--out", str(used), cwd=tmp_path)
    assert proc.returncode == 2 and "not empty" in proc.stderr, proc.stderr
    proc = _soak("run", "--duration", "1s", "--set", "BARRIER=1", cwd=tmp_path)
    assert proc.returncode != 0 and "OURIOS_<SECTION>_<NAME>" in proc.stderr
    assert not (tmp_path / "soak").exists(), "nothing may be started or written"


def test_make_soak_is_the_documented_command_and_not_part_of_make_test() -> None:
    def dry_run(target: str) -> str:
        proc = subprocess.run(
            ["make", "-n", "-o", ".venv/.installed", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "-m soak run --duration 10m --kill-every 60s" in dry_run("soak")
    assert "-m soak run --duration 60m --kill-every 60s" in dry_run("soak-long")
    assert "-m soak run" not in dry_run("test")
    docs = (ROOT / "docs" / "SOAK.md").read_text(encoding="utf-8")
    assert "python -m soak run --duration 10m --kill-every 60s" in docs
    assert "make soak-long" in docs

"""Tests for app.cli: serve's help and start-up line, config errors, wal subcommands."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from app.base.config import EFFECTIVE_EVENT, SETTINGS, load_settings
from app.cli import main, settings_help


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No OURIOS_* variable from the caller's environment; data under tmp_path."""
    for name in list(os.environ):
        if name.startswith("OURIOS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OURIOS_SERVER_DATA_DIR", str(tmp_path / "data"))


def effective_line(stderr: str) -> dict[str, object]:
    events = [
        json.loads(line)
        for line in stderr.splitlines()
        if line.startswith("{") and json.loads(line).get("event") == EFFECTIVE_EVENT
    ]
    assert len(events) == 1, stderr
    config = events[0]["config"]
    assert isinstance(config, dict)
    return config


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--config FILE" in out
    for row in SETTINGS:
        assert row.env_var in out
        assert f"({row.yaml_key})" in out
        assert f"default {row.default_display}; {row.allowed}" in out
    assert settings_help() in out


@pytest.fixture
def serve_to_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """``ourios serve`` runs up to building the node, which is refused (exit 1): what it
    logged first is on stderr. The root logger's handlers are restored afterwards."""
    seen: list[object] = []

    def build_node(settings: object, events: object) -> object:
        seen.append(settings)
        raise OSError("the test stops here")

    monkeypatch.setattr("app.node.server.build_node", build_node)
    # no signal relay thread or handlers: nothing is served
    monkeypatch.setattr("app.node.server._relay_signals", lambda stop, received: None)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        yield seen
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_serve_logs_the_effective_configuration_first(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    serve_to_build: list[object],
) -> None:
    monkeypatch.setenv("OURIOS_WAL_BARRIER_SECS", "30")
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert json.loads(err.splitlines()[0])["event"] == EFFECTIVE_EVENT
    config = effective_line(err)
    assert config == load_settings().effective()
    assert config["OURIOS_WAL_BARRIER_SECS"] == 30
    assert len(serve_to_build) == 1


def test_serve_reads_the_config_file_and_env_wins(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    serve_to_build: list[object],
) -> None:
    config_file = tmp_path / "ourios.yaml"
    config_file.write_text("wal:\n  barrier_secs: 30\n  housekeeping_secs: 7\n", encoding="utf-8")
    monkeypatch.setenv("OURIOS_WAL_HOUSEKEEPING_SECS", "9")
    assert main(["serve", "--config", str(config_file)]) == 1
    config = effective_line(capsys.readouterr().err)
    assert (config["OURIOS_WAL_BARRIER_SECS"], config["OURIOS_WAL_HOUSEKEEPING_SECS"]) == (30, 9)


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("OURIOS_SINK_FLUSH_BYTES", "1", "OURIOS_SINK_FLUSH_BYTES (sink.flush_bytes) = 1"),
        ("OURIOS_WAL_BARIER_SECS", "30", "unknown environment variable OURIOS_WAL_BARIER_SECS"),
        ("OURIOS_DISK_STOP_WATER_BYTES", "2GiB", "must be below OURIOS_DISK_LOW_WATER_BYTES"),
    ],
)
def test_config_error_exits_2_with_the_message(
    var: str,
    value: str,
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(var, value)
    assert main(["serve"]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert captured.err.startswith("ourios: configuration error: ")
    assert "Traceback" not in captured.err
    assert EFFECTIVE_EVENT not in captured.err
    assert captured.out == ""


def test_missing_config_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["serve", "--config", str(missing)]) == 2
    assert f"cannot read config file {missing}" in capsys.readouterr().err


def test_config_prints_effective_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == load_settings().effective()


def test_config_error_from_config_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OURIOS_SERVER_HTTP_PORT", "70000")
    assert main(["config"]) == 2
    assert "OURIOS_SERVER_HTTP_PORT (server.http_port) = 70000" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ourios ")


@pytest.mark.parametrize("argv", [[], ["wal"], ["nonsense"], ["serve", "--bogus"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: ourios" in capsys.readouterr().err


class FakeWalcli(types.ModuleType):
    """Stands in for app.cli.wal, recording what the CLI passed."""

    def __init__(self, code: int) -> None:
        super().__init__("app.cli.wal")
        self.code = code
        self.calls: list[tuple[str, Path, TextIO]] = []

    def inspect(self, directory: Path, out: TextIO) -> int:
        self.calls.append(("inspect", directory, out))
        out.write("inspected\n")
        return self.code

    def verify(self, directory: Path, out: TextIO) -> int:
        self.calls.append(("verify", directory, out))
        return self.code


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_wal_subcommands_call_walcli(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeWalcli(code=3)
    monkeypatch.setitem(sys.modules, "app.cli.wal", fake)
    assert main(["wal", command, str(tmp_path)]) == 3
    [(called, directory, out)] = fake.calls
    assert (called, directory) == (command, tmp_path)
    assert out is sys.stdout
    capsys.readouterr()


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_wal_subcommands_report_a_missing_walcli(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A None entry in sys.modules makes the import raise ImportError.
    monkeypatch.setitem(sys.modules, "app.cli.wal", None)
    assert main(["wal", command, str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert f"ourios: wal {command} is unavailable" in err
    assert "Traceback" not in err


def test_wal_subcommand_reports_a_walcli_without_the_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "app.cli.wal", types.ModuleType("app.cli.wal"))
    assert main(["wal", "verify", str(tmp_path)]) == 70
    assert "has no verify()" in capsys.readouterr().err


def test_console_script_entry_point(tmp_path: Path) -> None:
    # The real process: exit code and stderr as an operator (or the chart test) sees them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OURIOS_")}
    env.update({"OURIOS_SERVER_DATA_DIR": str(tmp_path), "OURIOS_WAL_MAX_TENANTS": "0"})
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert "OURIOS_WAL_MAX_TENANTS (wal.max_tenants) = 0" in result.stderr
    assert "Traceback" not in result.stderr

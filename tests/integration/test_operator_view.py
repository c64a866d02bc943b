"""What an operator sees of a real ``ourios serve`` (issue 24 items 6 and 7): its logs —
readable lines and a start-up summary on a terminal, JSON with RFC 3339 timestamps
elsewhere, from the core and its workers alike, and no warning from a healthy node —
and the standard ``process_*`` series of the core and of each worker on ``/metrics``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.noderig import request
from tests.support.procmem import status_kib
from tests.support.scrape import scrape, scrape_until
from tests.support.serve import ROOT, TEST_RESERVE_BYTES, ServeProcess

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
CONSOLE = re.compile(r"\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\S")
PROCESS_SERIES = (
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
)


class _Terminal:
    """A ``ourios serve`` whose stderr is a pseudo-terminal; lines are read with a
    deadline from the terminal's other end."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        primary, secondary = pty.openpty()
        self._fd = primary
        self._buffer = b""
        self.lines: list[str] = []
        full = {k: v for k, v in os.environ.items() if not k.startswith("OURIOS_")}
        full.update(
            {
                "OURIOS_SERVER_DATA_DIR": str(data_dir),
                "OURIOS_SERVER_HOST": "127.0.0.1",
                "OURIOS_SERVER_HTTP_PORT": "0",
                "OURIOS_SERVER_GRPC_PORT": "0",
                "OURIOS_DISK_RESERVE_BYTES": str(TEST_RESERVE_BYTES),
                "PYTHONPATH": str(ROOT),
                **env,
            }
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            cwd=ROOT,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=secondary,
            start_new_session=True,
        )
        os.close(secondary)

    def read_until(self, pattern: str, timeout: float = 60.0) -> str:
        """Lines until one matches ``pattern``; fails naming what was read."""
        regex = re.compile(pattern)
        for line in self.lines:
            if regex.search(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line matching {pattern!r} in {timeout} s:\n" + "\n".join(
                self.lines
            )
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # EIO: every writer closed the terminal
                chunk = b""
            assert chunk, f"stderr closed before {pattern!r}:\n" + "\n".join(self.lines)
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\n")
            for raw in complete:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                self.lines.append(line)
                if regex.search(line):
                    return line

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        os.close(self._fd)


def test_clone_6_serve_on_a_terminal_logs_readable_lines_and_a_start_up_summary(
    tmp_path: Path,
) -> None:
    """stderr a terminal, ``server.log_format`` left at auto: the core and its worker
    write console lines (no JSON object), ``server.listening`` is a short summary a
    person can act on, and the full configuration is not printed at info."""
    term = _Terminal(tmp_path / "node", {"OURIOS_SERVER_WORKERS": "1"})
    try:
        term.read_until(r"^    stop ")
        start = next(i for i, line in enumerate(term.lines) if "ourios is ready" in line)
        summary = "\n".join(term.lines[start : start + 9])
        port = re.search(r"OTLP/HTTP  http://127\.0\.0\.1:(\d+)/v1/logs", summary)
        assert port, summary
        for row in (
            "OTLP/gRPC  127.0.0.1:",
            "data dir ",
            "store      file://",
            "cadences ",
            "auth       open mode",
            "workers    1 (pid ",
            "stop       Ctrl-C or SIGTERM",
        ):
            assert row in summary, summary
        assert len(summary) < 800, summary
        # the worker's own log records (uvicorn's, from the worker process) read the same
        term.read_until(r"uvicorn\.error: Started server process")
        term.proc.send_signal(signal.SIGTERM)
        term.read_until(r"server\.stopped ")
        assert term.proc.wait(60) == 0
        events = [line for line in term.lines if line and not line.startswith("    ")]
        assert all(CONSOLE.match(line) for line in events), "\n".join(term.lines)
        assert not any("config.effective" in line for line in term.lines)
        assert any(re.search(r" INFO +worker\.ready index=0 pid=\d+", x) for x in events)
    finally:
        term.close()


def test_clone_6_a_healthy_node_logs_json_with_rfc3339_timestamps_and_no_warning(
    tmp_path: Path,
) -> None:
    """stderr a pipe: every line of the core and its worker is a JSON object with an RFC
    3339 ``ts``, the configuration first. A batch arrives, and housekeeping passes run
    every second while the tenant waits for its first cut (barrier_secs 300): the floor
    is Pinned by design and nothing warns."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tok-acme: [acme]\n")
    env = {
        "OURIOS_SERVER_WORKERS": "1",
        "OURIOS_WAL_HOUSEKEEPING_SECS": "1",
        "OURIOS_AUTH_TOKENS_FILE": str(tokens),
    }
    with ServeProcess(tmp_path / "node", env) as server:
        headers = {"Authorization": "Bearer tok-acme", "X-Ourios-Tenant": "acme"}
        status, body, _ = server.post_logs(request("healthy").SerializeToString(), headers)
        assert status == 200, (status, body)
        runs = scrape(server).value(
            "ourios_cadence_runs_total", cadence="housekeeping", outcome="ok"
        )
        after = runs or 0
        scrape_until(
            server,
            lambda s: (
                (s.value("ourios_cadence_runs_total", cadence="housekeeping", outcome="ok") or 0)
                >= after + 3
                and s.value("ourios_wal_retain_floor", state="pinned") == 1
            ),
            timeout=60,
        )
        assert server.terminate() == 0
    lines = [line for line in server.lines if line]
    parsed = [json.loads(line) for line in lines]  # every line is one object
    assert parsed[0]["event"] == "config.effective" and parsed[0]["config"]
    assert all(RFC3339.fullmatch(e["ts"]) for e in parsed), lines[:3]
    assert any(e.get("message", "").startswith("Started server process") for e in parsed)
    loud = [e for e in parsed if e["level"] not in ("debug", "info")]
    assert loud == [], loud


def test_clone_7_metrics_show_process_series_for_the_core_and_each_worker(
    tmp_path: Path,
) -> None:
    """``/metrics`` of a real serve with two workers: resident memory, CPU seconds, open
    and maximum fds and start time of the core (unlabelled) and of each worker
    (``worker``), the memory what ``/proc/<pid>/status`` says of that process."""
    with ServeProcess(tmp_path / "node", {"OURIOS_SERVER_WORKERS": "2"}) as server:
        assert server.proc is not None
        pids = {"": server.proc.pid}
        pids.update({str(e["index"]): int(e["pid"]) for e in server.event("worker.ready")})
        assert sorted(pids) == ["", "0", "1"], server.tail()
        s = scrape(server)
        for name in PROCESS_SERIES:
            found = {x.labels.get("worker", ""): x.value for x in s.samples(name)}
            assert sorted(found) == ["", "0", "1"], (name, found)
            assert all(v > 0 for v in found.values()), (name, found)
        rss = {
            x.labels.get("worker", ""): x.value for x in s.samples("process_resident_memory_bytes")
        }
        for worker, pid in pids.items():
            vm = status_kib(pid, "VmRSS")
            assert 0.5 < rss[worker] / (vm * 1024) < 2, (worker, rss, vm)

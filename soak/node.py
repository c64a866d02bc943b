"""The local node: one ``ourios serve`` process on a fixed data directory and port.

``ServeNode(data_dir, env, http_port, log_path)`` wraps ``tests.support.serve.
ServeProcess`` (the same launcher the crash tests use: JSON stderr events,
``server.listening``, then ``/readyz``) and adds what a soak needs:

- a fixed HTTP port, so the load generator's URL survives restarts;
- ``kill()`` (SIGKILL, reap) and ``start()`` on the same data directory, any number of
  times; each lifetime's stderr is appended to ``log_path`` when it ends (a
  ``{"soak": "lifetime", ...}`` line saying which process and how it ended, then its
  lines) and then dropped, so an hour of restarts holds one lifetime's lines in memory;
- the ``recovery.done`` event of every start, for the report.

``close()`` kills whatever is still running; it is safe to call twice.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.serve import ServeProcess

__all__ = ["Lifetime", "ServeNode", "free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Lifetime:
    """One process of the node: how it started and how it ended."""

    number: int
    pid: int
    started_at: float  # unix time the process was launched
    ready_s: float  # launch to /readyz 200
    recovery: Mapping[str, Any]  # the recovery.done event (empty when absent)
    ended_by: str = ""  # "sigkill", "sigterm" or "" while running
    exit_code: int | None = None


class ServeNode:
    def __init__(
        self,
        data_dir: Path,
        env: Mapping[str, str],
        *,
        http_port: int,
        log_path: Path,
        start_timeout_s: float = 90.0,
    ) -> None:
        self.data_dir = data_dir
        self.http_port = http_port
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self._env = {
            **env,
            "OURIOS_SERVER_HTTP_PORT": str(http_port),
            "OURIOS_SERVER_GRPC_PORT": "0",
        }
        self._proc: ServeProcess | None = None
        self.lifetimes: list[Lifetime] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.proc is not None and proc.proc.poll() is None

    @property
    def process(self) -> ServeProcess | None:
        """The current ``ServeProcess`` (None before the first start), to talk to the
        node directly (``post_logs``, ``event``)."""
        return self._proc

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.proc.pid if proc is not None and proc.proc is not None else None

    def start(self, timeout_s: float | None = None) -> Lifetime:
        """Launch on the data directory and wait for ``/readyz`` (within ``timeout_s``,
        default ``start_timeout_s``)."""
        if self.running:
            raise RuntimeError(f"node already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        proc = ServeProcess(self.data_dir, self._env)
        self._proc = proc
        launched = time.time()
        began = time.monotonic()
        try:
            proc.start(timeout=self.start_timeout_s if timeout_s is None else timeout_s)
        except BaseException:
            self._end("failed-start", kill=True)
            raise
        recovery = proc.event("recovery.done")
        assert proc.proc is not None
        life = Lifetime(
            number=len(self.lifetimes) + 1,
            pid=proc.proc.pid,
            started_at=launched,
            ready_s=time.monotonic() - began,
            recovery=recovery[-1] if recovery else {},
        )
        self.lifetimes.append(life)
        return life

    def kill(self) -> int:
        """SIGKILL the running process and reap it; returns its pid."""
        pid = self.pid
        if pid is None or not self.running:
            raise RuntimeError("node is not running")
        self._end("sigkill", kill=True)
        return pid

    def terminate(self, timeout_s: float = 120.0) -> int:
        """SIGTERM (drain, final cut, close) and wait; returns the exit code."""
        proc = self._proc
        if proc is None or not self.running:
            raise RuntimeError("node is not running")
        code = proc.terminate(timeout_s)
        self._end("sigterm", kill=False, code=code)
        return code

    def ready(self) -> bool:
        proc = self._proc
        return proc is not None and self.running and proc.get("/readyz")[0] == 200

    def events(self, name: str) -> list[dict[str, Any]]:
        proc = self._proc
        return proc.event(name) if proc is not None else []

    def close(self) -> None:
        if self._proc is not None:
            self._end("closed", kill=True)

    def _end(self, how: str, *, kill: bool, code: int | None = None) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            proc.kill()  # terminate() has already waited and joined the reader otherwise
        if proc.proc is not None:
            code = proc.proc.returncode if code is None else code
            if proc.proc.stderr is not None and not proc.proc.stderr.closed:
                proc.proc.stderr.close()
        if self.lifetimes and self.lifetimes[-1].pid == (proc.proc.pid if proc.proc else None):
            last = self.lifetimes[-1]
            self.lifetimes[-1] = Lifetime(
                last.number, last.pid, last.started_at, last.ready_s, last.recovery, how, code
            )
        with self.log_path.open("a", encoding="utf-8") as log:
            pid = proc.proc.pid if proc.proc else None
            header = {"soak": "lifetime", "pid": pid, "ended_by": how, "exit_code": code}
            log.write(json.dumps(header) + "\n")
            log.write("".join(line + "\n" for line in proc.lines))

"""A real ``ourios serve`` process for integration and crash tests.

``ServeProcess(data_dir, env).start()`` launches ``python -m app.cli serve`` with the
given settings (ports 0 by default), reads its stderr (one JSON object per line) until
``server.listening`` names the bound ports, then waits for ``/readyz``. ``terminate()``
sends SIGTERM and waits for a clean exit; ``kill()`` sends SIGKILL. Every event line is
kept in ``events`` for assertions.

The emergency disk reserve defaults to 1 MiB here (``OURIOS_DISK_RESERVE_BYTES``; 64 MiB
in production): every node a test starts allocates it for real, and the test runs keep
their data directories. A test about the reserve sets it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.closing import ClosedOnExit
from tests.support.poll import poll_until
from tests.support.scrape import try_scrape

ROOT = Path(__file__).resolve().parents[2]
#: the disk reserve a test node allocates unless the test sets its own (docstring)
TEST_RESERVE_BYTES = 1 << 20


class ServeExited(RuntimeError):
    """The node exited while a start-up wait was waiting on it (``returncode`` says how:
    a test whose probe SIGKILLs the node may be killed before it is ready)."""

    def __init__(self, returncode: int, waiting_for: str, tail: str) -> None:
        super().__init__(f"ourios serve exited with {returncode} {waiting_for}:\n{tail}")
        self.returncode = returncode


class ServeProcess(ClosedOnExit):
    def __init__(
        self,
        data_dir: Path,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.data_dir = data_dir
        #: after ``serve`` (``--config FILE``, a path relative to the repository root)
        self.args = list(args)
        #: the client context for the HTTP port when the node serves TLS
        self.tls = tls
        self.env = {"OURIOS_DISK_RESERVE_BYTES": str(TEST_RESERVE_BYTES), **dict(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.events: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, timeout: float = 60.0, *, recovered: bool = True) -> ServeProcess:
        """Start, wait for ``/readyz``, and — unless ``recovered=False`` — for the end of
        the start-up's replay (``recovery.done``; the node is ready before it). A start
        refused before readiness raises naming the exit status; a recovery that fails
        after it (``recovery.failed``) raises naming the event."""
        env = {
            **os.environ,
            "OURIOS_SERVER_DATA_DIR": str(self.data_dir),
            "OURIOS_SERVER_HOST": "127.0.0.1",
            "OURIOS_SERVER_HTTP_PORT": "0",
            "OURIOS_SERVER_GRPC_PORT": "0",
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        # Kubernetes-style or inherited OURIOS_* variables from the test runner must not
        # leak in: only what the test asked for.
        for key in list(env):
            if (
                key.startswith("OURIOS_")
                and key not in self.env
                and not key.startswith(("OURIOS_SERVER_",))
            ):
                del env[key]
        self._listening.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", *self.args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # its own session: ``close`` can reap whatever the node left behind (a worker
            # that outlived its core, which a test must be able to see first)
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(10)  # every line it wrote, for the message
                message = f"ourios serve exited with {self.proc.returncode}:\n{self.tail()}"
                self.close()  # the pipe too: no `with` block will (its __enter__ raised)
                raise RuntimeError(message)
            if time.monotonic() > deadline:
                message = f"ourios serve did not listen within {timeout} s:\n{self.stuck()}"
                self.close()
                raise RuntimeError(message)
        self.wait_ready(deadline - time.monotonic())
        if recovered:
            self.wait_recovered(max(timeout, 120.0))
        return self

    def wait_recovered(self, timeout: float = 120.0) -> dict[str, Any]:
        """The ``recovery.done`` event once it is logged (``RuntimeError`` on
        ``recovery.failed`` or on the process exiting; ``AssertionError`` after
        ``timeout``)."""

        def done() -> dict[str, Any]:
            with self._lock:
                for event in self.events:
                    if event.get("event") == "recovery.done":
                        return event
                    if event.get("event") == "recovery.failed":
                        raise RuntimeError(
                            f"ourios serve's recovery failed: {event.get('error')}\n{self.tail()}"
                        )
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ourios serve exited with {self.proc.returncode}:\n{self.tail()}"
                )
            return {}

        return poll_until("recovery.done", done, deadline_s=timeout, detail=self.stuck)

    def wait_event(
        self, name: str, count: int = 1, deadline_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """The node's ``name`` events once it has logged at least ``count`` of them
        (``AssertionError`` naming them and the log's tail after ``deadline_s``)."""

        def enough() -> list[dict[str, Any]]:
            got = self.event(name)
            return got if len(got) >= count else []

        return poll_until(
            f"{count} {name} event(s)", enough, deadline_s=deadline_s, detail=self.tail
        )

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            with self._lock:
                self.events.append(event)
            if event.get("event") == "server.listening":
                self.http_port = int(event["http_port"])
                self.grpc_port = int(event["grpc_port"])
                self.metrics_port = int(event.get("metrics_port", 0))
                self._listening.set()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until ``/readyz`` answers 200: ``ServeExited`` at once when the node exits
        first, and a timeout names the tail and every thread's stack in the node and its
        workers (``stuck``)."""

        def ready() -> bool:
            if self.get("/readyz")[0] == 200:
                return True
            assert self.proc is not None
            if self.proc.poll() is not None:
                self._reader_join()
                raise ServeExited(self.proc.returncode, "before /readyz answered 200", self.tail())
            return False

        poll_until("/readyz 200", ready, deadline_s=max(timeout, 1.0), detail=self.stuck)

    def _reader_join(self) -> None:
        """Every line the exited process wrote, for a message."""
        if self._reader is not None:
            self._reader.join(10)

    def stuck(self) -> str:
        """The tail, then ``py-spy dump`` of the node and each of its workers: what a
        wait that timed out was waiting on (a start that never became ready, once in
        CI, left only its tail)."""
        return f"{self.tail()}\n\n{self.stacks()}"

    def stacks(self) -> str:
        """Every thread's Python stack in the node and its child processes."""
        if self.proc is None or self.proc.poll() is not None:
            return "(no stacks: the process is not running)"
        spy = Path(sys.executable).with_name("py-spy")
        if not spy.exists():
            return f"(no stacks: {spy} is not installed)"
        pids = [self.proc.pid, *_children(self.proc.pid)]
        out = []
        for pid in pids:
            try:
                dump = subprocess.run(
                    [str(spy), "dump", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
            except subprocess.TimeoutExpired:
                out.append(f"== pid {pid}: py-spy dump timed out")
                continue
            out.append(f"== pid {pid}\n{dump.stdout}{dump.stderr}")
        return "\n".join(out)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = self._connection(10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def wait_turned(self, deadline_s: float = 120.0) -> None:
        """Wait until every acknowledged frame has been turned (the replay's backlog and
        ``ourios_ingest_backlog_frames`` at 0): a SIGTERM before that leaves them to the
        WAL and exits 75 (DESIGN.md §6), which a test about something else must not
        read as its failure. The deadline bounds a failure, it is not a pace."""
        values: dict[str, float] = {}

        def turned() -> bool:
            scraped = try_scrape(self)
            values.clear()
            for name in ("ourios_ingest_backlog_frames", "ourios_recovery_backlog_bytes"):
                value = scraped.value(name) if scraped is not None else None
                if value is not None:
                    values[name] = value
            return values.get("ourios_ingest_backlog_frames") == 0 and not values.get(
                "ourios_recovery_backlog_bytes"
            )

        poll_until("turn catching up", turned, deadline_s=deadline_s, detail=lambda: str(values))

    def post_logs(
        self, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        conn = self._connection(30)
        try:
            hdrs = {"Content-Type": "application/x-protobuf", **(headers or {})}
            conn.request("POST", "/v1/logs", body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(
                "127.0.0.1", self.http_port, timeout=timeout, context=self.tls
            )
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)

    def event(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == name]

    def tail(self, n: int = 40) -> str:
        with self._lock:
            return "\n".join(self.lines[-n:])

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"ourios serve ignored SIGTERM for {timeout} s:\n{self.tail()}"
            ) from None
        self._join_reader()
        return code

    def kill(self) -> None:
        """SIGKILL the node's own process (not its workers: they must die of it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._join_reader()

    def close(self) -> None:
        """Kill the node and anything left of its session, and release the pipe."""
        self.kill()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._join_reader()

    def start_refused(self, timeout: float = 60.0) -> dict[str, Any]:
        """Start a node that must refuse to: it exits 1 before it listens. Returns its one
        ``server.start_failed`` event, the node reaped and its session killed."""
        try:
            self.start(timeout=timeout)
        except RuntimeError as exc:
            if "exited with 1:" not in str(exc):
                raise
        else:
            raise AssertionError(f"the node started:\n{self.tail()}")
        finally:
            self.close()
        failed = self.event("server.start_failed")
        assert len(failed) == 1, self.tail()
        return failed[0]

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
            if self._reader.is_alive():
                return  # a survivor still holds the pipe: closing it would block on it
            self._reader = None
        if self.proc is not None and self.proc.stderr is not None and self.proc.poll() is not None:
            self.proc.stderr.close()

    def __enter__(self) -> ServeProcess:
        return self if self.proc is not None else self.start()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found

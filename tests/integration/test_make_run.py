"""What a newcomer meets first (issue 24, "From clone to trusted data in five minutes"):
`make run` installs the node alone, starts it with run.yaml's trial cadences, and the
README's `curl` works verbatim against it — its record then published and readable.

The node is started the way `make run` starts it: the arguments its recipe gives
`ourios serve` (read from `make -n run`), with only the data directory, the host and the
ports moved for the test (`tests/support/serve.py`); the README's `curl` text is run by
bash with the real `curl`, its port rewritten to the node's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support import require_tool
from tests.support.parquet_read import read_store
from tests.support.poll import poll_until
from tests.support.serve import ROOT, ServeProcess

README = ROOT / "README.md"
#: what the README promises (`make run`'s ports) and the curl's tenant and body
README_URL = "http://localhost:4318/v1/logs"
README_TENANT = "demo"
README_BODY = "user alice logged in from 10.0.0.1"
#: generous: run.yaml publishes within seconds, the production defaults in 300 s
PUBLISH_DEADLINE_SECS = 60.0
#: the metric docs/QUERY.md names: a records object has reached the store
PUBLISHED = re.compile(r'^ourios_sink_objects_total\{kind="records"\} [1-9]', re.M)


def make_dry_run(target: str) -> list[str]:
    """The commands `make <target>` would run from a clean slate (`-B`), unexecuted."""
    result = subprocess.run(
        [require_tool("make"), "-n", "-B", "--no-print-directory", "-C", str(ROOT), target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def make_run_args() -> list[str]:
    """What `make run` passes `ourios serve` (its recipe's serve line, after `serve`)."""
    serves = [line for line in make_dry_run("run") if re.search(r"/ourios serve\b", line)]
    assert len(serves) == 1, serves
    return shlex.split(serves[0].split("ourios serve", 1)[1])


def readme_curl() -> str:
    """The README's ```sh block that runs `curl`, as the reader copies it."""
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    curls = [b for b in blocks if b.startswith("curl ")]
    assert len(curls) == 1, "the README has one curl block under 'Send your first logs'"
    return curls[0]


def _effective(args: list[str]) -> dict[str, object]:
    """`ourios config` with `make run`'s arguments and no OURIOS_* of the runner's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OURIOS_")}
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "config", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, object] = json.loads(result.stdout)
    return config


def _wait_for_records(serve: ServeProcess, tenant: str) -> list[dict[str, object]]:
    """The tenant's published records once `ourios_sink_objects_total{kind="records"}`
    counts one (the signal docs/QUERY.md gives), while the node keeps running."""

    def published() -> bool:
        assert serve.proc is not None and serve.proc.poll() is None, serve.tail()
        return PUBLISHED.search(_metrics(serve)) is not None

    poll_until(
        "records published after the acknowledgement",
        published,
        deadline_s=PUBLISH_DEADLINE_SECS,
        detail=lambda: f"make run's settings: {make_run_args()}\n{serve.tail()}",
        every_s=0.1,
    )
    return read_store(serve.data_dir / "objects", "duckdb").records_of(tenant)


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash in ``cwd``, as a reader would paste it; its output as text."""
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _metrics(serve: ServeProcess) -> str:
    status, body = serve.get("/metrics")
    assert status == 200
    return body.decode()


def test_clone_1_the_readme_curl_is_acknowledged_then_published(tmp_path: Path) -> None:
    curl = readme_curl()
    assert curl.count(README_URL) == 1, curl
    config = _effective(make_run_args())
    # The README's ports are `make run`'s.
    assert (config["OURIOS_SERVER_HTTP_PORT"], config["OURIOS_SERVER_GRPC_PORT"]) == (4318, 4317)
    require_tool("curl")
    with ServeProcess(tmp_path / "data", args=make_run_args()) as serve:
        url = f"http://127.0.0.1:{serve.http_port}/v1/logs"
        before = time.time_ns()
        answer = _bash(curl.replace(README_URL, url), tmp_path)
        assert answer.returncode == 0, answer.stderr
        lines = answer.stdout.splitlines()
        assert lines[0].startswith("HTTP/1.1 200") and lines[-1] == "{}", answer.stdout
        records = _wait_for_records(serve, README_TENANT)
        # Without its Content-Type header the curl sends its default type: the 415's
        # message, as the node writes it, is the one the README shows.
        untyped = curl.replace("  -H 'Content-Type: application/json' \\\n", "")
        assert untyped != curl
        refused = _bash(untyped.replace(README_URL, url), tmp_path)
        lines = refused.stdout.splitlines()
        assert lines[0].startswith("HTTP/1.1 415"), refused.stdout
        assert lines[-1] in README.read_text(), lines[-1]
        assert serve.terminate() == 0, serve.tail()
    assert [r["body"] for r in records] == [README_BODY]
    (record,) = records
    assert record["resource_attributes"] == {"service.name": "checkout"}
    assert record["severity_text"] == "INFO"
    # `$(date +%s)000000000`: the second the curl ran
    assert before // 10**9 - 1 <= int(str(record["time_unix_nano"])) // 10**9 <= time.time()


def test_clone_2_make_run_publishes_within_seconds_production_waits(tmp_path: Path) -> None:
    args = make_run_args()
    assert args[:1] == ["--config"], args
    trial = _effective(args)
    production = _effective([])
    # run.yaml's cadences are the trial's own; the production defaults stay.
    assert production["OURIOS_WAL_BARRIER_SECS"] == production["OURIOS_SINK_FLUSH_AGE_SECS"] == 300
    assert isinstance(trial["OURIOS_WAL_BARRIER_SECS"], int)
    assert isinstance(trial["OURIOS_SINK_FLUSH_AGE_SECS"], int)
    assert trial["OURIOS_WAL_BARRIER_SECS"] <= 10 and trial["OURIOS_SINK_FLUSH_AGE_SECS"] <= 10
    with ServeProcess(tmp_path / "data", args=args) as serve:
        # the node says at start-up when what it acknowledges is published
        (listening,) = serve.event("server.listening")
        assert listening["publish_every_secs"] == {
            "wal.barrier_secs": trial["OURIOS_WAL_BARRIER_SECS"],
            "sink.flush_age_secs": trial["OURIOS_SINK_FLUSH_AGE_SECS"],
        }
        req = ExportLogsServiceRequest()
        record = req.resource_logs.add().scope_logs.add().log_records.add()
        record.time_unix_nano = time.time_ns()
        record.body.string_value = "first"
        body = req.SerializeToString()
        status, answer, _ = serve.post_logs(body, {"X-Ourios-Tenant": "t"})
        assert status == 200, answer
        records = _wait_for_records(serve, "t")
        assert serve.terminate() == 0, serve.tail()
    assert [r["body"] for r in records] == ["first"]


def test_clone_3_make_run_installs_the_node_alone_make_test_adds_the_toolchain() -> None:
    def installs(target: str) -> list[str]:
        return [line for line in make_dry_run(target) if re.search(r"pip install .*-e ", line)]

    (run_install,) = installs("run")
    # the node's own dependencies, no extras, pip's progress shown (no -q)
    assert re.search(r"install -e \.(\s|$)", run_install), run_install
    assert " -q" not in run_install, run_install
    test_installs = installs("test")
    assert test_installs[0] == run_install, test_installs
    assert any("[test,soak]" in line for line in test_installs[1:]), test_installs


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner's OURIOS_* must not reach `make -n` (make exports the environment)."""
    for key in [k for k in os.environ if k.startswith("OURIOS_")]:
        monkeypatch.delenv(key)

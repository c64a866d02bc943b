"""The test tooling itself works: helm, promtool, SeaweedFS S3, tmpfs ENOSPC, the
thread-leak check and the skip/fail rule for missing tools.

These are the first tests to look at when a later suite skips or errors on set-up.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.conftest import leaked_threads
from tests.support import S3Bucket, SeaweedS3, TmpfsMounts, require_tool


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)  # type: ignore[call-overload, no-any-return]


# --- require_tool --------------------------------------------------------------------


def test_require_tool_returns_absolute_path() -> None:
    path = require_tool("sh")
    assert os.path.isabs(path) and os.access(path, os.X_OK)


def test_require_tool_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-tool-xyz not found"):
        require_tool("no-such-tool-xyz")


def test_require_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-such-tool-xyz not found"):
        require_tool("no-such-tool-xyz")


# --- helm ----------------------------------------------------------------------------


def test_helm_version() -> None:
    result = run(require_tool("helm"), "version", "--short")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("v"), result.stdout


def test_helm_template_renders_a_tiny_chart(tmp_path: Path) -> None:
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    helm = require_tool("helm")
    lint = run(helm, "lint", str(chart))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = run(helm, "template", "rel", str(chart))
    assert rendered.returncode == 0, rendered.stderr
    assert "name: rel" in rendered.stdout and 'greeting: "hello"' in rendered.stdout


# --- promtool ------------------------------------------------------------------------

VALID_RULES = """\
groups:
  - name: tooling
    rules:
      - alert: TooManyErrors
        expr: rate(errors_total[5m]) > 1
        for: 5m
        labels:
          severity: page
        annotations:
          summary: errors are high
"""

BROKEN_RULES = """\
groups:
  - name: tooling
    rules:
      - alert: TooManyErrors
        expr: rate(errors_total[5m] >
"""

RULE_TEST = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: errors_total
        values: 0+120x20
    alert_rule_test:
      - eval_time: 15m
        alertname: TooManyErrors
        exp_alerts:
          - exp_labels: {severity: page}
            exp_annotations: {summary: errors are high}
"""


def test_promtool_version() -> None:
    result = run(require_tool("promtool"), "--version")
    assert result.returncode == 0, result.stderr
    assert "promtool, version" in result.stdout + result.stderr


def test_promtool_check_rules_accepts_valid_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(VALID_RULES)
    result = run(require_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rules found" in result.stdout


def test_promtool_check_rules_rejects_broken_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(BROKEN_RULES)
    result = run(require_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr


def test_promtool_test_rules_fires_the_alert(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(VALID_RULES)
    (tmp_path / "rules_test.yml").write_text(RULE_TEST)
    result = run(require_tool("promtool"), "test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- SeaweedFS S3 --------------------------------------------------------------------


def test_seaweed_put_get_list_delete(s3_bucket: S3Bucket) -> None:
    client = s3_bucket.server.client()
    client.put_object(Bucket=s3_bucket.name, Key="a/one.txt", Body=b"one")
    client.put_object(Bucket=s3_bucket.name, Key="a/two.txt", Body=b"two")
    client.put_object(Bucket=s3_bucket.name, Key="b/three.txt", Body=b"three")

    got = client.get_object(Bucket=s3_bucket.name, Key="a/two.txt")
    assert got["Body"].read() == b"two"
    assert s3_bucket.keys("a/") == ["a/one.txt", "a/two.txt"]
    assert s3_bucket.keys() == ["a/one.txt", "a/two.txt", "b/three.txt"]

    client.delete_object(Bucket=s3_bucket.name, Key="a/one.txt")
    assert s3_bucket.keys() == ["a/two.txt", "b/three.txt"]
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket=s3_bucket.name, Key="a/one.txt")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"


def test_seaweed_honours_conditional_create(s3_bucket: S3Bucket) -> None:
    """`IfNoneMatch='*'` creates once; a second create is refused with 412 and the
    first body stays (the sink relies on this for create-only object keys)."""
    client = s3_bucket.server.client()
    client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3_bucket.name, Key="k", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == b"first"


def test_seaweed_conditional_create_has_one_winner_under_contention(
    s3_bucket: S3Bucket,
) -> None:
    client = s3_bucket.server.client()
    # The first write to a new bucket grows its volumes, which makes concurrent first
    # writes wait up to ~2 s; warm up so the race is about the condition alone.
    client.put_object(Bucket=s3_bucket.name, Key="warm-up", Body=b"")

    def create(i: int) -> str:
        try:
            client.put_object(
                Bucket=s3_bucket.name, Key="race", Body=str(i).encode(), IfNoneMatch="*"
            )
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "created"

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(create, range(8)))
    assert outcomes.count("created") == 1, outcomes
    assert set(outcomes) == {"created", "PreconditionFailed"}, outcomes


def test_seaweed_refuses_wrong_credentials(seaweed_s3: SeaweedS3, s3_bucket: S3Bucket) -> None:
    import boto3
    from botocore.config import Config

    wrong = boto3.session.Session().client(
        "s3",
        endpoint_url=seaweed_s3.endpoint_url,
        aws_access_key_id=seaweed_s3.access_key,
        aws_secret_access_key="not-the-secret",
        region_name=seaweed_s3.region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    try:
        with pytest.raises(ClientError) as refused:
            wrong.list_objects_v2(Bucket=s3_bucket.name)
        assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    finally:
        wrong.close()


def test_seaweed_env_works_for_a_subprocess(s3_bucket: S3Bucket) -> None:
    """A child process configured only through `env()` (as the ingester is) can write."""
    s3_bucket.server.client().put_object(Bucket=s3_bucket.name, Key="seen", Body=b"x")
    script = textwrap.dedent(
        """
        import os, sys, boto3
        s3 = boto3.client("s3")
        bucket = os.environ["OURIOS_STORE_URL"].removeprefix("s3://")
        s3.put_object(Bucket=bucket, Key="from-child", Body=b"y")
        print(sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]))
        """
    )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "OURIOS_STORE_URL"
    }
    result = run(sys.executable, "-c", script, env={**env, **s3_bucket.env()})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['from-child', 'seen']"


def test_seaweed_fixture_reports_startup(seaweed_s3: SeaweedS3) -> None:
    assert seaweed_s3.startup_seconds is not None
    assert seaweed_s3.endpoint_url.startswith("http://127.0.0.1:")
    print(f"seaweed_s3 started in {seaweed_s3.startup_seconds:.2f} s")


# --- tmpfs ---------------------------------------------------------------------------


def test_small_tmpfs_gives_enospc_past_its_size(small_tmpfs: TmpfsMounts) -> None:
    size = 256 * 1024
    root = small_tmpfs(size)
    assert os.statvfs(root).f_blocks * os.statvfs(root).f_frsize == size

    chunk = b"\0" * 4096
    written = 0
    fd = os.open(root / "fill", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as full:
            while written <= 2 * size:
                written += os.write(fd, chunk)
    finally:
        os.close(fd)
    assert full.value.errno == errno.ENOSPC
    assert written == size


def test_tmpfs_close_detaches_a_busy_mount(tmp_path: Path) -> None:
    mounts = TmpfsMounts(tmp_path)
    root = mounts(64 * 1024)
    with open(root / "held", "wb"):  # an open file keeps the mount busy
        mounts.close()
        assert not os.path.ismount(root)


# --- thread-leak check ---------------------------------------------------------------


def test_leaked_threads_finds_a_running_thread_and_ignores_joined_ones() -> None:
    before = set(threading.enumerate())
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="tooling-leak-probe", daemon=True)
    worker.start()
    try:
        assert leaked_threads(before, join_window_s=0.0) == [worker]
    finally:
        stop.set()
        worker.join()
    assert leaked_threads(before, join_window_s=0.0) == []


def test_thread_leak_fixture_fails_the_leaking_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(
        test_leaks="""
        import threading

        import pytest

        STOP = threading.Event()
        THREADS = []


        def test_leaks_a_thread():
            t = threading.Thread(target=STOP.wait, name="leaky-worker")
            t.start()
            THREADS.append(t)


        def test_preexisting_thread_is_not_blamed():
            assert THREADS and THREADS[0].is_alive()


        @pytest.mark.thread_leak_ok("exercised on purpose")
        def test_marked_leak_is_allowed():
            t = threading.Thread(target=STOP.wait, name="allowed-worker", daemon=True)
            t.start()
            THREADS.append(t)


        def test_finished_thread_is_fine():
            t = threading.Thread(target=lambda: None, name="quick-worker")
            t.start()


        def test_zz_cleanup():
            STOP.set()
            for t in THREADS:
                t.join()
        """
    )
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-o", "thread_leak_join_seconds=0.2"
    )
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(
        ["*test left 1 thread(s) running*'leaky-worker' (non-daemon, target=Event.wait)*"]
    )

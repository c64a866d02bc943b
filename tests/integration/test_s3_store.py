"""S3Store against a real SeaweedFS S3 server: the store contract, the conditional
create (``If-None-Match: *``), percent-encoded tenant keys, Parquet read back by DuckDB,
and bounded retries against a closed port and a server that never answers.

DuckDB's httpfs extension is not installed here (installing it downloads from outside),
so published Parquet is fetched with boto3 and handed to DuckDB as a local file.
"""

from __future__ import annotations

import datetime as dt
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from sink.keys import new_object_name, parse_object_key, records_key
from sink.parquet import RecordColumns, RecordRow, encode_records
from sink.store import ObjectNotFound, RetryPolicy, S3Store, StoreError, from_url
from tests.support import S3Bucket, SeaweedS3

PREFIX = "ourios/test"
T0 = 1_714_521_600_000_000_000  # 2024-05-01T00:00:00Z


@pytest.fixture
def aws_env(seaweed_s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and region through the standard AWS environment, as in production."""
    for name, value in seaweed_s3.env().items():
        if name.startswith("AWS_") and name != "AWS_ENDPOINT_URL_S3":
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def store(s3_bucket: S3Bucket, seaweed_s3: SeaweedS3, aws_env: None) -> S3Store:
    return S3Store(s3_bucket.name, PREFIX, endpoint_url=seaweed_s3.endpoint_url)


def test_put_get_list_delete(store: S3Store, s3_bucket: S3Bucket) -> None:
    store.put("a/1", b"one")
    store.put("a/2", b"two")
    store.put("b/1", b"")
    assert store.get("a/1") == b"one" and store.get("b/1") == b""
    store.put("a/1", b"uno")  # overwrite
    assert store.get("a/1") == b"uno"
    assert store.list("") == ["a/1", "a/2", "b/1"]
    assert store.list("a/") == ["a/1", "a/2"]
    # the prefix is the store's: it is in the bucket, not in what callers see
    assert s3_bucket.keys() == [f"{PREFIX}/a/1", f"{PREFIX}/a/2", f"{PREFIX}/b/1"]
    store.delete("a/1")
    store.delete("a/1")  # deleting a missing key is not an error
    assert store.list("a/") == ["a/2"]
    with pytest.raises(ObjectNotFound) as info:
        store.get("a/1")
    assert info.value.error_type == "s3_not_found" and info.value.attempts == 1


def test_list_paginates(store: S3Store) -> None:
    keys = [f"many/{i:04d}" for i in range(1_050)]  # more than one 1,000-key page

    def put_range(lo: int, hi: int) -> None:
        for key in keys[lo:hi]:
            store.put(key, b"x")

    threads = [threading.Thread(target=put_range, args=(i, i + 150)) for i in range(0, 1_050, 150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.list("many/") == keys


def test_put_if_absent_is_a_real_conditional_create(store: S3Store) -> None:
    assert store.put_if_absent("k", b"first") is True
    assert store.put_if_absent("k", b"first") is False
    assert store.put_if_absent("k", b"second") is False
    assert store.get("k") == b"first"


def test_put_if_absent_race_has_exactly_one_winner(store: S3Store) -> None:
    n = 8
    start = threading.Barrier(n)
    results: dict[int, bool] = {}

    def create(i: int) -> None:
        start.wait()
        results[i] = store.put_if_absent("race", f"writer-{i}".encode() * 1000)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(results) == n and len(winners) == 1
    assert store.get("race") == f"writer-{winners[0]}".encode() * 1000


def test_a_percent_encoded_tenant_key_round_trips(store: S3Store, s3_bucket: S3Bucket) -> None:
    tenant = "acme=prod%100&a+b~!"
    key = records_key(tenant, dt.date(2024, 5, 1), new_object_name("ourios-0"))
    assert "tenant=acme%3Dprod%25100%26a%2Bb~%21/" in key
    assert store.put_if_absent(key, b"parquet") is True
    assert store.list("records/") == [key]
    assert store.get(key) == b"parquet"
    assert s3_bucket.keys() == [f"{PREFIX}/{key}"]  # stored verbatim, not double-decoded
    assert parse_object_key(store.list("records/")[0]).tenant == tenant


def test_parquet_published_to_s3_reads_back_in_duckdb(
    store: S3Store, s3_bucket: S3Bucket, seaweed_s3: SeaweedS3, tmp_path: Path
) -> None:
    cols = RecordColumns()
    resource = [("service.name", "checkout")]
    cols.extend(
        RecordRow(
            "acme", T0 + i, T0 + i, 9, "INFO", f"user {i} logged in",
            [("user", str(i))], resource, "auth", bytes(16) if i % 2 else b"", b"",
            7, [str(i)], 4096, i,
        )
        for i in range(100)
    )  # fmt: skip
    key = records_key("acme", dt.date(2024, 5, 1), new_object_name("ourios-0"))
    store.put(key, encode_records(cols))
    # Fetch with a client of the test's own, so the check does not trust S3Store.get.
    body = seaweed_s3.client().get_object(Bucket=s3_bucket.name, Key=f"{PREFIX}/{key}")["Body"]
    local = tmp_path / "obj.parquet"
    local.write_bytes(body.read())
    with duckdb.connect() as con:
        got = con.sql(
            f"select count(*), count(trace_id), sum(record_index), min(attributes['user']),"
            f" max(resource_attributes['service.name']) from read_parquet('{local}')"
        ).fetchall()
    assert got == [(100, 50, sum(range(100)), "0", "checkout")]


def test_from_url_builds_the_same_store(
    s3_bucket: S3Bucket, seaweed_s3: SeaweedS3, aws_env: None
) -> None:
    store = from_url(s3_bucket.url("p/q"), endpoint_url=seaweed_s3.endpoint_url)
    store.put("k", b"v")
    assert s3_bucket.keys() == ["p/q/k"]
    assert store.describe() == f"{s3_bucket.url('p/q')} at {seaweed_s3.endpoint_url}"


def test_missing_bucket_is_typed_and_not_retried(seaweed_s3: SeaweedS3, aws_env: None) -> None:
    # Reads, not a put: SeaweedFS creates a missing bucket on PUT for an Admin identity.
    store = S3Store("no-such-bucket-ourios", endpoint_url=seaweed_s3.endpoint_url)
    for op in (lambda: store.get("k"), lambda: store.list("")):
        with pytest.raises(StoreError) as info:
            op()
        assert (info.value.error_type, info.value.attempts) == ("s3_no_such_bucket", 1)


def test_wrong_credentials_are_typed_and_not_retried(
    s3_bucket: S3Bucket, seaweed_s3: SeaweedS3, aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    store = S3Store(s3_bucket.name, endpoint_url=seaweed_s3.endpoint_url)
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    assert info.value.error_type in ("s3_auth", "s3_access_denied")
    assert info.value.attempts == 1 and not info.value.ambiguous
    assert s3_bucket.keys() == []


# --- bounded retries against servers that are not there --------------------------------


@pytest.fixture
def dummy_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests are signed before they are sent, so even a dead endpoint needs keys."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ourios-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ourios-test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose kernel accepts connections that nobody ever answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        time.sleep(seconds)


def test_a_closed_port_fails_typed_after_the_attempt_budget(
    closed_port: int, dummy_credentials: None
) -> None:
    sleeps = Sleeps()
    store = S3Store(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{closed_port}",
        region="us-east-1",
        retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02),
        connect_timeout=1.0,
        sleep=sleeps,
        rng=random.Random(2),
    )
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    err = info.value
    assert (err.error_type, err.attempts, err.ambiguous) == ("s3_connection", 3, False)
    assert len(sleeps.delays) == 2 and all(d <= 0.02 for d in sleeps.delays)
    assert time.monotonic() - started < 10
    assert f"127.0.0.1:{closed_port}" in str(err)


def test_a_silent_server_times_out_ambiguously(silent_server: int, dummy_credentials: None) -> None:
    store = S3Store(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{silent_server}",
        region="us-east-1",
        retry=RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0),
        connect_timeout=1.0,
        read_timeout=0.3,
    )
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    # the request was sent and no reply came: the PUT may have been applied
    assert (info.value.error_type, info.value.attempts) == ("s3_timeout", 2)
    assert info.value.ambiguous
    with pytest.raises(StoreError) as info:
        store.get("k")
    assert info.value.error_type == "s3_timeout" and not info.value.ambiguous

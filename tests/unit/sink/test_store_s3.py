"""S3Store without a server: error classification, bounded retries with backoff, the
ambiguity flag and the conditional create, driven through botocore's Stubber and a
scripted client. The real server is exercised in tests/integration/test_s3_store.py."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import boto3.session
import pytest
from botocore import exceptions as bexc
from botocore.config import Config
from botocore.response import StreamingBody
from botocore.stub import Stubber

from sink.store import InvalidKey, ObjectNotFound, RetryPolicy, S3Store, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

ENDPOINT = "http://127.0.0.1:1"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def client() -> Iterator[S3Client]:
    c: S3Client = boto3.session.Session().client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )
    yield c
    c.close()


@pytest.fixture
def stub(client: S3Client) -> Iterator[Stubber]:
    with Stubber(client) as s:
        yield s
        s.assert_no_pending_responses()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make_store(client: Any, sleeps: Sleeps, attempts: int = 4, prefix: str = "p") -> S3Store:
    return S3Store(
        "bucket",
        prefix,
        client=cast("S3Client", client),
        retry=RetryPolicy(max_attempts=attempts, base_delay=0.1, max_delay=0.25),
        sleep=sleeps,
        rng=random.Random(1),
    )


def error(stub: Stubber, method: str, code: str, status: int) -> None:
    stub.add_client_error(method, service_error_code=code, http_status_code=status)


# --- requests and keys -----------------------------------------------------------------


def test_keys_are_put_under_the_prefix(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    store = make_store(client, sleeps, prefix="/a/b/")
    stub.add_response("put_object", {}, {"Bucket": "bucket", "Key": "a/b/k", "Body": b"v"})
    store.put("k", b"v")
    stub.add_response(
        "put_object",
        {},
        {"Bucket": "bucket", "Key": "a/b/k", "Body": b"v", "IfNoneMatch": "*"},
    )
    assert store.put_if_absent("k", b"v") is True
    stub.add_response(
        "get_object",
        {"Body": StreamingBody(io.BytesIO(b"v"), 1)},
        {"Bucket": "bucket", "Key": "a/b/k"},
    )
    assert store.get("k") == b"v"
    stub.add_response("delete_object", {}, {"Bucket": "bucket", "Key": "a/b/k"})
    store.delete("k")
    assert store.describe() == f"s3://bucket/a/b at {ENDPOINT}"


def test_list_strips_the_prefix_and_sorts(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    store = make_store(client, sleeps, prefix="p")
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "p/r/2"}, {"Key": "p/r/1"}], "IsTruncated": False},
        {"Bucket": "bucket", "Prefix": "p/r/"},
    )
    assert store.list("r/") == ["r/1", "r/2"]
    stub.add_response(
        "list_objects_v2", {"IsTruncated": False}, {"Bucket": "bucket", "Prefix": "p/"}
    )
    assert store.list("") == []


def test_invalid_keys_never_reach_the_server(client: S3Client, sleeps: Sleeps) -> None:
    store = make_store(client, sleeps)
    with Stubber(client):  # any request would fail as unexpected
        for key in ("../x", "/x", "a//b"):
            with pytest.raises(InvalidKey):
                store.put(key, b"v")


# --- classification and retries --------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "error_type"),
    [
        ("AccessDenied", 403, "s3_access_denied"),
        ("SignatureDoesNotMatch", 403, "s3_auth"),
        ("InvalidAccessKeyId", 403, "s3_auth"),
        ("NoSuchBucket", 404, "s3_no_such_bucket"),
        ("InvalidArgument", 400, "s3_client_error"),
        ("EntityTooLarge", 400, "s3_client_error"),
    ],
)
def test_client_errors_are_not_retried(
    stub: Stubber, client: S3Client, sleeps: Sleeps, code: str, status: int, error_type: str
) -> None:
    error(stub, "put_object", code, status)
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps).put("k", b"v")
    err = info.value
    assert (err.error_type, err.attempts, err.ambiguous, err.op) == (error_type, 1, False, "put")
    assert sleeps.delays == []
    assert code in str(err) and "'k'" in str(err)


@pytest.mark.parametrize(
    ("code", "status", "error_type", "ambiguous"),
    [
        ("SlowDown", 503, "s3_throttled", False),
        ("TooManyRequests", 429, "s3_throttled", False),
        ("RequestTimeout", 400, "s3_timeout", False),
        ("InternalError", 500, "s3_5xx", True),
        ("ServiceUnavailable", 503, "s3_5xx", True),
        ("BadGateway", 502, "s3_5xx", True),
        ("ConditionalRequestConflict", 409, "s3_conflict", False),
    ],
)
def test_retryable_errors_are_retried_until_the_budget_is_spent(
    stub: Stubber,
    client: S3Client,
    sleeps: Sleeps,
    code: str,
    status: int,
    error_type: str,
    ambiguous: bool,
) -> None:
    for _ in range(4):
        error(stub, "put_object", code, status)
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps, attempts=4).put("k", b"v")
    err = info.value
    assert (err.error_type, err.attempts, err.ambiguous) == (error_type, 4, ambiguous)
    # full jitter under a doubling cap: 0.1, 0.2, then capped at max_delay 0.25
    assert len(sleeps.delays) == 3
    assert all(0 <= d <= cap for d, cap in zip(sleeps.delays, (0.1, 0.2, 0.25), strict=True))


def test_a_retry_that_succeeds_returns_normally(
    stub: Stubber, client: S3Client, sleeps: Sleeps
) -> None:
    error(stub, "put_object", "SlowDown", 503)
    error(stub, "put_object", "InternalError", 500)
    stub.add_response("put_object", {})
    make_store(client, sleeps).put("k", b"v")
    assert len(sleeps.delays) == 2


def test_reads_are_never_ambiguous(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    error(stub, "get_object", "InternalError", 500)
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps, attempts=1).get("k")
    assert info.value.error_type == "s3_5xx" and not info.value.ambiguous


def test_get_of_a_missing_key(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    error(stub, "get_object", "NoSuchKey", 404)
    with pytest.raises(ObjectNotFound) as info:
        make_store(client, sleeps).get("k")
    assert info.value.error_type == "s3_not_found" and info.value.attempts == 1


def test_put_if_absent_maps_412_to_false(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    error(stub, "put_object", "PreconditionFailed", 412)
    assert make_store(client, sleeps).put_if_absent("k", b"v") is False
    assert sleeps.delays == []


def test_a_412_on_a_plain_put_is_an_error(stub: Stubber, client: S3Client, sleeps: Sleeps) -> None:
    error(stub, "put_object", "PreconditionFailed", 412)
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps).put("k", b"v")
    assert info.value.error_type == "s3_precondition"


def test_put_if_absent_retries_a_conflict_then_sees_the_winner(
    stub: Stubber, client: S3Client, sleeps: Sleeps
) -> None:
    error(stub, "put_object", "ConditionalRequestConflict", 409)
    error(stub, "put_object", "PreconditionFailed", 412)
    assert make_store(client, sleeps).put_if_absent("k", b"v") is False


# --- transport failures (a scripted client: the Stubber cannot raise these) ------------


class ScriptedClient:
    """Raises the scripted exceptions in order, then succeeds; counts the requests."""

    class meta:  # noqa: N801 - mirrors botocore's client.meta
        endpoint_url = ENDPOINT

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.requests = 0

    def _next(self) -> dict[str, Any]:
        self.requests += 1
        if self.failures:
            raise self.failures.pop(0)
        return {}

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        return self._next()

    def get_object(self, **kwargs: Any) -> dict[str, Any]:
        self._next()
        return {"Body": StreamingBody(io.BytesIO(b"v"), 1)}

    def delete_object(self, **kwargs: Any) -> dict[str, Any]:
        return self._next()


def read_timeout() -> Exception:
    return bexc.ReadTimeoutError(endpoint_url=ENDPOINT)


def connect_timeout() -> Exception:
    return bexc.ConnectTimeoutError(endpoint_url=ENDPOINT)


def refused() -> Exception:
    return bexc.EndpointConnectionError(endpoint_url=ENDPOINT)


def reset() -> Exception:
    return bexc.ConnectionClosedError(endpoint_url=ENDPOINT)


def precondition() -> Exception:
    response: Any = {
        "Error": {"Code": "PreconditionFailed", "Message": "exists"},
        "ResponseMetadata": {"HTTPStatusCode": 412},
    }
    return bexc.ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("failure", "error_type", "ambiguous"),
    [
        pytest.param(connect_timeout, "s3_timeout", False, id="connect_timeout"),
        pytest.param(refused, "s3_connection", False, id="refused"),
        pytest.param(read_timeout, "s3_timeout", True, id="read_timeout"),
        pytest.param(reset, "s3_connection", True, id="reset_after_send"),
    ],
)
def test_transport_failures_are_retried_and_flag_ambiguity(
    sleeps: Sleeps, failure: Any, error_type: str, ambiguous: bool
) -> None:
    client = ScriptedClient(*(failure() for _ in range(3)))
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps, attempts=3).put("k", b"v")
    err = info.value
    assert (err.error_type, err.ambiguous, err.attempts) == (error_type, ambiguous, 3)
    assert client.requests == 3 and len(sleeps.delays) == 2


def test_ambiguity_is_sticky_across_attempts(sleeps: Sleeps) -> None:
    client = ScriptedClient(read_timeout(), refused(), refused())
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps, attempts=3).put("k", b"v")
    # the last attempt was refused, but the first may have stored the object
    assert info.value.error_type == "s3_connection" and info.value.ambiguous


def test_a_lost_reply_then_412_reports_the_key_as_present(sleeps: Sleeps) -> None:
    client = ScriptedClient(read_timeout(), precondition())
    assert make_store(client, sleeps).put_if_absent("k", b"v") is False
    assert client.requests == 2


def test_a_timed_out_read_is_retried_and_not_ambiguous(sleeps: Sleeps) -> None:
    client = ScriptedClient(read_timeout())
    assert make_store(client, sleeps).get("k") == b"v"
    client = ScriptedClient(*(read_timeout() for _ in range(2)))
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps, attempts=2).get("k")
    assert not info.value.ambiguous


def test_credentials_missing_is_not_retried(sleeps: Sleeps) -> None:
    client = ScriptedClient(bexc.NoCredentialsError())
    with pytest.raises(StoreError) as info:
        make_store(client, sleeps).put("k", b"v")
    assert (info.value.error_type, info.value.attempts) == ("s3_credentials", 1)


def test_non_botocore_exceptions_propagate(sleeps: Sleeps) -> None:
    client = ScriptedClient(RuntimeError("bug"))
    with pytest.raises(RuntimeError, match="bug"):
        make_store(client, sleeps).put("k", b"v")


# --- the retry policy ------------------------------------------------------------------


def test_retry_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=2.0, max_delay=1.0)


def test_retry_policy_delays_are_full_jitter_under_a_doubling_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.5, max_delay=3.0)
    rng = random.Random(3)
    for retry, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        delays = [policy.delay(retry, rng) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays) and max(delays) > cap * 0.8

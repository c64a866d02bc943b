"""Object keys: tenant percent-encoding, the date partition, names and the key layout."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from sink.keys import (
    NANOS_PER_DAY,
    KeyFormatError,
    ParsedKey,
    archive_key,
    audit_key,
    check_key,
    check_tenant,
    decode_tenant,
    encode_tenant,
    new_object_name,
    node_identity,
    normalize_prefix,
    parse_object_key,
    partition_date,
    records_key,
)
from tests.support.tenants import INVALID_TENANTS
from wal import ObjectKind

# Every valid tenant byte: ASCII graphic (0x21..0x7E) except ':', '#', '/'.
TENANT_ALPHABET = "".join(chr(b) for b in range(0x21, 0x7F) if chr(b) not in ":#/")
tenants = st.text(alphabet=TENANT_ALPHABET, min_size=1, max_size=128)
CANONICAL = re.compile(r"(?:[A-Za-z0-9._~-]|%[0-9A-F]{2})+")
MAY_1_2024_NS = 1_714_521_600 * 1_000_000_000
UUID_TAIL = re.compile(r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


# --- tenant encoding -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "encoded"),
    [
        ("default", "default"),
        ("Tenant-01", "Tenant-01"),
        ("a.b_c~d", "a.b_c~d"),
        ("acme=prod", "acme%3Dprod"),
        ("100%", "100%25"),
        ("a+b", "a%2Bb"),
        (
            "!$&'()*,;<>?@[\\]^`{|}\"",
            "%21%24%26%27%28%29%2A%2C%3B%3C%3E%3F%40%5B%5C%5D%5E%60%7B%7C%7D%22",
        ),
        ("..", ".."),
    ],
)
def test_encode_tenant_keeps_unreserved_and_escapes_the_rest(tenant: str, encoded: str) -> None:
    assert encode_tenant(tenant) == encoded
    assert decode_tenant(encoded) == tenant


@seed(20240501)
@settings(max_examples=500, database=None)
@given(tenants)
def test_tenant_encoding_round_trips_and_is_canonical(tenant: str) -> None:
    encoded = encode_tenant(tenant)
    assert CANONICAL.fullmatch(encoded)
    assert "/" not in encoded and "=" not in encoded
    assert decode_tenant(encoded) == tenant


@seed(20240502)
@settings(max_examples=200, database=None)
@given(tenants, tenants)
def test_distinct_tenants_have_distinct_segments(a: str, b: str) -> None:
    assert (encode_tenant(a) == encode_tenant(b)) == (a == b)


@pytest.mark.parametrize("tenant", INVALID_TENANTS)
def test_invalid_tenants_are_refused(tenant: str) -> None:
    with pytest.raises(KeyFormatError):
        check_tenant(tenant)
    with pytest.raises(KeyFormatError):
        encode_tenant(tenant)


def test_key_format_error_is_a_value_error() -> None:
    assert issubclass(KeyFormatError, ValueError)


@pytest.mark.parametrize(
    "segment",
    [
        pytest.param("", id="empty"),
        pytest.param("acme%3dprod", id="lowercase_hex"),
        pytest.param("%41cme", id="escaped_unreserved"),
        pytest.param("a%G1", id="bad_hex"),
        pytest.param("a%4", id="short_escape"),
        pytest.param("a/b", id="slash"),
        pytest.param("a=b", id="raw_equals"),
        pytest.param("%3A", id="decodes_to_colon"),
        pytest.param("%2F", id="decodes_to_slash"),
        pytest.param("%FF", id="decodes_to_non_ascii"),
        pytest.param("x" * 129, id="too_long"),
    ],
)
def test_decode_tenant_refuses_non_canonical_or_invalid(segment: str) -> None:
    with pytest.raises(KeyFormatError):
        decode_tenant(segment)


# --- date partition --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ns", "day"),
    [
        (0, dt.date(1970, 1, 1)),
        (NANOS_PER_DAY - 1, dt.date(1970, 1, 1)),
        (NANOS_PER_DAY, dt.date(1970, 1, 2)),
        (MAY_1_2024_NS, dt.date(2024, 5, 1)),
        (MAY_1_2024_NS - 1, dt.date(2024, 4, 30)),
        (2**64 - 1, dt.date(2554, 7, 21)),
    ],
)
def test_partition_date_is_the_utc_day(ns: int, day: dt.date) -> None:
    assert partition_date(ns) == day


def test_partition_date_refuses_negative() -> None:
    with pytest.raises(KeyFormatError):
        partition_date(-1)


# --- names and node identity -----------------------------------------------------------


def test_new_object_name_is_node_then_uuid7() -> None:
    names = [new_object_name("ourios-0") for _ in range(100)]
    assert len(set(names)) == 100
    for name in names:
        match = UUID_TAIL.search(name)
        assert match and name[: match.start()] == "ourios-0"
        assert uuid.UUID(match.group(1)).version == 7
    # UUIDv7 leads with the time, so names from one node sort in creation order.
    assert names == sorted(names)


def test_new_object_name_refuses_an_unsanitized_node() -> None:
    with pytest.raises(KeyFormatError):
        new_object_name("Ourios_0")


@pytest.mark.parametrize("raw", ["ourios-0", "ourios-12", "a", "node-1-2-3"])
def test_node_identity_keeps_pod_names(raw: str) -> None:
    assert node_identity(raw) == raw


@pytest.mark.parametrize(
    "raw", ["Ourios-0", "ourios_0", "ourios.0", "-x-", "", "pod/evil", "é", "x" * 80]
)
def test_node_identity_sanitizes_to_a_dns_label(raw: str) -> None:
    node = node_identity(raw)
    assert re.fullmatch(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", node), node
    assert node != raw


def test_node_identity_keeps_distinct_raw_identities_distinct() -> None:
    raws = ["ourios_0", "ourios.0", "Ourios-0", "ourios-0"]
    assert len({node_identity(r) for r in raws}) == len(raws)


# --- key layout ------------------------------------------------------------------------


def test_records_and_audit_keys_follow_the_layout() -> None:
    day = dt.date(2024, 5, 1)
    name = "ourios-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192a3"
    assert records_key("acme=prod", day, name) == (
        f"records/tenant=acme%3Dprod/date=2024-05-01/{name}.parquet"
    )
    assert audit_key("default", day, name, prefix="/team/logs/") == (
        f"team/logs/audit/tenant=default/date=2024-05-01/{name}.parquet"
    )


@seed(20240503)
@settings(max_examples=200, database=None)
@given(
    tenants,
    st.dates(min_value=dt.date(1970, 1, 1), max_value=dt.date(2554, 7, 21)),
    st.sampled_from(list(ObjectKind)),
    st.sampled_from(["", "p", "a/b"]),
)
def test_object_keys_parse_back(tenant: str, day: dt.date, kind: ObjectKind, prefix: str) -> None:
    name = new_object_name("ourios-1")
    key = (records_key if kind is ObjectKind.RECORDS else audit_key)(
        tenant, day, name, prefix=prefix
    )
    check_key(key)
    assert parse_object_key(key, prefix=prefix) == ParsedKey(kind, tenant, day, name)


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("records/tenant=a/date=2024-05-01", id="three_segments"),
        pytest.param("logs/tenant=a/date=2024-05-01/x.parquet", id="unknown_kind"),
        pytest.param("records/t=a/date=2024-05-01/x.parquet", id="no_tenant"),
        pytest.param("records/tenant=a/date=20240501/x.parquet", id="non_canonical_date"),
        pytest.param("records/tenant=a/date=2024-13-01/x.parquet", id="bad_date"),
        pytest.param("records/tenant=a/date=2024-05-01/x.csv", id="suffix"),
        pytest.param("records/tenant=%3a/date=2024-05-01/x.parquet", id="bad_tenant"),
    ],
)
def test_parse_object_key_refuses_other_shapes(key: str) -> None:
    with pytest.raises(KeyFormatError):
        parse_object_key(key)


def test_parse_object_key_checks_the_prefix() -> None:
    key = records_key("a", dt.date(2024, 5, 1), "n", prefix="p")
    with pytest.raises(KeyFormatError):
        parse_object_key(key, prefix="q")


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "a%b"])
def test_object_key_refuses_unsafe_names(name: str) -> None:
    with pytest.raises(KeyFormatError):
        records_key("a", dt.date(2024, 5, 1), name)


def test_archive_key() -> None:
    assert archive_key("ourios-0", "00000000000000004096.wal") == (
        "wal-archive/ourios-0/00000000000000004096.wal"
    )
    assert archive_key("ourios-0", "1.wal", prefix="p/") == "p/wal-archive/ourios-0/1.wal"
    with pytest.raises(KeyFormatError):
        archive_key("ourios-0", "../1.wal")
    with pytest.raises(KeyFormatError):
        archive_key("Ourios 0", "1.wal")


# --- key and prefix validation ---------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("/abs/key", id="absolute"),
        pytest.param("a/../b", id="dotdot"),
        pytest.param("..", id="only_dotdot"),
        pytest.param("a/./b", id="dot"),
        pytest.param("a//b", id="empty_segment"),
        pytest.param("a/", id="trailing_slash"),
        pytest.param(".tmp", id="dot_prefixed"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
    ],
)
def test_check_key_refuses(key: str) -> None:
    with pytest.raises(KeyFormatError):
        check_key(key)


def test_normalize_prefix() -> None:
    assert normalize_prefix("") == ""
    assert normalize_prefix("/a/b/") == "a/b"
    with pytest.raises(KeyFormatError):
        normalize_prefix("a/../b")

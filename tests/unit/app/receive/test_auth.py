"""Tests for app/receive/auth.py: open mode, bearer tokens, tenant resolution and permission."""

from __future__ import annotations

import pytest

from app.base.rejections import BadRequest, PermissionDenied
from app.receive.auth import BEARER_CHALLENGE, Authenticator, BearerRejected

TOKENS = {
    "tok-single": frozenset({"acme"}),
    "tok-multi": frozenset({"acme", "globex"}),
    "tok-other": frozenset({"initech"}),
}


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(TOKENS)


# ── open mode ───────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("tokens", [None, {}], ids=["none", "empty"])
def test_open_mode_missing_tenant_is_default(tokens: dict[str, frozenset[str]] | None) -> None:
    auth = Authenticator(tokens)
    assert auth.open_mode
    assert auth.authorize(None, None) == "default"


def test_open_mode_takes_the_header_and_ignores_authorization() -> None:
    auth = Authenticator(None)
    assert auth.authorize("Bearer whatever", "team-a") == "team-a"
    assert auth.authorize("garbage", b"team-b") == "team-b"


@pytest.mark.parametrize("header", ["", "a b", "x:y", "a#b", "a/b", "é", "x" * 129], ids=repr)
def test_open_mode_invalid_tenant_is_400(header: str) -> None:
    with pytest.raises(BadRequest):
        Authenticator(None).authorize(None, header)


# ── token mode: 401 ─────────────────────────────────────────────────────────────────


def test_token_mode_is_not_open(auth: Authenticator) -> None:
    assert not auth.open_mode


def test_missing_authorization_is_401_with_bare_challenge(auth: Authenticator) -> None:
    with pytest.raises(BearerRejected) as info:
        auth.authorize(None, "acme")
    assert info.value.http_status == 401
    assert info.value.challenge == BEARER_CHALLENGE
    assert "Authorization" in info.value.message


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("", id="empty"),
        pytest.param("tok-single", id="no_scheme"),
        pytest.param("Basic tok-single", id="basic_scheme"),
        pytest.param("Bearer", id="scheme_only"),
        pytest.param("Bearer tok-single extra", id="two_tokens"),
        pytest.param("Bearer tok-single, Bearer tok-multi", id="header_repeated"),
    ],
)
def test_malformed_authorization_is_401_and_never_quotes_it(
    auth: Authenticator, header: str
) -> None:
    with pytest.raises(BearerRejected) as info:
        auth.authorize(header, "acme")
    assert info.value.challenge == f'{BEARER_CHALLENGE}, error="invalid_request"'
    assert "tok-" not in info.value.message


@pytest.mark.parametrize(
    "token", ["tok-singl", "tok-single-", "TOK-SINGLE", "nope", "tok-single\x00", "tök"]
)
def test_unknown_token_is_401_invalid_token(auth: Authenticator, token: str) -> None:
    with pytest.raises(BearerRejected) as info:
        auth.authorize(f"Bearer {token}", "acme")
    assert info.value.challenge == f'{BEARER_CHALLENGE}, error="invalid_token"'
    assert token not in info.value.message


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_scheme_is_case_insensitive(auth: Authenticator, scheme: str) -> None:
    assert auth.authorize(f"{scheme} tok-single", None) == "acme"


def test_auth_is_checked_before_the_tenant(auth: Authenticator) -> None:
    # An invalid tenant from a client without a token is still 401: it learns nothing.
    with pytest.raises(BearerRejected):
        auth.authorize(None, "bad tenant")
    with pytest.raises(BearerRejected):
        auth.authorize("Bearer nope", "initech")


# ── token mode: tenants ─────────────────────────────────────────────────────────────


def test_single_tenant_token_defaults_to_its_tenant(auth: Authenticator) -> None:
    assert auth.authorize("Bearer tok-single", None) == "acme"
    assert auth.authorize("Bearer tok-single", "acme") == "acme"


def test_multi_tenant_token_requires_the_header(auth: Authenticator) -> None:
    with pytest.raises(BadRequest, match="X-Ourios-Tenant"):
        auth.authorize("Bearer tok-multi", None)
    assert auth.authorize("Bearer tok-multi", "globex") == "globex"
    assert auth.authorize("Bearer tok-multi", b"acme") == "acme"


@pytest.mark.parametrize(
    ("token", "tenant"),
    [("tok-single", "globex"), ("tok-multi", "initech"), ("tok-other", "acme")],
)
def test_another_tenant_is_403_naming_the_tenant_not_the_token(
    auth: Authenticator, token: str, tenant: str
) -> None:
    with pytest.raises(PermissionDenied) as info:
        auth.authorize(f"Bearer {token}", tenant)
    assert info.value.http_status == 403
    assert repr(tenant) in info.value.message
    assert token not in info.value.message


def test_invalid_tenant_with_a_valid_token_is_400(auth: Authenticator) -> None:
    with pytest.raises(BadRequest):
        auth.authorize("Bearer tok-multi", "acme, globex")  # the header given twice
    with pytest.raises(BadRequest):
        auth.authorize("Bearer tok-single", "")


def test_tenant_default_is_not_implied_by_a_token(auth: Authenticator) -> None:
    # "default" is an open-mode convenience only; a token never writes it unless listed.
    with pytest.raises(PermissionDenied):
        auth.authorize("Bearer tok-single", "default")


def test_tokens_mapping_is_copied() -> None:
    tokens = {"t": frozenset({"a"})}
    auth = Authenticator(tokens)
    tokens["t"] = frozenset({"b"})
    tokens["u"] = frozenset({"b"})
    assert auth.authorize("Bearer t", None) == "a"
    with pytest.raises(BearerRejected):
        auth.authorize("Bearer u", None)

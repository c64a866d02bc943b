"""Bearer tokens and tenants: which tenant a request writes, and whether it may.

Two modes (DESIGN.md §3):

- **Open mode** (no tokens configured): any request may write any valid tenant; the
  `Authorization` header is ignored and a missing `X-Ourios-Tenant` means `default`.
- **Token mode** (`OURIOS_AUTH_TOKENS_FILE`: token → tenants): every request needs
  `Authorization: Bearer <token>` (scheme case-insensitive, exactly one token) naming a
  configured token, and may write only that token's tenants. The tenant header may be
  left out only when the token maps to exactly one tenant, which is then the tenant;
  a token with several tenants must say which (400, as a missing header).

Invariant: a token never writes another tenant's data. The tenant is validated
(`app.receive.otlp.parse_tenant`) before it is compared with the token's set, so the set
membership test sees only well-formed names.

Order of checks: the token first, then the tenant. A request without a valid token
learns nothing about tenants (401 whatever its tenant header says), and no message
ever quotes a token: 401 messages say which rule failed, 403 names the tenant.

Timing: tokens are looked up by their SHA-256 digest and the final match is
`hmac.compare_digest`, so the time taken does not depend on how much of a presented
token matches a configured one.

A header given more than once reaches this module combined as RFC 9110 §5.3 combines
field lines (``", "``-joined), which no rule here accepts: two bearer tokens are a
malformed `Authorization` (401) and two tenants contain a space (400).

Errors::

    Unauthenticated (app.receive.otlp)   401  UNAUTHENTICATED
    └── BearerRejected                 .challenge: the WWW-Authenticate value
    PermissionDenied (app.receive.otlp)  403  PERMISSION_DENIED
    BadRequest (app.receive.otlp)        400  INVALID_ARGUMENT   tenant missing or invalid
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

from app.base.rejections import PermissionDenied, Unauthenticated
from app.receive.otlp import parse_tenant

__all__ = ["BEARER_CHALLENGE", "Authenticator", "BearerRejected"]

#: The `WWW-Authenticate` value of a 401 without a token (RFC 6750 §3).
BEARER_CHALLENGE: Final = 'Bearer realm="ourios"'

_USAGE: Final = "expected 'Authorization: Bearer <token>'"


class BearerRejected(Unauthenticated):
    """401 in token mode; `challenge` is the `WWW-Authenticate` header value: the bare
    challenge when no token was sent, with RFC 6750's `error` when one was."""

    def __init__(self, message: str, error: str | None = None) -> None:
        super().__init__(message)
        self.challenge = (
            BEARER_CHALLENGE if error is None else f'{BEARER_CHALLENGE}, error="{error}"'
        )


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class Authenticator:
    """Resolves the tenant of a request and enforces the token's tenant list.

    `tokens` is the parsed tokens file (token → tenants); None or empty is open mode.
    Immutable after construction, so one instance serves every receiver thread.
    """

    __slots__ = ("_by_digest",)

    def __init__(self, tokens: Mapping[str, frozenset[str]] | None) -> None:
        # digest → (token bytes, tenants). Keyed by digest so a lookup's timing says
        # nothing about the token's bytes; the stored token is the final comparison.
        self._by_digest: dict[bytes, tuple[bytes, frozenset[str]]] = {}
        for token, tenants in (tokens or {}).items():
            raw = token.encode("utf-8")
            self._by_digest[_digest(raw)] = (raw, frozenset(tenants))

    @property
    def open_mode(self) -> bool:
        """True when no tokens are configured (DESIGN.md §3: warn at start-up)."""
        return not self._by_digest

    def authorize(self, authorization: str | None, tenant_header: str | bytes | None) -> str:
        """The tenant this request writes.

        `authorization` is the `Authorization` header (gRPC: `authorization`
        metadata), `tenant_header` the `X-Ourios-Tenant` header (`x-ourios-tenant`);
        None when absent. Raises `BearerRejected` (401), `PermissionDenied` (403) or
        `BadRequest` (400, tenant missing or invalid).
        """
        if not self._by_digest:
            return parse_tenant(tenant_header, open_mode=True)
        tenants = self._token_tenants(authorization)
        if tenant_header is None and len(tenants) == 1:
            # A single-tenant token names its tenant; requiring the header as well
            # would only give clients a way to get it wrong.
            (only,) = tenants
            return only
        tenant = parse_tenant(tenant_header, open_mode=False)
        if tenant not in tenants:
            raise PermissionDenied(f"this token may not write tenant {tenant!r}")
        return tenant

    def _token_tenants(self, authorization: str | None) -> frozenset[str]:
        if authorization is None:
            raise BearerRejected(f"missing Authorization header; {_USAGE}")
        parts = authorization.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            # Never quote the value: it may be a token sent with the wrong scheme.
            raise BearerRejected(f"malformed Authorization header; {_USAGE}", "invalid_request")
        presented = parts[1].encode("utf-8", errors="surrogateescape")
        entry = self._by_digest.get(_digest(presented))
        if entry is None or not hmac.compare_digest(entry[0], presented):
            raise BearerRejected("the bearer token is not valid", "invalid_token")
        return entry[1]

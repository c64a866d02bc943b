"""A request refused with a status the client is told: the ``IngestRejection`` family.

The receivers raise them and answer with them (`app.receive.otlp.status_body`); the
core's admission and pipeline raise them too, so they are the ground floor's vocabulary,
not the receiver's.

Errors and codes (DESIGN.md §7)::

    IngestRejection              http  grpc                 error_type
    ├── BadRequest                400  INVALID_ARGUMENT     bad_request
    ├── RequestLimitExceeded      400  INVALID_ARGUMENT     the limit (max_…)
    ├── UnsupportedMediaType      415  INVALID_ARGUMENT     unsupported_media_type
    ├── PayloadTooLarge           413  RESOURCE_EXHAUSTED   payload_too_large
    ├── Unauthenticated           401  UNAUTHENTICATED      unauthenticated
    ├── PermissionDenied          403  PERMISSION_DENIED    permission_denied
    └── Unavailable               503  UNAVAILABLE          unavailable (retry_after: hint)

(`app.receive.inflight` adds `Overloaded`, 503 / RESOURCE_EXHAUSTED with a Retry-After,
and `BodyTimeout`, 408.)

415 maps to INVALID_ARGUMENT: the client chose a content type or coding this server does
not accept, which is a property of the request, and OTLP clients treat both 415 and
INVALID_ARGUMENT as permanent. UNIMPLEMENTED would tell a gRPC client the method does
not exist (HTTP 501 in google.rpc.Code's mapping); on the gRPC transport grpcio itself
answers an unsupported `grpc-encoding`, so this class is only ever raised for HTTP.
PayloadTooLarge carries no RetryInfo: without one OTLP clients do not retry
RESOURCE_EXHAUSTED, and resending the same batch would fail the same way.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

__all__ = [
    "BadRequest",
    "IngestRejection",
    "PayloadTooLarge",
    "PermissionDenied",
    "RequestLimitExceeded",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedMediaType",
]


class IngestRejection(Exception):
    """A request refused with a status the client is told.

    Subclasses set the class attributes; `message` is what the client reads, and
    `retry_after` (seconds) becomes a `Retry-After` header and a RetryInfo detail.
    """

    http_status: ClassVar[int] = 500
    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    #: the class of refusal on the counters' ``error_type`` label; a refusal raised for
    #: a lower layer's error carries that error's own type
    error_type: str = "internal"

    def __init__(
        self, message: str, *, retry_after: int | None = None, error_type: str | None = None
    ) -> None:
        if retry_after is not None and retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        #: the records of the refused request when it was decoded (the refused-records
        #: counter), else 0
        self.records = 0
        if error_type is not None:
            self.error_type = error_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, retry_after={self.retry_after!r})"


class BadRequest(IngestRejection):
    """The request cannot be decoded or is invalid; resending it fails the same way."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    error_type = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnsupportedMediaType(IngestRejection):
    """A content type or content coding this server does not decode."""

    http_status = 415
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    error_type = "unsupported_media_type"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class PayloadTooLarge(IngestRejection):
    """The decompressed request exceeds `limit` bytes (a WAL frame's payload bound)."""

    http_status = 413
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    error_type = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds the limit of {limit} bytes (decompressed)")
        self.limit = limit


class Unauthenticated(IngestRejection):
    """No bearer token, or one that is not configured."""

    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    error_type = "unauthenticated"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class PermissionDenied(IngestRejection):
    """The token may not write the requested tenant."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    error_type = "permission_denied"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class Unavailable(IngestRejection):
    """A transient refusal; `retry_after` is given only where DESIGN.md §7 has a hint."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    error_type = "unavailable"


class RequestLimitExceeded(IngestRejection):
    """The request would expand past one of `RequestLimits` (DESIGN.md §7): refused
    before the expansion costs memory, naming the setting. Resending it fails the same
    way. ``error_type`` is the limit's name (``max_attributes_per_request``, …), so the
    refusal counters say which limit refused."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, limit: str, bound: int, value: int, what: str) -> None:
        super().__init__(f"{what} is {value}, over server.{limit}={bound}", error_type=limit)
        self.limit = limit
        self.bound = bound

"""``app.base.rejections``: each refusal carries its HTTP status, gRPC code and error
type (DESIGN.md §7)."""

from __future__ import annotations

import grpc
import pytest

from app.base.rejections import (
    BadRequest,
    IngestRejection,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
)


@pytest.mark.parametrize(
    ("rejection", "http_status", "code", "error_type"),
    [
        (BadRequest("bad"), 400, grpc.StatusCode.INVALID_ARGUMENT, "bad_request"),
        (
            UnsupportedMediaType("type"),
            415,
            grpc.StatusCode.INVALID_ARGUMENT,
            "unsupported_media_type",
        ),
        (PayloadTooLarge(8), 413, grpc.StatusCode.RESOURCE_EXHAUSTED, "payload_too_large"),
        (Unauthenticated("who"), 401, grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"),
        (PermissionDenied("no"), 403, grpc.StatusCode.PERMISSION_DENIED, "permission_denied"),
        (Unavailable("later"), 503, grpc.StatusCode.UNAVAILABLE, "unavailable"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, IngestRejection) else None,
)
def test_rejection_classes_carry_their_codes(
    rejection: IngestRejection, http_status: int, code: grpc.StatusCode, error_type: str
) -> None:
    assert isinstance(rejection, IngestRejection)
    assert (rejection.http_status, rejection.grpc_code, rejection.error_type) == (
        http_status,
        code,
        error_type,
    )
    assert rejection.retry_after is None


def test_negative_retry_after_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        Unavailable("x", retry_after=-1)

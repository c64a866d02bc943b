"""``app.ingest.mining.errors``: one family a caller can catch whole, each error naming
what refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.ingest.mining.errors import (
    MinerError,
    MinerFailedError,
    SnapshotDecodeError,
    TemplateIdError,
    TemplateIdExhaustedError,
    TemplateIdStateError,
)


def test_snapshot_decode_error_says_why() -> None:
    exc = SnapshotDecodeError("unknown version 9")
    assert str(exc) == "miner snapshot refused: unknown version 9"
    assert exc.reason == "unknown version 9"


@pytest.mark.parametrize("cls", [TemplateIdError, TemplateIdStateError, TemplateIdExhaustedError])
def test_template_id_errors_name_the_allocator_file(cls: type[TemplateIdError]) -> None:
    exc = cls(Path("/data/template_ids"), "recorded node ordinal 1")
    assert str(exc) == "template id allocator /data/template_ids: recorded node ordinal 1"
    assert exc.path == Path("/data/template_ids") and exc.reason == "recorded node ordinal 1"


def test_every_error_is_a_miner_error() -> None:
    for exc in (
        SnapshotDecodeError("r"),
        MinerFailedError("boom"),
        TemplateIdStateError(Path("f"), "r"),
        TemplateIdExhaustedError(Path("f"), "r"),
    ):
        with pytest.raises(MinerError):
            raise exc
    assert issubclass(TemplateIdStateError, TemplateIdError)
    assert issubclass(TemplateIdExhaustedError, TemplateIdError)
    assert not issubclass(SnapshotDecodeError, TemplateIdError)

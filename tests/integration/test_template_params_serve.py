"""A record's parameters fill the template version it is published with (issue 24 item
4): a real ``ourios serve`` mines two records of one new template in two requests (two
frames: the first mined while the template was its own text), and the published rows
read back by DuckDB and pyarrow name the version whose text their parameters fill —
with the embedded store and with SeaweedFS, and after a SIGKILL, from the replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.noderig import bodies_request
from tests.support.parquet_read import Published, download_prefix, read_store
from tests.support.seaweed import S3Bucket
from tests.support.serve import ServeProcess

TENANT = "acme"
BODIES = ("user alice logged in from 10.0.0.1", "user bob logged in from 10.0.0.2")


def _request(i: int, body: str) -> bytes:
    req = bodies_request(None, [body], times=[1_714_521_600_000_000_000 + i])
    data: bytes = req.SerializeToString()
    return data


def _publish(data_dir: Path, env: dict[str, str], *, kill: bool = False) -> None:
    """Each body in a request of its own; then a clean stop publishes everything, or a
    SIGKILL before anything is published and the restarted node's replay publishes it."""
    with ServeProcess(data_dir, env) as serve:
        for i, body in enumerate(BODIES):
            status, answer, _ = serve.post_logs(_request(i, body), {"X-Ourios-Tenant": TENANT})
            assert status == 200, (status, answer)
        serve.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        if kill:
            serve.kill()
        else:
            assert serve.terminate() == 0, serve.tail()
    if kill:
        assert not (data_dir / "objects" / "records").exists()  # nothing was published
        with ServeProcess(data_dir, env) as serve:
            assert serve.terminate() == 0, serve.tail()


def _fill(text: str, params: list[str]) -> str:
    values = iter(params)
    rebuilt = " ".join(next(values) if token == "<*>" else token for token in text.split(" "))
    assert next(values, None) is None, (text, params)
    return rebuilt


def _check(published: Published) -> None:
    records = published.records_of(TENANT)
    audit = published.audit_of(TENANT)
    assert sorted(r["body"] for r in records) == sorted(BODIES)
    texts = {(a["template_id"], a["template_version"]): a["template"] for a in audit}
    (template_id,) = {r["template_id"] for r in records}
    last = max(v for tid, v in texts if tid == template_id)
    assert texts[(template_id, last)] == "user <*> logged in from <*>"
    for row in records:
        assert row["template_version"] == last, row  # the published version's parameters
        assert row["template_params"], row  # the first record is no longer empty
        assert (
            _fill(texts[(template_id, row["template_version"])], row["template_params"])
            == (row["body"])
        )


def test_issue24_4_both_records_fill_the_published_version_embedded(tmp_path: Path) -> None:
    _publish(tmp_path / "data", {})
    for reader in ("duckdb", "pyarrow"):
        _check(read_store(tmp_path / "data" / "objects", reader))


def test_issue24_4_a_replay_after_sigkill_publishes_the_same_rows_embedded(
    tmp_path: Path,
) -> None:
    _publish(tmp_path / "data", {}, kill=True)
    _check(read_store(tmp_path / "data" / "objects", "pyarrow"))


@pytest.mark.slow
def test_issue24_4_both_records_fill_the_published_version_seaweedfs(
    tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    prefix = "params"
    _publish(tmp_path / "data", {**s3_bucket.env(), "OURIOS_STORE_URL": s3_bucket.url(prefix)})
    copy = tmp_path / "copy"
    download_prefix(s3_bucket.server.client(), s3_bucket.name, prefix, copy)
    for reader in ("duckdb", "pyarrow"):
        _check(read_store(copy, reader))

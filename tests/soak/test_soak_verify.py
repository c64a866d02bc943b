"""The ack ledger and the verifier (soak/ledger.py, soak/verify.py).

Objects are written with the product's own Parquet encoder (``sink.parquet``) under the
product's key layout, into a local directory and into a real SeaweedFS bucket, so the
verifier reads what a node publishes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink.parquet import RecordColumns, RecordRow, encode_records
from soak import verify as verify_cli
from soak.ledger import ID_ATTRIBUTE, LedgerWriter, Outcome, read_ledgers, record_id
from soak.verify import (
    LocalObjects,
    PublishedIds,
    S3Objects,
    read_published,
    run_verify,
    verify,
    wait_ledger_end,
)
from tests.support.seaweed import S3Bucket

NOW_NS = 1_796_000_000_000_000_000


def _rows(ids: list[tuple[str, str]]) -> bytes:
    """A records object holding one row per (tenant, id), as the sink encodes it."""
    cols = RecordColumns()
    cols.extend(
        RecordRow(
            tenant=tenant,
            time_unix_nano=NOW_NS + i,
            observed_time_unix_nano=NOW_NS + i,
            severity_number=9,
            severity_text="INFO",
            body=f"user {i} logged in",
            attributes=[("logger", "auth"), (ID_ATTRIBUTE, rid)] if rid else [("logger", "x")],
            resource_attributes=[("service.name", "auth")],
            scope_name="com.example.auth",
            trace_id=None,
            span_id=None,
            template_id=1,
            template_params=[str(i)],
            wal_lsn=100 + i,
            record_index=i,
        )
        for i, (tenant, rid) in enumerate(ids)
    )
    return encode_records(cols)


def _put_local(root: Path, name: str, ids: list[tuple[str, str]]) -> None:
    path = root / "records" / "tenant=t1" / "date=2026-12-02" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_rows(ids))


def _ledger(directory: Path) -> None:
    """Four requests of three records: acked, acked, refused, no response; one in
    flight. Tenants t1, t1, t2, t2, t1."""
    with LedgerWriter(directory, "w0p1") as ledger:
        ledger.sent("r.1", 3, "t1")
        ledger.acked("r.1", 200, 12.5)
        ledger.sent("r.2", 3, "t1")
        ledger.acked("r.2", 200, 80.0)
        ledger.sent("r.3", 3, "t2")
        ledger.refused("r.3", 503)
        ledger.sent("r.4", 3, "t2")
        ledger.error("r.4", "ConnectionRefusedError(111)\twith a tab")
        ledger.sent("r.5", 3, "t1")


def _ids(request: str, tenant: str, n: int = 3) -> list[tuple[str, str]]:
    return [(tenant, record_id(request, i)) for i in range(n)]


# --- the ledger ------------------------------------------------------------------------


def test_ledger_round_trip(tmp_path: Path) -> None:
    _ledger(tmp_path)
    index = read_ledgers(tmp_path)
    assert index.files == 1 and index.ended and index.torn_lines == 0
    assert not index.anomalies
    outcomes = {r: e.outcome for r, e in index.requests.items()}
    assert outcomes == {
        "r.1": Outcome.ACKED,
        "r.2": Outcome.ACKED,
        "r.3": Outcome.REFUSED,
        "r.4": Outcome.ERROR,
        "r.5": Outcome.IN_FLIGHT,
    }
    assert index.requests["r.3"].status == 503
    assert [latency for _, _, latency in index.acks()] == [12.5, 80.0]
    assert index.record_counts()[Outcome.ACKED] == 6
    assert index.sent_records == 15


def test_a_torn_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    ledger = LedgerWriter(tmp_path, "w0p2")
    ledger.sent("r.1", 2, "t1")
    ledger.acked("r.1", 200, 5.0)
    ledger.sent("r.2", 2, "t1")
    path = ledger.path
    # A SIGKILLed worker: no end line, and half of an A line. The writer's file stays
    # open, as a killed worker's does, until the test is done reading.
    with ledger:
        with path.open("a", encoding="utf-8") as f:
            f.write("A\tr.2\t20")
        index = read_ledgers(tmp_path)
    assert index.torn_lines == 1 and not index.ended
    assert index.requests["r.2"].outcome is Outcome.IN_FLIGHT
    assert index.requests["r.1"].outcome is Outcome.ACKED


@pytest.mark.parametrize(
    ("lines", "anomaly"),
    [
        pytest.param(["A\tr.9\t200\t1.0\t1.0"], "unsent", id="outcome_without_send"),
        pytest.param(["S\tr.1\t1\tt\t1.0", "S\tr.1\t1\tt\t1.0"], "sent twice", id="resent"),
        pytest.param(
            ["S\tr.1\t1\tt\t1.0", "A\tr.1\t200\t1.0\t1", "E\tr.1\t0\t1.0\tx"],
            "second outcome",
            id="two_outcomes",
        ),
        pytest.param(["S\tr.1\tmany\tt\t1.0"], "unreadable", id="bad_count"),
    ],
)
def test_ledger_anomalies_are_reported(tmp_path: Path, lines: list[str], anomaly: str) -> None:
    (tmp_path / "w.ledger").write_text("\n".join(lines) + "\n", encoding="utf-8")
    index = read_ledgers(tmp_path)
    assert len(index.anomalies) == 1 and anomaly in index.anomalies[0], index.anomalies


# --- the verifier ------------------------------------------------------------------------


def test_a_clean_store_verifies(tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    _put_local(objects, "a", _ids("r.1", "t1"))
    # r.2 split over two objects; r.4 (no response) made it in: allowed.
    _put_local(objects, "b", _ids("r.2", "t1")[:1] + _ids("r.4", "t2"))
    _put_local(objects, "c", _ids("r.2", "t1")[1:])
    source = LocalObjects(objects)
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(source), "local")
    assert report.ok, report.lines()
    assert (report.lost, report.never_sent, report.wrong_tenant, report.duplicates) == (0, 0, 0, 0)
    assert report.maybe_published == 3
    assert report.records_acked == 6 and report.distinct_ids == 9
    assert report.objects == 3 and report.rows == 9


def test_lost_phantom_wrong_tenant_and_duplicates_are_found(tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    # r.1.1 lost; r.2.0 twice; r.2.2 under the wrong tenant; an id nobody sent; a row
    # without an id.
    _put_local(objects, "a", [_ids("r.1", "t1")[0], _ids("r.1", "t1")[2], *_ids("r.2", "t1")[:2]])
    _put_local(objects, "b", [_ids("r.2", "t1")[0], ("t2", "r.2.2"), ("t1", "x.1.0"), ("t1", "")])
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(LocalObjects(objects)))
    assert not report.ok
    assert report.lost == 1 and report.lost_sample == ["r.1.1"]
    assert report.lost_by_tenant == {"t1": 1}
    assert report.never_sent == 1 and report.never_sent_sample == ["x.1.0"]
    assert report.wrong_tenant == 1 and "'t2'" in report.wrong_tenant_sample[0]
    assert report.duplicates == 1 and report.duplicated_ids == 1
    assert report.duplicated_sample == ["r.2.0"]
    assert report.rows_without_id == 1
    text = "\n".join(report.lines())
    assert "FAILED" in text and "r.1.1" in text


def test_issue16_a_duplicate_alone_fails_the_verdict(tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    _put_local(objects, "a", [*_ids("r.1", "t1"), *_ids("r.2", "t1")])
    _put_local(objects, "b", _ids("r.2", "t1")[:1])  # a second copy, nothing else wrong
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(LocalObjects(objects)))
    assert (report.lost, report.never_sent, report.wrong_tenant) == (0, 0, 0)
    assert report.duplicates == 1 and not report.ok
    assert "FAILED" in "\n".join(report.lines())


def _put_audit(root: Path, name: str, events: list[tuple[str, int, int]]) -> None:
    path = root / "audit" / "tenant=t1" / "date=2026-12-02" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "tenant": [t for t, _, _ in events],
            "template_id": pa.array([i for _, i, _ in events], pa.int64()),
            "template_version": pa.array([v for _, _, v in events], pa.int32()),
        }
    )
    pq.write_table(table, path)


def test_issue16_a_template_event_published_twice_fails_the_verdict(tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    _put_local(objects, "a", [*_ids("r.1", "t1"), *_ids("r.2", "t1")])
    _put_audit(objects, "e1", [("t1", 7, 1), ("t1", 7, 2)])
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(LocalObjects(objects)))
    assert report.ok and report.template_events == 2 and report.audit_objects == 1
    _put_audit(objects, "e2", [("t1", 7, 2)])  # the same version of the same template
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(LocalObjects(objects)))
    assert not report.ok and report.audit_duplicates == 1
    assert report.audit_duplicated_sample == ["t1|7|2"]


def test_an_unreadable_object_fails_the_verdict(tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    _put_local(objects, "a", _ids("r.1", "t1") + _ids("r.2", "t1"))
    bad = objects / "records" / "tenant=t1" / "date=2026-12-02" / "torn.parquet"
    bad.write_bytes(b"PAR1 not really")
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(LocalObjects(objects)))
    assert report.lost == 0 and not report.ok
    assert report.unreadable_objects and "torn.parquet" in report.unreadable_objects[0]


def test_reading_again_reads_only_new_objects(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    _put_local(objects, "a", _ids("r.1", "t1"))
    published = read_published(LocalObjects(objects))
    _put_local(objects, "b", _ids("r.2", "t1"))
    read_published(LocalObjects(objects), published)
    assert published.rows == 6 and len(published.objects) == 2


def test_the_verifier_reads_an_s3_bucket(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    _ledger(tmp_path / "ledger")
    client = s3_bucket.server.client()
    key = "soak/records/tenant=t1/date=2026-12-02/n0-1.parquet"
    client.put_object(Bucket=s3_bucket.name, Key=key, Body=_rows(_ids("r.1", "t1")))
    source = S3Objects(client, s3_bucket.name, "soak")
    assert source.keys() == ["records/tenant=t1/date=2026-12-02/n0-1.parquet"]
    report = verify(read_ledgers(tmp_path / "ledger"), read_published(source), source.describe())
    assert report.lost == 3 and report.lost_sample == ["r.2.0", "r.2.1", "r.2.2"]
    client.put_object(
        Bucket=s3_bucket.name, Key=key.replace("n0-1", "n0-2"), Body=_rows(_ids("r.2", "t1"))
    )
    assert verify(read_ledgers(tmp_path / "ledger"), read_published(source)).ok


def test_the_cli_waits_for_the_ledger_then_settles(tmp_path: Path) -> None:
    """``python -m soak verify`` as the verifier Job runs it: wait for the ledger's end
    line, then re-read the store until the last acknowledged records arrive."""
    ledger_dir = tmp_path / "ledger"
    objects = tmp_path / "objects"
    writer = LedgerWriter(ledger_dir, "w0p3")
    writer.sent("r.1", 3, "t1")
    writer.acked("r.1", 200, 1.0)
    assert not wait_ledger_end(ledger_dir, 0.2, 0.05)
    writer.close()
    assert wait_ledger_end(ledger_dir, 5.0, 0.05)

    # The object lands only after the verifier's first read of the store: the source
    # sets an event when it has listed, and that releases the writer.
    first_read = threading.Event()

    class Listing(LocalObjects):
        def keys(self, prefix: str = "records/") -> list[str]:
            found = super().keys(prefix)
            first_read.set()
            return found

    def publish_late() -> None:
        if first_read.wait(30):
            _put_local(objects, "late", _ids("r.1", "t1"))

    objects.mkdir(parents=True)
    publisher = threading.Thread(target=publish_late)
    publisher.start()
    try:
        report = run_verify(
            Listing(objects), ledger_dir, settle_timeout_s=20, settle_interval_s=0.1
        )
    finally:
        first_read.set()
        publisher.join(30)
    assert report.ok and report.rows == 3, report.lines()
    assert report.seconds < 20


def test_the_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    _ledger(tmp_path / "ledger")
    objects = tmp_path / "objects"
    _put_local(objects, "a", _ids("r.1", "t1"))
    parser = argparse.ArgumentParser()
    verify_cli.add_arguments(parser)
    out = tmp_path / "verify.json"
    args = parser.parse_args(
        ["--store", f"file://{objects}", "--ledger", str(tmp_path / "ledger"), "--out", str(out)]
    )
    assert verify_cli.main(args) == 1
    assert json.loads(out.read_text())["lost"] == 3
    assert "lost (acked, not in the store): 3" in capsys.readouterr().out
    _put_local(objects, "b", _ids("r.2", "t1"))
    assert verify_cli.main(args) == 0
    # A ledger still open (the soak Job is running) past the wait: exit 2, not a verdict.
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "w9.ledger").write_text("# soak-ledger 1 w9 1.0\nS\tq.1\t1\tt1\t1.0\n")
    args = parser.parse_args(
        ["--store", str(objects), "--ledger", str(tmp_path / "open"), "--wait-ledger-end", "0.1"]
    )
    assert verify_cli.main(args) == 2
    assert "not closed" in capsys.readouterr().err


def test_published_ids_count_rows_without_an_id() -> None:
    published = PublishedIds()
    published.add("k", _rows([("t1", ""), ("t1", "r.1.0")]))
    assert published.rows == 2 and published.rows_without_id == 1

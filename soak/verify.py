"""The verifier: compare the published Parquet with the ack ledgers.

Reads every record object of the store (``records/tenant=*/date=*/*.parquet`` under a
local directory, or under ``s3://bucket/prefix`` through boto3 with the standard AWS
environment and an optional endpoint URL), takes each row's ``soak.id`` attribute and
its ``tenant``, and reads every ``*.ledger`` file under the ledger directory
(``soak.ledger``). It reports:

- **lost**: ids of acknowledged (``A``) requests that are in no object — the one
  outcome the node promises never happens;
- **never sent**: ids in the store that no ``S`` line announced (a phantom record);
- **wrong tenant**: rows published under another tenant than their request's;
- **duplicates**: extra copies of an id — a failure: after any SIGKILL the node
  publishes every acknowledged record exactly once (issue 16: the publish intents);
- **template events twice**: an audit row whose (tenant, template_id, template_version)
  another audit row has too — a failure, for the same reason (the audit objects are
  read as well);
- rows without an id (another client wrote to the store), ledger anomalies and torn
  lines.

Exit status: 0 when nothing is lost, never sent, under the wrong tenant or published
twice (records or template events); 1 otherwise
(2 when the ledgers were not closed in time, see below).
``--settle-timeout S`` re-reads the store (new objects only: objects are immutable)
until the verdict is clean or S seconds passed, for a node that keeps running (in
Kubernetes the verifier cannot SIGTERM it; what was acknowledged last is published by
the next barrier or age sweep). ``--wait-ledger-end S`` first waits up to S seconds
for every ledger to carry its end line (the verifier Job starts beside the soak Job).
Every option has an environment default (``SOAK_STORE_URL``,
``SOAK_STORE_ENDPOINT_URL``, ``SOAK_LEDGER_DIR``, ``SOAK_VERIFY_OUT``), which is how
the Kubernetes Job sets them.

The set work runs in Arrow (``value_counts``, ``is_in``) on id arrays built without a
Python loop per record, so an hour-long soak of a few million records verifies in
seconds after the objects are read.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from soak.ledger import ID_ATTRIBUTE, LedgerIndex, Outcome, read_ledgers

__all__ = [
    "LocalObjects",
    "ObjectSource",
    "PublishedIds",
    "S3Objects",
    "VerifyReport",
    "main",
    "object_source",
    "read_published",
    "verify",
]

RECORDS_PREFIX: Final = "records/"
AUDIT_PREFIX: Final = "audit/"
SAMPLE: Final = 20  # ids shown per finding
_READERS: Final = 8


class ObjectSource(Protocol):
    def keys(self, prefix: str = RECORDS_PREFIX) -> list[str]:
        """Keys of the objects under ``prefix`` (records or audit), relative to the
        store root."""
        ...

    def read(self, key: str) -> bytes: ...

    def describe(self) -> str: ...


class LocalObjects:
    """The embedded store: files under ``root`` (``OURIOS_STORE_URL=file://root``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self, prefix: str = RECORDS_PREFIX) -> list[str]:
        base = self.root / prefix
        # Final names only: a publish in progress writes a dot-named temp and renames it.
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*.parquet")
            if not p.name.startswith(".")
        )

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def describe(self) -> str:
        return f"file://{self.root}"


class S3Objects:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def keys(self, prefix: str = RECORDS_PREFIX) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        start = len(self.prefix)
        return sorted(
            obj["Key"][start:]
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
            for obj in page.get("Contents", [])
            if obj["Key"].endswith(".parquet")
        )

    def read(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]
        data: bytes = body.read()
        return data

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def object_source(url: str, endpoint_url: str | None = None) -> ObjectSource:
    """``file:///abs/path``, a plain path, or ``s3://bucket[/prefix]``."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 5, "mode": "standard"},
                max_pool_connections=_READERS * 2,
            ),
        )
        return S3Objects(client, parts.netloc, parts.path)
    if parts.scheme in ("file", ""):
        return LocalObjects(Path(parts.path if parts.scheme else url))
    raise ValueError(f"store {url!r}: expected file:///path or s3://bucket[/prefix]")


@dataclass
class PublishedIds:
    """The ids and tenants of every row read so far, one Arrow chunk per object."""

    ids: list[pa.Array] = field(default_factory=list)
    tenants: list[pa.Array] = field(default_factory=list)
    objects: set[str] = field(default_factory=set)
    rows: int = 0
    rows_without_id: int = 0
    unreadable: list[str] = field(default_factory=list)
    #: audit objects read, and one "tenant|template_id|template_version" per event row
    audit_objects: set[str] = field(default_factory=set)
    events: list[pa.Array] = field(default_factory=list)

    def add_audit(self, key: str, data: bytes) -> None:
        try:
            table = pq.read_table(
                io.BytesIO(data), columns=["tenant", "template_id", "template_version"]
            )
        except (pa.ArrowException, OSError) as exc:
            self.unreadable.append(f"{key}: {exc!r}")
            return
        self.audit_objects.add(key)
        parts = [table.column(n).cast(pa.string()) for n in table.column_names]
        self.events.append(pc.binary_join_element_wise(*parts, "|").combine_chunks())

    def add(self, key: str, data: bytes) -> None:
        try:
            table = pq.read_table(io.BytesIO(data), columns=["tenant", "attributes"])
        except (pa.ArrowException, OSError) as exc:
            self.unreadable.append(f"{key}: {exc!r}")
            return
        self.objects.add(key)
        self.rows += table.num_rows
        for attributes, tenant in zip(
            table.column("attributes").chunks, table.column("tenant").chunks, strict=True
        ):
            ids = pc.map_lookup(attributes, ID_ATTRIBUTE, "first")
            present = pc.is_valid(ids)
            self.rows_without_id += len(ids) - pc.sum(present).as_py() if len(ids) else 0
            self.ids.append(ids.filter(present).cast(pa.string()))
            self.tenants.append(tenant.filter(present).cast(pa.string()))


def read_published(
    source: ObjectSource, into: PublishedIds | None = None, readers: int = _READERS
) -> PublishedIds:
    """Read the objects not yet in ``into`` (all of them the first time)."""
    published = into if into is not None else PublishedIds()
    todo = [k for k in source.keys() if k not in published.objects]
    todo += [k for k in source.keys(AUDIT_PREFIX) if k not in published.audit_objects]
    lock = threading.Lock()

    def fetch(key: str) -> None:
        data = source.read(key)
        with lock:
            if key.startswith(AUDIT_PREFIX):
                published.add_audit(key, data)
            else:
                published.add(key, data)

    with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="soak-verify") as pool:
        for _ in pool.map(fetch, todo):
            pass
    return published


@dataclass
class VerifyReport:
    store: str
    ledger_files: int
    torn_lines: int
    ledger_anomalies: list[str]
    requests_sent: int
    records_sent: int
    records_acked: int
    records_refused: int
    records_error: int
    records_in_flight: int
    objects: int
    unreadable_objects: list[str]
    rows: int
    rows_without_id: int
    distinct_ids: int
    lost: int
    lost_sample: list[str]
    lost_by_tenant: dict[str, int]
    never_sent: int
    never_sent_sample: list[str]
    wrong_tenant: int
    wrong_tenant_sample: list[str]
    duplicates: int  # extra copies beyond the first
    duplicated_ids: int
    duplicated_sample: list[str]
    maybe_published: int  # ids of refused/error/in-flight requests found in the store
    #: audit objects read, template events in them, and extra copies of an event
    audit_objects: int = 0
    template_events: int = 0
    audit_duplicates: int = 0
    audit_duplicated_sample: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.never_sent == 0
            and self.wrong_tenant == 0
            and self.duplicates == 0
            and self.audit_duplicates == 0
            and not self.unreadable_objects
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def lines(self) -> list[str]:
        verdict = "OK" if self.ok else "FAILED"
        out = [
            f"verify {verdict}: store {self.store}, {self.objects} objects, {self.rows} rows,"
            f" {self.distinct_ids} distinct ids ({self.seconds:.1f} s)",
            f"  ledger: {self.ledger_files} files, {self.requests_sent} requests,"
            f" {self.records_sent} records sent, {self.records_acked} acked,"
            f" {self.records_refused} refused, {self.records_error} no response,"
            f" {self.records_in_flight} in flight; torn lines {self.torn_lines}",
            f"  lost (acked, not in the store): {self.lost}",
            f"  never sent (in the store, no S line): {self.never_sent}",
            f"  wrong tenant: {self.wrong_tenant}",
            f"  duplicates: {self.duplicates} extra copies of {self.duplicated_ids} ids",
            f"  template events: {self.template_events} in {self.audit_objects} objects,"
            f" {self.audit_duplicates} published more than once",
            f"  unacknowledged but published: {self.maybe_published};"
            f" rows without an id: {self.rows_without_id}",
        ]
        if self.lost_sample:
            out.append(f"  lost, first: {self.lost_sample} by tenant {self.lost_by_tenant}")
        if self.never_sent_sample:
            out.append(f"  never sent, first: {self.never_sent_sample}")
        if self.wrong_tenant_sample:
            out.append(f"  wrong tenant, first: {self.wrong_tenant_sample}")
        if self.duplicated_sample:
            out.append(f"  duplicated, first: {self.duplicated_sample}")
        if self.audit_duplicated_sample:
            out.append(f"  template events twice, first: {self.audit_duplicated_sample}")
        if self.ledger_anomalies:
            out.append(f"  ledger anomalies ({len(self.ledger_anomalies)}):")
            out.extend(f"    {a}" for a in self.ledger_anomalies[:SAMPLE])
        if self.unreadable_objects:
            out.append(f"  unreadable objects: {self.unreadable_objects[:SAMPLE]}")
        return out


def _expand(requests: Sequence[str], counts: Sequence[int]) -> tuple[pa.Array, np.ndarray]:
    """The record ids ``<request>.<i>`` of every request, and each id's request index."""
    n = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(n), dtype=np.int64), n)
    starts = np.repeat(np.cumsum(n) - n, n)
    index = np.arange(int(n.sum()), dtype=np.int64) - starts
    names = pc.take(pa.array(requests, pa.string()), pa.array(owner))
    ids = pc.binary_join_element_wise(names, pc.cast(pa.array(index), pa.string()), ".")
    return ids, owner


def _sample(values: pa.Array) -> list[str]:
    return [str(v) for v in values.slice(0, SAMPLE).to_pylist()]


def verify(ledger: LedgerIndex, published: PublishedIds, store: str = "") -> VerifyReport:
    began = time.monotonic()
    names = list(ledger.requests)
    entries = [ledger.requests[r] for r in names]
    all_ids, owner = _expand(names, [e.records for e in entries])
    outcome = np.array([e.outcome.value for e in entries], dtype=np.int64)
    id_outcome = outcome[owner] if len(owner) else outcome[:0]
    acked_mask = pa.array(id_outcome == Outcome.ACKED.value)

    ids = pa.chunked_array(published.ids, pa.string()).combine_chunks()
    tenants = pa.chunked_array(published.tenants, pa.string()).combine_chunks()
    counts = pc.value_counts(ids)
    unique = counts.field("values")
    copies = counts.field("counts")
    duplicated = pc.greater(copies, 1)

    # Lost: acknowledged ids missing from the store.
    acked_ids = all_ids.filter(acked_mask)
    missing = pc.invert(pc.is_in(acked_ids, value_set=unique))
    lost_ids = acked_ids.filter(missing)
    lost_by_tenant: dict[str, int] = {}
    if len(lost_ids):
        acked_owner = owner[np.asarray(acked_mask.to_numpy(zero_copy_only=False), dtype=bool)]
        lost_owner = acked_owner[np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool)]
        for i in lost_owner:
            tenant = entries[int(i)].tenant
            lost_by_tenant[tenant] = lost_by_tenant.get(tenant, 0) + 1

    # Never sent: ids in the store no S line announced.
    phantom = pc.invert(pc.is_in(unique, value_set=all_ids))
    phantom_ids = unique.filter(phantom)

    # Wrong tenant: the row's tenant differs from its request's.
    position = pc.index_in(ids, value_set=all_ids)
    request_tenant = pa.array([e.tenant for e in entries], pa.string())
    expected = pc.take(request_tenant, pc.take(pa.array(owner), position))
    wrong = pc.fill_null(pc.not_equal(expected, tenants), False)
    wrong_rows = pc.sum(wrong).as_py() or 0
    wrong_sample = [
        f"{i} published as {t!r}, sent as {e!r}"
        for i, t, e in zip(
            ids.filter(wrong).slice(0, SAMPLE).to_pylist(),
            tenants.filter(wrong).slice(0, SAMPLE).to_pylist(),
            expected.filter(wrong).slice(0, SAMPLE).to_pylist(),
            strict=True,
        )
    ]

    not_acked = all_ids.filter(pc.invert(acked_mask))
    maybe = pc.sum(pc.is_in(not_acked, value_set=unique)).as_py() or 0

    events = pa.chunked_array(published.events, pa.string()).combine_chunks()
    event_counts = pc.value_counts(events)
    twice = pc.greater(event_counts.field("counts"), 1)
    audit_extra = (pc.sum(event_counts.field("counts")).as_py() or 0) - len(event_counts)

    records = ledger.record_counts()
    report = VerifyReport(
        store=store,
        ledger_files=ledger.files,
        torn_lines=ledger.torn_lines,
        ledger_anomalies=ledger.anomalies[:100],
        requests_sent=len(entries),
        records_sent=ledger.sent_records,
        records_acked=records[Outcome.ACKED],
        records_refused=records[Outcome.REFUSED],
        records_error=records[Outcome.ERROR],
        records_in_flight=records[Outcome.IN_FLIGHT],
        objects=len(published.objects),
        unreadable_objects=published.unreadable[:100],
        rows=published.rows,
        rows_without_id=published.rows_without_id,
        distinct_ids=len(unique),
        lost=len(lost_ids),
        lost_sample=_sample(lost_ids),
        lost_by_tenant=dict(sorted(lost_by_tenant.items())),
        never_sent=len(phantom_ids),
        never_sent_sample=_sample(phantom_ids),
        wrong_tenant=int(wrong_rows),
        wrong_tenant_sample=wrong_sample,
        duplicates=int((pc.sum(copies).as_py() or 0) - len(unique)),
        duplicated_ids=int(pc.sum(duplicated).as_py() or 0),
        duplicated_sample=_sample(unique.filter(duplicated)),
        maybe_published=int(maybe),
        audit_objects=len(published.audit_objects),
        template_events=len(events),
        audit_duplicates=int(audit_extra),
        audit_duplicated_sample=_sample(event_counts.field("values").filter(twice)),
    )
    report.seconds = time.monotonic() - began
    return report


def run_verify(
    source: ObjectSource,
    ledger_dir: Path,
    *,
    settle_timeout_s: float = 0.0,
    settle_interval_s: float = 10.0,
) -> VerifyReport:
    """Read, verify; with a settle timeout, re-read new objects until clean or out of
    time (polling an external store, which publishes on its own cadence)."""
    began = time.monotonic()
    deadline = began + settle_timeout_s
    published = PublishedIds()
    pause = threading.Event()
    while True:
        ledger = read_ledgers(ledger_dir)
        read_published(source, published)
        report = verify(ledger, published, source.describe())
        if report.ok or time.monotonic() + settle_interval_s > deadline:
            report.seconds = time.monotonic() - began
            return report
        pause.wait(settle_interval_s)


def wait_ledger_end(ledger_dir: Path, timeout_s: float, interval_s: float = 5.0) -> bool:
    """Poll until every ledger under ``ledger_dir`` is closed by its worker, or time out;
    returns whether they were."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not read_ledgers(ledger_dir).ended:
        if time.monotonic() + interval_s > deadline:
            return read_ledgers(ledger_dir).ended
        pause.wait(interval_s)
    return True


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    store = _env("SOAK_STORE_URL")
    ledger = _env("SOAK_LEDGER_DIR")
    out = _env("SOAK_VERIFY_OUT")
    parser.add_argument(
        "--store",
        default=store,
        required=store is None,
        help="file:///abs/path, a directory, or s3://bucket[/prefix] ($SOAK_STORE_URL)",
    )
    parser.add_argument(
        "--endpoint-url",
        default=_env("SOAK_STORE_ENDPOINT_URL"),
        help="S3-compatible endpoint ($SOAK_STORE_ENDPOINT_URL)",
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        default=Path(ledger) if ledger else None,
        required=ledger is None,
        help="ledger directory ($SOAK_LEDGER_DIR)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(out) if out else None,
        help="write the report JSON here ($SOAK_VERIFY_OUT)",
    )
    parser.add_argument("--settle-timeout", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--settle-interval", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--wait-ledger-end", type=float, default=0.0, metavar="SECONDS")


def main(args: argparse.Namespace) -> int:
    if args.wait_ledger_end > 0 and not wait_ledger_end(args.ledger, args.wait_ledger_end):
        index = read_ledgers(args.ledger)
        print(
            f"ledgers under {args.ledger} not closed within {args.wait_ledger_end:g} s"
            f" ({index.files_ended} of {index.files} closed)",
            file=sys.stderr,
        )
        return 2
    source = object_source(args.store, args.endpoint_url)
    report = run_verify(
        source,
        args.ledger,
        settle_timeout_s=args.settle_timeout,
        settle_interval_s=args.settle_interval,
    )
    print("\n".join(report.lines()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))

"""docs/QUERY.md cannot rot: every ```python block of the guide runs here on its own, in
a fresh namespace holding only the guide's inputs — as a reader who copies one snippet
runs it — against what a real ``ourios serve`` published, once with the embedded store
and once with SeaweedFS (the DuckDB-over-the-embedded-store snippets then read a copy of
the bucket, and the S3 snippets read the bucket itself); its answers are checked
against what was sent.

The block whose first line is ``# guide: inputs`` is the reader's settings: every other
block starts from the names it sets, with the test's values in place of its
placeholders. Blocks marked ``# guide: s3`` run only against SeaweedFS.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.parquet_read import download_prefix
from tests.support.seaweed import S3Bucket
from tests.support.serve import ROOT, ServeProcess

GUIDE = ROOT / "docs" / "QUERY.md"
TENANT = "acme=prod"  # percent-encoded in its key: acme%3Dprod
OTHER = "globex"
NANOS = 10**9
DAY_NS = 86_400 * NANOS

#: body shapes: the miner makes one template of each; the values are its parameters
SHAPES = (
    ("user {} logged in from {}", ("alice", "bob", "carol"), ("10.0.0.1", "10.0.0.2")),
    ("GET /api/orders/{} took {} ms", ("17", "42", "99"), ("5", "12", "130")),
    ("disk {} is {} percent full", ("sda1", "sdb1"), ("91", "17")),
)


@dataclass
class Sent:
    """What the test sent, to check the guide's answers against."""

    records: list[dict[str, Any]] = field(default_factory=list)

    def of(self, tenant: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["tenant"] == tenant]


def code_blocks() -> list[tuple[str, str]]:
    """(tag, code) of every ```python block of the guide, in order."""
    text = GUIDE.read_text()
    out = []
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        first = block.splitlines()[0].strip()
        tag = first.removeprefix("# guide:").strip() if first.startswith("# guide:") else ""
        out.append((tag, block))
    return out


def _send(serve: ServeProcess, seed: int) -> Sent:
    rng = random.Random(seed)
    sent = Sent()
    now = time.time_ns()
    traces = [f"{rng.getrandbits(128):032x}" for _ in range(3)]
    for n in range(24):
        tenant = TENANT if n % 4 else OTHER
        req = ExportLogsServiceRequest()
        sl = req.resource_logs.add().scope_logs.add()
        sl.scope.name = "guide"
        for k in range(rng.randint(3, 8)):
            shape, first, second = rng.choice(SHAPES)
            a, b = rng.choice(first), rng.choice(second)
            body = shape.format(a, b)
            if n == 5 and k == 0:
                t = 0  # no time: filed by its observed time
            elif n % 7 == 3:
                t = now - 2 * DAY_NS - rng.randrange(3600) * NANOS  # two days ago
            else:
                t = now - rng.randrange(1800) * NANOS  # the last half hour
            trace = rng.choice(traces) if rng.random() < 0.5 else None
            rec = sl.log_records.add()
            rec.time_unix_nano = t
            rec.observed_time_unix_nano = now
            rec.severity_text = "INFO"
            rec.body.string_value = body
            if trace is not None:
                rec.trace_id = bytes.fromhex(trace)
                rec.span_id = rng.getrandbits(64).to_bytes(8, "big")
            sent.records.append(
                {"tenant": tenant, "t": t, "body": body, "trace": trace, "params": (a, b)}
            )
        status, answer, _ = serve.post_logs(req.SerializeToString(), {"X-Ourios-Tenant": tenant})
        assert status == 200, (status, answer)
    return sent


def _run_node(tmp_path: Path, env: dict[str, str], seed: int) -> Sent:
    serve = ServeProcess(tmp_path / "data", env)
    with serve:
        sent = _send(serve, seed)
        serve.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert serve.terminate() == 0, serve.tail()
    return sent


def _run_guide(bound: dict[str, Any], *, s3: bool) -> dict[str, Any]:
    """Each block in a namespace of its own holding only the inputs block's names (the
    test's values bound in place of its placeholders), so a block that leans on
    another's names fails with NameError. Returns what the blocks set; a name two
    blocks set keeps the first block's value."""
    blocks = code_blocks()
    inputs = [code for tag, code in blocks if tag == "inputs"]
    assert len(inputs) == 1, "the guide has one inputs block"
    declared: dict[str, Any] = {}
    exec(compile(inputs[0], f"{GUIDE}:inputs", "exec"), declared)  # noqa: S102
    del declared["__builtins__"]
    assert set(bound) <= set(declared), (
        f"the inputs block does not set {set(bound) - set(declared)}"
    )
    results: dict[str, Any] = dict(bound)
    ran = 0
    for tag, code in blocks:
        if tag == "inputs" or (tag == "s3" and not s3):
            continue
        names = {**declared, **bound}
        exec(compile(code, f"{GUIDE}:{tag or 'block'}", "exec"), names)  # noqa: S102
        for name, value in names.items():
            if name not in declared and name != "__builtins__":
                results.setdefault(name, value)
        ran += 1
    assert ran >= (7 if s3 else 5), f"the guide's blocks were not found ({ran} ran)"
    return results


def _check(names: dict[str, Any], sent: Sent) -> None:
    mine = sent.of(TENANT)
    per_day = names["per_day"]
    assert sum(n for _, n in per_day) == len(mine)
    day_of = Counter(
        (dt.datetime.fromtimestamp((r["t"] or time.time_ns()) / NANOS, dt.UTC).date()) for r in mine
    )
    assert {d for d, _ in per_day} == set(day_of)

    for day, first, last in names["day_ranges"]:  # each partition holds its own day
        assert first.date() == day and last.date() == day

    named = names["named"]
    assert named and all(template for _, template, _, _ in named)

    since = names["since"]
    recent = [r for r in mine if r["t"] >= since]
    top = names["top"]
    assert sum(n for _, _, n in top) == len(recent)
    shapes = {s.split(" {}")[0].split(" ")[0] for s, _, _ in SHAPES}
    assert {text.split(" ")[0] for _, text, _ in top} <= shapes
    assert [n for _, _, n in top] == sorted((n for _, _, n in top), reverse=True)

    # The values each <*> took are words of the bodies the test sent (a record published
    # before a later widening carries fewer, so positions are not compared, and the
    # miner's tokens may be wider than the shape's placeholders).
    assert names["template_id"] != 0
    words = {w for r in mine for w in r["body"].split()}
    got = names["params"]
    assert got and {value for _, value, _ in got} <= words, got
    assert all(pos >= 1 and n >= 1 for pos, _, n in got)

    # every record of the tenant is rebuilt from its version's text and parameters
    assert len(names["rebuilt"]) == len(mine)

    trace_id = names["TRACE_ID"]
    expected = sorted((r["t"], r["body"]) for r in mine if r["trace"] == trace_id)
    assert [(t, body) for t, _, _, body in names["trace"]] == expected
    assert expected, "the chosen trace has records"


def _inputs(sent: Sent) -> dict[str, Any]:
    mine = sent.of(TENANT)
    traced = Counter(r["trace"] for r in mine if r["trace"])
    last_day = max(_day(r["t"] or time.time_ns()) for r in mine)
    return {"TENANT": TENANT, "TRACE_ID": traced.most_common(1)[0][0], "DAY": last_day.isoformat()}


def _day(t: int) -> dt.date:
    return dt.datetime.fromtimestamp(t / NANOS, dt.UTC).date()


@pytest.mark.slow
def test_clone_9_each_guide_block_runs_on_its_own_over_the_embedded_store(tmp_path: Path) -> None:
    sent = _run_node(tmp_path, {}, seed=16)
    names = _inputs(sent) | {"OBJECTS": str(tmp_path / "data" / "objects")}
    _check(_run_guide(names, s3=False), sent)


@pytest.mark.slow
def test_clone_9_each_guide_block_runs_on_its_own_over_seaweedfs(
    tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    prefix = "guide"
    env = {**s3_bucket.env(), "OURIOS_STORE_URL": s3_bucket.url(prefix)}
    sent = _run_node(tmp_path, env, seed=61)
    copy = tmp_path / "copy"
    download_prefix(s3_bucket.server.client(), s3_bucket.name, prefix, copy)
    server_env = s3_bucket.server.env()
    names = _inputs(sent) | {
        "OBJECTS": str(copy),
        "ENDPOINT": server_env["OURIOS_STORE_ENDPOINT_URL"].removeprefix("http://"),
        "BUCKET": s3_bucket.name,
        "PREFIX": f"{prefix}/",
        "ACCESS_KEY": server_env["AWS_ACCESS_KEY_ID"],
        "SECRET_KEY": server_env["AWS_SECRET_ACCESS_KEY"],
    }
    names = _run_guide(names, s3=True)
    _check(names, sent)
    mine = sent.of(TENANT)
    assert names["tenant_records"].num_rows == len(mine)
    assert names["one_day"].num_rows == names["per_day"][-1][1]
    assert names["top_s3"] == names["top"]

"""SIGKILL a real ``ourios serve`` under concurrent load, again and again: every
acknowledged record is published in the end (DESIGN.md §5.1 "WAL before ack" and §6
start-up replay).

Each round starts ``ourios serve`` on the same data directory (start-up replays the WAL),
drives it with ``tests.support.ackload`` (several senders, several tenants, a unique id
in every record), and SIGKILLs it after a random number of acknowledged requests drawn
from the seed. The last round stops the load and sends SIGTERM, which flushes every
buffered row. Then every Parquet object under ``objects/records`` is read:

- every acknowledged id is present, exactly once (issue 16: a restart asks the store
  which objects its publish intents name and republishes nothing they hold, so a
  duplicate is a failure);
- every present id was sent (acknowledged, refused or unanswered — never one whose
  connection was refused), under the tenant it was sent to, with its body and its
  ``rid`` attribute agreeing;
- each restart's ``recovery.done`` replayed at least the frames acknowledged before it.

The seed is printed; set ``SIGKILL_SEED`` to rerun one. Nothing here sleeps: kills are
placed by counting acknowledgements, the server's readiness is awaited by
``ServeProcess``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.support.ackload import AckLedger, AckLoad, Outcome, rid_of_body
from tests.support.crashrig import NO_CUT_ENV, release, seed_from
from tests.support.scrape import scrape
from tests.support.serve import ServeProcess

TENANTS = ("acme", "globex", "initech")

# Nothing may reclaim WAL segments during the test, so a restart replays every frame
# written so far and the recovery.done check below can count them.
BASE_ENV = {**NO_CUT_ENV, "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "20"}


@dataclass
class Round:
    number: int
    kill_after: int  # acknowledged requests awaited before the signal
    acked_before_start: int  # acknowledged requests of all earlier rounds
    recovery: dict[str, Any]
    acked_at_signal: int = 0
    queue_depth_at_signal: float = 0.0  # ourios_sink_publisher_queue_depth just before it
    new_objects: list[Path] = field(default_factory=list)  # published during the round
    temps_after: int = 0
    signal: str = "SIGKILL"


@dataclass
class Campaign:
    """Rounds of serve-under-load ended by SIGKILL, then one ended by SIGTERM."""

    data_dir: Path
    env: Mapping[str, str]
    seed: int
    kills: int
    ack_window: tuple[int, int]  # K is drawn from this range (inclusive) each round
    senders: int
    records_per_request: tuple[int, int] = (1, 8)
    ledger: AckLedger = field(default_factory=AckLedger)
    rounds: list[Round] = field(default_factory=list)

    def run(self) -> None:
        rng = random.Random(self.seed)
        for n in range(self.kills + 1):
            self._round(rng, final=n == self.kills)

    def _round(self, rng: random.Random, *, final: bool) -> None:
        before = set(_objects(self.data_dir))
        serve = ServeProcess(self.data_dir, self.env)
        try:
            r = self._serve(serve, rng, final=final)
        finally:
            release(serve)
        r.new_objects = sorted(set(_objects(self.data_dir)) - before)
        r.temps_after = len(_temps(self.data_dir))

    def _serve(self, serve: ServeProcess, rng: random.Random, *, final: bool) -> Round:
        acked_before = self.ledger.requests_with(Outcome.ACKED)
        with serve:
            recovery = serve.event("recovery.done")
            assert len(recovery) == 1, f"seed {self.seed}: recovery.done {recovery}\n{serve.tail()}"
            kill_after = rng.randint(*self.ack_window)
            with AckLoad(
                self.ledger,
                serve.http_port,
                senders=self.senders,
                tenants=TENANTS,
                seed=rng.getrandbits(64),
                records_per_request=self.records_per_request,
            ) as load:
                r = Round(load.round, kill_after, acked_before, recovery[0])
                self.rounds.append(r)
                got = load.wait_acked(kill_after, timeout=30)
                assert got >= kill_after, (
                    f"seed {self.seed} round {r.number}: the load stopped after {got} acks"
                    f" of {kill_after}: {self.ledger.summary()}\n{serve.tail()}"
                )
                r.queue_depth_at_signal = _metric(serve, "ourios_sink_publisher_queue_depth")
                if final:
                    load.stop()
                    serve.wait_turned()  # a stop leaves the unturned to the WAL (exit 75)
                    r.signal = "SIGTERM"
                    r.acked_at_signal = load.acked
                    code = serve.terminate()
                    assert code == 0, f"seed {self.seed}: exit {code}\n{serve.tail()}"
                    stopped = serve.event("server.stopped")
                    assert stopped and stopped[0]["rows_left_in_wal"] == 0, serve.tail()
                    assert stopped[0]["publisher_joined"] is True, serve.tail()
                else:
                    r.acked_at_signal = load.acked
                    serve.kill()
                    load.join()  # every sender sees its connection break
        return r

    def report(self, counts: Counter[str]) -> str:
        dup_by_round: Counter[int] = Counter()
        for rid, c in counts.items():
            if c > 1:
                req = self.ledger.request_of(rid)
                dup_by_round[req.round if req else 0] += c - 1
        lines = [f"seed {self.seed}: {len(self.rounds)} rounds"]
        for r in self.rounds:
            rec = {k: r.recovery.get(k) for k in ("frames", "records_replayed", "seconds")}
            live = _rows_of_round(r.new_objects, r.number)
            lines.append(
                f"  round {r.number}: {r.signal} after K={r.kill_after} acks ({r.acked_at_signal}"
                f" when sent, {self.ledger.requests_with(Outcome.ACKED, rounds=[r.number])} in"
                f" all; publisher queue {r.queue_depth_at_signal:g}),"
                f" {len(r.new_objects)} objects published"
                f" ({live} rows of this round), temps left {r.temps_after}, recovery {rec},"
                f" duplicates {dup_by_round[r.number]}"
            )
        lines.append(f"  outcomes: { {k: dict(v) for k, v in self.ledger.summary().items()} }")
        return "\n".join(lines)


def _metric(serve: ServeProcess, name: str) -> float:
    value = scrape(serve).value(name)
    assert value is not None, f"/metrics has no {name}"
    return value


def _rows_of_round(objects: list[Path], round_number: int) -> int:
    prefix = f"r{round_number}-"
    return sum(
        1
        for path in objects
        for body in pq.read_table(path, columns=["body"]).column("body").to_pylist()
        if (rid_of_body(body) or "").startswith(prefix)
    )


def _objects(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "objects" / "records").glob("tenant=*/date=*/*.parquet"))


def _temps(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "objects").rglob(".*.tmp"))


def _published(data_dir: Path) -> list[tuple[str, str | None, str | None]]:
    """(tenant, rid attribute, rid in body) of every published record row."""
    rows: list[tuple[str, str | None, str | None]] = []
    for path in _objects(data_dir):
        table = pq.read_table(path, columns=["tenant", "body", "attributes"])
        for tenant, body, attributes in zip(
            table.column("tenant").to_pylist(),
            table.column("body").to_pylist(),
            table.column("attributes").to_pylist(),
            strict=True,
        ):
            rid = dict(attributes).get("rid")
            rows.append((tenant, rid, rid_of_body(body)))
    return rows


def _check(campaign: Campaign) -> Counter[str]:
    """The assertions of the module docstring; returns how often each id was published."""
    ledger = campaign.ledger
    rows = _published(campaign.data_dir)
    counts: Counter[str] = Counter()
    mismatched: list[str] = []
    wrong_tenant: list[str] = []
    for tenant, rid, body_rid in rows:
        if rid is None or rid != body_rid:
            mismatched.append(f"attribute {rid!r} vs body {body_rid!r}")
            continue
        counts[rid] += 1
        req = ledger.request_of(rid)
        if req is not None and req.tenant != tenant:
            wrong_tenant.append(f"{rid} sent to {req.tenant!r}, published under {tenant!r}")
    report = campaign.report(counts)
    print(report)
    assert not mismatched, f"{report}\nrows whose rid and body disagree: {mismatched[:10]}"
    assert not wrong_tenant, f"{report}\nrows under the wrong tenant: {wrong_tenant[:10]}"

    acked = ledger.rids(Outcome.ACKED)
    missing = sorted(acked - counts.keys())
    if missing:
        by_round = Counter(q.round for m in missing if (q := ledger.request_of(m)) is not None)
        shown = []
        for m in missing[:20]:
            req = ledger.request_of(m)
            assert req is not None
            shown.append(f"{m} (tenant {req.tenant}, acked in round {req.round})")
        pytest.fail(
            f"{report}\n{len(missing)} of {len(acked)} acknowledged records were never"
            f" published (missing per round: {dict(by_round)}); first: {shown}",
            pytrace=False,
        )
    duplicated = sorted(rid for rid, c in counts.items() if c > 1)
    assert not duplicated, (
        f"{report}\n{len(duplicated)} ids published more than once"
        f" ({_duplicates(counts)} extra copies): {duplicated[:20]}"
    )
    maybe = ledger.rids(Outcome.ACKED, Outcome.REFUSED, Outcome.UNKNOWN)
    never_sent = sorted(counts.keys() - maybe)
    assert not never_sent, (
        f"{report}\n{len(never_sent)} published ids were never sent: {never_sent[:20]}"
    )

    # Recovery: housekeeping is off, so every frame written so far survives and each
    # acknowledged request is one frame: a restart walks at least that many (those at or
    # below a tenant's snapshot horizon are counted as skipped, the rest are re-mined).
    for r in campaign.rounds[1:]:
        frames = r.recovery["frames"]
        assert frames >= r.acked_before_start, (
            f"{report}\nround {r.number}: recovery.done walked {frames} frames, but"
            f" {r.acked_before_start} requests had been acknowledged before it: {r.recovery}"
        )
        assert r.recovery["frames_skipped"] <= frames, r.recovery
    assert campaign.rounds[0].recovery["frames"] == 0, campaign.rounds[0].recovery
    return counts


def _acked_records_before(ledger: AckLedger, round_number: int) -> int:  # noqa: F811
    return sum(
        len(r.rids)
        for r in ledger.requests
        if r.outcome is Outcome.ACKED and r.round < round_number
    )


def _duplicates(counts: Counter[str]) -> int:
    return sum(c - 1 for c in counts.values() if c > 1)


def test_every_acknowledged_record_survives_sigkill_at_random_points(tmp_path: Path) -> None:
    started = time.monotonic()
    campaign = Campaign(
        data_dir=tmp_path / "data",
        env={**BASE_ENV, "OURIOS_SINK_FLUSH_BYTES": "4096"},
        seed=seed_from("SIGKILL_SEED"),
        kills=4,
        ack_window=(60, 500),
        senders=6,
    )
    campaign.run()
    counts = _check(campaign)
    print(
        f"duplicates: {_duplicates(counts)} extra copies of {len(counts)} distinct ids;"
        f" {time.monotonic() - started:.1f} s"
    )


def test_every_acknowledged_record_survives_sigkill_during_constant_flushes(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    campaign = Campaign(
        data_dir=tmp_path / "data",
        # The smallest flush size: every turn detaches a partition, so the publisher is
        # always mid-publish (encoding, writing a temp file, renaming) when the kill lands.
        env={**BASE_ENV, "OURIOS_SINK_FLUSH_BYTES": "1024"},
        seed=seed_from("SIGKILL_SEED"),
        kills=2,
        ack_window=(150, 400),
        senders=4,
        records_per_request=(4, 12),
    )
    campaign.run()
    counts = _check(campaign)
    for r in campaign.rounds[:-1]:
        # Objects were published during the round and partitions were still queued for
        # the publisher when the kill was sent: it landed amid publishing.
        assert r.new_objects and r.queue_depth_at_signal > 0, campaign.report(counts)
    print(
        f"duplicates: {_duplicates(counts)} extra copies of {len(counts)} distinct ids;"
        f" temp files left by kills: {[r.temps_after for r in campaign.rounds]};"
        f" {time.monotonic() - started:.1f} s"
    )

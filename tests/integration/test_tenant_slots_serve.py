"""RFC 0055 tenant slots against a real ``ourios serve`` (the wire, the gauges, and the
table seeded before any listener exists).

RFC 0055 §9.5: a batch for a tenant id the node does not hold, with ``max_tenants`` held, is
refused naming the tenant — 503 with a protobuf Status body and no Retry-After — while
a held tenant is admitted; the refusal is counted with ``error_type=wal_tenant_cap`` and
sets no latch; ``ourios_wal_tenants`` over its states sums to ``ourios_wal_tenants_limit``
with ``free`` at zero. After a restart the table is seeded from the tenants recovery
restored before the listeners start: the first request after ``server.listening`` —
a held tenant admitted at once, a new id at the limit refused — leaves no race window.
"""

from __future__ import annotations

from pathlib import Path

from google.rpc import status_pb2

from tests.support.noderig import bodies_request
from tests.support.scrape import scrape
from tests.support.serve import ServeProcess

ENV = {"OURIOS_WAL_MAX_TENANTS": "2", "OURIOS_WAL_BARRIER_SECS": "1"}


def body(tag: str) -> bytes:
    data: bytes = bodies_request(None, [f"hello {tag}"]).SerializeToString()
    return data


def post(serve: ServeProcess, tenant: str) -> tuple[int, bytes, dict[str, str]]:
    return serve.post_logs(body(tenant), {"X-Ourios-Tenant": tenant})


def test_rfc0055_9_5_tenant_capacity_on_the_wire_and_the_table_seeded_before_listeners(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with ServeProcess(data, ENV) as serve:
        assert post(serve, "alpha")[0] == 200
        assert post(serve, "beta")[0] == 200
        status, raw, headers = post(serve, "gamma")
        assert status == 503 and "retry-after" not in headers
        refusal = status_pb2.Status.FromString(raw)
        assert "'gamma'" in refusal.message and "2 of max_tenants=2" in refusal.message
        assert not refusal.details  # no RetryInfo
        assert post(serve, "alpha")[0] == 200  # held tenants are unaffected
        m = scrape(serve)
        held = m['ourios_wal_tenants{state="held"}']
        reserved = m['ourios_wal_tenants{state="reserved"}']
        free = m['ourios_wal_tenants{state="free"}']
        assert (held, reserved, free) == (2, 0, 0)
        assert held + reserved + free == m["ourios_wal_tenants_limit"] == 2
        refused = (
            "ourios_ingest_requests_total"
            '{error_type="wal_tenant_cap",outcome="refused",transport="http"}'
        )
        assert m[refused] == 1
        assert "ourios_barrier_failed_epoch" not in m  # no latch
        assert serve.terminate() == 0

    with ServeProcess(data, ENV) as again:
        # the very first requests after the listeners opened
        assert post(again, "gamma")[0] == 503
        assert post(again, "beta")[0] == 200
        m = scrape(again)
        assert m['ourios_wal_tenants{state="held"}'] == 2
        again.wait_turned()  # a stop before the turn leaves frames to the WAL (exit 75)
        assert again.terminate() == 0


def test_bounded_4_an_open_mode_client_cannot_take_every_tenant_slot(tmp_path: Path) -> None:
    """Issue 21 item 4: in open mode anyone may name any tenant, and no slot is ever
    freed, so one client naming new tenants as fast as it can must not take them all.
    With the shipped rate (server.open_new_tenants_per_minute, 60) it gets about a
    minute's worth; the rest are refused 503 with a Retry-After and nothing reserved,
    while tenants that hold a slot are served as before."""
    with ServeProcess(tmp_path / "data", {"OURIOS_WAL_BARRIER_SECS": "1"}) as serve:
        assert post(serve, "default")[0] == 200
        statuses: list[int] = []
        refusal: tuple[bytes, dict[str, str]] | None = None
        for i in range(150):
            status, raw, headers = post(serve, f"hostile-{i}")
            statuses.append(status)
            if status != 200 and refusal is None:
                refusal = raw, headers
        admitted = statuses.count(200)
        # the bucket holds 60 (one is "default"), refilled at one a second meanwhile
        assert 59 <= admitted < 100, statuses
        assert statuses.count(503) == 150 - admitted
        assert refusal is not None
        raw, headers = refusal
        assert int(headers["retry-after"]) >= 1
        message = status_pb2.Status.FromString(raw).message
        assert "server.open_new_tenants_per_minute=60" in message
        assert post(serve, "default")[0] == 200  # held tenants are unaffected
        m = scrape(serve)
        assert m['ourios_wal_tenants{state="reserved"}'] == 0
        assert m['ourios_wal_tenants{state="free"}'] >= 1024 - 100
        refused = (
            "ourios_ingest_requests_total"
            '{error_type="open_new_tenant_rate",outcome="refused",transport="http"}'
        )
        assert m[refused] == 150 - admitted
        assert serve.terminate() == 0
        (event,) = serve.event("tenant.open_rate_limited")  # one a minute at most
        assert event["per_minute"] == 60

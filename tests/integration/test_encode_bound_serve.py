"""Issue 23 item 6 against a real ``ourios serve``: a WAL rotation's cut publishes every
tenant's partition at once, and no more than ``server.encode_concurrency`` of their
Parquet encodes are ever in flight (``app.node.encode_dispatch``).

The node runs one worker, a 64 KiB segment, and no other cut (no barrier timer, no age
sweep, no size trigger), so the only publishes are the rotation cut's: its eight flush
lanes, 24 tenants' partitions. ``ourios_encode_jobs_in_flight_max`` is the most encodes
that were ever in flight at once; without the bound the lanes send theirs together (one
worker's job thread takes them one by one, the others queue on its channel) and it
reaches the lanes' count. The cut's publishes run paced (``server.encode_duty_percent``):
the slots they held rest after them, which ``ourios_encode_slot_rest_seconds_total``
sums.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.noderig import request
from tests.support.poll import poll_until
from tests.support.scrape import Scrape, scrape
from tests.support.serve import ServeProcess

TENANTS = 24
BOUND = 2

ENV = {
    "OURIOS_SERVER_WORKERS": "1",
    "OURIOS_SERVER_ENCODE_CONCURRENCY": str(BOUND),
    "OURIOS_WAL_SEGMENT_MAX_BYTES": str(64 * 1024),
    "OURIOS_WAL_BARRIER_SECS": "86400",
    "OURIOS_WAL_HOUSEKEEPING_SECS": "86400",
    "OURIOS_SINK_FLUSH_AGE_SECS": "86400",
    "OURIOS_SINK_FLUSH_BYTES": str(256 << 20),
}


def _post(node: ServeProcess, tenant: str, req: ExportLogsServiceRequest) -> None:
    status, body, _ = node.post_logs(req.SerializeToString(), {"X-Ourios-Tenant": tenant})
    assert status == 200, (status, body)


def _records_objects(s: Scrape) -> float:
    return s.total("ourios_sink_objects_total", kind="records")


def test_tail_6_a_rotation_cut_runs_no_more_encodes_than_the_setting(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "node", ENV) as node:
        # every tenant's rows buffered in the first segment, nothing published yet
        for t in range(TENANTS):
            _post(node, f"t{t:02d}", request(f"t{t}", 20))
        node.wait_turned()
        assert _records_objects(scrape(node)) == 0, node.tail()

        def rotated() -> Scrape | None:
            # one more large frame for the first tenant until a segment rotates and its
            # cut has published every tenant (a frame is never split: the segment
            # rotates at the append after the one that filled it)
            s = scrape(node)
            if _records_objects(s) >= TENANTS:
                return s
            _post(node, "t00", request("pad", 400))
            return None

        s = poll_until(
            "the rotation cut's publishes", rotated, deadline_s=120, detail=node.tail, every_s=0.2
        )
        assert s is not None
        assert s.value("ourios_encode_jobs_limit") == BOUND
        most = s.value("ourios_encode_jobs_in_flight_max")
        assert most is not None and 1 <= most <= BOUND, (most, s.text)
        # The cut's publishes ran paced (server.encode_duty_percent, 50 by default): the
        # slots they held rested after them, as long as they were held.
        rested = s.value("ourios_encode_slot_rest_seconds_total")
        assert rested is not None and rested > 0, s.text
        assert s.value("ourios_barrier_epoch") is not None

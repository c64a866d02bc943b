"""A frame that cannot be decoded at replay does not stop the node (issue 22 item 4,
DESIGN.md §6).

A real ``ourios serve`` takes load for two tenants and one batch whose bodies carry the
marker ``undecodable-`` (acknowledged: its frame is durable), and is SIGKILLed before
any cut, so the restart replays every frame. The restarted node decodes its replay on
two worker processes; a ``sitecustomize`` probe that only the workers load makes their
DECODE of that one payload fail — raise ``MemoryError`` (``raises``), or kill the worker
(``kills``) — on every attempt. What must happen:

* the node starts and finishes its recovery (``recovery.done``), every other frame
  replayed and published exactly once;
* the frame is isolated after ``wal.frame_decode_attempts`` (3) failures: one
  ``replay.frame_isolated`` names its tenant, segment file, byte offset, attempts and
  error, ``ourios_replay_frames_isolated_total`` is 1, ``recovery.done`` lists it;
* nothing acknowledged vanishes unnamed: the frame's payload is kept byte for byte
  where the event says (it decodes: the marked records are in it), and the node stops
  with exit 0 (the marked records are the only ones missing from the store).

Before, the ``MemoryError`` became a refusal that recovery turned into
``CorruptionError`` (the start failed), and a payload that killed its worker was sent
to the next one for ever, with no event.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.ackload import AckLedger, AckLoad, Outcome
from tests.support.crashrig import seed_from
from tests.support.noderig import request
from tests.support.parquet_read import read_kind
from tests.support.scrape import try_scrape
from tests.support.serve import ROOT, ServeProcess

TENANTS = ("acme", "globex")
MARKER = "undecodable-"
ENV = {
    # no cut before the kill (neither timed nor rotation-fired): the restart replays it all
    "OURIOS_WAL_BARRIER_SECS": "86400",
    "OURIOS_WAL_SEGMENT_MAX_BYTES": str(64 << 20),
    "OURIOS_SINK_FLUSH_AGE_SECS": "1",
    "OURIOS_WAL_FRAME_DECODE_ATTEMPTS": "3",
    "OURIOS_DISK_LOW_WATER_BYTES": "1",
    "OURIOS_DISK_STOP_WATER_BYTES": "0",
    "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "4",
    "OURIOS_SERVER_WORKERS": "0",
}

_PROBE = '''"""Probe for tests/crash/test_replay_decode_failure_serve.py (sitecustomize of the
workers of the node that test restarts): their replay DECODE of one payload fails."""
import os, sys

_mode = os.environ.get("DECODE_FAULT")
if _mode and "--channel-fd" in sys.argv:  # a worker, not the core
    # patched where the worker module (run as __main__ after this) imports it from
    import app.receive.otlp as _otlp

    # the worker's DECODE step: decode_flat (the native decoder, else upb + flatten)
    _decode = _otlp.decode_flat

    def _faulty(payload, tenant, limits=None):
        if b"undecodable-" in bytes(payload):
            if _mode == "kills":
                os._exit(137)
            raise MemoryError()
        return _decode(payload, tenant, limits)

    _otlp.decode_flat = _faulty
'''


def _metric(serve: ServeProcess, name: str) -> float | None:
    s = try_scrape(serve)
    return s.value(name) if s else None


@pytest.mark.parametrize("fault", ["raises", "kills"])
def test_every_state_4_a_frame_that_does_not_decode_at_replay_is_isolated_and_the_node_starts(
    fault: str, tmp_path: Path
) -> None:
    seed = seed_from("DECODE_SEED")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_PROBE)
    data = tmp_path / "data"
    ledger = AckLedger()

    # -- load, one marked batch among it, and a SIGKILL before any cut ---------------------
    first = ServeProcess(data, ENV).start()
    try:
        with AckLoad(ledger, first.http_port, senders=3, tenants=TENANTS, seed=seed) as load:
            load.wait_acked(40, timeout=60)
            marked = request(f"{MARKER}x", 4).SerializeToString()
            status, body, _ = first.post_logs(marked, {"X-Ourios-Tenant": "acme"})
            assert status == 200, (status, body)
            load.wait_acked(load.acked + 40, timeout=60)
            first.kill()
            load.join()
    finally:
        first.close()

    # -- the restart decodes its replay on workers that fail on that payload ---------------
    env = {
        **ENV,
        "OURIOS_SERVER_WORKERS": "2",
        "PYTHONPATH": f"{probe}{os.pathsep}{ROOT}",
        "DECODE_FAULT": fault,
    }
    second = ServeProcess(data, env).start()  # recovery.done: the start did not fail
    try:
        (isolated,) = second.event("replay.frame_isolated")
        assert isolated["level"] == "error" and isolated["tenant"] == "acme", isolated
        assert isolated["attempts"] == 3 and isolated["in_store"] is False, isolated
        assert re.fullmatch(r"\d{20}\.wal", isolated["segment"]), isolated
        segment = data / "wal" / isolated["segment"]
        assert isolated["offset"] < segment.stat().st_size, isolated
        if fault == "raises":
            assert "MemoryError" in isolated["error"], isolated
        else:
            assert "died" in isolated["error"], isolated
        (done,) = second.event("recovery.done")
        assert done["frames_isolated"] == 1 and done["isolated"] == {
            isolated["frame"]: isolated["error"]
        }, done
        assert _metric(second, "ourios_replay_frames_isolated_total") == 1.0
        kept = ExportLogsServiceRequest.FromString(Path(isolated["saved"]).read_bytes())
        rids = {
            a.value.string_value
            for rl in kept.resource_logs
            for sl in rl.scope_logs
            for rec in sl.log_records
            for a in rec.attributes
            if a.key == "rid"
        }
        assert rids == {f"{MARKER}x/{i}" for i in range(4)}, rids
        assert Path(isolated["saved"]).with_suffix(".json").exists()
        assert second.terminate() == 0, second.tail(40)
    finally:
        second.close()

    # -- every other acknowledged record is in the store, once ----------------------------
    rows = read_kind(data / "objects", "records", "pyarrow")
    counts = Counter(r["attributes"]["rid"] for r in rows)
    assert not [rid for rid, n in counts.items() if n > 1], "published more than once"
    missing = sorted(ledger.rids(Outcome.ACKED) - counts.keys())
    assert ledger.rids(Outcome.ACKED) and not missing, f"acknowledged and lost: {missing[:10]}"
    assert not [rid for rid in counts if MARKER in rid]  # the isolated frame's, named above

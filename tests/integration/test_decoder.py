"""The OTLP decoder a real ``ourios serve`` uses (``server.decoder``, app/receive/native.py):
the native extension by default; the upb path, said loudly, when the extension cannot be
imported (a ``sitecustomize`` on ``PYTHONPATH`` makes the import fail in the core and in
its workers alike, as a missing or broken build would).

Each node runs one worker, so both processes' start-up choice is seen: the
``receive.decoder`` event (a warning on the upb path), ``ourios_build_info``, and a
protobuf request acknowledged and decoded either way.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from tests.support.scrape import scrape
from tests.support.serve import ROOT, ServeProcess

ENV = {"OURIOS_SERVER_WORKERS": "1", "OURIOS_SERVER_SHUTDOWN_GRACE_SECS": "5"}

#: Installed first thing in every interpreter that has it on its path: the extension's
#: import raises, as it does when the build is missing or does not load.
_BLOCK_EXTENSION = """
import sys

class _NoNativeDecoder:
    def find_spec(self, name, path=None, target=None):
        if name == "app.receive._otlpdecode":
            raise ImportError("blocked by the test's sitecustomize")
        return None

sys.meta_path.insert(0, _NoNativeDecoder())
"""


def _request() -> bytes:
    record = logs_pb2.LogRecord(
        body=common_pb2.AnyValue(string_value="decoded"),
        attributes=[common_pb2.KeyValue(key="n", value=common_pb2.AnyValue(double_value=0.5))],
    )
    req = ExportLogsServiceRequest(
        resource_logs=[
            logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=[record] * 3)])
        ]
    )
    return bytes(req.SerializeToString())


def _build_info(node: ServeProcess) -> list[tuple[str, str]]:
    return [
        (s.labels["decoder"], s.labels["version"])
        for s in scrape(node).samples("ourios_build_info")
        if s.value == 1.0
    ]


def _ingested(node: ServeProcess) -> float:
    found = scrape(node).value("ourios_ingest_records_total", outcome="ok", transport="http")
    return found or 0.0


def test_native_2_serve_decodes_natively_by_default(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "data", ENV) as node:
        chosen = node.event("receive.decoder")
        assert len(chosen) == 2, node.tail()  # the core and its worker
        assert all(e["decoder"] == "native" and e["level"] == "info" for e in chosen)
        assert {e.get("worker") for e in chosen} == {None, 0}
        assert [decoder for decoder, _ in _build_info(node)] == ["native"]
        status, _, _ = node.post_logs(_request())
        assert status == 200
        assert _ingested(node) == 3


def test_native_2_serve_without_the_extension_runs_on_upb_and_says_so(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_BLOCK_EXTENSION, encoding="utf-8")
    env = {**ENV, "PYTHONPATH": f"{shim}:{ROOT}"}
    with ServeProcess(tmp_path / "data", env) as node:
        chosen = node.event("receive.decoder")
        assert len(chosen) == 2, node.tail()
        for event in chosen:
            assert event["level"] == "warning"
            assert event["decoder"] == "upb" and event["wanted"] == "native"
            assert "cannot be imported" in event["reason"]
            assert "blocked by the test's sitecustomize" in event["reason"]
        (info,) = _build_info(node)
        assert info[0] == "upb"
        status, _, _ = node.post_logs(_request())
        assert status == 200
        assert _ingested(node) == 3

"""The decode-only ceiling: the ingest server's HTTP stack with none of its work.

The same stack as ``ourios serve`` (FastAPI on uvicorn, uvloop + httptools, lifespan
off, access log off, a pre-bound socket) serving ``POST /v1/logs``: read the body,
check the tenant header (``parse_tenant``), ``app.receive.otlp.decompress`` the body, parse
and validate it with ``app.receive.otlp.decode_request``, and answer 200 with an empty
``ExportLogsServiceResponse``. No WAL, no mining, no publishing — what the issue calls
"parses the request and returns 200". So the ratio ``ourios serve`` / ceiling says how
much of the stack's capacity the node's own work (WAL append + fsync, flatten,
mining, buffering) leaves for records.

``flatten`` is *not* part of the ceiling: turning the protobuf into record columns is
the node's work, not parsing (and, measured, costs about 7× ``decode_request`` for
100-record requests), so it belongs on the node's side of the ratio. ``--work
flatten`` adds it, for an informational second ceiling; ``--work null`` only reads
the body, which measures the stack (and the load generator) alone.

Run as a subprocess; it prints one JSON line on stdout once it listens::

    .venv/bin/python -m soak.bench.ceiling_server --port 0
    {"event": "ceiling.listening", "port": 43117, "work": "decode"}

SIGTERM or SIGINT stop it (uvicorn's handlers).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Final, Literal

if __package__ in (None, ""):  # run as a file: make `app` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvicorn
from fastapi import FastAPI
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from starlette.requests import Request
from starlette.responses import Response

from app.base.rejections import IngestRejection
from app.receive.otlp import decode_request, decompress, flatten, parse_tenant, status_body

Work = Literal["null", "decode", "flatten"]
WORKS: Final[tuple[Work, ...]] = ("null", "decode", "flatten")

#: The node's default OURIOS_WAL_MAX_FRAME_BYTES, as the decompression limit.
MAX_BODY_BYTES: Final = 8 * 1024 * 1024
PROTOBUF: Final = "application/x-protobuf"
_EMPTY_RESPONSE: Final = ExportLogsServiceResponse().SerializeToString()


def create_app(work: Work = "decode") -> FastAPI:
    """The ceiling's app: `POST /v1/logs` doing `work`, `GET /readyz` answering 200."""
    if work not in WORKS:
        raise ValueError(f"work {work!r}: expected one of {', '.join(WORKS)}")

    # An async Starlette route on the FastAPI app, as `app.receive.otlp_http` registers
    # its routes (no dependency solving). The parse runs on the event loop, not in
    # the node's worker thread: a ceiling should be the cheapest way to parse, so the
    # thread hop is counted as the node's cost.
    async def export_logs(request: Request) -> Response:
        body = await request.body()
        if work != "null":
            headers = request.headers
            try:
                tenant = parse_tenant(headers.get("x-ourios-tenant"), True)
                data = decompress(body, headers.get("content-encoding"), MAX_BODY_BYTES)
                req = decode_request(data, headers.get("content-type", ""))
                if work == "flatten":
                    flatten(req, tenant)
            except IngestRejection as exc:
                content, media_type = status_body(exc, json=False)
                return Response(content, status_code=exc.http_status, media_type=media_type)
        return Response(_EMPTY_RESPONSE, media_type=PROTOBUF)

    async def readyz(request: Request) -> Response:
        return Response(b"ready\n", media_type="text/plain")

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_route("/v1/logs", export_logs, methods=["POST"], include_in_schema=False)
    app.add_route("/readyz", readyz, methods=["GET"], include_in_schema=False)
    return app


def serve(host: str, port: int, work: Work) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    config = uvicorn.Config(
        create_app(work),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
    )
    server = uvicorn.Server(config)
    # Bound before the line is printed, so a client that read it can connect at once.
    print(
        json.dumps({"event": "ceiling.listening", "port": sock.getsockname()[1], "work": work}),
        flush=True,
    )
    server.run(sockets=[sock])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OTLP/HTTP decode-only ceiling server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--work", choices=WORKS, default="decode")
    args = parser.parse_args(argv)
    return serve(args.host, args.port, args.work)


if __name__ == "__main__":
    sys.exit(main())

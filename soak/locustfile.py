"""The soak load: OTLP/HTTP protobuf batches from many tenants, every record ledgered.

Run by ``python -m soak run`` (as a subprocess) or by hand::

    locust -f soak/locustfile.py --headless -u 8 -r 8 --run-time 10m \\
        --host http://127.0.0.1:4318 --soak-rate 20 --soak-batch 50 --soak-tenants 16 \\
        --soak-ledger-dir out/ledger

Each user is a ``FastHttpUser`` (geventhttpclient: one keep-alive connection per user,
no retries). Bodies come from ``soak.bench.loadgen.build_pool`` (realistic service logs,
built once per process from the seed); each request takes the next pool entry, stamps
every record with a unique ``soak.id`` attribute (``soak.ledger`` gives the id scheme)
and is sent as a tenant drawn from the user's seeded RNG. The ledger line ``S`` is
written before the request, ``A`` after a complete 2xx, ``R`` after another status,
``E`` when there is no complete response; a 2xx whose body could not be read is an
``E``, since the client cannot prove what it saw.

Pacing: ``--soak-rate`` requests/s in total, split evenly over the users
(``constant_throughput``), so the offered load is fixed and a node that is down or slow
shows as errors and latency rather than as a lower rate. ``--soak-rate 0`` is closed
loop. After a connection error a user waits ``ERROR_BACKOFF_S`` before its next
request (a refused connect returns at once; without it a closed-loop user would spin
while the node restarts).

Every option also reads an environment variable (``SOAK_RATE``, ``SOAK_BATCH``,
``SOAK_TENANTS``, ``SOAK_SEED``, ``SOAK_RUN_ID``, ``SOAK_LEDGER_DIR``, ``SOAK_POOL``,
``SOAK_TOKEN``), which is how the Kubernetes Job sets them.
"""

from __future__ import annotations

import os
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Final

# locust puts this file's directory on sys.path, not the repository root, and
# soak.bench.loadgen lives there; PYTHONPATH set by the harness or the image also works.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from locust import FastHttpUser, events, task  # noqa: E402
from locust.contrib.fasthttp import LocustBadStatusCode  # noqa: E402
from locust.env import Environment  # noqa: E402
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
)

from soak.bench.loadgen import RequestPool, build_pool  # noqa: E402
from soak.ledger import ID_ATTRIBUTE, LedgerWriter, record_id  # noqa: E402

OTLP_PATH: Final = "/v1/logs"
ERROR_BACKOFF_S: Final = 0.2


# locust's EventHook.add_listener is unannotated, so mypy calls the decorator untyped.
@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any) -> None:
    group = parser.add_argument_group("ourios soak")
    group.add_argument(
        "--soak-rate",
        type=float,
        env_var="SOAK_RATE",
        default=20.0,
        help="requests/s over all users (0: closed loop)",
    )
    group.add_argument(
        "--soak-batch", type=int, env_var="SOAK_BATCH", default=50, help="records per request"
    )
    group.add_argument(
        "--soak-tenants", type=int, env_var="SOAK_TENANTS", default=16, help="tenant count"
    )
    group.add_argument("--soak-seed", type=int, env_var="SOAK_SEED", default=1)
    group.add_argument(
        "--soak-run-id",
        env_var="SOAK_RUN_ID",
        default="",
        help="prefix of every request id (default: random per process)",
    )
    group.add_argument(
        "--soak-ledger-dir", env_var="SOAK_LEDGER_DIR", default="soak-ledger", help="ledger dir"
    )
    group.add_argument(
        "--soak-pool", type=int, env_var="SOAK_POOL", default=64, help="distinct bodies"
    )
    group.add_argument(
        "--soak-token", env_var="SOAK_TOKEN", default="", help="Authorization: Bearer TOKEN"
    )


def tenant_names(count: int) -> tuple[str, ...]:
    if count < 1:
        raise ValueError(f"--soak-tenants {count}: must be ≥ 1")
    return tuple(f"tenant-{i:03d}" for i in range(count))


def stamp(template: ExportLogsServiceRequest, request: str) -> tuple[int, bytes]:
    """A copy of ``template`` with ``soak.id = <request>.<i>`` on its i-th record; returns
    the record count and the serialised body."""
    message = ExportLogsServiceRequest()
    message.CopyFrom(template)
    index = 0
    for resource_logs in message.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                kv = record.attributes.add()
                kv.key = ID_ATTRIBUTE
                kv.value.string_value = record_id(request, index)
                index += 1
    return index, message.SerializeToString()


class _Process:
    """What the users of one locust process share: options, the pool, the ledger."""

    def __init__(self, environment: Environment) -> None:
        options = environment.parsed_options
        self.rate = float(getattr(options, "soak_rate", 20.0))
        self.users = max(1, int(getattr(options, "num_users", 1) or 1))
        self.tenants = tenant_names(int(getattr(options, "soak_tenants", 16)))
        self.seed = int(getattr(options, "soak_seed", 1))
        self.token = str(getattr(options, "soak_token", "") or "")
        run_id = str(getattr(options, "soak_run_id", "") or "") or secrets.token_hex(4)
        runner = environment.runner
        worker_index = getattr(runner, "worker_index", 0) if runner is not None else 0
        self.worker = f"w{worker_index}p{os.getpid()}"
        self.prefix = f"{run_id}.{self.worker}"
        self.pool: RequestPool = build_pool(
            count=int(getattr(options, "soak_pool", 64)),
            records_per_request=int(getattr(options, "soak_batch", 50)),
            tenants=self.tenants,
            seed=self.seed,
        )
        self.ledger = LedgerWriter(
            Path(str(getattr(options, "soak_ledger_dir", "soak-ledger"))), self.worker
        )
        self.next_user = 0

    def close(self) -> None:
        self.ledger.close()


_shared: _Process | None = None


def _process(environment: Environment) -> _Process:
    global _shared  # one per locust process, created by its first user
    if _shared is None:
        _shared = _Process(environment)
    return _shared


@events.quitting.add_listener  # type: ignore[untyped-decorator]  # unannotated, as above
def _close_ledger(**_: Any) -> None:
    if _shared is not None:
        _shared.close()


class OtlpUser(FastHttpUser):
    """One OTLP/HTTP client connection (module docstring)."""

    network_timeout = 30.0
    connection_timeout = 5.0
    max_retries = 0

    def on_start(self) -> None:
        shared = _process(self.environment)
        self.shared = shared
        self.number = shared.next_user
        shared.next_user += 1
        self.rng = random.Random(f"{shared.seed}:{shared.worker}:{self.number}")
        self.seq = 0
        self.offset = self.rng.randrange(len(shared.pool))
        self.backoff = False
        self.started = time.perf_counter()
        self.headers = {"Content-Type": "application/x-protobuf"}
        if shared.token:
            self.headers["Authorization"] = f"Bearer {shared.token}"

    def wait_time(self) -> float:
        """Open loop: the rest of this user's period of users/rate seconds (locust's
        ``constant_throughput``), or the error back-off."""
        if self.backoff:
            return ERROR_BACKOFF_S
        if self.shared.rate <= 0:
            return 0.0
        period = self.shared.users / self.shared.rate
        return max(0.0, period - (time.perf_counter() - self.started))

    @task
    def export(self) -> None:
        shared = self.shared
        self.seq += 1
        self.started = started = time.perf_counter()
        request = f"{shared.prefix}.{self.number}.{self.seq}"
        template = shared.pool.messages[(self.offset + self.seq) % len(shared.pool)]
        tenant = self.rng.choice(shared.tenants)
        records, body = stamp(template, request)
        shared.ledger.sent(request, records, tenant)
        headers = {**self.headers, "X-Ourios-Tenant": tenant}
        with self.client.post(
            OTLP_PATH,
            # locust annotates data as str | dict, but sends bytes as they are (its docstring:
            # "String/bytes to send in the body"); the body is binary protobuf
            data=body,  # type: ignore[arg-type]
            headers=headers,
            catch_response=True,
            name="/v1/logs",
        ) as response:
            latency_ms = (time.perf_counter() - started) * 1000
            status = int(response.status_code or 0)
            # A status outside the client's "valid" codes arrives as LocustBadStatusCode
            # on a complete response; a body that could not be read (even of a 2xx) as
            # an exception in request_meta.
            error = getattr(response, "error", None)
            if isinstance(error, LocustBadStatusCode):
                error = None
            error = error or response.request_meta.get("exception")
            if status == 0 or error is not None:
                shared.ledger.error(request, repr(error) if error else "no response")
                response.failure(f"no complete response: {error!r}")
                self.backoff = True
            elif 200 <= status < 300:
                shared.ledger.acked(request, status, latency_ms)
                response.success()
                self.backoff = False
            else:
                shared.ledger.refused(request, status)
                response.failure(f"HTTP {status}")
                self.backoff = status == 503

"""What one receiving process holds at once: the in-flight bound (DESIGN.md §7).

Every ``POST /v1/logs`` and ``Export`` takes a `Ticket` from the process's one
`InflightBudget` after authentication and before any byte of its body is read or
inflated, and returns it when answered. The ticket counts one request and the body
bytes the request holds:

- HTTP: the declared ``Content-Length`` (or the raw cap when there is none) before the
  read, then what was read; each step of gzip inflation grows it before the next step
  runs (``app.receive.otlp.decompress``), so inflating stops at the budget;
- gRPC: the largest message grpcio may hand over (``wal.max_frame_bytes`` + 64 KiB)
  before the message is received, then the message's size.

Large bodies — a ticket holding over `SMALL_BYTES` at any moment, which includes
every gRPC call until its message is received — may hold at most three quarters of the
bytes together (`LARGE_SHARE`): the last quarter is kept for small requests, so a flood
of maximal bodies cannot refuse the ordinary small batches of other clients.

Beyond ``server.max_inflight_requests`` or ``server.max_inflight_bytes`` the request is
refused at once with `Overloaded`: HTTP 503 / gRPC RESOURCE_EXHAUSTED with a one-second
Retry-After (RetryInfo), which OTLP clients retry. The refusal names the bound; at most
one ``receiver.inflight_limit`` event a minute says how many were refused since the last.

The decode slots (``server.max_concurrent_decodes``) bound the requests parsed and
flattened at once — the step whose memory is a multiple of the body — shared by both
transports; a request waits for a slot while holding its ticket.

Thread-safe: the HTTP event loop, its worker threads and the gRPC handler threads share
one budget.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import grpc

from app.base.rejections import IngestRejection
from app.receive.otlp import RequestLimits

if TYPE_CHECKING:
    from app.base.config import Settings

__all__ = [
    "RETRY_AFTER_S",
    "BodyTimeout",
    "InflightBudget",
    "Overloaded",
    "ReceiverBounds",
    "Ticket",
    "default_bounds",
    "receiver_bounds",
]

#: The Retry-After of an in-flight refusal: a request in flight takes about this long.
RETRY_AFTER_S: Final = 1
#: At most one ``receiver.inflight_limit`` event per this many seconds.
EVENT_EVERY_S: Final = 60.0
#: A ticket holding more than this is a large body (module docstring).
SMALL_BYTES: Final = 1 << 20
#: The share of ``max_inflight_bytes`` large bodies may hold together.
LARGE_SHARE: Final = 0.75

Events = Callable[[str, Mapping[str, object]], None]


class Overloaded(IngestRejection):
    """The process's in-flight bound is reached: retry shortly. ``error_type`` names the
    bound (``max_inflight_requests`` or ``max_inflight_bytes``)."""

    http_status = 503
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, bound: str, message: str) -> None:
        super().__init__(message, retry_after=RETRY_AFTER_S, error_type=bound)


class BodyTimeout(IngestRejection):
    """The body was not received within ``server.body_read_timeout_secs``. HTTP 408;
    a gRPC call is cancelled instead (CANCELLED, which OTLP clients retry)."""

    http_status = 408
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    error_type = "body_read_timeout"

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"the request body was not received within server.body_read_timeout_secs={timeout:g} s"
        )


class Ticket:
    """One request's share of the budget; `release` is idempotent."""

    __slots__ = ("_budget", "held", "large")

    def __init__(self, budget: InflightBudget, held: int) -> None:
        self._budget = budget
        self.held = held
        #: held more than SMALL_BYTES at some point: counted in the large share since
        self.large = held > SMALL_BYTES

    def grow(self, more: int) -> None:
        """Hold `more` bytes too, or raise `Overloaded` (holding what it held)."""
        self._budget._resize(self, self.held + more)

    def resize(self, size: int) -> None:
        """Hold exactly `size` bytes (a shrink always succeeds)."""
        self._budget._resize(self, size)

    def release(self) -> None:
        self._budget._release(self)


class InflightBudget:
    """The bound on requests and body bytes in flight in one process (module docstring)."""

    def __init__(
        self,
        max_requests: int,
        max_bytes: int,
        decodes: int = 2,
        *,
        events: Events | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("max_requests", max_requests), ("max_bytes", max_bytes)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if decodes < 1:
            raise ValueError(f"decodes must be >= 1, got {decodes}")
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.decodes = decodes
        self._slots = threading.BoundedSemaphore(decodes)
        self._lock = threading.Lock()
        self._events = events
        self._clock = clock
        self.requests = 0
        self.bytes = 0
        #: what large tickets hold (module docstring)
        self.large_bytes = 0
        self.max_large_bytes = int(max_bytes * LARGE_SHARE)
        #: refusals by bound since the process started (tests, the event)
        self.refused: dict[str, int] = {}
        self._refused_since_event = 0
        self._last_event: float | None = None

    def take(self, size: int) -> Ticket:
        """A ticket for one request holding `size` bytes, or `Overloaded`."""
        with self._lock:
            if self.requests >= self.max_requests:
                refusal = Overloaded(
                    "max_inflight_requests",
                    f"{self.requests} requests are in flight in this process, at "
                    f"server.max_inflight_requests={self.max_requests}; retry in "
                    f"{RETRY_AFTER_S} s",
                )
            elif self.bytes + size > self.max_bytes:
                refusal = self._over_bytes(size)
            elif size > SMALL_BYTES and self.large_bytes + size > self.max_large_bytes:
                refusal = self._over_large(size)
            else:
                self.requests += 1
                self.bytes += size
                ticket = Ticket(self, size)
                if ticket.large:
                    self.large_bytes += size
                return ticket
            event = self._count_locked(refusal)
        self._emit(event)
        raise refusal

    def _resize(self, ticket: Ticket, size: int) -> None:
        with self._lock:
            if ticket.held < 0:
                raise RuntimeError("the ticket was released")
            more = size - ticket.held
            large = ticket.large or size > SMALL_BYTES
            large_more = size - (ticket.held if ticket.large else 0) if large else 0
            if more > 0 and self.bytes + more > self.max_bytes:
                refusal = self._over_bytes(more)
            elif large_more > 0 and self.large_bytes + large_more > self.max_large_bytes:
                refusal = self._over_large(large_more)
            else:
                self.bytes += more
                self.large_bytes += large_more
                ticket.held = size
                ticket.large = large
                return
            event = self._count_locked(refusal)
        self._emit(event)
        raise refusal

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.held < 0:
                return
            self.bytes -= ticket.held
            if ticket.large:
                self.large_bytes -= ticket.held
            self.requests -= 1
            ticket.held = -1

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """A decode slot, waited for (in a thread, never on an event loop)."""
        with self._slots:
            yield

    def _over_bytes(self, more: int) -> Overloaded:
        return Overloaded(
            "max_inflight_bytes",
            f"{self.bytes} bytes of request bodies are in flight in this process and "
            f"{more} more would pass server.max_inflight_bytes={self.max_bytes}; retry in "
            f"{RETRY_AFTER_S} s",
        )

    def _over_large(self, more: int) -> Overloaded:
        return Overloaded(
            "max_inflight_bytes",
            f"{self.large_bytes} bytes of bodies over {SMALL_BYTES} bytes are in flight in "
            f"this process and {more} more would pass their share, {self.max_large_bytes} "
            f"of server.max_inflight_bytes={self.max_bytes} (the rest is kept for small "
            f"requests); retry in {RETRY_AFTER_S} s",
        )

    def _count_locked(self, refusal: Overloaded) -> dict[str, object] | None:
        """Count a refusal; the event's fields when one is due (at most one a minute)."""
        self.refused[refusal.error_type] = self.refused.get(refusal.error_type, 0) + 1
        self._refused_since_event += 1
        now = self._clock()
        if self._last_event is not None and now - self._last_event < EVENT_EVERY_S:
            return None
        self._last_event = now
        fields: dict[str, object] = {
            "bound": f"server.{refusal.error_type}",
            "refused_since_last_event": self._refused_since_event,
            "inflight_requests": self.requests,
            "inflight_bytes": self.bytes,
            "max_inflight_requests": self.max_requests,
            "max_inflight_bytes": self.max_bytes,
            "action": "refusing new requests with 503 / RESOURCE_EXHAUSTED and a "
            f"{RETRY_AFTER_S} s Retry-After until requests in flight finish",
        }
        self._refused_since_event = 0
        return fields

    def _emit(self, fields: dict[str, object] | None) -> None:
        if fields is not None and self._events is not None:
            self._events("receiver.inflight_limit", fields)


class ReceiverBounds:
    """What the receivers of one process are configured with (``server.*``)."""

    __slots__ = ("body_read_timeout", "budget", "grpc_max_concurrent_rpcs", "limits")

    def __init__(
        self,
        limits: RequestLimits,
        budget: InflightBudget,
        body_read_timeout: float,
        grpc_max_concurrent_rpcs: int,
    ) -> None:
        self.limits = limits
        self.budget = budget
        self.body_read_timeout = body_read_timeout
        self.grpc_max_concurrent_rpcs = grpc_max_concurrent_rpcs


def receiver_bounds(settings: Settings, events: Events | None = None) -> ReceiverBounds:
    """The bounds the ``server`` settings name, with one budget for both transports."""
    server = settings.server
    return ReceiverBounds(
        RequestLimits(
            records=server.max_request_records,
            attributes_per_record=server.max_attributes_per_record,
            attributes_per_request=server.max_attributes_per_request,
            key_bytes=server.max_attribute_key_bytes,
            value_bytes=server.max_attribute_value_bytes,
            expanded_bytes=server.max_expanded_bytes,
        ),
        InflightBudget(
            server.max_inflight_requests,
            server.max_inflight_bytes,
            server.max_concurrent_decodes,
            events=events,
        ),
        float(server.body_read_timeout_secs),
        server.grpc_max_concurrent_rpcs,
    )


def default_bounds(max_frame_bytes: int) -> ReceiverBounds:
    """The settings' defaults, for receivers built without settings (tests, tools); the
    byte budget always holds one largest coded body and what it inflates to within the
    large bodies' share (the settings' rule)."""
    return ReceiverBounds(
        RequestLimits(),
        InflightBudget(256, max(64 << 20, 3 * max_frame_bytes + (2 << 20)), 2),
        30.0,
        256,
    )

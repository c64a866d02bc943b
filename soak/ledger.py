"""The ack ledger: what the load generator sent and what the node acknowledged.

Format (version 1). One UTF-8 text file per load worker process,
``<dir>/<worker>.ledger``, opened for append and line-buffered, so every line is in the
kernel as soon as it is written: a SIGKILLed locust, a stopped locust or a killed node
leaves a ledger that reads back completely except, at worst, one torn last line. Lines
are tab-separated; the first field is the kind:

``# soak-ledger 1 <worker> <unix-time>``
    header, once per open (a restarted worker appends a second header; harmless).
``# soak-ledger-end <worker> <unix-time>``
    written by ``close()``: the worker has stopped and wrote everything it will. The
    Kubernetes verifier Job waits for it (``LedgerIndex.ended``), since it runs beside
    the soak Job instead of after it.
``S <request> <records> <tenant> <unix-time>``
    written *before* the request leaves the client: the ids ``<request>.0`` …
    ``<request>.<records-1>`` may now exist in the store.
``A <request> <status> <unix-time> <latency-ms>``
    a complete 2xx response was read: the node promised these records.
``R <request> <status> <unix-time>``
    a complete non-2xx response: the records may or may not be in the store.
``E <request> 0 <unix-time> <detail>``
    no complete response (refused connection, reset, timeout, the node was killed):
    the records may or may not be in the store.

A request with an ``S`` line and no outcome line was in flight when the worker stopped;
it counts as unknown. A record id (the ``soak.id`` attribute on every record) is
``<request>.<index>``; a request id is ``<run>.<worker>.<user>.<seq>``, unique across
every worker and restart of a run because ``<worker>`` carries the process id and the
run id is fresh per run.

The invariant the verifier checks: every id of an ``A`` request is in the store, and no
id in the store lacks an ``S`` line. A torn last line is ignored and counted: a torn
``A`` line only makes the check weaker for that one request, never wrong.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

__all__ = [
    "ID_ATTRIBUTE",
    "LEDGER_SUFFIX",
    "LedgerIndex",
    "LedgerWriter",
    "Outcome",
    "RequestEntry",
    "read_ledgers",
    "record_id",
]

#: The log-record attribute carrying the record's unique id.
ID_ATTRIBUTE: Final = "soak.id"
LEDGER_SUFFIX: Final = ".ledger"
_VERSION: Final = "1"


class Outcome(enum.Enum):
    """A request's fate as far as the client knows. Starts at 1, so zeroed bytes never read
    as an outcome."""

    ACKED = 1
    REFUSED = 2
    ERROR = 3
    IN_FLIGHT = 4  # sent, no outcome line: the worker stopped or was killed first


_KIND_OUTCOME: Final = {"A": Outcome.ACKED, "R": Outcome.REFUSED, "E": Outcome.ERROR}


def record_id(request: str, index: int) -> str:
    return f"{request}.{index}"


def _clean(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


class LedgerWriter:
    """Appends one worker's lines. Not thread-safe: one writer per process, and locust's
    greenlets never switch inside ``write`` of a regular file."""

    def __init__(self, directory: Path, worker: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.path = directory / f"{worker}{LEDGER_SUFFIX}"
        # buffering=1: line-buffered, every line is flushed to the kernel when written.
        self._file: TextIO | None = self.path.open("a", encoding="utf-8", buffering=1)
        self._write(f"# soak-ledger {_VERSION} {worker} {time.time():.3f}")

    def _write(self, line: str) -> None:
        if self._file is None:
            raise RuntimeError(f"ledger {self.path} is closed")
        self._file.write(line + "\n")

    def sent(self, request: str, records: int, tenant: str) -> None:
        self._write(f"S\t{request}\t{records}\t{_clean(tenant)}\t{time.time():.3f}")

    def acked(self, request: str, status: int, latency_ms: float) -> None:
        self._write(f"A\t{request}\t{status}\t{time.time():.3f}\t{latency_ms:.1f}")

    def refused(self, request: str, status: int) -> None:
        self._write(f"R\t{request}\t{status}\t{time.time():.3f}")

    def error(self, request: str, detail: str) -> None:
        self._write(f"E\t{request}\t0\t{time.time():.3f}\t{_clean(detail)[:200]}")

    def close(self) -> None:
        if self._file is not None:
            self._write(f"# soak-ledger-end {self.worker} {time.time():.3f}")
            self._file.close()
            self._file = None

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class RequestEntry:
    records: int
    tenant: str
    sent_at: float
    outcome: Outcome = Outcome.IN_FLIGHT
    status: int = 0
    done_at: float | None = None
    latency_ms: float | None = None  # A lines: send → complete response, client side


@dataclass
class LedgerIndex:
    """Every request of every ledger file, by request id."""

    requests: dict[str, RequestEntry] = field(default_factory=dict)
    files: int = 0
    #: Files whose last header is followed by an end line (the worker closed it).
    files_ended: int = 0
    torn_lines: int = 0
    #: Lines that parse but break the format: an outcome without an ``S`` line, a second
    #: outcome for one request, a repeated ``S``. Any is a harness bug worth seeing.
    anomalies: list[str] = field(default_factory=list)

    def requests_with(self, *outcomes: Outcome) -> Iterator[tuple[str, RequestEntry]]:
        wanted = set(outcomes)
        return ((r, e) for r, e in self.requests.items() if e.outcome in wanted)

    def record_counts(self) -> Counter[Outcome]:
        """Records (not requests) by outcome."""
        counts: Counter[Outcome] = Counter()
        for entry in self.requests.values():
            counts[entry.outcome] += entry.records
        return counts

    @property
    def ended(self) -> bool:
        """At least one ledger, and every ledger closed by its worker."""
        return self.files > 0 and self.files_ended == self.files

    @property
    def sent_records(self) -> int:
        return sum(e.records for e in self.requests.values())

    def acks(self) -> list[tuple[float, int, float | None]]:
        """``(time, records, latency_ms)`` of every acknowledged request, by time."""
        return sorted(
            (
                (e.done_at, e.records, e.latency_ms)
                for e in self.requests.values()
                if e.outcome is Outcome.ACKED and e.done_at is not None
            ),
            key=lambda ack: ack[0],
        )

    def add_lines(self, lines: Iterable[str], source: str) -> None:
        for number, line in enumerate(lines, 1):
            self._add(line, f"{source}:{number}")

    def _add(self, line: str, where: str) -> None:
        if not line or line.startswith("#"):
            return
        parts = line.split("\t")
        kind = parts[0]
        try:
            if kind == "S" and len(parts) >= 5:
                request = parts[1]
                if request in self.requests:
                    self.anomalies.append(f"{where}: request {request} sent twice")
                    return
                self.requests[request] = RequestEntry(int(parts[2]), parts[3], float(parts[4]))
                return
            outcome = _KIND_OUTCOME.get(kind)
            if outcome is not None and len(parts) >= 4:
                entry = self.requests.get(parts[1])
                if entry is None:
                    self.anomalies.append(f"{where}: outcome {kind} for unsent {parts[1]}")
                elif entry.outcome is not Outcome.IN_FLIGHT:
                    self.anomalies.append(f"{where}: second outcome {kind} for {parts[1]}")
                else:
                    entry.outcome = outcome
                    entry.status = int(parts[2])
                    entry.done_at = float(parts[3])
                    if outcome is Outcome.ACKED and len(parts) >= 5:
                        entry.latency_ms = float(parts[4])
                return
        except ValueError:
            pass
        self.anomalies.append(f"{where}: unreadable line {line[:80]!r}")


def read_ledgers(directory: Path) -> LedgerIndex:
    """All ``*.ledger`` files under ``directory`` (recursively), torn last lines skipped."""
    index = LedgerIndex()
    for path in sorted(directory.rglob(f"*{LEDGER_SUFFIX}")):
        index.files += 1
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        # A complete file ends with "\n", leaving "" last; anything else is a torn line.
        if lines[-1]:
            index.torn_lines += 1
        index.add_lines(lines[:-1], str(path))
        comments = [line for line in lines[:-1] if line.startswith("# soak-ledger")]
        if comments and comments[-1].startswith("# soak-ledger-end "):
            index.files_ended += 1
    return index

"""The sampler: scrape the node's ``/metrics`` every few seconds into a JSONL series.

One JSON object per line, appended and flushed per scrape (a killed harness leaves a
readable file). A scrape that answered::

    {"t": 1796167250.1, "up": true, "wal_segments": 4, "wal_disk_bytes": 8809618,
     "wal_unreclaimed_bytes": 78850, "wal_checkpoint_lsn": 1048576, ...,
     "ingest_requests": {"ok": 120, "error": 3}, "ingest_records": {"ok": 6000},
     "ack_count": 120, "ack_sum": 0.9, "ack_buckets": [[0.005, 80], ..., ["+Inf", 120]]}

and one that did not (the node is down, between a kill and its restart)::

    {"t": 1796167252.1, "up": false, "error": "ConnectionRefusedError(111, ...)"}

The gauges are DESIGN.md §9's names without the ``ourios_`` prefix; counters are
summed over every label but ``outcome``; the ack histogram is
``ourios_ingest_ack_seconds`` (cumulative buckets, as exposed). Counters restart at
zero with every process, so the helpers that turn the series into rates and latency
quantiles (``counter_deltas``, ``interval_quantiles``) treat a decrease as a restart:
the delta is then the new value itself.

``Sampler(url, path, interval_s)`` is a thread with ``start()``/``close()``; its pacing
is ``Event.wait(interval)``, so ``close()`` ends it at once.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "GAUGES",
    "Sampler",
    "counter_deltas",
    "histogram_quantile",
    "interval_quantiles",
    "load_samples",
    "parse_metrics",
    "restarts",
    "scrape",
]

#: Gauges copied into every sample, by exposed name → key in the sample.
GAUGES: Final = {
    "ourios_wal_segments": "wal_segments",
    "ourios_wal_disk_bytes": "wal_disk_bytes",
    "ourios_wal_unreclaimed_bytes": "wal_unreclaimed_bytes",
    "ourios_wal_checkpoint_lsn_bytes": "wal_checkpoint_lsn",
    "ourios_wal_unflushed_bytes": "wal_unflushed_bytes",
    "ourios_wal_oldest_unreclaimed_age_seconds": "wal_oldest_unreclaimed_age_s",
    "ourios_wal_retain_floor_lag_bytes": "wal_retain_floor_lag_bytes",
    "ourios_sink_buffered_bytes": "sink_buffered_bytes",
    "ourios_sink_publisher_queue_depth": "sink_publisher_queue_depth",
    "ourios_barrier_epoch": "barrier_epoch",
    "ourios_disk_free_bytes": "disk_free_bytes",
    "ourios_recovery_duration_seconds": "recovery_duration_s",
}
_STATE_GAUGES: Final = {
    "ourios_wal_rotation_state": "rotation_state",
    "ourios_wal_retain_floor": "retain_floor",
}
_COUNTERS: Final = {
    "ourios_ingest_requests": "ingest_requests",
    "ourios_ingest_records": "ingest_records",
}
_ACK_HISTOGRAM: Final = "ourios_ingest_ack_seconds"
SCRAPE_TIMEOUT_S: Final = 5.0


def parse_metrics(text: str) -> dict[str, Any]:
    """The sample fields (module docstring) of one Prometheus text exposition."""
    out: dict[str, Any] = {}
    for key in _COUNTERS.values():
        out[key] = {}
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if name in _COUNTERS:
            per_outcome: dict[str, float] = out[_COUNTERS[name]]
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels.get("outcome", "")
                    per_outcome[outcome] = per_outcome.get(outcome, 0.0) + sample.value
        elif name in _STATE_GAUGES:
            for sample in family.samples:
                if sample.value == 1:
                    out[_STATE_GAUGES[name]] = sample.labels.get("state", "")
        elif name == _ACK_HISTOGRAM:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_count"):
                    out["ack_count"] = sample.value
                elif sample.name.endswith("_sum"):
                    out["ack_sum"] = sample.value
        else:
            for sample in family.samples:
                gauge = GAUGES.get(sample.name)
                if gauge is not None and not sample.labels:
                    out[gauge] = sample.value
    if buckets:
        buckets.sort()
        out["ack_buckets"] = [[_le_json(le), count] for le, count in buckets]
    return out


def _le_json(le: float) -> float | str:
    return "+Inf" if math.isinf(le) else le


def _le_float(le: float | str) -> float:
    return math.inf if le == "+Inf" else float(le)


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    """GET ``url`` (plain http) and return the body; raises ``OSError`` or
    ``http.client.HTTPException`` when the node does not answer 200."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"metrics URL {url!r}: only http://HOST[:PORT]/PATH is supported")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    try:
        conn.request("GET", parts.path or "/metrics")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise http.client.HTTPException(f"GET {url}: HTTP {response.status}")
        return body.decode("utf-8")
    finally:
        conn.close()


class Sampler:
    """Scrape ``url`` every ``interval_s`` into ``path`` (module docstring)."""

    def __init__(
        self,
        url: str,
        path: Path,
        interval_s: float = 2.0,
        *,
        fetch: Callable[[str], str] = scrape,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s {interval_s}: must be > 0")
        self.url = url
        self.path = path
        self.interval_s = interval_s
        self._fetch = fetch
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The thread and a caller's sample_once (the harness takes one before SIGTERM)
        # append to one file and bump the counters: one scrape at a time.
        self._lock = threading.Lock()
        self.samples = 0
        self.down = 0

    def sample_once(self) -> dict[str, Any]:
        """One scrape, appended to the file; returns the sample."""
        with self._lock:
            t = self._clock()
            row: dict[str, Any]
            try:
                row = {"t": round(t, 3), "up": True, **parse_metrics(self._fetch(self.url))}
            except (OSError, http.client.HTTPException, ValueError) as exc:
                row = {"t": round(t, 3), "up": False, "error": repr(exc)[:200]}
                self.down += 1
            self.samples += 1
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
            return row

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SCRAPE_TIMEOUT_S + 5)
            self._thread = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ── turning the series into rates and quantiles ──────────────────────────────────────


def load_samples(path: Path) -> list[dict[str, Any]]:
    """Every sample of a JSONL file, a torn last line skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def restarts(samples: Sequence[dict[str, Any]]) -> list[bool]:
    """Per sample: the node restarted since the previous answered scrape (its barrier
    epoch, which every process starts at 1 and raises each cut, went down)."""
    out = []
    previous: float | None = None
    for row in samples:
        epoch = row.get("barrier_epoch") if row.get("up") else None
        out.append(epoch is not None and previous is not None and epoch < previous)
        if epoch is not None:
            previous = epoch
    return out


def counter_deltas(
    values: Sequence[float | None], restarted: Sequence[bool] | None = None
) -> list[float | None]:
    """Per-step increase of a counter; ``None`` where either end is missing (node down).
    After a restart (``restarted[i]``, or a decrease) the delta is the new value."""
    out: list[float | None] = [None]
    previous: float | None = values[0] if values else None
    for i, value in enumerate(values[1:], 1):
        if value is None or previous is None:
            # Across a gap the process may have restarted: what it counted since is
            # only an upper bound of the interval's increase, so it is not a rate.
            out.append(None)
        elif value < previous or (restarted is not None and restarted[i]):
            out.append(value)
        else:
            out.append(value - previous)
        previous = value
    return out


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile`` on cumulative ``(le, count)`` buckets: linear
    interpolation inside the bucket holding rank ``q × total``; ``None`` when empty.
    A rank in the ``+Inf`` bucket returns the highest finite bound."""
    if not buckets:
        return None
    ordered = sorted(buckets)
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def _buckets(row: dict[str, Any]) -> list[tuple[float, float]] | None:
    raw = row.get("ack_buckets") if row.get("up") else None
    if not raw:
        return None
    return [(_le_float(le), float(count)) for le, count in raw]


def interval_quantiles(
    samples: Sequence[dict[str, Any]], qs: Iterable[float]
) -> list[dict[float, float | None]]:
    """Per sample, the ack-latency quantiles of the requests acknowledged since the
    previous sample (bucket deltas, reset-aware); empty dicts where unknown."""
    quantiles = tuple(qs)
    out: list[dict[float, float | None]] = []
    previous: list[tuple[float, float]] | None = None
    for row, restarted in zip(samples, restarts(samples), strict=True):
        current = _buckets(row)
        if current is None or previous is None or len(previous) != len(current):
            out.append({})
        else:
            if current[-1][1] >= previous[-1][1] and not restarted:
                delta = [(le, c - p) for (le, c), (_, p) in zip(current, previous, strict=True)]
            else:
                delta = current  # restarted: everything counted is new
            out.append({q: histogram_quantile(q, delta) for q in quantiles})
        previous = current
    return out

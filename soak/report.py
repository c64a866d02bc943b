"""The soak report: PNG plots of the sampled series and a markdown summary.

Inputs are the files a run leaves in its output directory: ``samples.jsonl``
(``soak.sampler``), ``kills.jsonl`` (``soak.chaos``), ``verify.json``
(``soak.verify``), ``run.json`` (the run's settings and timeline, written by
``soak.run``) and the ack ledgers (``ledger/``, ``soak.ledger``). Outputs, in the same
directory:

- ``wal.png`` — WAL bytes on disk and unreclaimed bytes against the checkpoint LSN
  (all in MiB; the checkpoint is a byte position, so its slope is the WAL write rate
  behind the barrier), and the segment count against the derived bound;
- ``ingest.png`` — records/s acknowledged as the client saw them (the ledger, so the
  downtime after a kill shows as zero) and as the node counted them (its
  ``ourios_ingest_records_total``), and requests/s that got no 2xx;
- ``latency.png`` — ack latency p50/p99 per time bin as the client measured it (send →
  complete 2xx, from the ledger), and the node's p99 per sampling interval (the
  ``ourios_ingest_ack_seconds`` bucket deltas);
- ``summary.md`` / ``summary.json`` — the table below, the verifier's lines, the kills.

Every plot marks each SIGKILL with a vertical line and shades each kill → ready span
(from the kill log, not the samples, so a short outage between two scrapes still
shows). Matplotlib runs on the Agg backend (no display).

The segment bound (``segment_bound``), derived from the node's settings and the WAL
write rate, by the reclamation rule (DESIGN.md §5.7): a closed segment is unlinked by
the first housekeeping pass after a barrier whose checkpoint and tenant snapshots
cover it. A segment closed just after a cut waits up to one barrier period B for the
next cut; if a SIGKILL lands just before that cut, it waits the downtime D and a further
B for the new process's first cut; the cut's flush and publish take at most another B
at soak rates; then up to one housekeeping period H. So no closed segment is older than
3B + D + H, and segments are created at most ``r/S + 1/A`` per second (size rotation at
WAL write rate r bytes/s with S-byte segments, plus age rotation every A seconds). With
the active segment and one sealed by a torn tail at restart::

    max segments ≤ ceil((r/S + 1/A) · (3B + D + H)) + 2

r is measured from the run itself: the highest checkpoint LSN (bytes of WAL frames
covered) over the load's duration, × 1.5 for burstiness. D is the longest kill → ready.
If reclamation stalled, the count would grow by ``r/S + 1/A`` per second without limit,
so the bound is crossed within about 3B + D + H of a stall.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from soak.chaos import Kill  # noqa: E402
from soak.ledger import LedgerIndex, Outcome  # noqa: E402
from soak.sampler import (  # noqa: E402
    counter_deltas,
    histogram_quantile,
    interval_quantiles,
    restarts,
)

__all__ = [
    "PLOTS",
    "Summary",
    "estimate_wal_rate",
    "report_dir",
    "segment_bound",
    "summarise",
    "write_report",
]

MIB: Final = 1024 * 1024
RATE_HEADROOM: Final = 1.5
PLOTS: Final = ("wal.png", "ingest.png", "latency.png")

Sample = dict[str, Any]


def segment_bound(
    *,
    wal_bytes_per_s: float,
    segment_max_bytes: int,
    segment_age_s: float,
    barrier_s: float,
    housekeeping_s: float,
    down_s: float,
) -> int:
    """The most WAL segments the reclamation rule allows (module docstring)."""
    created_per_s = wal_bytes_per_s / segment_max_bytes + 1 / segment_age_s
    oldest_s = 3 * barrier_s + down_s + housekeeping_s
    return math.ceil(created_per_s * oldest_s) + 2


def estimate_wal_rate(samples: Sequence[Sample], load_s: float) -> float:
    """WAL write rate (bytes/s) for the bound: the highest checkpoint LSN over the
    load's duration, with headroom."""
    lsns = [float(s["wal_checkpoint_lsn"]) for s in samples if s.get("wal_checkpoint_lsn")]
    if not lsns or load_s <= 0:
        return 0.0
    return max(lsns) / load_s * RATE_HEADROOM


# ── client-side series (the ledger) ──────────────────────────────────────────────────


@dataclass(frozen=True)
class ClientSeries:
    """The ledger binned by time: what the load generator saw."""

    bin_s: float
    starts: list[float]  # unix time of each bin's start
    acked_records: list[int]
    failed_requests: list[int]  # refused (non-2xx) or no complete response
    latencies_ms: list[list[float]]  # per bin, of acknowledged requests

    @classmethod
    def of(cls, ledger: LedgerIndex, t0: float, t1: float, bin_s: float) -> ClientSeries:
        count = max(1, math.ceil((t1 - t0) / bin_s))
        acked = [0] * count
        failed = [0] * count
        latencies: list[list[float]] = [[] for _ in range(count)]
        for entry in ledger.requests.values():
            if entry.done_at is None:
                continue
            i = min(count - 1, max(0, int((entry.done_at - t0) // bin_s)))
            if entry.outcome is Outcome.ACKED:
                acked[i] += entry.records
                if entry.latency_ms is not None:
                    latencies[i].append(entry.latency_ms)
            else:
                failed[i] += 1
        return cls(bin_s, [t0 + i * bin_s for i in range(count)], acked, failed, latencies)


def _nearest_rank(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# ── the summary ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Summary:
    label: str
    duration_s: float
    records_sent: int
    records_acked: int
    records_refused: int
    records_no_response: int
    lost: int
    never_sent: int
    wrong_tenant: int
    duplicates: int
    template_event_duplicates: int
    kills: int
    max_down_s: float | None
    max_recovery_s: float | None
    max_segments: int | None
    segment_bound: int | None
    max_wal_disk_bytes: int | None
    max_unreclaimed_bytes: int | None
    final_checkpoint_lsn: int | None
    acked_records_per_s: float | None
    client_ack_p50_ms: float | None
    client_ack_p99_ms: float | None
    client_ack_max_ms: float | None
    node_ack_p50_ms: float | None
    node_ack_p99_ms: float | None
    samples: int
    samples_down: int
    verdict: str

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def markdown(self) -> str:
        def num(v: float | int | None, unit: str = "", digits: int = 0) -> str:
            if v is None:
                return "—"
            text = f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"
            return f"{text}{unit}"

        def mib(v: int | None) -> str:
            return "—" if v is None else f"{v / MIB:,.1f} MiB ({v:,} B)"

        def ms_pair(a: float | None, b: float | None) -> str:
            return f"{num(a, ' ms', 1)} / {num(b, ' ms', 1)}"

        bound_ok = (
            ""
            if self.max_segments is None or self.segment_bound is None
            else (" ✓" if self.max_segments <= self.segment_bound else " ✗ over the bound")
        )
        rows = [
            ("verdict", self.verdict),
            ("duration", f"{self.duration_s:,.0f} s ({self.duration_s / 60:.1f} min)"),
            ("records sent", num(self.records_sent)),
            ("records acknowledged", num(self.records_acked)),
            ("records refused (non-2xx)", num(self.records_refused)),
            ("records without a response", num(self.records_no_response)),
            ("**lost** (acknowledged, not published)", num(self.lost)),
            ("never sent (published, not in a ledger)", num(self.never_sent)),
            ("published under the wrong tenant", num(self.wrong_tenant)),
            ("**duplicates** (extra copies of a record)", num(self.duplicates)),
            ("**template events published twice**", num(self.template_event_duplicates)),
            ("SIGKILLs", num(self.kills)),
            ("longest kill → ready", num(self.max_down_s, " s", 1)),
            ("longest recovery (recovery.done)", num(self.max_recovery_s, " s", 2)),
            ("max WAL segments", f"{num(self.max_segments)}{bound_ok}"),
            ("segment bound (derived)", num(self.segment_bound)),
            ("max WAL bytes on disk", mib(self.max_wal_disk_bytes)),
            ("max unreclaimed WAL bytes", mib(self.max_unreclaimed_bytes)),
            ("final checkpoint LSN", mib(self.final_checkpoint_lsn)),
            ("acknowledged records/s (mean)", num(self.acked_records_per_s, "", 0)),
            ("ack latency, client p50 / p99", ms_pair(self.client_ack_p50_ms,
                                                      self.client_ack_p99_ms)),
            ("ack latency, client max", num(self.client_ack_max_ms, " ms", 1)),
            ("ack latency, node p50 / p99", ms_pair(self.node_ack_p50_ms, self.node_ack_p99_ms)),
            ("samples (node down)", f"{self.samples:,} ({self.samples_down:,})"),
        ]  # fmt: skip
        lines = [f"## Soak summary: {self.label}", "", "| | |", "|---|---|"]
        lines.extend(f"| {k} | {v} |" for k, v in rows)
        return "\n".join(lines) + "\n"


def _max_int(samples: Sequence[Sample], key: str) -> int | None:
    values = [s[key] for s in samples if s.get("up") and s.get(key) is not None]
    return int(max(values)) if values else None


def _buckets(row: Sample) -> list[tuple[float, float]] | None:
    raw = row.get("ack_buckets") if row.get("up") else None
    if not raw:
        return None
    return [(math.inf if le == "+Inf" else float(le), float(c)) for le, c in raw]


def _node_quantiles(samples: Sequence[Sample]) -> tuple[float | None, float | None]:
    """p50/p99 of every acknowledgement the node timed: bucket deltas summed over the
    samples, a restart counting everything the new process counted."""
    total: dict[float, float] = {}
    previous: list[tuple[float, float]] | None = None
    for row, restarted in zip(samples, restarts(samples), strict=True):
        current = _buckets(row)
        if current is not None:
            if previous is None or restarted or current[-1][1] < previous[-1][1]:
                delta = current
            else:
                delta = [(le, c - p) for (le, c), (_, p) in zip(current, previous, strict=True)]
            for le, c in delta:
                total[le] = total.get(le, 0.0) + c
        previous = current
    buckets = sorted(total.items())
    p50 = histogram_quantile(0.5, buckets)
    p99 = histogram_quantile(0.99, buckets)
    return (
        None if p50 is None else p50 * 1000,
        None if p99 is None else p99 * 1000,
    )


def summarise(
    samples: Sequence[Sample],
    kills: Sequence[Kill],
    verified: dict[str, Any],
    run: dict[str, Any],
    ledger: LedgerIndex | None = None,
) -> Summary:
    settings = run.get("settings", {})
    load_s = float(run.get("load_seconds") or run.get("duration_s") or 0.0)
    downs = [k.down_s for k in kills if k.down_s is not None]
    bound: int | None = None
    if settings:
        bound = segment_bound(
            wal_bytes_per_s=estimate_wal_rate(samples, load_s),
            segment_max_bytes=int(settings["segment_max_bytes"]),
            segment_age_s=float(settings["segment_age_secs"]),
            barrier_s=float(settings["barrier_secs"]),
            housekeeping_s=float(settings["housekeeping_secs"]),
            down_s=max(downs, default=0.0),
        )
    recoveries = [float(r) for r in run.get("recovery_seconds", []) if r is not None]
    node_p50, node_p99 = _node_quantiles(samples)
    latencies = (
        [e.latency_ms for e in ledger.requests.values() if e.latency_ms is not None]
        if ledger is not None
        else []
    )
    max_segments = _max_int(samples, "wal_segments")
    problems = [] if verified.get("ok") else ["verifier"]
    if bound is not None and max_segments is not None and max_segments > bound:
        problems.append(f"segments {max_segments} > bound {bound}")
    problems.extend(str(p) for p in run.get("problems", []))
    acked = int(verified.get("records_acked", 0))
    return Summary(
        label=str(run.get("label", "")),
        duration_s=float(run.get("duration_s") or 0.0),
        records_sent=int(verified.get("records_sent", 0)),
        records_acked=acked,
        records_refused=int(verified.get("records_refused", 0)),
        records_no_response=int(verified.get("records_error", 0))
        + int(verified.get("records_in_flight", 0)),
        lost=int(verified.get("lost", 0)),
        never_sent=int(verified.get("never_sent", 0)),
        wrong_tenant=int(verified.get("wrong_tenant", 0)),
        duplicates=int(verified.get("duplicates", 0)),
        template_event_duplicates=int(verified.get("audit_duplicates", 0)),
        kills=len(kills),
        max_down_s=max(downs) if downs else None,
        max_recovery_s=max(recoveries) if recoveries else None,
        max_segments=max_segments,
        segment_bound=bound,
        max_wal_disk_bytes=_max_int(samples, "wal_disk_bytes"),
        max_unreclaimed_bytes=_max_int(samples, "wal_unreclaimed_bytes"),
        final_checkpoint_lsn=_max_int(samples, "wal_checkpoint_lsn"),
        acked_records_per_s=acked / load_s if load_s > 0 else None,
        client_ack_p50_ms=_nearest_rank(latencies, 0.5),
        client_ack_p99_ms=_nearest_rank(latencies, 0.99),
        client_ack_max_ms=max(latencies) if latencies else None,
        node_ack_p50_ms=node_p50,
        node_ack_p99_ms=node_p99,
        samples=len(samples),
        samples_down=sum(1 for s in samples if not s.get("up")),
        verdict="PASS" if not problems else "FAIL: " + "; ".join(problems),
    )


# ── plots ────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Axis:
    """Seconds (or minutes, for runs over ten minutes) since the run started."""

    t0: float
    scale: float

    def x(self, t: float) -> float:
        return (t - self.t0) / self.scale

    @property
    def label(self) -> str:
        return "minutes since start" if self.scale == 60.0 else "seconds since start"


def _mark(ax: Axes, kills: Sequence[Kill], axis: _Axis) -> None:
    """Kills as vertical lines; each kill → ready span shaded (to the plot's end when
    the node never came back)."""
    for i, kill in enumerate(kills):
        x = axis.x(kill.at)
        ax.axvline(
            x, color="tab:red", linestyle="--", linewidth=0.8, label="SIGKILL" if i == 0 else None
        )
        end = axis.x(kill.at + kill.down_s) if kill.down_s is not None else ax.get_xlim()[1]
        ax.axvspan(
            x, end, color="0.85", linewidth=0, label="down (kill → ready)" if i == 0 else None
        )


def _series(samples: Sequence[Sample], key: str, scale: float = 1.0) -> list[float]:
    return [
        float(s[key]) / scale if s.get("up") and s.get(key) is not None else math.nan
        for s in samples
    ]


def _outcome_total(row: Sample, key: str, ok: bool) -> float | None:
    if not row.get("up"):
        return None
    values: dict[str, float] = row.get(key) or {}
    return sum(v for k, v in values.items() if (k == "ok") == ok)


def _rates(samples: Sequence[Sample], values: Sequence[float | None]) -> list[float]:
    deltas = counter_deltas(values, restarts(samples))
    out = [math.nan]
    for i in range(1, len(samples)):
        d = deltas[i]
        dt = float(samples[i]["t"]) - float(samples[i - 1]["t"])
        out.append(d / dt if d is not None and dt > 0 else math.nan)
    return out


def _legend(*axes: Axes) -> None:
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    axes[0].legend(handles, labels, loc="upper left", fontsize=8)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(
    out_dir: Path,
    samples: Sequence[Sample],
    kills: Sequence[Kill],
    run: dict[str, Any],
    bound: int | None,
    ledger: LedgerIndex | None = None,
) -> list[Path]:
    t0 = float(run.get("started_at") or (samples[0]["t"] if samples else 0.0))
    t1 = float(samples[-1]["t"]) if samples else float(run.get("ended_at") or t0 + 1.0)
    axis = _Axis(t0, 60.0 if t1 - t0 > 600 else 1.0)
    xs = [axis.x(float(s["t"])) for s in samples]
    title = str(run.get("label", "soak"))
    paths: list[Path] = []

    # WAL bytes and segments against the checkpoint.
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    top.plot(xs, _series(samples, "wal_disk_bytes", MIB), label="WAL bytes on disk")
    top.plot(xs, _series(samples, "wal_unreclaimed_bytes", MIB), label="unreclaimed WAL bytes")
    top.set_ylabel("MiB")
    right = top.twinx()
    right.plot(
        xs,
        _series(samples, "wal_checkpoint_lsn", MIB),
        color="tab:green",
        linewidth=1.2,
        label="checkpoint LSN",
    )
    right.set_ylabel("checkpoint LSN (MiB of WAL written)")
    _mark(top, kills, axis)
    _legend(top, right)
    top.set_title(f"{title}: WAL against the checkpoint")
    bottom.step(xs, _series(samples, "wal_segments"), where="post", label="WAL segments")
    if bound is not None:
        bottom.axhline(bound, color="tab:orange", linestyle=":", label=f"bound {bound}")
    _mark(bottom, kills, axis)
    bottom.set_ylabel("segments")
    bottom.set_xlabel(axis.label)
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper left", fontsize=8)
    paths.append(_save(fig, out_dir / "wal.png"))

    client = None
    if ledger is not None and ledger.requests:
        span = t1 - t0
        client = ClientSeries.of(ledger, t0, t1, max(2.0, span / 200))

    # Ingest rate.
    fig, ax = plt.subplots(figsize=(11, 4))
    if client is not None:
        cx = [axis.x(t + client.bin_s / 2) for t in client.starts]
        ax.plot(
            cx, [n / client.bin_s for n in client.acked_records], label="acked records/s (client)"
        )
    ok_records = [_outcome_total(s, "ingest_records", True) for s in samples]
    ax.plot(
        xs, _rates(samples, ok_records), linestyle=":", label="accepted records/s (node counter)"
    )
    ax.set_ylabel("records/s")
    right = ax.twinx()
    if client is not None:
        right.plot(
            cx,
            [n / client.bin_s for n in client.failed_requests],
            color="tab:purple",
            linewidth=0.8,
            label="requests/s without a 2xx (client)",
        )
    right.set_ylabel("failed requests/s")
    _mark(ax, kills, axis)
    _legend(ax, right)
    ax.set_title(f"{title}: ingest rate")
    ax.set_xlabel(axis.label)
    paths.append(_save(fig, out_dir / "ingest.png"))

    # Ack latency.
    fig, ax = plt.subplots(figsize=(11, 4))
    if client is not None:
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            ys = [
                math.nan if (v := _nearest_rank(lat, q)) is None else v
                for lat in client.latencies_ms
            ]
            ax.plot(cx, ys, label=f"client {label}")
    # The node's p99 over windows as wide as the client's bins (every stride-th sample),
    # so a long run's line is as readable as a short one's.
    bin_s = client.bin_s if client is not None else 0.0
    spacing = (t1 - t0) / max(1, len(samples) - 1)
    stride = max(1, round(bin_s / spacing)) if spacing > 0 else 1
    picked = samples[::stride]
    node = interval_quantiles(picked, (0.99,))
    ax.plot(
        [axis.x(float(s["t"])) for s in picked],
        [(v * 1000 if (v := row.get(0.99)) is not None else math.nan) for row in node],
        linestyle=":",
        label="node p99 (ourios_ingest_ack_seconds)",
    )
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    _mark(ax, kills, axis)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"{title}: ack latency")
    ax.set_xlabel(axis.label)
    paths.append(_save(fig, out_dir / "latency.png"))
    return paths


def write_report(
    out_dir: Path,
    samples: Sequence[Sample],
    kills: Sequence[Kill],
    verified: dict[str, Any],
    run: dict[str, Any],
    verify_lines: Sequence[str] = (),
    ledger: LedgerIndex | None = None,
) -> Summary:
    """Write the plots, ``summary.md`` and ``summary.json`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(samples, kills, verified, run, ledger)
    write_plots(out_dir, samples, kills, run, summary.segment_bound, ledger)
    text = summary.markdown()
    if verify_lines:
        text += "\n```\n" + "\n".join(verify_lines) + "\n```\n"
    if kills:
        text += (
            "\n| kill | at (s) | killed | waited (s) | down (s) | back |\n"
            "|---:|---:|---|---:|---:|---|\n"
        )
        t0 = float(run.get("started_at") or kills[0].at)
        for k in kills:
            down = "—" if k.down_s is None else f"{k.down_s:.1f}"
            back = k.back or k.error or "—"
            text += (
                f"| {k.number} | {k.at - t0:.1f} | {k.target} | {k.waited_s:.1f} | {down}"
                f" | {back} |\n"
            )
    (out_dir / "summary.md").write_text(text, encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def report_dir(out_dir: Path) -> Summary:
    """Rebuild the report from a run's files (``python -m soak report DIR``)."""
    from soak.chaos import read_kills
    from soak.ledger import read_ledgers
    from soak.sampler import load_samples

    samples = load_samples(out_dir / "samples.jsonl")
    kills = read_kills(out_dir / "kills.jsonl")
    verified = json.loads((out_dir / "verify.json").read_text())
    run = json.loads((out_dir / "run.json").read_text())
    lines = [str(x) for x in verified.get("lines", [])]
    ledger = read_ledgers(out_dir / "ledger")
    return write_report(out_dir, samples, kills, verified, run, lines, ledger)
